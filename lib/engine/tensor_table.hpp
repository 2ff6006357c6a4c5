// lib/engine/tensor_table.hpp — the coordinator's table of tensors (step 2 of the protocol in
// include/flexpar/engine/engine.hpp): for each tensor some rank has reported and not every rank has
// run, which ranks have it and with which description. A tensor is its name and its step
// (description::step): the same name in two steps is two rows, so that they never pair. The
// coordinator fills it; the stall inspector reads it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <flexpar/core/deadline.hpp>

#include "protocol.hpp"

namespace flexpar::detail {

struct table_row {
  std::vector<std::optional<description>> by_rank;  // what each rank reported; empty where not yet
  std::vector<bool> by_slot;                        // which ranks reported it by cache slot
  std::vector<bool> skipped;                        // which ranks ended the step without it (end_step)
  std::optional<std::uint32_t> slot;                // the cache slot they reported
  clock::time_point first_seen, last_warning;
  std::uint64_t order = 0;  // when it was first seen: complete tensors run in this order
};

/// A row's tensor: its name, in the step of the ranks that reported it.
struct tensor_key {
  tensor_key(std::string n, std::uint32_t s = 0) : name(std::move(n)), step(s) {}  // NOLINT: a name is step 0's
  std::string name;
  std::uint32_t step = 0;
  friend bool operator==(const tensor_key&, const tensor_key&) = default;
};
struct tensor_key_hash {
  std::size_t operator()(const tensor_key& k) const noexcept {
    return std::hash<std::string>{}(k.name) ^ (std::size_t{k.step} * 0x9e3779b97f4a7c15ull);
  }
};

using tensor_table = std::unordered_map<tensor_key, table_row, tensor_key_hash>;

/// " (step 5)" after a tensor's name in a message, for a loop that counts steps (nothing for step 0).
inline std::string step_text(std::uint32_t step) {
  return step == 0 ? std::string() : " (step " + std::to_string(step) + ")";
}

/// Whether no rank has reported the tensor (only skips of it, if anything).
inline bool skips_only(const table_row& t) {
  for (const auto& d : t.by_rank)
    if (d) return false;
  return true;
}

/// The ranks that have neither reported the tensor, nor skipped it, nor joined (a joined rank counts
/// as having it; a rank that ended its step without it has answered for it too).
inline std::vector<int> missing_ranks(const table_row& t, const std::vector<bool>& joined) {
  std::vector<int> missing;
  for (std::size_t r = 0; r < t.by_rank.size(); ++r)
    if (!t.by_rank[r] && !joined[r] && !(r < t.skipped.size() && t.skipped[r])) missing.push_back(static_cast<int>(r));
  return missing;
}

}  // namespace flexpar::detail
