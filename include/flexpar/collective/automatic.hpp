// flexpar/collective/automatic.hpp — what `algorithm::automatic` picks, and the machine it picks for.
//
// Every collective's choice compares the cost functions of the algorithms that can run on the
// communicator (collective/cost.hpp) on one machine, cost_params. That machine is either configured
// with set_cost_params(), or fitted once, at the first collective that needs it, from timed calls of
// the algorithms themselves (measure_machine): the transport ring's allreduce and allgather at three
// sizes give alpha and beta, the shared-memory allreduce and allgather of my node at four sizes give
// shm_alpha and copy_beta, each pair by least squares on the relative error of its cost function;
// gamma is the reduction kernel timed alone. Each rank times its own calls, the slowest rank's
// median counts, and rank 0's fit is broadcast, so that every rank evaluates the same costs and picks
// the same algorithm. No size, rank count or machine is special-cased: an algorithm wins where its
// cost function, on the fitted machine, is the smallest.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include <flexpar/collective/algorithm.hpp>
#include <flexpar/collective/allgather_recursive_doubling.hpp>
#include <flexpar/collective/allgather_ring.hpp>
#include <flexpar/collective/allreduce_halving_doubling.hpp>
#include <flexpar/collective/allreduce_hierarchical.hpp>
#include <flexpar/collective/allreduce_ring.hpp>
#include <flexpar/collective/allreduce_shared_memory.hpp>
#include <flexpar/collective/alltoall_pairwise.hpp>
#include <flexpar/collective/barrier_dissemination.hpp>
#include <flexpar/collective/broadcast_binomial_tree.hpp>
#include <flexpar/collective/broadcast_chain.hpp>
#include <flexpar/collective/exchange_shared_memory.hpp>
#include <flexpar/collective/reduce_binomial_tree.hpp>
#include <flexpar/collective/reduce_chain.hpp>
#include <flexpar/collective/reduce_scatter_ring.hpp>

