// flexpar/collective/reduce_scatter_ring.hpp — reduce-scatter around a ring, chunked and pipelined.
//
// p ranks, the buffer cut into p blocks (block_layout: even, or the counts of the `v` variant).
// Step s = 0 .. p-2: rank r sends block (r-s-1) to r+1 and receives block (r-s-2) from r-1, which it
// reduces into its own copy. After p-1 steps rank r holds block r reduced over all ranks.
// Each block travels as chunks of pipeline_chunk_bytes; a chunk is forwarded as soon as it has been
// reduced, and the receives of step s+1 are posted before step s is reduced, so that sending,
// receiving and reducing overlap.
//
// result_at::front: the last step (p-2) leaves my reduced block at the start of the buffer instead of
// at its own place, so that the caller can keep it as the whole buffer without moving it:
//   - when the front does not overlap my block (displ(rank) >= count(rank), e.g. every rank but 0 of an
//     even split) and my block is 4 chunks or more, the peer's partials land straight in the front,
//     and front (op)= my block: no more memory traffic than the in-place ring. A front chunk's
//     receive is posted once the sends that read it have completed (every block but mine is sent,
//     at step 0 or as a forward);
//   - otherwise the last step reduces "landed chunk (op) my block" into the front, forward, in pieces
//     no longer than the distance between the two (the front lies at or before my block, so no element
//     of my block is overwritten before it is read), each front chunk after the sends that read it.
// Rank 0's front is its block: that is the in-place ring.
#pragma once

#include <algorithm>
#include <utility>
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

/// dst = a (op) b where dst lies at or before a and may overlap it (dst.data() <= a.data()): forward, in
/// pieces no longer than the distance between them, so that no piece writes an element of `a` it has
/// yet to read; a short distance (under 4 KiB) reduces in place and then moves the result forward.
template <element T>
void reduce_forward(std::span<T> dst, std::span<T> a, std::span<const T> b, reduce_op op) {
  const auto gap = static_cast<std::size_t>(a.data() - dst.data());
  if (gap == 0) {
    reduce_into(a, b, op);
  } else if (gap >= dst.size()) {
    reduce_into(dst, std::span<const T>(a), b, op);
  } else if (gap * sizeof(T) < 4096) {
    reduce_into(a, b, op);
    std::copy(a.begin(), a.end(), dst.begin());  // dst before a: a forward copy is an overlap-safe move
  } else {
    for (std::size_t at = 0; at < dst.size(); at += gap) {
      const std::size_t m = std::min(gap, dst.size() - at);
      reduce_into(dst.subspan(at, m), std::span<const T>(a.subspan(at, m)), b.subspan(at, m), op);
    }
  }
}

