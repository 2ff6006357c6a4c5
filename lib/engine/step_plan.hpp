// lib/engine/step_plan.hpp — the steady state of the protocol ("The steady state" in
// include/flexpar/engine/engine.hpp): a step that has repeated is frozen into a plan of buckets, and
// every rank replays it with one small agreement per round instead of a report and a response per
// tensor.
//
// Three parts, each without a thread or a transport (tests/engine/test_engine_units.cpp):
//  - plan_recorder (rank 0, inside the coordinator): watches the response lists it sends, cuts them
//    into steps where a tensor comes back, and proposes a plan once two steps in a row ran the same
//    tensors, every one by cache slot, and nothing else is pending anywhere;
//  - step_plan: the plan itself, the same on every rank (built from the response cache's slots, as
//    rank 0 announced them), its tensors in bucket order, each bucket one run of the fused executor;
//  - plan_slots (every rank): the submissions of the current step in their slots, which buckets are
//    complete here, which tensors the step did not submit (end_step), and the agreement vector of a
//    round with how to read the reduced one.
#pragma once

#include <algorithm>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "entry.hpp"
#include "fused_executor.hpp"
#include "protocol.hpp"

namespace flexpar::detail {

class response_cache;

/// A frozen step (see the top of this file).
class step_plan {
 public:
  /// The tensors at `buckets`' cache slots, bucket by bucket, resolved in `cache`; `rank` is this
  /// rank (whose counts its submissions must have).
  /// @throws error ("engine protocol error: ...") for an unknown slot or a slot in two buckets.
  step_plan(const response_cache& cache, std::span<const std::vector<std::uint32_t>> buckets, int rank);

  [[nodiscard]] std::size_t tensors() const noexcept { return tensors_.size(); }
  [[nodiscard]] std::size_t buckets() const noexcept { return bucket_begin_.size() - 1; }
  /// The tensor called `name`, or nothing.
  [[nodiscard]] std::optional<std::uint32_t> find(const std::string& name) const;
  /// Tensor k as the executor runs it: name, description, every rank's count.
  [[nodiscard]] const response& tensor(std::uint32_t k) const { return tensors_[k]; }
  [[nodiscard]] std::uint32_t bucket_of(std::uint32_t k) const { return bucket_of_[k]; }
  /// Bucket b's tensors [first, first + size) in plan order.
  [[nodiscard]] std::uint32_t first_of(std::uint32_t b) const { return bucket_begin_[b]; }
  [[nodiscard]] std::uint32_t size_of_bucket(std::uint32_t b) const { return bucket_begin_[b + 1] - bucket_begin_[b]; }
  /// Bucket b as a run of the fused executor (response_run over the plan's tensors).
  [[nodiscard]] std::span<const response> bucket_tensors(std::uint32_t b) const;
  /// 0, 1, ..., the largest bucket's size - 1: the indices of a response_run over bucket_tensors().
  [[nodiscard]] std::span<const std::size_t> positions(std::uint32_t b) const;
  /// Whether a submission with description `d` is tensor k as this rank has it.
  [[nodiscard]] bool matches(std::uint32_t k, const description& d) const;
  /// A digest of every tensor's name, description and counts and of the buckets: equal on every rank
  /// that holds the same plan.
  [[nodiscard]] std::uint64_t digest() const noexcept { return digest_; }

 private:
  std::vector<response> tensors_;
  std::vector<std::uint32_t> bucket_begin_;  // bucket b: tensors_[bucket_begin_[b], bucket_begin_[b + 1])
  std::vector<std::uint32_t> bucket_of_;
  std::vector<std::size_t> positions_;
  std::unordered_map<std::string, std::uint32_t> index_;
  std::uint64_t digest_ = 0;
  int rank_;
};

/// What one rank brings to a round of the steady state, and what the round tells it.
struct plan_round {
  bool leave = false;          ///< this rank drops the plan (every rank does, this round)
  std::vector<bool> complete;  ///< per bucket: every tensor of it submitted here
  std::vector<bool> started;   ///< per bucket: some tensor of it submitted here
};
struct plan_verdict {
  bool leave = false;                     ///< some rank drops the plan: every rank negotiates again
  bool digest_differs = false;            ///< the ranks hold different plans (a protocol error)
  std::vector<bool> complete_everywhere;  ///< run these buckets, in bucket order
  std::vector<bool> started_somewhere;    ///< with !complete_everywhere: a bucket waiting for a rank
};

/// The agreement vector of a round, reduced with reduce_op::max: byte 0 "leave"; per bucket b, byte
/// 1 + b "not complete here" (its max is "not complete everywhere") and byte 1 + B + b "started
/// here"; then the 8 bytes of the plan digest and the 8 of its complement (a rank whose digest
/// differs sees another maximum in one of them, whichever way it differs).
std::vector<std::uint8_t> encode_round(const plan_round& mine, std::uint64_t digest);
/// Reads the reduced vector of a round of a plan of `buckets` buckets, as the rank with `digest`.
/// @throws error ("engine protocol error: ...") on a vector of another length.
plan_verdict decode_round(std::span<const std::uint8_t> reduced, std::size_t buckets, std::uint64_t digest);

/// A rank's submissions of the current step under a plan (guarded by the engine's mutex).
class plan_slots {
 public:
  explicit plan_slots(std::shared_ptr<const step_plan> plan);