namespace flexpar {

/// Sets the machine that `automatic` evaluates costs with on `comm` (no measurement then).
/// Call it on every rank, with the same values: it may build the communicator's collective context
/// (which is collective), and ranks with different machines could pick different algorithms.
inline void set_cost_params(communicator& comm, const cost_params& machine) {
  detail::collective_context& ctx = detail::context_of(comm);
  ctx.machine = machine;
  ctx.last_allreduce_bytes = ~std::size_t{0};  // choices made on the old machine no longer hold
}

/// The machine that best explains the timed calls: alpha, beta from `transport` (steps, wire bytes),
/// shm_alpha, copy_beta from `node` (flag hand-offs, copied bytes), with `gamma` given (the
/// reduction bytes of every sample are priced with it). Channels without samples keep `fallback`'s.
inline cost_params fit_machine(std::span<const timed_cost> transport, std::span<const timed_cost> node, double gamma,
                               const cost_params& fallback = {}) {
  cost_params m = fallback;
  m.gamma = gamma;
  auto reduce_part = [gamma](const cost& c) { return c.reduce_bytes * gamma; };
  constexpr double min_alpha = 1e-8, min_beta = 1e-13;  // 10 ns per step, 10 TB/s
  if (!transport.empty())
    std::tie(m.alpha, m.beta) = fit_channel(
        transport, [](const cost& c) { return c.steps; }, [](const cost& c) { return c.wire_bytes; }, reduce_part,
        min_alpha, min_beta);
  if (!node.empty())
    std::tie(m.shm_alpha, m.copy_beta) = fit_channel(
        node, [](const cost& c) { return c.shm_steps; }, [](const cost& c) { return c.copy_bytes; }, reduce_part,
        min_alpha, min_beta);
  return m;
}

namespace detail {

inline double seconds_since(clock::time_point start) {
  return std::chrono::duration<double>(clock::now() - start).count();
}

/// Median seconds of `run()` on this rank over `reps` calls after one warm-up, the ranks of `comm`
/// starting each call together (a barrier before it).
template <class Run>
double median_call_seconds(communicator& comm, int reps, Run&& run) {
  run();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    {
      call c = begin_call(comm);
      dissemination_barrier(c);
    }
    const auto start = clock::now();
    run();
    times.push_back(seconds_since(start));
  }
  std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
  return times[static_cast<std::size_t>(reps / 2)];
}

/// Sizes (bytes of the whole buffer) that the fit times: one latency-bound, the rest bandwidth-bound.
inline constexpr std::array<std::size_t, 3> fit_transport_bytes{256, std::size_t{64} << 10, std::size_t{1} << 20};
inline constexpr std::array<std::size_t, 4> fit_node_bytes{256, std::size_t{64} << 10, std::size_t{1} << 20,
                                                           std::size_t{4} << 20};
inline constexpr int fit_repetitions = 3;

/// Collective: the measurement described at the top of this file.
inline cost_params measure_machine(communicator& comm) {
  const int p = comm.size();
  std::vector<float> buffer;
  auto floats = [&](std::size_t bytes, int ranks) {  // whole blocks of `ranks` elements, at least one each
    const std::size_t n = std::max<std::size_t>(static_cast<std::size_t>(ranks), bytes / sizeof(float)) /
                          static_cast<std::size_t>(ranks) * static_cast<std::size_t>(ranks);
    buffer.assign(n, 1.0f);
    return std::span<float>(buffer);
  };

  // gamma: the reduction kernel alone, 1 MiB, best of three
  std::vector<float> a(std::size_t{1} << 18, 1.0f), b(a.size(), 2.0f);
  double best_reduce = 1e9;
  for (int i = 0; i < 3; ++i) {
    const auto start = clock::now();
    reduce_into(std::span(a), std::span<const float>(b), reduce_op::sum);
    best_reduce = std::min(best_reduce, seconds_since(start));
  }

  // the transport: ring allreduce and ring allgather over the whole communicator
  std::vector<timed_cost> transport, node;
  std::vector<double> seconds;  // every sample's time on this rank, in one order on every rank
  for (const std::size_t bytes : fit_transport_bytes) {
    std::span<float> data = floats(bytes, p);
    const double size = static_cast<double>(data.size_bytes());
    seconds.push_back(median_call_seconds(comm, fit_repetitions, [&] { allreduce_ring(comm, data, reduce_op::max); }));
    transport.push_back({allreduce_ring_cost(p, size), 0});
    const block_layout layout = block_layout::even(data.size(), p);
    seconds.push_back(median_call_seconds(comm, fit_repetitions, [&] {
      call c = begin_call(comm);
      ring_allgather(c, data, layout);
    }));
    transport.push_back({allgather_ring_cost(p, size), 0});
  }

  // my node's segment: shared-memory allreduce and allgather among the ranks of my node
  const node_topology& topo = comm.topology();
  communicator* local = nullptr;
  if (topo.node_count() == 1)
    local = &comm;
  else if (topo.uniform() && topo.local_size() > 1)
    local = hierarchy_of(comm).node.get();
  // every rank takes the node samples or none does (a node whose segment failed opts every node out)
  std::array<std::int32_t, 1> segment{local != nullptr && one_node_segment(*local) != nullptr ? 1 : 0};
  if (topo.node_count() > 1) allreduce_ring(comm, std::span<std::int32_t>(segment), reduce_op::min);
  if (segment[0] != 0) {
    const int l = local->size();
    for (const std::size_t bytes : fit_node_bytes) {
      std::span<float> data = floats(bytes, l);
      const double size = static_cast<double>(data.size_bytes());
      seconds.push_back(
          median_call_seconds(*local, fit_repetitions, [&] { allreduce_shared_memory(*local, data, reduce_op::max); }));
      node.push_back({allreduce_shared_memory_cost(l, size), 0});
      const block_layout layout = block_layout::even(data.size(), l);
      seconds.push_back(
          median_call_seconds(*local, fit_repetitions, [&] { shared_memory_allgather(*local, data, layout); }));
      node.push_back({allgather_shared_memory_cost(l, size), 0});
    }
  }
  seconds.push_back(best_reduce);

  // the slowest rank's times (every rank has the same samples: the same node sizes on every node,
  // a segment on every node or on none, as one_node_segment answers), fitted on rank 0
  allreduce_ring(comm, std::span<double>(seconds), reduce_op::max);
  const double gamma = std::max(1e-13, seconds.back() / static_cast<double>(a.size() * sizeof(float)));
  std::size_t k = 0;
  for (timed_cost& s : transport) s.seconds = seconds[k++];
  for (timed_cost& s : node) s.seconds = seconds[k++];
  const cost_params m = fit_machine(transport, node, gamma);
  std::array<double, 5> values{m.alpha, m.beta, m.gamma, m.shm_alpha, m.copy_beta};
  call c = begin_call(comm);
  binomial_tree_broadcast(c, std::span<double>(values), 0);
  return {values[0], values[1], values[2], values[3], values[4]};
}

}  // namespace detail

