// lib/zero/registration.hpp — the parameters a sharded_data_parallel holds, and the agreement of every
// rank on them at start() (flexpar/zero/sharded_data_parallel.hpp).
#pragma once

#include <cstddef>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/zero/sharded_data_parallel.hpp>
#include <span>
#include <string>
#include <string_view>

namespace flexpar::zero::detail {

/// One registered parameter: its name, size and initializer, and (after start()) where it lies.
struct member {
  std::string name;
  std::size_t count = 0;
  initializer init;
  std::size_t bucket = 0, offset = 0;  // where it lies in its bucket
  bool ready = false;                  // gradient_ready() this pass
};

/// Collective over `comm`: every rank contributes (count, total, hash of names, hash of sizes, first
/// parameter over the bucket limit and its size, stage, bucket_bytes); on a difference the first
/// differing parameter's name and size on every rank are gathered to name both sides.
/// @throws usage_error (on every rank, "[rank `rank`] `op`: ...": the caller's rank and operation) when
///         the ranks differ in their stage or bucket_bytes, in their parameters, or when a parameter is
///         larger than a bucket.
void agree_on_registrations(communicator& comm, std::span<const member> members, const options& opts, int rank,
                            std::string_view op);

}  // namespace flexpar::zero::detail
