// flexpar/collective/allreduce_halving_doubling.hpp — recursive halving reduce-scatter followed by
// recursive doubling allgather (Rabenseifner), for any number of ranks.
//
// p' = the largest power of two <= p, e = p - p' extra ranks.
//   step 1 (fold):      among ranks 0 .. 2e-1, each even rank sends its buffer to the odd rank after
//                       it, which reduces it and stands for both; the even ranks wait for step 4.
//   step 2 (halving):   log2(p') rounds; in each, partners (virtual ranks differing in one bit) swap
//                       halves of their current range and reduce the half they keep.
//   step 3 (doubling):  the same rounds in reverse; partners swap their reduced ranges.
//   step 4 (unfold):    each odd rank of step 1 sends the result back to its even partner.
// 2 log2(p') messages (+2 when p is not a power of two) and 2(p'-1)/p' of the buffer on the wire:
// fewer steps than the ring, so the choice for small and medium buffers.
#pragma once

#include <bit>
#include <vector>

#include <flexpar/collective/context.hpp>
#include <flexpar/collective/reduce_kernel.hpp>

namespace flexpar {

constexpr cost allreduce_halving_doubling_cost(int p, double bytes) noexcept {
  const int p2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
  const bool fold = p != p2;
  const double share = p2 > 1 ? (p2 - 1) * bytes / p2 : 0.0;
  return {2 * detail::floor_log2(p2) + (fold ? 2.0 : 0.0), 2 * share + (fold ? 2 * bytes : 0.0),
          share + (fold ? bytes : 0.0)};
}

namespace detail {

template <element T>
void allreduce_halving_doubling(communicator& comm, std::span<T> data, reduce_op op) {
  call c = begin_call(comm);
  const int p = c.size, r = c.rank;
  if (p == 1) return;
  const int p2 = static_cast<int>(std::bit_floor(static_cast<unsigned>(p)));
  const int extra = p - p2;
  const std::size_t n = data.size();
  auto landing = scratch<T>(extra > 0 ? n : n - n / 2);

  // step 1: fold the extra ranks into their odd neighbours
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      c.t.send(r + 1, c.tag, bytes_of(data), c.until);
      c.recv(r + 1, writable_bytes_of(data));  // step 4, seen from the even side
      return;
    }
    c.recv(r - 1, writable_bytes_of(std::span<T>(landing.get(), n)));
    reduce_into(data, std::span<const T>(landing.get(), n), op);
  }
  const int me = r < 2 * extra ? r / 2 : r - extra;  // my virtual rank among p'
  auto real = [&](int v) { return v < extra ? 2 * v + 1 : v + extra; };

  // step 2: recursive halving; remember each round's range for step 3
  struct range {
    std::size_t lo, hi;
  };
  struct round {
    range whole;
    bool kept_low;
  };
  std::vector<round> rounds;
  std::size_t lo = 0, hi = n;
  for (int mask = p2 / 2; mask >= 1; mask /= 2) {
    const int partner = real(me ^ mask);
    const std::size_t mid = lo + (hi - lo) / 2;
    const bool keep_low = (me & mask) == 0;
    const range keep = keep_low ? range{lo, mid} : range{mid, hi};
    const range give = keep_low ? range{mid, hi} : range{lo, mid};
    const std::span<T> incoming(landing.get(), keep.hi - keep.lo);
    clear_to_send ready(c, partner, partner, needs_clear_to_send(c, (hi - lo) / 2 * sizeof(T)));  // both: [lo, hi)
    request in = c.irecv(partner, writable_bytes_of(incoming));
    ready.granted();
    request out = c.t.isend(partner, c.tag, bytes_of(data.subspan(give.lo, give.hi - give.lo)));
    in.wait(c.until);
    reduce_into(data.subspan(keep.lo, keep.hi - keep.lo), std::span<const T>(incoming), op);
    out.wait(c.until);
    rounds.push_back({{lo, hi}, keep_low});
    lo = keep.lo;
    hi = keep.hi;
  }

  // step 3: recursive doubling, the rounds of step 2 in reverse
  for (int mask = 1; mask < p2; mask *= 2) {
    const int partner = real(me ^ mask);
    const round done = rounds.back();
    rounds.pop_back();
    const range whole = done.whole;
    const range theirs = done.kept_low ? range{hi, whole.hi} : range{whole.lo, lo};
    clear_to_send ready(c, partner, partner, needs_clear_to_send(c, (whole.hi - whole.lo) / 2 * sizeof(T)));
    request in = c.irecv(partner, writable_bytes_of(data.subspan(theirs.lo, theirs.hi - theirs.lo)));
    ready.granted();
    request out = c.t.isend(partner, c.tag, bytes_of(data.subspan(lo, hi - lo)));
    in.wait(c.until);
    out.wait(c.until);
    lo = whole.lo;
    hi = whole.hi;
  }

  // step 4: unfold — hand the result to the even rank folded into me
  if (r < 2 * extra) c.t.send(r - 1, c.tag, bytes_of(data), c.until);
}

}  // namespace detail
}  // namespace flexpar