/// The machine `automatic` uses on `comm`: configured, or measured on first call (collective then).
inline const cost_params& machine_of(communicator& comm) {
  detail::collective_context& ctx = detail::context_of(comm);
  if (!ctx.machine) ctx.machine = comm.size() > 1 ? detail::measure_machine(comm) : cost_params{};
  return *ctx.machine;
}

namespace detail {
algorithm cheapest_allreduce(communicator& comm, std::size_t bytes, double gathered_seconds = 0);
}

/// The algorithm `allreduce(..., automatic)` runs for `bytes` on `comm`. Collective (it may measure
/// the machine and create the shared-memory segment); every rank gets the same answer.
inline algorithm choose_allreduce(communicator& comm, std::size_t bytes) {
  const int p = comm.size();
  if (p == 1) return algorithm::ring;
  detail::collective_context& ctx = detail::context_of(comm);
  if (ctx.last_allreduce_bytes == bytes) return static_cast<algorithm>(ctx.last_allreduce_choice);
  const algorithm chosen = detail::cheapest_allreduce(comm, bytes);
  ctx.last_allreduce_bytes = bytes;
  ctx.last_allreduce_choice = static_cast<int>(chosen);
  return chosen;
}

/// The algorithm of one allreduce over several tensors that lie apart (the engine's fused run) of
/// `bytes` together: as choose_allreduce, but the algorithms that need them in one buffer pay for
/// the copies into it and out of it (2 × bytes at the machine's copy rate), which shared_memory,
/// reading and writing the tensors where they lie (allreduce_shared_memory_pieces), does not.
/// Collective, like choose_allreduce; every rank gets the same answer.
inline algorithm choose_fused_allreduce(communicator& comm, std::size_t bytes) {
  if (comm.size() == 1) return algorithm::ring;
  return detail::cheapest_allreduce(comm, bytes, 2.0 * static_cast<double>(bytes) * machine_of(comm).copy_beta);
}

namespace detail {

/// An algorithm that can run, and its predicted seconds.
struct candidate {
  algorithm a;
  double seconds;
};

/// The first of the cheapest (ties go to the earlier candidate).
inline algorithm cheapest(std::span<const candidate> candidates) {
  const auto best = std::min_element(candidates.begin(), candidates.end(),
                                     [](const candidate& x, const candidate& y) { return x.seconds < y.seconds; });
  return best->a;
}

/// `gathered_seconds`: what the algorithms other than shared_memory pay on top (the copies of tensors
/// that lie apart into one buffer and back: choose_fused_allreduce).
inline algorithm cheapest_allreduce(communicator& comm, std::size_t bytes, double gathered_seconds) {
  const int p = comm.size();
  const cost_params& m = machine_of(comm);
  const double b = static_cast<double>(bytes);
  const node_topology& topo = comm.topology();
  std::vector<candidate> candidates{
      {algorithm::ring, allreduce_ring_cost(p, b).seconds(m) + gathered_seconds},
      {algorithm::halving_doubling, allreduce_halving_doubling_cost(p, b).seconds(m) + gathered_seconds}};
  if (one_node_segment(comm) != nullptr)
    candidates.push_back({algorithm::shared_memory, allreduce_shared_memory_cost(p, b).seconds(m)});
  if (topo.node_count() > 1 && topo.uniform() && topo.local_size() > 1) {
    const bool segment = one_node_segment(*hierarchy_of(comm).node) != nullptr;
    candidates.push_back({algorithm::hierarchical,
                          allreduce_hierarchical_cost(topo.local_size(), topo.node_count(), b, m, segment).seconds(m) +
                              gathered_seconds});
  }
  return cheapest(candidates);
}

}  // namespace detail

