// flexpar/sbp/ops/along_axis.hpp — ops that need one tensor axis whole on every rank, on global
// tensors of any memory (tables in signature.hpp):
//
//   softmax<A>(t)              S(i) -> S(i) for i != A   B -> B   (not S(A), not P)
//   layer_norm<A>(t, eps)      S(i) -> S(i) for i != A   B -> B   (the axis's mean and variance)
//   reduce_sum<A>(t)           S(A) -> P(sum)   S(i) -> S(i < A ? i : i - 1)   B -> B   P(sum) -> P(sum)
//   softmax_grad<A>(y, dy)     (S(i), S(i)) -> S(i) for i != A   (B, B) -> B   (B, P(sum)) -> P(sum)   (host)
//   layer_norm_grad<A>(x, dy)  as softmax_grad                                                        (host)
//
// A shard is seen as [outer, rows, inner] around the axis (detail::around); the backend's kernels
// (backend<M>::softmax, layer_norm, sum_lines) work line by line, in double rounded once.
#pragma once

#include <cmath>
#include <cstddef>
#include <utility>

#include <flexpar/sbp/ops/common.hpp>

namespace flexpar::sbp {

namespace detail {
/// The tensor `kernel(where, x, out, lines)` computes from `t` along tensor axis `axis` (same type and
/// shape). @throws usage_error naming `op` when `axis` is not an axis of the tensor.
template <class Tensor, class Kernel>
Tensor along_axis(const Tensor& t, int axis, const char* op, Kernel kernel) {
  require_axis(t.where().parent().rank(), t.shape(), axis, op);
  const around lines(t.local_shape(), static_cast<std::size_t>(axis));
  typename Tensor::shard_type out = Tensor::acquire(t.where(), t.to_local().size());
  kernel(t.where(), t.to_local(), backend<typename Tensor::memory_type>::elements(out), lines);
  return Tensor::adopt(t.where(), t.shape(), std::move(out));
}

/// dx = `row(dx_row, x_row, dy_row, rows, step)` on every row of tensor axis `axis` of two shards of
/// one shape (a fresh buffer from the pool; `row` writes every element of its row).
template <element T, sbp_type X, sbp_type D, class M, class Row>
aligned_vector<T> along_axis_pair(const global_tensor<T, X, M>& x, const global_tensor<T, D, M>& dy, int axis,
                                  const char* op, Row row) {
  require_same_placement(x, dy, op);
  require_same_shape(x, dy, op);
  require_axis(x.where().parent().rank(), x.shape(), axis, op);
  aligned_vector<T> out = x.where().pool().template acquire<T>(x.to_local().size());
  if (!out.empty()) {
    const around v(x.local_shape(), static_cast<std::size_t>(axis));
    const T* xs = x.to_local().data();
    const T* ds = dy.to_local().data();
    for (std::size_t o = 0; o < v.outer; ++o)
      for (std::size_t i = 0; i < v.inner; ++i) {
        const std::size_t at = o * v.rows * v.inner + i;
        row(out.data() + at, xs + at, ds + at, v.rows, v.inner);
      }
  }
  return out;
}

/// Checks that q's shard holds whole sequences and whole heads, and returns the head width.
}  // namespace detail

/// Layer normalization over tensor axis Axis (which must be whole on every rank): each row along
/// the axis becomes (x - mean) / sqrt(var + eps), mean and (population) variance in double, rounded
/// once. The affine part (gain and bias) is a mul and an add of the caller's.
/// @throws usage_error when Axis is not an axis of the tensor.
template <int Axis, element T, sbp_type A, class M>
auto layer_norm(const global_tensor<T, A, M>& t, double eps = 1e-5) {
  if constexpr (!nd_signature([](const parallel& p) { return signature::layer_norm(p, Axis); }, nd_of<A>::value).ok) {
    (void)sizeof(diagnostic::layer_norm_has_no_signature<A, Axis>);
    return;
  } else {
    return detail::along_axis(t, Axis, "layer_norm", [eps](const auto& where, auto x, auto out, const auto& lines) {
      backend<M>::layer_norm(where, x, out, lines, eps);
    });
  }
}

/// Softmax over tensor axis Axis (which must be whole on every rank), in double rounded once.
template <int Axis, element T, sbp_type A, class M>
auto softmax(const global_tensor<T, A, M>& t) {
  if constexpr (!nd_signature([](const parallel& p) { return signature::softmax(p, Axis); }, nd_of<A>::value).ok) {
    (void)sizeof(diagnostic::softmax_has_no_signature<A, Axis>);
    return;
  } else {
    return detail::along_axis(t, Axis, "softmax", [](const auto& where, auto x, auto out, const auto& lines) {
      backend<M>::softmax(where, x, out, lines);
    });
  }
}

/// Sum over tensor axis Axis, which is removed; over a split axis the result is P(sum).
template <int Axis, element T, sbp_type A, class M>
auto reduce_sum(const global_tensor<T, A, M>& t) {
  constexpr nd_signature_result sig =
      nd_signature([](const parallel& p) { return signature::reduce_sum(p, Axis); }, nd_of<A>::value);
  if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::reduce_sum_has_no_signature<A, Axis>);
    return;
  } else {
    using result = global_tensor<T, detail::sbp_type_of<sig.out, one_axis_sbp<A>>, M>;
    detail::require_axis(t.where().parent().rank(), t.shape(), Axis, "reduce_sum");
    shape_t out_shape = t.shape();
    out_shape.erase(out_shape.begin() + Axis);
    if (!t.where().contains_me()) return result::adopt(t.where(), out_shape, {});
    const detail::around lines(t.local_shape(), Axis);
    typename result::shard_type out = result::acquire(t.where(), lines.outer * lines.inner);
    backend<M>::sum_lines(t.where(), t.to_local(), backend<M>::elements(out), lines);
    return result::adopt(t.where(), out_shape, std::move(out));
  }
}

