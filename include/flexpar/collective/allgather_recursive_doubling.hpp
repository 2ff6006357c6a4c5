// flexpar/collective/allgather_recursive_doubling.hpp — allgather by recursive doubling, any p.
//
// p' = the largest power of two <= p; ranks p' .. p-1 are extras, each paired with rank r - p'.
//   step 1 (fold):     every extra rank sends its block to its partner.
//   step 2 (doubling): log2(p') rounds; in round k, rank r and r ^ 2^k swap every block they hold
//                      (the blocks of their 2^k-rank group and of those ranks' extras).
//   step 3 (unfold):   each partner sends the extra rank every block but its own.
// Blocks travel as one message each, in ascending block order on both sides, so counts may differ
// per rank (the `v` variant) and zero-sized blocks cost a zero-length message.
#pragma once

#include <bit>
#include <vector>

#include <flexpar/collective/context.hpp>

namespace flexpar {

/// log2(p') steps (+2 when p is not a power of two), (p-1)/p of the buffer on the wire (+ all of it
/// for the unfold).
constexpr cost allgather_recursive_doubling_cost(int p, double bytes) noexcept {
  const int p2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
  const bool fold = p != p2;
  return {detail::floor_log2(p2) + (fold ? 2.0 : 0.0), (p - 1) * bytes / p + (fold ? bytes : 0.0), 0.0};
}

namespace detail {

template <element T>
void recursive_doubling_allgather(call& c, std::span<T> data, const block_layout& layout) {
  const int p = c.size, r = c.rank;
  if (p == 1) return;
  const int p2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
  const int extra = p - p2;
  std::vector<request> pending;
  auto send_block = [&](int peer, int block) {
    pending.push_back(c.t.isend(peer, c.tag, bytes_of(layout.of(data, block))));
  };
  auto recv_block = [&](int peer, int block) {
    pending.push_back(c.irecv(peer, writable_bytes_of(layout.of(data, block))));
  };
  auto finish = [&] {
    wait_all(pending, c.until);
    pending.clear();
  };

  if (r >= p2) {  // an extra rank: steps 1 and 3 only
    send_block(r - p2, r);
    for (int block = 0; block < p; ++block)
      if (block != r) recv_block(r - p2, block);
    finish();
    return;
  }
  // step 1: take my extra's block
  if (r < extra) {
    recv_block(r + p2, r + p2);
    finish();
  }
  // step 2: doubling; a group of virtual ranks carries the blocks of its ranks and their extras
  auto for_each_block_of_group = [&](int first, int ranks, auto&& f) {
    for (int v = first; v < first + ranks; ++v) {
      f(v);
      if (v < extra) f(v + p2);
    }
  };
  for (int mask = 1; mask < p2; mask *= 2) {
    const int partner = r ^ mask;
    for_each_block_of_group(r & ~(mask - 1), mask, [&](int block) { send_block(partner, block); });
    for_each_block_of_group(partner & ~(mask - 1), mask, [&](int block) { recv_block(partner, block); });
    finish();
  }
  // step 3: everything but its own block back to my extra
  if (r < extra) {
    for (int block = 0; block < p; ++block)
      if (block != r + p2) send_block(r + p2, block);
    finish();
  }
}

}  // namespace detail
}  // namespace flexpar
