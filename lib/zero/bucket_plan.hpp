// lib/zero/bucket_plan.hpp — the buckets of a sharded_data_parallel: its parameters flattened, in
// registration order, into buckets of at most options::bucket_bytes (flexpar/zero/sharded_data_parallel.hpp).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "registration.hpp"

namespace flexpar::zero::detail {

/// One bucket's members (indices into the registered parameters) and its size in f32 values.
struct bucket_layout {
  std::vector<std::size_t> members;
  std::size_t elements = 0;
};

/// Packs `members` in order: a bucket takes parameters until the next one would pass bucket_bytes,
/// then a new bucket begins. Sets each member's bucket and offset. @pre every member fits in a bucket
/// (agree_on_registrations checked it).
[[nodiscard]] std::vector<bucket_layout> plan_buckets(std::span<member> members, std::size_t bucket_bytes);

}  // namespace flexpar::zero::detail
