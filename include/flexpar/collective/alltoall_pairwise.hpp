// flexpar/collective/alltoall_pairwise.hpp — alltoall by pairwise exchange.
//
// Step 0: my own block is copied locally. Step s = 1 .. p-1: send block (r+s) to rank r+s and receive
// block (r-s) from rank r-s. One partner per step keeps every rank sending and receiving exactly one
// message at a time (no incast).
#pragma once

#include <algorithm>

#include <flexpar/collective/context.hpp>

namespace flexpar {

/// p-1 steps, each moving one block (bytes/p of the send buffer); my own block copied locally, and
/// in place the whole buffer copied aside first (the public alltoall does that).
constexpr cost alltoall_pairwise_cost(int p, double bytes, bool in_place = false) noexcept {
  return {.steps = static_cast<double>(p - 1),
          .wire_bytes = (p - 1) * bytes / p,
          .copy_bytes = bytes / p + (in_place ? bytes : 0.0)};
}

namespace detail {

/// `in` and `out` hold p blocks of `count` elements; block j of `in` goes to rank j, block i of
/// `out` comes from rank i. @pre in and out do not overlap.
template <element T>
void pairwise_alltoall(call& c, std::span<const T> in, std::span<T> out, std::size_t count) {
  const int p = c.size, r = c.rank;
  auto block = [&](auto span, int b) { return span.subspan(static_cast<std::size_t>(b) * count, count); };
  std::copy_n(block(in, r).begin(), count, block(out, r).begin());  // step 0
  for (int step = 1; step < p; ++step) {
    const int to = modulo(r + step, p), from = modulo(r - step, p);
    request incoming = c.irecv(from, writable_bytes_of(block(out, from)));
    request outgoing = c.t.isend(to, c.tag, std::as_bytes(block(in, to)));
    incoming.wait(c.until);
    outgoing.wait(c.until);
  }
}

/// Uneven: block j of `in` (sends.of(in, j)) goes to rank j; block i of `out` (receives.of(out, i))
/// comes from rank i. Empty blocks still exchange an empty message (one step per partner, as above).
/// @pre in and out do not overlap; sends.count(j) on rank i == receives.count(i) on rank j.
template <element T>
void pairwise_alltoall_v(call& c, std::span<const T> in, const block_layout& sends, std::span<T> out,
                         const block_layout& receives) {
  const int p = c.size, r = c.rank;
  std::copy_n(sends.of(in, r).begin(), sends.count(r), receives.of(out, r).begin());  // step 0
  for (int step = 1; step < p; ++step) {
    const int to = modulo(r + step, p), from = modulo(r - step, p);
    request incoming = c.irecv(from, writable_bytes_of(receives.of(out, from)));
    request outgoing = c.t.isend(to, c.tag, std::as_bytes(sends.of(in, to)));
    incoming.wait(c.until);
    outgoing.wait(c.until);
  }
}

/// Uneven, with the blocks provided and received by the caller (alltoall_v_placed): step s = 1 .. p-1
/// sends source(r+s) to rank r+s, receives rank r-s's block into target(r-s), and once both are done
/// hands it to landed(r-s, block). My own block is the caller's (step 0 is not here).
template <element T, class Source, class Target, class Landed>
void pairwise_alltoall_v_placed(call& c, Source&& source, Target&& target, Landed&& landed) {
  const int p = c.size, r = c.rank;
  for (int step = 1; step < p; ++step) {
    const int to = modulo(r + step, p), from = modulo(r - step, p);
    const std::span<const T> outgoing = source(to);
    const std::span<T> landing = target(from);
    request incoming = c.irecv(from, writable_bytes_of(landing));
    request sent = c.t.isend(to, c.tag, std::as_bytes(outgoing));
    incoming.wait(c.until);
    sent.wait(c.until);
    landed(from, std::span<const T>(landing));
  }
}

}  // namespace detail
}  // namespace flexpar
