// flexpar/collective/broadcast_binomial_tree.hpp — binomial-tree broadcast.
//
// Virtual rank v = (rank - root) mod p. Step 1: v receives the whole buffer from v minus its lowest
// set bit (the root receives nothing). Step 2: v sends it to v + 2^k for every 2^k below that bit,
// largest first. ceil(log2 p) rounds: the choice for small buffers.
#pragma once

#include <vector>

#include <flexpar/collective/context.hpp>

namespace flexpar {

/// ceil(log2 p) steps, each moving the whole buffer.
constexpr cost broadcast_binomial_tree_cost(int p, double bytes) noexcept {
  return {detail::ceil_log2(p), detail::ceil_log2(p) * bytes, 0.0};
}

namespace detail {

template <element T>
void binomial_tree_broadcast(call& c, std::span<T> data, int root) {
  const int p = c.size;
  const int v = modulo(c.rank - root, p);
  auto real = [&](int virtual_rank) { return modulo(virtual_rank + root, p); };
  int mask = 1;
  // step 1: receive from my parent
  while (mask < p) {
    if (v & mask) {
      c.recv(real(v - mask), writable_bytes_of(data));
      break;
    }
    mask *= 2;
  }
  // step 2: send to my children
  std::vector<request> sends;
  for (mask /= 2; mask > 0; mask /= 2)
    if (v + mask < p) sends.push_back(c.t.isend(real(v + mask), c.tag, bytes_of(data)));
  wait_all(sends, c.until);
}

}  // namespace detail
}  // namespace flexpar
