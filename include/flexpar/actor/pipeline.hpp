// flexpar/actor/pipeline.hpp — pipeline parallelism: stages on ranks, micro-batches, GPipe and 1F1B schedules.
//
// A model is cut into p stages; stage s runs on rank `stage_ranks[s]`. A mini-batch is split into
// m micro-batches. Each stage is an actor with two firings per micro-batch: forward (input
// activation from stage s-1, output to stage s+1) and backward (gradient from stage s+1, gradient
// of its input to stage s-1). The stage keeps the activations of every micro-batch between its
// forward and its backward (the stash): the memory that the schedule bounds.
//
// Schedules, as the order of one stage's firings (schedule_ops):
//  - GPipe: F0 F1 ... F(m-1), then B0 ... B(m-1). Simple; every stage stashes all m micro-batches.
//  - 1F1B: w = min(p - s - 1, m) warm-up forwards, then alternate one forward and one backward,
//    then the remaining backwards. Stage s stashes at most min(p - s, m) micro-batches (<= p).
// Both schedules run the backwards of a stage in micro-batch order, so gradients accumulate in the
// same order as a serial loop over the micro-batches (the same floats, bit for bit).
// Both have the same bubble, (p - 1) / (m + p - 1) of the step for stages of equal cost.
//
// Activations and gradients are std::vector<float>, sent as a size and a payload on a private split
// of the communicator's transport; sends are non-blocking (so that neighbours sending to each
// other cannot deadlock), every receive has the step's deadline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/comm/communicator.hpp>

namespace flexpar {

class timeline;
class pipeline;

/// The order in which each stage runs its forwards and backwards.
enum class pipeline_schedule : unsigned char {
  gpipe,        ///< all forwards, then all backwards (stash: m per stage)
  one_f_one_b,  ///< warm-up, then one forward one backward (stash: p - s on stage s)
};

/// "gpipe" or "1f1b".
std::string_view name_of(pipeline_schedule s) noexcept;

/// One firing of a stage.
struct pipeline_op {
  /// Forward or backward.
  enum class kind : unsigned char {
    forward,  ///< run the stage's forward on the micro-batch
    backward  ///< run the stage's backward on the micro-batch
  };
  /// Which of the two this firing is.
  kind what;
  /// The micro-batch, 0 <= micro_batch < m.
  int micro_batch;
  /// Equal ops.
  friend bool operator==(const pipeline_op&, const pipeline_op&) = default;
};

/// The order of the 2m firings of stage `stage` of `stages` under `s`.
/// @throws usage_error unless 0 <= stage < stages and micro_batches >= 1.
std::vector<pipeline_op> schedule_ops(pipeline_schedule s, int stages, int stage, int micro_batches);

/// What one stage does. Activations are flat float vectors (row-major micro-batch x features).
struct pipeline_stage {
  /// Label of the stage (timeline track, errors).
  std::string label;
  /// forward(micro_batch, input, output): `input` is the previous stage's output (on stage 0: what
  /// the `input` function produced); write this stage's output.
  std::function<void(int micro_batch, const std::vector<float>& input, std::vector<float>& output)> forward;
  /// backward(micro_batch, input, output, grad_output, grad_input): `input`/`output` are the stashed
  /// activations of this micro-batch's forward; accumulate the weight gradients and write the
  /// gradient of the input (ignored on stage 0).
  std::function<void(int micro_batch, const std::vector<float>& input, const std::vector<float>& output,
                     const std::vector<float>& grad_output, std::vector<float>& grad_input)>
      backward;
};

/// Measurements of one step on this rank's stage.
struct pipeline_step_stats {
  int stage = -1;                    ///< this rank's stage (-1: none; the other fields are empty)
  std::size_t peak_activations = 0;  ///< most micro-batches stashed at once (the memory counter)
  double busy_seconds = 0;           ///< time inside forward/backward bodies
  double step_seconds = 0;           ///< time of the whole step on this rank
  std::vector<float> losses;         ///< per micro-batch losses (last stage only)
};

/// Builds a pipeline: every rank describes every stage and its rank; each keeps its own.
class pipeline_builder {
 public:
  /// A pipeline over `comm` (which must outlive the pipeline built).
  explicit pipeline_builder(communicator& comm) : comm_(&comm) {}
  /// Adds the next stage, placed on `rank`.
  pipeline_builder& stage(int rank, pipeline_stage s) {
    ranks_.push_back(rank);
    stages_.push_back(std::move(s));
    return *this;
  }
  /// The number of micro-batches per step (m >= 1).
  pipeline_builder& micro_batches(int m) {
    micro_batches_ = m;
    return *this;
  }
  /// The schedule (default 1F1B).
  pipeline_builder& schedule(pipeline_schedule s) {
    schedule_ = s;
    return *this;
  }
  /// What stage 0 receives as the input of micro-batch i (called on stage 0's rank).
  pipeline_builder& input(std::function<void(int micro_batch, std::vector<float>& input)> f) {
    input_ = std::move(f);
    return *this;
  }
  /// The loss of the last stage's output for micro-batch i; writes d(loss)/d(output) (called on the
  /// last stage's rank). Returns the loss.
  pipeline_builder& loss(
      std::function<float(int micro_batch, const std::vector<float>& output, std::vector<float>& grad)> f) {
    loss_ = std::move(f);
    return *this;
  }
  /// Records every firing as a span on a track per stage ("stage 2: fc3"); `t` must outlive the pipeline.
  pipeline_builder& record(timeline& t) {
    trace_ = &t;
    return *this;
  }
  /// Collective over the communicator. @throws usage_error if a stage's rank is out of range or
  /// twice, m < 1, there is no stage, or the input/loss functions are missing.
  pipeline build();

