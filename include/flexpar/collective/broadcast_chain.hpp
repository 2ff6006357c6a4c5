// flexpar/collective/broadcast_chain.hpp — pipelined chain broadcast.
//
// Virtual rank v = (rank - root) mod p; v receives every chunk from v-1 and forwards it to v+1 as
// soon as it has arrived. With k chunks the last rank has the data after p-1+k-1 chunk times:
// bandwidth-optimal for large buffers, at a latency of p-1 hops.
#pragma once

#include <vector>

#include <flexpar/collective/context.hpp>

namespace flexpar {

/// (p-1) + (chunks-1) steps of one chunk each.
constexpr cost broadcast_chain_cost(int p, double bytes) noexcept {
  if (p <= 1) return {};
  const double chunk = static_cast<double>(pipeline_chunk_bytes);
  const double chunks = bytes > chunk ? detail::ceil_div(bytes, chunk) : 1.0;
  const double per_step = bytes < chunk ? bytes : chunk;
  return {(p - 1) + chunks - 1, ((p - 1) + chunks - 1) * per_step, 0.0};
}

namespace detail {

template <element T>
void chain_broadcast(call& c, std::span<T> data, int root) {
  const int p = c.size;
  if (p == 1) return;
  const int v = modulo(c.rank - root, p);
  const int prev = modulo(c.rank - 1, p), next = modulo(c.rank + 1, p);
  const chunking chunks = pipeline_chunks<T>(data.size());
  std::vector<request> receives, sends;
  if (v > 0)
    for (std::size_t k = 0; k < chunks.count(); ++k)
      receives.push_back(c.irecv(prev, writable_bytes_of(chunks.of(data, k))));
  for (std::size_t k = 0; k < chunks.count(); ++k) {
    if (v > 0) receives[k].wait(c.until);
    if (v < p - 1) sends.push_back(c.t.isend(next, c.tag, bytes_of(chunks.of(data, k))));
  }
  wait_all(sends, c.until);
}

}  // namespace detail
}  // namespace flexpar