/// allgather(_v): ring, recursive_doubling, or (all ranks on one node) shared_memory, by cost.
/// Collective (it may measure the machine and create the segment); every rank gets the same answer.
inline algorithm choose_allgather(communicator& comm, std::size_t bytes) {
  const int p = comm.size();
  if (p == 1) return algorithm::ring;
  const cost_params& m = machine_of(comm);
  const double b = static_cast<double>(bytes);
  std::vector<detail::candidate> candidates{
      {algorithm::ring, allgather_ring_cost(p, b).seconds(m)},
      {algorithm::recursive_doubling, allgather_recursive_doubling_cost(p, b).seconds(m)}};
  if (detail::one_node_segment(comm) != nullptr)
    candidates.push_back({algorithm::shared_memory, allgather_shared_memory_cost(p, b).seconds(m)});
  return detail::cheapest(candidates);
}

/// alltoall of a `bytes` buffer per rank, `in_place` or not: pairwise or (all ranks on one node)
/// shared_memory, by cost; collective, like choose_allgather.
inline algorithm choose_alltoall(communicator& comm, std::size_t bytes, bool in_place = false) {
  const int p = comm.size();
  if (p == 1) return algorithm::pairwise;
  const cost_params& m = machine_of(comm);
  const double b = static_cast<double>(bytes);
  std::vector<detail::candidate> candidates{{algorithm::pairwise, alltoall_pairwise_cost(p, b, in_place).seconds(m)}};
  if (detail::one_node_segment(comm) != nullptr)
    candidates.push_back({algorithm::shared_memory, alltoall_shared_memory_cost(p, b).seconds(m)});
  return detail::cheapest(candidates);
}

/// reduce_scatter(_v): ring or (all ranks on one node) shared_memory, by cost; collective, like
/// choose_allgather.
inline algorithm choose_reduce_scatter(communicator& comm, std::size_t bytes) {
  const int p = comm.size();
  if (p == 1) return algorithm::ring;
  const cost_params& m = machine_of(comm);
  const double b = static_cast<double>(bytes);
  std::vector<detail::candidate> candidates{{algorithm::ring, reduce_scatter_ring_cost(p, b).seconds(m)}};
  if (detail::one_node_segment(comm) != nullptr)
    candidates.push_back({algorithm::shared_memory, reduce_scatter_shared_memory_cost(p, b).seconds(m)});
  return detail::cheapest(candidates);
}

/// broadcast: chain or binomial_tree, by cost.
inline algorithm choose_broadcast(communicator& comm, std::size_t bytes) {
  const int p = comm.size();
  if (p <= 2) return algorithm::chain;
  const cost_params& m = machine_of(comm);
  const double b = static_cast<double>(bytes);
  return broadcast_binomial_tree_cost(p, b).seconds(m) < broadcast_chain_cost(p, b).seconds(m)
             ? algorithm::binomial_tree
             : algorithm::chain;
}

/// reduce: chain or binomial_tree, by cost.
inline algorithm choose_reduce(communicator& comm, std::size_t bytes) {
  const int p = comm.size();
  if (p <= 2) return algorithm::chain;
  const cost_params& m = machine_of(comm);
  const double b = static_cast<double>(bytes);
  return reduce_binomial_tree_cost(p, b).seconds(m) < reduce_chain_cost(p, b).seconds(m) ? algorithm::binomial_tree
                                                                                         : algorithm::chain;
}

}  // namespace flexpar