 private:
  friend class pipeline;
  communicator* comm_;
  std::vector<int> ranks_;
  std::vector<pipeline_stage> stages_;
  int micro_batches_ = 1;
  pipeline_schedule schedule_ = pipeline_schedule::one_f_one_b;
  std::function<void(int, std::vector<float>&)> input_;
  std::function<float(int, const std::vector<float>&, std::vector<float>&)> loss_;
  timeline* trace_ = nullptr;
};

/// A built pipeline: run_step() runs one mini-batch (m micro-batches) through every stage.
class pipeline {
 public:
  /// Collective over the stage ranks (ranks without a stage return at once): one forward and
  /// backward of every micro-batch in this stage's schedule order. Weight gradients accumulate in
  /// the stage's backward; apply them after the step.
  /// @throws timeout_error at `until` naming the stage, micro-batch and peer waited for.
  pipeline_step_stats run_step(deadline until);

  /// This rank's stage, or -1.
  [[nodiscard]] int stage() const noexcept { return stage_; }
  /// Number of stages.
  [[nodiscard]] int stages() const noexcept { return static_cast<int>(ranks_.size()); }
  /// Number of micro-batches per step.
  [[nodiscard]] int micro_batches() const noexcept { return micro_batches_; }
  /// The schedule.
  [[nodiscard]] pipeline_schedule schedule() const noexcept { return schedule_; }

 private:
  friend class pipeline_builder;
  explicit pipeline(pipeline_builder& b);
  void receive(int peer, tag_t tag, std::vector<float>& into, deadline until, std::string_view what, int micro_batch);
  void send(int peer, tag_t tag, const std::vector<float>& data);

  std::unique_ptr<transport> transport_;
  std::vector<int> ranks_;
  int stage_ = -1;
  int micro_batches_;
  pipeline_schedule schedule_;
  pipeline_stage mine_;
  std::function<void(int, std::vector<float>&)> input_;
  std::function<float(int, const std::vector<float>&, std::vector<float>&)> loss_;
  timeline* trace_;
  struct outgoing {
    std::uint64_t size;
    std::vector<float> data;
    request size_sent, data_sent;
  };
  std::vector<std::unique_ptr<outgoing>> sends_;
};

}  // namespace flexpar
