// flexpar/collective/automatic.hpp — what `algorithm::automatic` picks, and the machine it picks for.
//
// The machine (cost_params) of a communicator is either configured with set_cost_params(), or
// measured once, at the first collective that needs it, by a short ping-pong between ranks 0 and 1
// (alpha, beta) and by timing the reduction kernel and memcpy on rank 0 (gamma, copy_beta); rank 0's
// numbers are broadcast so that every rank evaluates the same costs and picks the same algorithm.
#pragma once

#include <array>
#include <chrono>
#include <cstring>
#include <vector>

#include <flexpar/collective/algorithm.hpp>
#include <flexpar/collective/allgather_recursive_doubling.hpp>
#include <flexpar/collective/allgather_ring.hpp>
#include <flexpar/collective/allreduce_halving_doubling.hpp>
#include <flexpar/collective/allreduce_hierarchical.hpp>
#include <flexpar/collective/allreduce_ring.hpp>
#include <flexpar/collective/allreduce_shared_memory.hpp>
#include <flexpar/collective/broadcast_binomial_tree.hpp>
#include <flexpar/collective/broadcast_chain.hpp>
#include <flexpar/collective/exchange_shared_memory.hpp>
#include <flexpar/collective/reduce_binomial_tree.hpp>
#include <flexpar/collective/reduce_chain.hpp>

namespace flexpar {

/// Sets the machine that `automatic` evaluates costs with on `comm` (no measurement then).
/// Call it on every rank, with the same values: it may build the communicator's collective context
/// (which is collective), and ranks with different machines could pick different algorithms.
inline void set_cost_params(communicator& comm, const cost_params& machine) {
  detail::collective_context& ctx = detail::context_of(comm);
  ctx.machine = machine;
  ctx.last_allreduce_bytes = ~std::size_t{0};  // choices made on the old machine no longer hold
}

namespace detail {

inline double seconds_since(clock::time_point start) {
  return std::chrono::duration<double>(clock::now() - start).count();
}

/// Collective: the measurement described at the top of this file.
inline cost_params measure_machine(communicator& comm) {
  call c = begin_call(comm);
  cost_params m;
  if (c.size > 1 && c.rank <= 1) {
    const int peer = 1 - c.rank;
    auto ping_pong = [&](std::span<std::byte> message, int iterations) {
      const auto start = clock::now();
      for (int i = 0; i < iterations; ++i) {
        if (c.rank == 0) {
          c.t.send(peer, c.tag, message, c.until);
          c.t.recv(peer, c.tag, message, c.until);
        } else {
          c.t.recv(peer, c.tag, message, c.until);
          c.t.send(peer, c.tag, message, c.until);
        }
      }
      return seconds_since(start) / (2.0 * iterations);
    };
    std::vector<std::byte> message(std::size_t{1} << 20);
    ping_pong(std::span(message).first(8), 5);  // warm-up
    m.alpha = ping_pong(std::span(message).first(8), 40);
    ping_pong(message, 1);
    const double large = ping_pong(message, 4);
    m.beta = std::max(1e-12, (large - m.alpha) / static_cast<double>(message.size()));
  }
  if (c.rank == 0) {
    std::vector<float> a(std::size_t{1} << 18, 1.0f), b(a.size(), 2.0f);
    double best_reduce = 1e9, best_copy = 1e9;
    for (int i = 0; i < 3; ++i) {
      auto start = clock::now();
      reduce_into(std::span(a), std::span<const float>(b), reduce_op::sum);
      best_reduce = std::min(best_reduce, seconds_since(start));
      start = clock::now();
      std::memcpy(b.data(), a.data(), a.size() * sizeof(float));
      best_copy = std::min(best_copy, seconds_since(start));
    }
    const double bytes = static_cast<double>(a.size() * sizeof(float));
    m.gamma = std::max(1e-12, best_reduce / bytes);
    m.copy_beta = std::max(1e-12, best_copy / bytes);
  }
  std::array<double, 5> values{m.alpha, m.beta, m.gamma, m.shm_alpha, m.copy_beta};
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
algorithm cheapest_allreduce(communicator& comm, std::size_t bytes);
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

namespace detail {
inline algorithm cheapest_allreduce(communicator& comm, std::size_t bytes) {
  const int p = comm.size();
  const cost_params& m = machine_of(comm);
  const double b = static_cast<double>(bytes);
  const node_topology& topo = comm.topology();
  struct candidate {
    algorithm a;
    double seconds;
  };
  std::vector<candidate> candidates{{algorithm::ring, allreduce_ring_cost(p, b).seconds(m)},
                                    {algorithm::halving_doubling, allreduce_halving_doubling_cost(p, b).seconds(m)}};
  if (topo.node_count() == 1)
    candidates.push_back({algorithm::shared_memory, allreduce_shared_memory_cost(p, b).seconds(m)});
  if (topo.node_count() > 1 && topo.uniform() && topo.local_size() > 1)
    candidates.push_back(
        {algorithm::hierarchical, allreduce_hierarchical_cost(topo.local_size(), topo.node_count(), b, m).seconds(m)});
  std::stable_sort(candidates.begin(), candidates.end(), [](auto& x, auto& y) { return x.seconds < y.seconds; });
  for (const candidate& c : candidates) {
    if (c.a == algorithm::shared_memory && !detail::shared_memory_of(comm)) continue;
    return c.a;
  }
  return algorithm::ring;
}
}  // namespace detail

/// allgather(_v): on one node shared_memory whenever the segment exists, otherwise ring or
/// recursive_doubling, by cost. The one-node rule is not a cost comparison: the cost model's
/// ping-pong alpha prices the transport's steps cheaper than the segment's hand-offs, while the
/// segment measured as fast or faster at every size (doc/collectives.md has the table). Collective
/// (it may create the segment); every rank gets the same answer.
inline algorithm choose_allgather(communicator& comm, std::size_t bytes) {
  const int p = comm.size();
  if (p == 1) return algorithm::ring;
  if (detail::one_node_segment(comm)) return algorithm::shared_memory;
  const cost_params& m = machine_of(comm);
  const double b = static_cast<double>(bytes);
  return allgather_recursive_doubling_cost(p, b).seconds(m) < allgather_ring_cost(p, b).seconds(m)
             ? algorithm::recursive_doubling
             : algorithm::ring;
}

/// alltoall: on one node shared_memory whenever the segment exists (the rule of choose_allgather,
/// for the same reason), pairwise otherwise; collective, like choose_allgather.
inline algorithm choose_alltoall(communicator& comm, std::size_t) {
  if (comm.size() == 1) return algorithm::pairwise;
  return detail::one_node_segment(comm) ? algorithm::shared_memory : algorithm::pairwise;
}

/// reduce_scatter(_v): on one node shared_memory whenever the segment exists (as for allgather: each
/// rank reads its buffer once and reduces its block out of the peers' round buffers in cache, where
/// the ring copies every block through the transport and reduces it on arrival), ring otherwise;
/// collective, like choose_allgather.
inline algorithm choose_reduce_scatter(communicator& comm, std::size_t) {
  if (comm.size() == 1) return algorithm::ring;
  return detail::one_node_segment(comm) ? algorithm::shared_memory : algorithm::ring;
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
