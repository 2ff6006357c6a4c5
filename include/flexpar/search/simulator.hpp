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
//      and the synchronization of the weight gradient over the weight's replicas: the cheapest of the
//      algorithms the sync_policy allows (ring; hierarchical when the group spans nodes evenly; with
//      a looser policy bytegrad, 1-bit Adam, decentralized): chosen per op and network
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

#include <flexpar/collective/algorithm.hpp>
#include <flexpar/search/cluster.hpp>
#include <flexpar/search/config.hpp>
#include <flexpar/search/graph.hpp>
#include <flexpar/search/profile.hpp>

namespace flexpar::search {

/// How a weight gradient is synchronized over its replicas is a flexpar::algorithm (collective/algorithm.hpp, the one
/// naming of the collectives and the relaxations). The simulator models seven of them, and picks the cheapest one its
/// sync_policy allows, per op and network (BAGUA's open problem):
///   none                         nothing to synchronize (the weight is not replicated)
///   ring                         f32 ring allreduce (exact)
///   hierarchical                 f32 intra-node reduce-scatter, inter-node allreduce, intra-node allgather (exact)
///   bytegrad                     min-max uint8 compressed centralized average (lossy; replicas identical)
///   onebit_adam                  1-bit compressed momentum with error feedback (owns its optimizer: Adam)
///   decentralized                f32 weights averaged with one peer per step (shift_one peers; replicas differ)
///   low_precision_decentralized  uint8 weight differences with the ring neighbours (replicas differ)
/// Their names are name_of(algorithm)'s.

/// Which gradient synchronizations the simulator may choose; each policy allows those of the ones before.
enum class sync_policy : unsigned char {
  exact,       ///< ring or hierarchical allreduce only: the optimizer's exact semantics (the default)
  compressed,  ///< also bytegrad: the same optimizer on an 8-bit quantized average, replicas stay identical
  relaxed,     ///< also 1-bit Adam and the decentralized ones: they change the optimizer's semantics
};

/// "exact", "compressed", "relaxed".
std::string_view name_of(sync_policy p) noexcept;

/// The policy named "exact", "compressed" or "relaxed". @throws usage_error for another name (listing them).
sync_policy sync_policy_from(std::string_view name);

/// The least permissive policy that allows `a` (none, ring, hierarchical: exact; bytegrad: compressed; the rest:
/// relaxed).
sync_policy policy_of(algorithm a) noexcept;

/// True when `a` changes the optimizer's semantics (it is not an allreduce of the gradients, exact or
/// quantized): 1-bit Adam and the decentralized algorithms.
inline bool changes_optimizer(algorithm a) noexcept { return policy_of(a) == sync_policy::relaxed; }

/// A replica group of a weight-gradient synchronization.
struct sync_group {
  int ranks = 1;     ///< ranks holding a replica
  int nodes = 1;     ///< nodes they are on
  int per_node = 0;  ///< ranks on each node when every node has the same number, else 0
};

/// Seconds to synchronize a weight gradient of `bytes` (f32) over `grp` with `a` on `c` (+infinity when `a`
/// does not apply: hierarchical on one node or an uneven group, or one the simulator does not model). Wire steps and
/// bytes follow the algorithm's pattern (the relax headers' wire_bytes()) on `c.params(grp.nodes > 1)`; local passes
/// (sums, averages) go through memory (gamma); encodes and decodes at `c.compression`'s rates:
///   ring          allreduce_ring_cost(p, M)
///   hierarchical  allreduce_hierarchical_cost(per_node, nodes, M)
///   bytegrad      2(p-1) steps, 2(p-1)/p E8(M) wire, M reduced; encode (1 + 1/p) M, decode 2M (min-max)
///   onebit_adam   2(p-1) steps, 2(p-1)/p E1(M) wire, M reduced; encode (1 + 1/p) M, decode 2M (1-bit),
///                 its Adam passes over M (compression.adam_update)
///   decentralized                1 step, M wire, M averaged (shift_one peers)
///   low_precision_decentralized  q steps, q E8(M) wire (q = 1 for p = 2, else 2 neighbours), (2q + 2) M
///                                local passes; encode M, decode (q + 1) M (min-max)
/// and for every relaxation 4M of memory traffic to fuse the tensors into one bucket and back,
/// with p = grp.ranks, M = bytes. 0 for p = 1.
double sync_seconds(algorithm a, const sync_group& grp, double bytes, const cluster& c);

/// What the simulator predicts for one op under the current strategy.
struct op_times {
  double forward = 0;             ///< forward computation, seconds
  double backward = 0;            ///< backward computation
  double input_boxing = 0;        ///< forward boxing of all its inputs
  double gradient_allreduce = 0;  ///< allreduce of its weight gradient
  double backward_boxing = 0;     ///< backward boxing of its input gradients, and the loss's boxing of its output
  double update = 0;              ///< the optimizer update of its weight shard
  flexpar::algorithm algorithm = flexpar::algorithm::none;  ///< chosen for that allreduce
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
  /// The gradient synchronizations the simulator may choose from the next simulate() on (default
  /// sync_policy::exact, so results do not change unless asked). @post change() needs a simulate() first.
  void set_policy(sync_policy p) noexcept;
  /// The policy in force.
  [[nodiscard]] sync_policy policy() const noexcept;
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
