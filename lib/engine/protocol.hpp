// lib/engine/protocol.hpp — what the engine's messages carry (steps 1 and 4 of the protocol in
// include/flexpar/engine/engine.hpp) and their encoding.
//
// A report (step 1) goes from every rank to the coordinator; a response list (step 4) from the
// coordinator to every rank. Both are plain structs here so that the coordinator, the response cache
// and the fused executor can be driven without a transport; encode/decode are the only places that
// know the byte layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <flexpar/engine/engine.hpp>

namespace flexpar::detail {

class response_cache;

/// What every rank must agree on about a tensor (the count only where the collective needs it).
struct description {
  collective_kind kind = collective_kind::allreduce;
  dtype type = dtype::f32;
  reduce_op op = reduce_op::sum;
  std::int32_t root = -1;
  std::uint64_t count = 0;
  memory_kind memory = memory_kind::host;
  /// The submitting rank's step: how many times it had called engine::end_step before (0 for a rank
  /// that never does). Every rank's must agree, so that a tensor of one step never pairs with the
  /// same tensor of the next (a rank that skipped it); not part of what the response cache matches.
  std::uint32_t step = 0;
};

/// A tensor reported in full (its name and description).
struct reported_tensor {
  std::string name;
  description desc;
};

/// A tensor of the frozen plan that a rank's step `step` ended without (engine::end_step).
struct skipped_tensor {
  std::uint32_t slot = 0;  // its response-cache slot
  std::uint32_t step = 0;
};

/// Step 1: one rank's report for one cycle.
struct report {
  bool joined = false;
  bool shutting_down = false;
  std::vector<std::uint32_t> slots;       // tensors the rank has, by response-cache slot
  std::vector<std::uint32_t> slot_steps;  // the step of each of `slots` (empty: all 0)
  std::vector<reported_tensor> full;      // tensors the rank has, in full
  /// Tensors of the frozen plan this rank ended a step without: the ranks that submitted them get an
  /// error naming this one instead of waiting for it.
  std::vector<skipped_tensor> skipped;
};

enum class response_type : std::uint8_t { run_cached, run_full, error };
enum class error_kind : std::uint8_t { mismatch, timeout, usage };

/// One response of step 4.
struct response {
  response_type type = response_type::run_full;
  std::uint32_t slot = 0;
  std::string name;
  description desc;
  std::vector<std::uint64_t> counts;  // per rank
  error_kind error = error_kind::mismatch;
  std::string text;
  /// The step of the submissions it answers; on the wire only for an error, which fails this step's
  /// submission of the tensor on each rank (a rank's submission of another step stays).
  std::uint32_t step = 0;
};

/// Step 4: what the coordinator sends every rank.
struct response_list {
  bool all_joined = false;
  bool all_shutdown = false;
  /// Once these responses ran, nothing is outstanding on any rank (every tensor reported has been
  /// answered; no rank joined or shutting down): the ranks go quiet (engine.cpp, "Quiet").
  bool quiet = false;
  std::int32_t last_joined = -1;  // the last rank to join, when all_joined
  std::vector<response> responses;
  /// A plan to freeze after these responses ran (lib/engine/step_plan.hpp): its buckets, by cache
  /// slot, in run order; empty: none.
  std::vector<std::vector<std::uint32_t>> plan;
};

std::vector<std::byte> encode(const report& r);
/// @throws error ("engine protocol error: ...") on a short or long message.
report decode_report(std::span<const std::byte> bytes);

std::vector<std::byte> encode(const response_list& list);
/// Decodes a response list and fills every run_cached response's name, description and counts from
/// `cache` (so that every response can be run as it is); `ranks` is the communicator's size.
/// @throws error ("engine protocol error: ...") on a malformed message or an unknown cache slot.
response_list decode_response_list(std::span<const std::byte> bytes, const response_cache& cache, int ranks);

}  // namespace flexpar::detail
