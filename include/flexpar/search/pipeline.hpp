// flexpar/search/pipeline.hpp — pipeline stages and micro-batches in the strategy search: a timed
// model of the actor pipeline's schedule, the 3-D strategy of a layered model (stage cuts, each
// stage's data x tensor mesh, micro-batches), its step time and memory from per-stage costs, and a
// Metropolis-Hastings search over it.
//
// simulate_pipeline runs the rules the actor pipeline runs by (actor/pipeline.hpp), with durations:
// stage j fires its forwards and its backwards in micro-batch order, one firing at a time per device;
// a forward needs the previous stage's forward of that micro-batch (plus the transfer), and a free
// stash register (K_j of them, freed when the backward of that micro-batch ends); a backward needs
// its own forward and the next stage's backward (plus the transfer), and the previous stage to have
// taken all but `gradient_registers - 1` of this stage's earlier gradients; a device that is idle
// fires what is ready, backwards first under 1F1B and forwards first under GPipe (equal kinds: the
// one ready first). With unit durations it is the unit-time machine of the actor runtime: GPipe and
// 1F1B take exactly 2 (m + p - 1) units (tests/search/test_search_pipeline.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <flexpar/actor/pipeline.hpp>
#include <flexpar/search/cluster.hpp>
#include <flexpar/search/graph.hpp>

namespace flexpar::search {

/// One stage's work per micro-batch, seconds.
struct stage_timing {
  double forward = 0;   ///< its forward (on the last stage: with the loss)
  double backward = 0;  ///< its backward (recomputation included where the stage recomputes)
  double send = 0;      ///< moving its output to the next stage, and the gradient back (each way)
  int device = -1;      ///< the device (rank group) it runs on; -1: its own (stage index)
};

/// What simulate_pipeline found.
struct pipeline_timeline {
  double seconds = 0;                   ///< from the first forward to the last backward's end
  std::vector<double> busy;             ///< per device: seconds inside firings
  std::vector<std::size_t> peak_stash;  ///< per stage: most micro-batches held at once
  double bubble = 0;                    ///< 1 - mean(busy) / seconds
};

/// The step of `stages` with `micro_batches` under `schedule` (header comment). `stash` overrides the
/// schedule's register counts (flexpar::stash_registers, one per stage, each >= 1).
/// @throws usage_error for no stage, m < 1, a count of 0, or a stash vector of another size.
pipeline_timeline simulate_pipeline(const std::vector<stage_timing>& stages, int micro_batches,
                                    pipeline_schedule schedule, std::vector<std::size_t> stash = {},
                                    int gradient_registers = 2);

/// A 3-D strategy for a model of `blocks` equal blocks between a first part (embeddings) and a last
/// part (output layer, loss): `blocks.size()` pipeline stages (stage s holds blocks[s] consecutive
/// blocks; the first part joins stage 0, the last part the last stage), each on its own mesh of
/// data x tensor ranks; the mini-batch cut into micro_batches.
struct pipeline_strategy {
  int data = 1;                                                 ///< data-parallel ranks per stage
  int tensor = 1;                                               ///< tensor-parallel ranks per stage
  int micro_batches = 1;                                        ///< micro-batches per step
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;  ///< GPipe or 1F1B
  std::vector<int> blocks;                                      ///< blocks per stage, each >= 1

