// lib/engine/tensor_table.hpp — the coordinator's table of tensors (step 2 of the protocol in
// include/flexpar/engine/engine.hpp): for each tensor some rank has reported and not every rank has
// run, which ranks have it and with which description. The coordinator fills it; the stall inspector
// reads it.
#pragma once

#include <cstdint>
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
  std::optional<std::uint32_t> slot;                // the cache slot they reported
  clock::time_point first_seen, last_warning;
  std::uint64_t order = 0;  // when it was first seen: complete tensors run in this order
};

using tensor_table = std::unordered_map<std::string, table_row>;

/// The ranks that have neither reported the tensor nor joined (a joined rank counts as having it).
inline std::vector<int> missing_ranks(const table_row& t, const std::vector<bool>& joined) {
  std::vector<int> missing;
  for (std::size_t r = 0; r < t.by_rank.size(); ++r)
    if (!t.by_rank[r] && !joined[r]) missing.push_back(static_cast<int>(r));
  return missing;
}

}  // namespace flexpar::detail