  enum class placed : unsigned char {
    not_in_plan,       ///< not a tensor of the plan, another description, or its slot still full
    in_slot,           ///< in its slot; its bucket still lacks tensors
    completes_bucket,  ///< in its slot, and its bucket is now complete here
  };
  /// Puts a submission into its slot when it is a tensor of the plan with this rank's description and
  /// its slot is free (the same tensor's previous submission has been run); `of_this_step`: it counts
  /// for the step in progress (end_step), not for one that ended before the plan was frozen.
  placed place(const std::shared_ptr<engine_entry>& e, bool of_this_step = true);
  /// After the plan was dropped, until the step ends: notes a submission of a tensor of the plan for
  /// end_step (a rank whose step the drop cut in two still says which tensors its step lacked).
  void mark(const engine_entry& e);
  /// The bucket of a tensor placed last (after place() returned in_slot or completes_bucket).
  [[nodiscard]] std::uint32_t bucket_of(const engine_entry& e) const;
  /// The entries of bucket b in plan order (its slots stay full until take()).
  [[nodiscard]] std::span<const std::shared_ptr<engine_entry>> entries(std::uint32_t b) const;

  /// This rank ended a step (engine::end_step): the tensors of the plan it did not submit since the
  /// last end_step, by index; the step's marks start over.
  std::vector<std::uint32_t> end_step();

  /// What this rank brings to the next round; `leave` as given.
  [[nodiscard]] plan_round round(bool leave) const;
  /// Takes bucket b's entries out of their slots (it runs now); the slots are free again.
  std::vector<std::shared_ptr<engine_entry>> take(std::uint32_t b);
  /// Every entry still in a slot, in plan order (the plan is dropped: they are negotiated instead).
  std::vector<std::shared_ptr<engine_entry>> take_all();
  /// Whether some bucket is complete here and not yet run (this rank waits for the others).
  [[nodiscard]] bool waiting() const noexcept { return complete_buckets_ > 0; }
  /// Whether some bucket has a submission of this step here (a quiet thread wakes for it: the
  /// rounds, and the patience with a rank that never completes it, go on while one is begun).
  [[nodiscard]] bool begun() const noexcept {
    return std::any_of(filled_.begin(), filled_.end(), [](std::uint32_t n) { return n > 0; });
  }

  [[nodiscard]] const step_plan& plan() const noexcept { return *plan_; }
  [[nodiscard]] const std::shared_ptr<const step_plan>& shared() const noexcept { return plan_; }

 private:
  std::shared_ptr<const step_plan> plan_;
  std::vector<std::shared_ptr<engine_entry>> slot_;  // per tensor: its submission of this step, until run
  std::vector<bool> submitted_;                      // per tensor: submitted since the last end_step
  std::vector<std::uint32_t> filled_;                // per bucket: slots full
  std::size_t complete_buckets_ = 0;
};

/// Rank 0's watch over the response lists (the top of this file). A step ends where the responses'
/// step changes (a loop that calls engine::end_step) or, in a loop that does not, where a tensor of
/// the step in progress comes back.
class plan_recorder {
 public:
  /// Buckets as the fused executor would run the recorded lists: at most `fusion_threshold` bytes.
  explicit plan_recorder(std::size_t fusion_threshold) : fusion_threshold_(fusion_threshold) {}

  /// One cycle's response list as the fusion plan sees it, with `slots[i]` the cache slot of response
  /// i (nothing when it runs in full or is an error) and `steps[i]` its step. `quiet`: nothing is
  /// pending anywhere after it (the coordinator's table holds no submission, no rank has joined or is
  /// shutting down). Returns the buckets, by cache slot, of a plan to freeze now, or nothing.
  std::optional<std::vector<std::vector<std::uint32_t>>> observe(std::span<const fusion_item> list,
                                                                 std::span<const std::optional<std::uint32_t>> slots,
                                                                 std::span<const std::uint32_t> steps, bool quiet);
  /// Forgets the steps seen so far (after a freeze, or when the plan was dropped).
  void reset();

 private:
  struct step {
    std::vector<std::vector<std::uint32_t>> buckets;  // by slot, in the order they ran
    std::vector<std::uint32_t> sorted;                // every slot of the step (ascending once it ended)
    std::vector<bool> has;                            // by slot: in the step
    bool clean = true;                                // every response by cache slot, no error
    std::uint32_t step = 0;                           // the responses' step
  };
  std::size_t fusion_threshold_;
  step current_, previous_;
  bool have_previous_ = false;
};

}  // namespace flexpar::detail