  /// Stages.
  [[nodiscard]] int stages() const noexcept { return static_cast<int>(blocks.size()); }
  /// Ranks it needs: stages x data x tensor.
  [[nodiscard]] int ranks() const noexcept { return stages() * data * tensor; }
  /// "P x D x T, m = .., 1f1b, blocks 1+2".
  [[nodiscard]] std::string describe() const;
};

/// Where a stage sits and what it holds, for a cost function.
struct stage_shape {
  int stages = 1;         ///< stages of the strategy
  int data = 1;           ///< its mesh: data-parallel ranks
  int tensor = 1;         ///< its mesh: tensor-parallel ranks
  int micro_batches = 1;  ///< micro-batches per step (the micro-batch is the mini-batch / this)
  int blocks = 0;         ///< blocks it holds
  bool first = false;     ///< holds the first part
  bool last = false;      ///< holds the last part
};

/// A stage's costs, from measurement or a model.
struct stage_cost {
  double forward = 0;                  ///< seconds per micro-batch
  double backward = 0;                 ///< seconds per micro-batch
  double step = 0;                     ///< seconds once per step: gradient synchronization and the optimizer
  double send = 0;                     ///< seconds to move its output activation to the next stage
  std::uint64_t weight_bytes = 0;      ///< per device: weights, gradients and optimizer states
  std::uint64_t activation_bytes = 0;  ///< per device and stashed micro-batch
};

/// The costs of a stage (collective-free: called on one rank, with the same answers on every rank).
using stage_cost_fn = std::function<stage_cost(const stage_shape&)>;

/// The predicted step of a strategy.
struct pipeline_estimate {
  double seconds = 0;             ///< the step: the pipeline plus the slowest stage's per-step work
  double pipeline_seconds = 0;    ///< forwards and backwards (simulate_pipeline)
  double bubble = 0;              ///< the pipeline's bubble fraction
  std::uint64_t peak_memory = 0;  ///< the most bytes on one device: weights + stash x activations
  bool fits = true;               ///< peak_memory <= the limit
};

/// The step of `s` from `cost` (each stage's stash: flexpar::stash_registers); +infinity seconds when a
/// device's memory exceeds `memory_limit` (bytes; 0: no limit).
/// @throws usage_error for a strategy with no stage, a stage of no block, or m < 1.
pipeline_estimate estimate(const pipeline_strategy& s, const stage_cost_fn& cost, std::uint64_t memory_limit = 0);

/// Stage costs from the op-graph simulator, for clusters that cannot be measured here: a stage is the
/// graph `stage_graph(shape)` (its micro-batch's ops) on data x tensor consecutive devices of `whole`
/// (one node when they fit in one, else whole nodes), its per-op configs found by mcmc_search over
/// those devices (`iterations` steps: per-op SBP inside the stage), and its costs the simulator's per-op
/// times of that strategy: forward = sum of forward + input boxing, backward = backward + backward
/// boxing, per step = gradient synchronization + update (a stage's gradient synchronization is not
/// overlapped with the pipeline's drain; a single stage is priced by its simulated step, which overlaps
/// it with the backward); the activation (`activation_bytes(shape)` per
/// device) moves on the inter-node link when a stage fills whole nodes, else on the intra-node link.
/// A stage whose strategy does not fit a device's memory costs +infinity. Memoized per shape.
stage_cost_fn simulated_stage_costs(std::function<graph(const stage_shape&)> stage_graph, cluster whole,
                                    std::function<double(const stage_shape&)> activation_bytes, std::uint64_t seed,
                                    std::size_t iterations = 300);

/// `blocks` blocks cut into `stages` stages as evenly as they go, the first stages taking one more.
std::vector<int> balanced_blocks(int blocks, int stages);

/// What a search may propose for a model: its size and the divisibility rules of its executor.
struct pipeline_space {
  int ranks = 1;                                     ///< ranks to use (all of them)
  int blocks = 1;                                    ///< blocks of the model
  int batch = 1;                                     ///< sequences per mini-batch
  int heads = 1;                                     ///< attention heads (tensor must divide them)
  int vocabulary = 1;                                ///< output classes (tensor must divide them)
  std::vector<int> micro_batch_choices{1, 2, 4, 8};  ///< m values to try (m must divide the batch / data)
  /// True when `s` runs here: ranks match, stages <= blocks, data x m divides the batch, tensor divides
  /// heads and vocabulary, every stage holds a block or more; one stage has m = 1 and 1F1B (no schedule).
  [[nodiscard]] bool valid(const pipeline_strategy& s) const;
  /// Data, tensor and pipeline parallelism alone, where valid (pipeline: blocks balanced, the largest m).
  [[nodiscard]] std::vector<pipeline_strategy> pure() const;
};

/// Metropolis-Hastings over pipeline_strategy (seeded; the generator is owned): proposals change the
/// number of stages (its blocks rebalanced; m drawn too when a pipeline begins), move one block across a
/// stage boundary, change the data x tensor split, m, or the schedule; a faster proposal is taken, a slower one with
/// probability exp(-beta (t_new - t) / t). Starts from the best pure strategy; returns the best seen.
class pipeline_search {
 public:
  /// A search of `space` with costs `cost`, seeded.
  pipeline_search(pipeline_space space, stage_cost_fn cost, std::uint64_t seed, std::uint64_t memory_limit = 0);
  /// Runs `proposals` proposals; returns the best strategy seen (valid, finite when any is).
  pipeline_strategy run(int proposals, double beta = 5.0);
  /// The estimate of `s` (search::estimate with this search's costs and memory limit).
  pipeline_estimate estimate_of(const pipeline_strategy& s);

 private:
  pipeline_strategy propose(const pipeline_strategy& s);
  pipeline_space space_;
  stage_cost_fn cost_;
  std::mt19937_64 rng_;
  std::uint64_t memory_limit_ = 0;
};

/// The strategy as JSON: {"data", "tensor", "micro_batches", "schedule", "blocks": [...]}.
std::string to_json(const pipeline_strategy& s);
/// Parses what to_json(pipeline_strategy) writes. @throws usage_error naming what is missing or wrong.
pipeline_strategy pipeline_strategy_from_json(const std::string& text);

}  // namespace flexpar::search
