// flexpar/collective/reduce_binomial_tree.hpp — binomial-tree reduce.
//
// Virtual rank v = (rank - root) mod p. Round k = 0, 1, ..: a rank whose bit k is set sends its
// partial result to v - 2^k and is done; otherwise it receives from v + 2^k (if that rank exists)
// and reduces. ceil(log2 p) rounds: the choice for small buffers.
#pragma once

#include <flexpar/collective/broadcast_binomial_tree.hpp>
#include <flexpar/collective/reduce_kernel.hpp>

namespace flexpar {

/// ceil(log2 p) steps, each moving and reducing the whole buffer.
constexpr cost reduce_binomial_tree_cost(int p, double bytes) noexcept {
  return {detail::ceil_log2(p), detail::ceil_log2(p) * bytes, detail::ceil_log2(p) * bytes};
}

namespace detail {

/// `acc` holds my contribution on entry; at the root it holds the reduction afterwards.
template <element T>
void binomial_tree_reduce(call& c, std::span<T> acc, reduce_op op, int root) {
  const int p = c.size;
  const int v = modulo(c.rank - root, p);
  auto real = [&](int virtual_rank) { return modulo(virtual_rank + root, p); };
  std::unique_ptr<T[]> landing;
  for (int mask = 1; mask < p; mask *= 2) {
    if (v & mask) {
      c.t.send(real(v - mask), c.tag, bytes_of(acc), c.until);
      return;
    }
    if (v + mask < p) {
      if (!landing) landing = scratch<T>(acc.size());
      const std::span<T> incoming(landing.get(), acc.size());
      c.recv(real(v + mask), writable_bytes_of(incoming));
      reduce_into(acc, std::span<const T>(incoming), op);
    }
  }
}

}  // namespace detail
}  // namespace flexpar
