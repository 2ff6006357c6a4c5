// flexpar/collective/barrier_dissemination.hpp — dissemination barrier.
//
// Round k = 0 .. ceil(log2 p)-1: send an empty message to rank r + 2^k, wait for one from r - 2^k.
// After the last round every rank has heard, directly or through others, from every rank.
#pragma once

#include <flexpar/collective/context.hpp>

namespace flexpar {

/// ceil(log2 p) steps of empty messages.
constexpr cost barrier_dissemination_cost(int p) noexcept { return {detail::ceil_log2(p), 0.0, 0.0}; }

namespace detail {

inline void dissemination_barrier(call& c) {
  for (int distance = 1; distance < c.size; distance *= 2) {
    request incoming = c.irecv(modulo(c.rank - distance, c.size), {});
    request outgoing = c.t.isend(modulo(c.rank + distance, c.size), c.tag, {});
    incoming.wait(c.until);
    outgoing.wait(c.until);
  }
}

}  // namespace detail
}  // namespace flexpar
