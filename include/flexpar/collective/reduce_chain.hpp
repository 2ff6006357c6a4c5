// flexpar/collective/reduce_chain.hpp — pipelined chain reduce.
//
// Virtual rank v = (rank - root) mod p; data flows from v = p-1 down to the root. Rank v receives a
// chunk from v+1, reduces it into its own contribution and passes the chunk on to v-1 at once, so
// the chain's links and reductions all work at the same time on consecutive chunks.
#pragma once

#include <vector>

#include <flexpar/collective/broadcast_chain.hpp>
#include <flexpar/collective/reduce_kernel.hpp>

namespace flexpar {

/// The chain broadcast's cost, plus one reduction of the buffer.
constexpr cost reduce_chain_cost(int p, double bytes) noexcept {
  cost c = broadcast_chain_cost(p, bytes);
  c.reduce_bytes = p > 1 ? bytes : 0.0;
  return c;
}

namespace detail {

/// `acc` holds my contribution on entry; at the root it holds the reduction afterwards (on other
/// ranks it holds a partial result).
template <element T>
void chain_reduce(call& c, std::span<T> acc, reduce_op op, int root) {
  const int p = c.size;
  if (p == 1) return;
  const int v = modulo(c.rank - root, p);
  const int from = modulo(c.rank + 1, p), to = modulo(c.rank - 1, p);
  const chunking chunks = pipeline_chunks<T>(acc.size());
  std::vector<request> receives, sends;
  std::unique_ptr<T[]> landing;
  if (v < p - 1) {
    landing = scratch<T>(acc.size());
    const std::span<T> area(landing.get(), acc.size());
    for (std::size_t k = 0; k < chunks.count(); ++k)
      receives.push_back(c.irecv(from, writable_bytes_of(chunks.of(area, k))));
  }
  for (std::size_t k = 0; k < chunks.count(); ++k) {
    if (v < p - 1) {
      receives[k].wait(c.until);
      reduce_into(chunks.of(acc, k), std::span<const T>(chunks.of(std::span<T>(landing.get(), acc.size()), k)), op);
    }
    if (v > 0) sends.push_back(c.t.isend(to, c.tag, bytes_of(chunks.of(acc, k))));
  }
  wait_all(sends, c.until);
}

}  // namespace detail
}  // namespace flexpar
