// flexpar/collective/allreduce_ring.hpp — ring allreduce = ring reduce-scatter + ring allgather.
//
//   step 1 (reduce-scatter): p-1 steps; rank r ends with block r reduced over every rank
//   step 2 (allgather):      p-1 steps; every reduced block goes once around the ring
// Bandwidth-optimal (each rank sends 2(p-1)/p of the buffer), latency 2(p-1) messages: the choice
// for large buffers on a flat network.
#pragma once

#include <flexpar/collective/allgather_ring.hpp>
#include <flexpar/collective/reduce_scatter_ring.hpp>

namespace flexpar {

/// 2(p-1) steps, 2(p-1)/p * bytes on the wire, (p-1)/p * bytes reduced.
constexpr cost allreduce_ring_cost(int p, double bytes) noexcept {
  return reduce_scatter_ring_cost(p, bytes) + allgather_ring_cost(p, bytes);
}

namespace detail {

template <element T>
void allreduce_ring(communicator& comm, std::span<T> data, reduce_op op) {
  call c = begin_call(comm);
  const block_layout layout = block_layout::even(data.size(), c.size);
  ring_reduce_scatter(c, data, layout, op);  // step 1
  ring_allgather(c, data, layout);           // step 2
}

}  // namespace detail
}  // namespace flexpar
