// lib/engine/response_cache.hpp — the response cache of step 6 (include/flexpar/engine/engine.hpp).
//
// Every rank enters each description run in full at the next free slot, in response order; since
// every rank runs the same response list, every rank's cache holds the same tensors at the same
// slots without a message about it. In steady state a rank reports a tensor by its slot (4 bytes)
// instead of its description, and the coordinator answers by slot too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "protocol.hpp"

namespace flexpar::detail {

/// A tensor as the cache remembers it: its description and every rank's count.
struct cache_entry {
  std::string name;
  description desc;  // count unused: see counts
  std::vector<std::uint64_t> counts;
};

class response_cache {
 public:
  /// `capacity` slots at most (0: no cache; every tensor is reported in full).
  explicit response_cache(std::size_t capacity) : capacity_(capacity) {}

  /// The slot of tensor `name` when the cache holds it with this description, `rank`'s count
  /// included; nothing when the name is unknown or anything about it changed.
  [[nodiscard]] std::optional<std::uint32_t> slot_of(const std::string& name, const description& d, int rank) const;

  /// Enters a response that ran in full: at its name's slot when the name is known (its description
  /// changed), otherwise at the next slot while there is room.
  void remember(const response& r);

  /// The tensor at `slot`. @throws error ("engine protocol error: ...") for a slot never given.
  [[nodiscard]] const cache_entry& at(std::uint32_t slot) const;

  [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }

 private:
  std::size_t capacity_;
  std::vector<cache_entry> entries_;
  std::unordered_map<std::string, std::uint32_t> slot_by_name_;
};

}  // namespace flexpar::detail
