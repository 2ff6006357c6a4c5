// flexpar/collective/allreduce_hierarchical.hpp — two-level allreduce over the node topology.
//
// L ranks per node, N nodes (the communicator's node_topology: detected, or a configured mesh via
// config::ranks_per_node / run_in_process(..., ranks_per_node), so that it runs on one machine).
//   step 1: intra-node reduce-scatter: local rank l holds block l reduced over its node
//   step 2: inter-node allreduce of block l among the N ranks with local rank l (one per node)
//   step 3: intra-node allgather of the L reduced blocks
// Steps 1 and 3 go through the node's shared-memory segment (exchange_shared_memory.hpp: one copy
// into the segment and one out, no message) when every rank of the node mapped it, and around the
// transport's ring otherwise (a configured mesh whose "nodes" share no segment, /dev/shm missing).
// Only 1/L of the buffer crosses the slow inter-node links, and each inter-node group is N ranks,
// not N*L: the choice when nodes hold several ranks and links between nodes are the bottleneck.
#pragma once

#include <string>

#include <flexpar/collective/allgather_ring.hpp>
#include <flexpar/collective/allreduce_halving_doubling.hpp>
#include <flexpar/collective/allreduce_ring.hpp>
#include <flexpar/collective/exchange_shared_memory.hpp>
#include <flexpar/collective/reduce_scatter_ring.hpp>

namespace flexpar {

/// L ranks per node, N nodes: the intra-node reduce-scatter and allgather (through the node's
/// segment, or around the transport's ring inside the node when `node_segment` is false) plus the
/// cheaper inter-node allreduce of bytes/L.
constexpr cost allreduce_hierarchical_cost(int ranks_per_node, int nodes, double bytes, const cost_params& m,
                                           bool node_segment = true) noexcept {
  const double block = bytes / ranks_per_node;
  const cost ring = allreduce_ring_cost(nodes, block);
  const cost hd = allreduce_halving_doubling_cost(nodes, block);
  const cost across = ring.seconds(m) <= hd.seconds(m) ? ring : hd;
  if (node_segment)
    return reduce_scatter_shared_memory_cost(ranks_per_node, bytes) + across +
           allgather_shared_memory_cost(ranks_per_node, bytes);
  return within_node(reduce_scatter_ring_cost(ranks_per_node, bytes)) + across +
         within_node(allgather_ring_cost(ranks_per_node, bytes));
}

namespace detail {

/// The node and across-node sub-communicators of `comm`, split once and kept in its context.
inline collective_context& hierarchy_of(communicator& comm) {
  collective_context& ctx = context_of(comm);
  if (!ctx.node) {
    if (!comm.topology().uniform())
      throw error_on<usage_error>(comm.rank(), "allreduce(hierarchical)",
                                  "nodes hold different numbers of ranks; the hierarchical algorithm needs the same "
                                  "number on every node (use ring or halving_doubling)");
    ctx.node = std::make_unique<communicator>(comm.split_node());
    ctx.across = std::make_unique<communicator>(comm.split_across_nodes());
  }
  return ctx;
}

template <element T>
void allreduce_hierarchical(communicator& comm, std::span<T> data, reduce_op op) {
  collective_context& ctx = hierarchy_of(comm);
  communicator& node = *ctx.node;
  communicator& across = *ctx.across;
  const block_layout layout = block_layout::even(data.size(), node.size());
  const bool segment = one_node_segment(node) != nullptr;  // the same answer on every rank of the node
  const std::span<T> mine = layout.of(data, node.rank());
  if (segment) {  // step 1
    shared_memory_reduce_scatter(node, std::span<const T>(data), layout, mine, op);
  } else {
    call local = begin_call(node);
    ring_reduce_scatter(local, data, layout, op);
  }
  const double block_bytes = static_cast<double>(mine.size() * sizeof(T));
  const cost_params m = ctx.machine.value_or(cost_params{});
  if (allreduce_ring_cost(across.size(), block_bytes).seconds(m) <=
      allreduce_halving_doubling_cost(across.size(), block_bytes).seconds(m))  // step 2
    allreduce_ring(across, mine, op);
  else
    allreduce_halving_doubling(across, mine, op);
  if (segment) {  // step 3
    shared_memory_allgather(node, data, layout);
  } else {
    call local = begin_call(node);
    ring_allgather(local, data, layout);
  }
}

}  // namespace detail
}  // namespace flexpar
