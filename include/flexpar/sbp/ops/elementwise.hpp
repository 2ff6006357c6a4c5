// flexpar/sbp/ops/elementwise.hpp — element-wise ops on global tensors of any memory, their output
// SBPs deduced from the inputs' (tables in signature.hpp; a combination without a signature is a
// compile error naming a boxing that fixes it):
//
//   add(a, b)          (S(i), S(i)) -> S(i)   (B, B) -> B   (P(sum), P(sum)) -> P(sum)
//   mul(a, b)          (S(i), S(i)) -> S(i)   (B, B) -> B   (P(sum), B) -> P(sum)   (B, P(sum)) -> P(sum)
//   relu(t), gelu(t)   S(i) -> S(i)   B -> B   (not P: relu(a + b) != relu(a) + relu(b))
//   gelu_grad(x, dy)   (S(i), S(i)) -> S(i)   (B, B) -> B   (B, P(sum)) -> P(sum)   (host memory)
//
// The local pass is the backend's kernel (backend<M>::add, mul, relu, gelu); the result's shard comes
// from the placement's pool and the kernel writes every element of it.
#pragma once

#include <cmath>
#include <cstddef>
#include <numbers>
#include <utility>

#include <flexpar/sbp/ops/common.hpp>

namespace flexpar::sbp {

namespace detail {
/// The tensor `kernel(where, x, out)` computes from `t`, of type Result (same shape, out's elements
/// from the pool).
template <class Result, class Tensor, class Kernel>
Result map_shard(const Tensor& t, Kernel kernel) {
  typename Result::shard_type out = Result::acquire(t.where(), t.to_local().size());
  kernel(t.where(), t.to_local(), backend<typename Result::memory_type>::elements(out));
  return Result::adopt(t.where(), t.shape(), std::move(out));
}
}  // namespace detail

/// Element-wise sum (signatures in the header).
template <element T, sbp_type A, sbp_type B, class M>
auto add(const global_tensor<T, A, M>& a, const global_tensor<T, B, M>& b) {
  if constexpr (!detail::binary_ok<detail::add_rule, diagnostic::add_has_no_signature, A, B>()) {
    return;
  } else {
    detail::require_same_placement(a, b, "add");
    detail::require_same_shape(a, b, "add");
    return detail::map_shard<global_tensor<T, A, M>>(
        a, [&](const auto& where, auto x, auto out) { backend<M>::add(where, x, b.to_local(), out); });
  }
}

/// Element-wise product (signatures in the header).
template <element T, sbp_type A, sbp_type B, class M>
auto mul(const global_tensor<T, A, M>& a, const global_tensor<T, B, M>& b) {
  if constexpr (!detail::binary_ok<detail::mul_rule, diagnostic::mul_has_no_signature, A, B>()) {
    return;
  } else {
    detail::require_same_placement(a, b, "mul");
    detail::require_same_shape(a, b, "mul");
    return detail::map_shard<global_tensor<T, detail::binary_out<detail::mul_rule, A, B>, M>>(
        a, [&](const auto& where, auto x, auto out) { backend<M>::mul(where, x, b.to_local(), out); });
  }
}

/// max(0, x) element-wise; keeps S and B (not P).
template <element T, sbp_type A, class M>
auto relu(const global_tensor<T, A, M>& t) {
  if constexpr (!nd_signature(signature::relu, nd_of<A>::value).ok) {
    (void)sizeof(diagnostic::relu_has_no_signature_for_partial<A>);
    return;
  } else {
    return detail::map_shard<global_tensor<T, A, M>>(
        t, [](const auto& where, auto x, auto out) { backend<M>::relu(where, x, out); });
  }
}

/// The GELU, x Φ(x) = x (1 + erf(x / sqrt 2)) / 2 element-wise (computed in double, rounded once);
/// keeps S and B (not P).
template <element T, sbp_type A, class M>
auto gelu(const global_tensor<T, A, M>& t) {
  if constexpr (!nd_signature(signature::gelu, nd_of<A>::value).ok) {
    (void)sizeof(diagnostic::gelu_has_no_signature_for_partial<A>);
    return;
  } else {
    return detail::map_shard<global_tensor<T, A, M>>(
        t, [](const auto& where, auto x, auto out) { backend<M>::gelu(where, x, out); });
  }
}

/// The gradient of gelu: dx = dy (Φ(x) + x φ(x)) element-wise (in double, rounded once).
template <element T, sbp_type X, sbp_type D, class M>
requires(backend<M>::host_memory) auto gelu_grad(const global_tensor<T, X, M>& x, const global_tensor<T, D, M>& dy) {
  if constexpr (!detail::binary_ok<detail::elementwise_grad_rule, diagnostic::elementwise_grad_has_no_signature, X,
                                   D>()) {
    return;
  } else {
    detail::require_same_placement(x, dy, "gelu_grad");
    detail::require_same_shape(x, dy, "gelu_grad");
    aligned_vector<T> out = x.where().pool().template acquire<T>(x.to_local().size());
    const auto xs = x.to_local(), ds = dy.to_local();
    const double inv_sqrt2 = std::numbers::sqrt2 / 2.0, inv_sqrt2pi = std::numbers::inv_sqrtpi / std::numbers::sqrt2;
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double v = double(accumulate_t<T>(xs[i]));
      const double slope = 0.5 * (1.0 + std::erf(v * inv_sqrt2)) + v * std::exp(-0.5 * v * v) * inv_sqrt2pi;
      out[i] = T(accumulate_t<T>(double(accumulate_t<T>(ds[i])) * slope));
    }
    return global_tensor<T, detail::binary_out<detail::elementwise_grad_rule, X, D>, M>::adopt(x.where(), x.shape(),
                                                                                               std::move(out));
  }
}

}  // namespace flexpar::sbp
