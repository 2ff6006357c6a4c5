// flexpar/collective/reduce_scatter_ring.hpp — reduce-scatter around a ring, chunked and pipelined.
//
// p ranks, the buffer cut into p blocks (block_layout: even, or the counts of the `v` variant).
// Step s = 0 .. p-2: rank r sends block (r-s-1) to r+1 and receives block (r-s-2) from r-1, which it
// reduces into its own copy. After p-1 steps rank r holds block r reduced over all ranks.
// Each block travels as chunks of pipeline_chunk_bytes; a chunk is forwarded as soon as it has been
// reduced, and the receives of step s+1 are posted before step s is reduced, so that sending,
// receiving and reducing overlap.
#pragma once

#include <vector>

#include <flexpar/collective/context.hpp>
#include <flexpar/collective/reduce_kernel.hpp>

namespace flexpar {

/// Cost of the ring reduce-scatter of `bytes` in total over p ranks: p-1 steps of bytes/p each.
constexpr cost reduce_scatter_ring_cost(int p, double bytes) noexcept {
  const double share = bytes / p;
  return {static_cast<double>(p - 1), (p - 1) * share, (p - 1) * share};
}

namespace detail {

/// In place over `data` (layout.total elements): afterwards layout.of(data, rank) is reduced over
/// all ranks; the other blocks hold partial results. Uses the call's tag.
template <element T>
void ring_reduce_scatter(call& c, std::span<T> data, const block_layout& layout, reduce_op op) {
  const int p = c.size, r = c.rank;
  if (p == 1) return;
  const int next = modulo(r + 1, p), prev = modulo(r - 1, p);
  auto send_block = [&](int step) { return modulo(r - step - 1, p); };
  auto recv_block = [&](int step) { return modulo(r - step - 2, p); };

  // Two landing areas: step s receives into area s % 2 while step s-1's area is being reduced.
  const std::size_t area = layout.max_count();
  auto landing = scratch<T>(2 * area);
  auto landing_of = [&](int step) { return std::span<T>(landing.get() + (step % 2) * area, area); };
  std::vector<request> sends;
  std::vector<request> receives[2];
  auto post_receives = [&](int step) {
    const chunking chunks = pipeline_chunks<T>(layout.count(recv_block(step)));
    for (std::size_t k = 0; k < chunks.count(); ++k)
      receives[step % 2].push_back(c.t.irecv(prev, c.tag, writable_bytes_of(chunks.of(landing_of(step), k))));
  };

  // step 0: push my copy of block r-1 to the next rank
  const std::span<T> first = layout.of(data, send_block(0));
  const chunking first_chunks = pipeline_chunks<T>(first.size());
  for (std::size_t k = 0; k < first_chunks.count(); ++k)
    sends.push_back(c.t.isend(next, c.tag, bytes_of(first_chunks.of(first, k))));
  post_receives(0);

  for (int step = 0; step < p - 1; ++step) {
    const bool forward = step + 1 < p - 1;
    if (forward) post_receives(step + 1);
    // receive block r-s-2 chunk by chunk, reduce it into mine, pass it on (it is block r-(s+1)-1)
    const std::span<T> mine = layout.of(data, recv_block(step));
    const chunking chunks = pipeline_chunks<T>(mine.size());
    const std::span<T> landed = landing_of(step);
    for (std::size_t k = 0; k < chunks.count(); ++k) {
      receives[step % 2][k].wait(c.until);
      reduce_into(chunks.of(mine, k), std::span<const T>(chunks.of(landed, k)), op);
      if (forward) sends.push_back(c.t.isend(next, c.tag, bytes_of(chunks.of(mine, k))));
    }
    receives[step % 2].clear();
  }
  wait_all(sends, c.until);
}

}  // namespace detail
}  // namespace flexpar
