// flexpar/search/simulator.hpp — the execution simulator: a training step of a graph under a strategy
// as a task graph, simulated event by event on per-device compute queues and per-device link queues.
//
// Tasks, in program order (the order a device stream would issue them):
//   1. forward phase, ops in topological order: for each input edge a boxing task (the producer's
//      output SBP -> the SBP the consumer needs, priced by sbp::plan + the collectives' cost
//      functions on the shared mesh, or a placement change by shard-box intersection when the two
//      ops have different meshes), then the op's forward computation; for an op nobody reads (the
//      model's output) the boxing the loss needs: P(sum) -> S(0) and its gradient S(0) -> B
//   2. backward phase, ops in reverse: the op's backward computation (2x forward FLOPs), a boxing task
//      per input edge carrying the input gradient back (dual SBPs: S -> S, B -> P(sum), P(sum) -> B),
//      and the allreduce of the weight gradient over the weight's replicas (ring, or hierarchical when
//      the group spans nodes evenly and that is cheaper: the algorithm is chosen per op and network)
//   3. update phase: each op's optimizer update on its weight shard (memory bound)
// A task occupies a set of queues (the compute queues of its op's devices, or the link queues of the
// devices a transfer touches); it starts when its dependencies have ended and every queue it needs is
// free (queues are FIFO in program order), and holds them for its duration. The step time is the last
// end. A strategy whose parameters (weights, gradients, two optimizer states) do not fit a device's
// memory has step time +infinity.
//
// Delta simulation (FlexFlow's, which its open-source version lost): the task graph's shape does not
// depend on the strategy, only durations and queues do. change(op, config) recomputes the costs of the
// tasks that touch that op and reschedules from its first task in program order, restoring every
// queue's state at that point from its history; the answer is bit-for-bit the full simulation's.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <flexpar/search/cluster.hpp>
#include <flexpar/search/config.hpp>
#include <flexpar/search/graph.hpp>
#include <flexpar/search/profile.hpp>

namespace flexpar::search {

/// The algorithm a weight-gradient allreduce runs.
enum class allreduce_algorithm : unsigned char { none, ring, hierarchical };

/// "none", "ring", "hierarchical".
std::string_view name_of(allreduce_algorithm a) noexcept;

/// What the simulator predicts for one op under the current strategy.
struct op_times {
  double forward = 0;                                         ///< forward computation, seconds
  double backward = 0;                                        ///< backward computation
  double input_boxing = 0;                                    ///< forward boxing of all its inputs
  double gradient_allreduce = 0;                              ///< allreduce of its weight gradient
  allreduce_algorithm algorithm = allreduce_algorithm::none;  ///< chosen for that allreduce
};

/// The simulator of a graph on a cluster (header comment). Not thread-safe; copyable is not needed.
class simulator {
 public:
  /// Builds the task skeleton of `g` (copied) on `c` (copied). @throws usage_error for a bad cluster.
  simulator(graph g, cluster c);
  /// The same, with op times measured by `profile` (copied) where it has them, the FLOP model elsewhere.
  simulator(graph g, cluster c, kernel_profile profile);
  ~simulator();
  /// Moves the simulator (its task graph and state).
  simulator(simulator&&) noexcept;
  /// Moves the simulator (its task graph and state).
  simulator& operator=(simulator&&) noexcept;

  /// Full simulation: every task cost computed from scratch, every task scheduled. Returns the step time
  /// (seconds). @throws usage_error when `s` has the wrong size or an invalid config (naming the op).
  double simulate(const strategy& s);
  /// Delta simulation: op `i` gets config `c`, the rest keeps the current strategy. Returns the step time.
  /// @pre simulate() was called. @throws usage_error for an invalid config.
  double change(std::size_t i, const soap_config& c);

  /// The step time of the current strategy.
  [[nodiscard]] double step_time() const noexcept;
  /// The current strategy.
  [[nodiscard]] const strategy& current() const noexcept;
  /// The predicted times of op i under the current strategy.
  [[nodiscard]] op_times times_of(std::size_t i) const;
  /// The graph.
  [[nodiscard]] const graph& model() const noexcept;
  /// The cluster.
  [[nodiscard]] const cluster& machine() const noexcept;
  /// Tasks in the task graph.
  [[nodiscard]] std::size_t task_count() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace flexpar::search
