// flexpar/actor/pipeline.hpp — pipeline parallelism as an actor graph: stages on ranks, micro-batches,
// GPipe, 1F1B and interleaved 1F1B from register counts.
//
// A model is cut into stages; stage j runs on rank `stage_ranks[j]` (a rank may hold several: with
// stages placed round-robin, rank r holding r, r + p, r + 2p, ..., this is interleaved 1F1B with
// virtual stages). A mini-batch is split into m micro-batches. Every step is an actor graph:
//
//   F_j: forward of stage j. In: the activation from F_(j-1) (stage 0: the input function). Out: the
//        stage's input x and output y, each an out<std::vector<float>, dynamic_registers>. y feeds
//        F_(j+1) (a cross-rank edge when the next stage is on another rank) and B_j; x feeds B_j.
//   B_j: backward of stage j. In: x and y of the micro-batch, and the gradient from B_(j+1) (last
//        stage: the loss function's gradient). Out: the gradient of x to B_(j-1) (none on stage 0).
//
// A stage's x and y registers are held from its forward until its backward: their register count
// is the stash, the activations the stage may hold, and the schedule is nothing but that count
// and who goes first when both are ready (OneFlow's observation):
//  - GPipe: stash m, forwards first. Every stage runs all its forwards, then all backwards.
//  - 1F1B: stash min(S - j, m) on stage j of S (all stages, virtual ones included; one more when a
//    device holds several), backwards first. Stage j runs S - j - 1 forwards ahead, then
//    alternates; the back-pressure of the full stash is what makes it alternate. Among the ready
//    firings of one kind the one ready first goes first (the graph's rule for equal priorities):
//    with several stages per device, that is interleaved 1F1B.
// A rank's actors share one stream (they never fire at the same time: one device), unless
// streams() maps stages to several. Backwards of a stage run in micro-batch order, so
// gradients accumulate as a serial loop over the micro-batches does: the same floats, bit for bit.
// The bubble of equal stages is (p - 1) / (v m + p - 1) for p ranks with v stages each; measured by
// pipeline_step_stats, and exactly by deterministic_scheduler::run_rounds on pipeline_step's graph.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/actor/actor_graph.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/sbp/layout.hpp>

