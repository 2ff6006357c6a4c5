// flexpar/collective/allgather_ring.hpp — allgather around a ring, chunked and pipelined.
//
// Step s = 0 .. p-2: rank r sends block (r-s) to r+1 and receives block (r-s-1) from r-1 straight
// into its place. Every receive is posted up front; a chunk is forwarded as soon as it arrives.
#pragma once

#include <vector>

#include <flexpar/collective/context.hpp>

namespace flexpar {

/// Cost of the ring allgather of `bytes` in total over p ranks: p-1 steps of bytes/p each.
constexpr cost allgather_ring_cost(int p, double bytes) noexcept {
  return {static_cast<double>(p - 1), (p - 1) * (bytes / p), 0.0};
}

namespace detail {

/// In place over `data`: block `rank` of `layout` is mine on entry; every block is everyone's after.
template <element T>
void ring_allgather(call& c, std::span<T> data, const block_layout& layout) {
  const int p = c.size, r = c.rank;
  if (p == 1) return;
  const int next = modulo(r + 1, p), prev = modulo(r - 1, p);
  auto recv_block = [&](int step) { return modulo(r - step - 1, p); };

  clear_to_send ready(c, prev, next, needs_clear_to_send(c, first_message_bytes<T>(layout)));
  std::vector<std::vector<request>> receives(static_cast<std::size_t>(p - 1));
  for (int step = 0; step < p - 1; ++step) {
    const std::span<T> block = layout.of(data, recv_block(step));
    const chunking chunks = pipeline_chunks<T>(block.size());
    for (std::size_t k = 0; k < chunks.count(); ++k)
      receives[static_cast<std::size_t>(step)].push_back(c.irecv(prev, writable_bytes_of(chunks.of(block, k))));
  }
  ready.granted();  // next has posted its receives
  std::vector<request> sends;
  // step 0: my own block
  const std::span<T> mine = layout.of(data, r);
  const chunking my_chunks = pipeline_chunks<T>(mine.size());
  for (std::size_t k = 0; k < my_chunks.count(); ++k)
    sends.push_back(c.t.isend(next, c.tag, bytes_of(my_chunks.of(mine, k))));
  // steps 1 ..: forward what arrived in the step before
  for (int step = 0; step < p - 1; ++step) {
    const std::span<T> block = layout.of(data, recv_block(step));
    const chunking chunks = pipeline_chunks<T>(block.size());
    for (std::size_t k = 0; k < chunks.count(); ++k) {
      receives[static_cast<std::size_t>(step)][k].wait(c.until);
      if (step + 1 < p - 1) sends.push_back(c.t.isend(next, c.tag, bytes_of(chunks.of(block, k))));
    }
  }
  wait_all(sends, c.until);
}

}  // namespace detail
}  // namespace flexpar