/// The gradient of layer_norm<Axis>(x, eps) (no gain or bias): along each row x̂ = (x - mean) r with
/// r = 1 / sqrt(var + eps), dx = r (dy - mean(dy) - x̂ mean(dy x̂)) (in double, rounded once).
template <int Axis, element T, sbp_type X, sbp_type D, class M>
requires(backend<M>::host_memory) auto layer_norm_grad(const global_tensor<T, X, M>& x,
                                                       const global_tensor<T, D, M>& dy, double eps = 1e-5) {
  using Rule = detail::along_axis_grad_rule<Axis>;
  if constexpr (!detail::binary_ok<Rule, diagnostic::elementwise_grad_has_no_signature, X, D>()) {
    return;
  } else {
    aligned_vector<T> out = detail::along_axis_pair(
        x, dy, Axis, "layer_norm_grad", [eps](T* dx, const T* xr, const T* dr, std::size_t rows, std::size_t step) {
          const auto n = static_cast<double>(rows);
          double mean = 0, var = 0;
          for (std::size_t r = 0; r < rows; ++r) mean += double(accumulate_t<T>(xr[r * step]));
          mean /= n;
          for (std::size_t r = 0; r < rows; ++r) {
            const double d = double(accumulate_t<T>(xr[r * step])) - mean;
            var += d * d;
          }
          const double scale = 1.0 / std::sqrt(var / n + eps);
          double mean_dy = 0, mean_dy_xhat = 0;
          for (std::size_t r = 0; r < rows; ++r) {
            const double g = double(accumulate_t<T>(dr[r * step]));
            mean_dy += g;
            mean_dy_xhat += g * (double(accumulate_t<T>(xr[r * step])) - mean) * scale;
          }
          mean_dy /= n;
          mean_dy_xhat /= n;
          for (std::size_t r = 0; r < rows; ++r) {
            const double xhat = (double(accumulate_t<T>(xr[r * step])) - mean) * scale;
            dx[r * step] =
                T(accumulate_t<T>(scale * (double(accumulate_t<T>(dr[r * step])) - mean_dy - xhat * mean_dy_xhat)));
          }
        });
    return global_tensor<T, detail::binary_out<Rule, X, D>, M>::adopt(x.where(), x.shape(), std::move(out));
  }
}

/// The gradient of softmax<Axis> from its output y: dx = y (dy - sum(dy y)) along each row.
template <int Axis, element T, sbp_type Y, sbp_type D, class M>
requires(backend<M>::host_memory) auto softmax_grad(const global_tensor<T, Y, M>& y, const global_tensor<T, D, M>& dy) {
  using Rule = detail::along_axis_grad_rule<Axis>;
  if constexpr (!detail::binary_ok<Rule, diagnostic::elementwise_grad_has_no_signature, Y, D>()) {
    return;
  } else {
    aligned_vector<T> out = detail::along_axis_pair(
        y, dy, Axis, "softmax_grad", [](T* dx, const T* yr, const T* dr, std::size_t rows, std::size_t step) {
          double dot = 0;
          for (std::size_t r = 0; r < rows; ++r)
            dot += double(accumulate_t<T>(yr[r * step])) * double(accumulate_t<T>(dr[r * step]));
          for (std::size_t r = 0; r < rows; ++r)
            dx[r * step] = T(
                accumulate_t<T>(double(accumulate_t<T>(yr[r * step])) * (double(accumulate_t<T>(dr[r * step])) - dot)));
        });
    return global_tensor<T, detail::binary_out<Rule, Y, D>, M>::adopt(y.where(), y.shape(), std::move(out));
  }
}

}  // namespace flexpar::sbp