namespace flexpar {

class timeline;
class pipeline;

/// Which micro-batches a stage may hold, and which firing goes first.
enum class pipeline_schedule : unsigned char {
  gpipe,        ///< stash m per stage, forwards first
  one_f_one_b,  ///< stash min(S - j, m) on stage j of S, backwards first (interleaved when a rank holds several)
};

/// "gpipe" or "1f1b".
std::string_view name_of(pipeline_schedule s) noexcept;

/// The stash register count of stage `stage` of `stages` (virtual stages counted) under `s` with
/// `micro_batches`, the stage sharing its device (rank and stream) with `stages_per_stream` stages
/// in all: GPipe m; 1F1B min(stages - stage, m), and one more when interleaved (stages_per_stream
/// > 1: with stages - stage the interleaved order stalls its device every few micro-batches on a
/// unit-time machine, with one more it ends within p - 1 units of the theory's time;
/// tests/actor/test_pipeline_inproc.cpp).
/// @throws usage_error unless 0 <= stage < stages, micro_batches >= 1 and stages_per_stream >= 1.
std::size_t stash_registers(pipeline_schedule s, int stages, int stage, int micro_batches, int stages_per_stream = 1);

/// The bubble fraction of a step of equal stages, p ranks each holding v stages, m micro-batches:
/// (p - 1) / (v m + p - 1).
double pipeline_bubble_theory(int ranks, int stages_per_rank, int micro_batches) noexcept;

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

/// Where a stage runs when it spans several ranks (a sub-mesh: tensor or data parallelism inside
/// the stage), and how the activation it takes and the one it gives lie on it. The stage's forward,
/// on each rank of the mesh, gets this rank's box of its input (sbp::shard_box under `input`) and
/// writes its box of the output (under `output`); its backward gets its box of the output's gradient
/// and writes the input's gradient over its input box. Along a mesh axis where the input is
/// broadcast, that gradient is this rank's part only (the gradient of B is P): the pipeline adds the
/// parts of the replicas. Between stages the pipeline moves each piece from the rank that holds it
/// to the ranks that need it (the intersections of the boxes: a placement change on actor edges).
struct stage_mesh {
  std::vector<int> ranks;     ///< the mesh's ranks of the pipeline's communicator, row-major
  std::vector<int> shape;     ///< the mesh's extents (their product: ranks.size()); empty: {ranks.size()}
  sbp::nd_parallel input{};   ///< the input's layout, one entry per mesh axis, split or broadcast
  sbp::nd_parallel output{};  ///< the output's layout, one entry per mesh axis, split or broadcast
};

/// Measurements of one step on one stage of this rank.
struct pipeline_stage_stats {
  int stage = -1;                    ///< the stage
  std::size_t stash_registers = 0;   ///< its register count (the bound)
  std::size_t peak_activations = 0;  ///< most micro-batches stashed at once (measured on the registers)
  double busy_seconds = 0;           ///< time inside its forward/backward/loss bodies
};

/// Measurements of one step on this rank.
struct pipeline_step_stats {
  std::vector<pipeline_stage_stats> stages;  ///< this rank's stages, in stage order (empty: none here)
  double busy_seconds = 0;                   ///< time inside the bodies of this rank's stages
  double step_seconds = 0;                   ///< time of the whole step on this rank
  std::vector<float> losses;                 ///< per micro-batch losses (on the last stage's ranks: of this rank's box)
};

/// Builds a pipeline: every rank describes every stage and its rank; each keeps its own.
class pipeline_builder {
 public:
  /// A pipeline over `comm` (which must outlive the pipeline built).
  explicit pipeline_builder(communicator& comm) : comm_(&comm) {}
  /// Adds the next stage, placed on `rank` (a rank may hold several stages).
  pipeline_builder& stage(int rank, pipeline_stage s) { return stage(stage_mesh{{rank}, {1}, {}, {}}, std::move(s)); }
  /// Adds the next stage, on a mesh of ranks (3-D parallelism: each stage tensor- or data-parallel
  /// inside). The meshes of two stages are the same ranks or share none.
  pipeline_builder& stage(stage_mesh mesh, pipeline_stage s) {
    meshes_.push_back(std::move(mesh));
    stages_.push_back(std::move(s));
    return *this;
  }
  /// The logical shape of the activation from stage j to stage j + 1, for j = 0 ... S - 2 (per
  /// micro-batch); needed where a stage spans several ranks (the boxes of its pieces).
  pipeline_builder& activation_shapes(std::vector<sbp::shape_t> shapes) {
    shapes_ = std::move(shapes);
    return *this;
  }
  /// Every rank of a stage's mesh must fire the stage's forwards and backwards in the same order
  /// when the bodies call collectives over the mesh. With `on` (the default where a mesh has several
  /// ranks), the pipeline fixes that order at build: it runs the step's graph on the unit-time machine
  /// (deterministic_scheduler::run_rounds) and each stream then follows the order found there.
  pipeline_builder& fixed_order(bool on = true) {
    fixed_order_ = on ? 1 : 0;
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
  /// Overrides the schedule's stash counts: one per stage, each >= 1 (any counts run; smaller ones
  /// hold less and stall more). Who goes first stays the schedule's.
  pipeline_builder& stash_registers(std::vector<std::size_t> per_stage) {
    stash_ = std::move(per_stage);
    return *this;
  }
  /// The register count of the gradient outputs (>= 1; default 2), and so of the receiving end of
  /// each gradient edge.
  pipeline_builder& gradient_registers(std::size_t n) {
    gradient_registers_ = n;
    return *this;
  }
  /// The stream of each stage (>= 0): the forwards and backwards of stages on one stream never fire
  /// at the same time (one device); stages on different streams of one rank may (several devices
  /// per process). Default: the stage's rank (a rank's stages take turns).
  pipeline_builder& streams(std::vector<int> per_stage) {
    streams_ = std::move(per_stage);
    return *this;
  }
  /// Worker threads of the pipeline's actor_executor (default 1: a stream fires one body at a time);
  /// run_step's caller drives the cross-rank edges meanwhile and fires nothing, so that no message
  /// waits behind a stage's body.
  pipeline_builder& threads(std::size_t n) {
    threads_ = n;
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
  /// Collective over the communicator. @throws usage_error if a stage's rank is out of range, m < 1,
  /// there is no stage, a stash count is 0 or their number is not the stages', a mesh is malformed
  /// (extents, a rank twice, a layout with another number of axes or partial, two meshes that
  /// overlap without being equal), activation shapes are missing or do not fit the layouts, or the
  /// input/loss functions are missing where they are called.
  pipeline build();

 private:
  friend class pipeline;
  communicator* comm_;
  std::vector<stage_mesh> meshes_;
  std::vector<pipeline_stage> stages_;
  std::vector<sbp::shape_t> shapes_;
  int fixed_order_ = -1;  // -1: where a mesh has several ranks
  int micro_batches_ = 1;
  pipeline_schedule schedule_ = pipeline_schedule::one_f_one_b;
  std::vector<std::size_t> stash_;
  std::size_t gradient_registers_ = 2;
  std::vector<int> streams_;
  std::size_t threads_ = 1;
  std::function<void(int, std::vector<float>&)> input_;
  std::function<float(int, const std::vector<float>&, std::vector<float>&)> loss_;
  timeline* trace_ = nullptr;
};

/// One step's actor graph (built by pipeline::make_step): run it with any driver, then read stats().
class pipeline_step {
 public:
  /// Moves the step (its graph and counters).
  pipeline_step(pipeline_step&&) noexcept;
  /// Moves the step (its graph and counters).
  pipeline_step& operator=(pipeline_step&&) noexcept;
  /// Frees the step's graph.
  ~pipeline_step();
  /// The graph: F_j and B_j for every stage j (labels "<stage label>.forward" / ".backward").
  [[nodiscard]] actor_graph& graph() noexcept;
  /// This rank's measurements; call it after the graph ran (step_seconds is left 0: the driver's).
  [[nodiscard]] pipeline_step_stats stats() const;

 private:
  friend class pipeline;
  struct state;
  explicit pipeline_step(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

/// A built pipeline: run_step() runs one mini-batch (m micro-batches) through every stage.
class pipeline {
 public:
  /// Moves the pipeline (its executor, bus and stages).
  pipeline(pipeline&&) noexcept;
  /// Moves the pipeline (its executor, bus and stages).
  pipeline& operator=(pipeline&&) noexcept;
  /// Joins the pipeline's executor.
  ~pipeline();

  /// Collective over the stage ranks (ranks without a stage return at once): builds the step's
  /// actor graph and runs it on the pipeline's executor. Weight gradients accumulate in the stages'
  /// backwards; apply them after the step.
  /// @throws timeout_error at `until`, naming every unfinished actor and what it waits for;
  ///         actor_failure / peer_failure as actor_executor::run. After a failed step the pipeline
  ///         refuses to run again (usage_error): its edges' messages may be half delivered.
  pipeline_step_stats run_step(deadline until);
  /// The actor graph of the next step, for another driver (deterministic_scheduler: run_random,
  /// run_rounds). Steps run one after another: make the next after this one ran on every rank.
  pipeline_step make_step();

  /// This rank's first stage, or -1 (a rank may hold several: local_stages()).
  [[nodiscard]] int stage() const noexcept;
  /// This rank's stages, in order.
  [[nodiscard]] const std::vector<int>& local_stages() const noexcept;
  /// Number of stages.
  [[nodiscard]] int stages() const noexcept;
  /// Number of micro-batches per step.
  [[nodiscard]] int micro_batches() const noexcept;
  /// The schedule.
  [[nodiscard]] pipeline_schedule schedule() const noexcept;
  /// The stash register count of every stage.
  [[nodiscard]] const std::vector<std::size_t>& stash() const noexcept;

 private:
  friend class pipeline_builder;
  friend class pipeline_step;
  struct state;
  explicit pipeline(pipeline_builder& b);
  std::unique_ptr<state> s_;
};

}  // namespace flexpar