/// In place over `data` (layout.total elements): afterwards layout.of(data, rank) is reduced over
/// all ranks (result_at::my_block), or data[0, layout.count(rank)) is (result_at::front); the other
/// elements hold partial results. Uses the call's tag.
template <element T>
void ring_reduce_scatter(call& c, std::span<T> data, const block_layout& layout, reduce_op op,
                         result_at where = result_at::my_block) {
  const int p = c.size, r = c.rank;
  if (p == 1) return;  // block 0 is the front
  const int next = modulo(r + 1, p), prev = modulo(r - 1, p);
  auto send_block = [&](int step) { return modulo(r - step - 1, p); };
  auto recv_block = [&](int step) { return modulo(r - step - 2, p); };

  // Two landing areas: step s receives into area s % 2 while step s-1's area is being reduced.
  const std::size_t area = layout.max_count();
  auto landing = scratch<T>(2 * area);
  auto landing_of = [&](int step) { return std::span<T>(landing.get() + (step % 2) * area, area); };
  std::vector<request> sends;
  std::vector<std::pair<std::size_t, std::size_t>> sent_from;  // [begin, end) of data each send reads
  auto send = [&](std::span<T> piece) {
    sends.push_back(c.t.isend(next, c.tag, bytes_of(piece)));
    const auto begin = static_cast<std::size_t>(piece.data() - data.data());
    sent_from.emplace_back(begin, begin + piece.size());
  };
  // true once the sends that read [begin, end) have completed (waiting for them when `block`)
  auto sent = [&](std::size_t begin, std::size_t end, bool block) {
    for (std::size_t i = 0; i < sends.size(); ++i)
      if (sent_from[i].first < end && begin < sent_from[i].second) {
        if (block)
          sends[i].wait(c.until);
        else if (!sends[i].test())
          return false;
      }
    return true;
  };
  // The last step lands the peer's partials straight in the front when the front does not overlap
  // my block: each front chunk's receive is posted once the sends that read it have completed.
  // Only for a block of several chunks: the first front chunk waits for its send, which for a block of
  // one chunk turns the two transfers of p = 2 into one after the other (measured: 1.7x at 1 MiB).
  const bool land_in_front = where == result_at::front && layout.displ(r) >= layout.count(r) &&
                             pipeline_chunks<T>(layout.count(r)).count() >= 4;
  std::vector<request> receives[2];
  auto post_receives = [&](int step) {
    if (land_in_front && step == p - 2) return;  // posted chunk by chunk in the last step
    const chunking chunks = pipeline_chunks<T>(layout.count(recv_block(step)));
    for (std::size_t k = 0; k < chunks.count(); ++k)
      receives[step % 2].push_back(c.irecv(prev, writable_bytes_of(chunks.of(landing_of(step), k))));
  };

  // step 0: push my copy of block r-1 to the next rank, once it has posted its receives (when
  // needs_clear_to_send: the data then never arrives before its receive)
  const std::span<T> first = layout.of(data, send_block(0));
  const chunking first_chunks = pipeline_chunks<T>(first.size());
  clear_to_send ready(c, prev, next, needs_clear_to_send(c, first_message_bytes<T>(layout)));
  post_receives(0);
  ready.granted();
  for (std::size_t k = 0; k < first_chunks.count(); ++k) send(first_chunks.of(first, k));

  for (int step = 0; step < p - 1; ++step) {
    const bool forward = step + 1 < p - 1;
    if (forward) post_receives(step + 1);
    // receive block r-s-2 chunk by chunk, reduce it into mine, pass it on (it is block r-(s+1)-1)
    const std::span<T> mine = layout.of(data, recv_block(step));
    const chunking chunks = pipeline_chunks<T>(mine.size());
    const std::span<T> landed = landing_of(step);
    const bool to_front = !forward && where == result_at::front;  // the last step, result at the front
    const std::span<T> front = data.first(mine.size());
    auto range_of = [&](std::span<T> piece) {
      const auto begin = static_cast<std::size_t>(piece.data() - data.data());
      return std::pair{begin, begin + piece.size()};
    };
    std::size_t posted_in_front = 0;
    auto post_in_front = [&](std::size_t at_least) {  // front chunks whose sends are done; chunk at_least waits
      for (; posted_in_front < chunks.count(); ++posted_in_front) {
        const std::span<T> into = chunks.of(front, posted_in_front);
        const auto [begin, end] = range_of(into);
        if (!sent(begin, end, posted_in_front <= at_least)) break;
        receives[step % 2].push_back(c.irecv(prev, writable_bytes_of(into)));
      }
    };
    for (std::size_t k = 0; k < chunks.count(); ++k) {
      if (to_front && land_in_front) {  // front (op)= my block, the peer's partial having landed there
        post_in_front(k);
        receives[step % 2][k].wait(c.until);
        reduce_into(chunks.of(front, k), std::span<const T>(chunks.of(mine, k)), op);
        continue;
      }
      receives[step % 2][k].wait(c.until);
      if (to_front) {  // front = landed (op) my block, forward over the overlap
        const std::span<T> out = chunks.of(front, k);
        const auto [begin, end] = range_of(out);
        sent(begin, end, true);
        reduce_forward(out, chunks.of(mine, k), std::span<const T>(chunks.of(landed, k)), op);
      } else {
        reduce_into(chunks.of(mine, k), std::span<const T>(chunks.of(landed, k)), op);
      }
      if (forward) send(chunks.of(mine, k));
    }
    receives[step % 2].clear();
  }
  wait_all(sends, c.until);
}

}  // namespace detail
}  // namespace flexpar
