// flexpar/sbp/ops/convolution.hpp — 2-D convolution and its gradients on global tensors of any
// memory (stride 1, `pad` zeros on every side; tables in signature.hpp):
//
//   conv2d(x [N,C,H,W], w [K,C,R,S], pad)   (S(0), B) -> S(0)      sample parallel
//                                           (B, S(0)) -> S(1)      output channels (the weight's K) split
//                                           (S(1), S(1)) -> P(sum) input channels (the reduced C) split on both
//                                           (P(sum), B) -> P(sum)   (B, P(sum)) -> P(sum)   (B, B) -> B
//   conv2d_grad_input(dy [N,K,P,Q], w, pad) -> dx [N,C,H,W]
//                                           (S(0), B) -> S(0)   (S(1), S(0)) -> P(sum)   (B, S(1)) -> S(1)
//                                           (P(sum), B) -> P(sum)   (B, P(sum)) -> P(sum)   (B, B) -> B
//   conv2d_grad_weight(x, dy, pad) -> dw [K,C,R,S]
//                                           (S(0), S(0)) -> P(sum)   (B, S(1)) -> S(0)   (S(1), B) -> S(1)
//                                           (P(sum), B) -> P(sum)   (B, P(sum)) -> P(sum)   (B, B) -> B
//
// The local pass is the backend's conv kernel (im2col + GEMM per sample: the BLAS on the host,
// cuBLAS on a GPU). The run-time form (dynamic.hpp) shares the geometry and the kernel.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include <flexpar/sbp/host_kernels.hpp>
#include <flexpar/sbp/local_math.hpp>
#include <flexpar/sbp/ops/common.hpp>

namespace flexpar::sbp {

namespace detail {

using conv2d_rule = rule_of<&signature::conv2d>;
using conv2d_grad_input_rule = rule_of<&signature::conv2d_grad_input>;
using conv2d_grad_weight_rule = rule_of<&signature::conv2d_grad_weight>;

inline const char* name_of(conv_pass p) noexcept {
  switch (p) {
    case conv_pass::forward: return "conv2d";
    case conv_pass::grad_input: return "conv2d_grad_input";
    case conv_pass::grad_weight: return "conv2d_grad_weight";
  }
  return "conv2d";
}

inline std::string shape_error(int rank, conv_pass pass, const char* left, const shape_t& a, const char* right,
                               const shape_t& b, const char* why) {
  std::string s = on_rank(rank, name_of(pass));
  s.append(left).append(" ").append(to_string(a)).append(" and ").append(right).append(" ").append(to_string(b));
  return s.append(": ").append(why);
}

/// The logical output shape of a convolution pass from its operands' logical shapes (the geometry is
/// stride 1 with `pad` zeros on each side). @throws usage_error naming the op and both shapes.
inline shape_t conv_out_shape(int rank, conv_pass pass, const shape_t& a, const shape_t& b, std::size_t pad) {
  const char* ln = pass == conv_pass::grad_input ? "dy" : "input";
  const char* rn = pass == conv_pass::grad_weight ? "dy" : "weight";
  if (a.size() != 4 || b.size() != 4)
    throw usage_error(shape_error(rank, pass, ln, a, rn, b, "both must have 4 axes (NCHW, KCRS)"));
  switch (pass) {
    case conv_pass::forward:  // x [N,C,H,W], w [K,C,R,S] -> [N,K,P,Q]
      if (a[1] != b[1]) throw usage_error(shape_error(rank, pass, ln, a, rn, b, "input channels differ"));
      if (a[2] + 2 * pad < b[2] || a[3] + 2 * pad < b[3])
        throw usage_error(shape_error(rank, pass, ln, a, rn, b, "the kernel is larger than the padded input"));
      return {a[0], b[0], a[2] + 2 * pad - b[2] + 1, a[3] + 2 * pad - b[3] + 1};
    case conv_pass::grad_input:  // dy [N,K,P,Q], w [K,C,R,S] -> [N,C,H,W], H = P + R - 1 - 2 pad
      if (a[1] != b[0]) throw usage_error(shape_error(rank, pass, ln, a, rn, b, "output channels differ"));
      if (a[2] + b[2] < 1 + 2 * pad || a[3] + b[3] < 1 + 2 * pad || a[2] == 0 || a[3] == 0)
        throw usage_error(shape_error(rank, pass, ln, a, rn, b, "no input of this padding has that output"));
      return {a[0], b[1], a[2] + b[2] - 1 - 2 * pad, a[3] + b[3] - 1 - 2 * pad};
    case conv_pass::grad_weight:  // x [N,C,H,W], dy [N,K,P,Q] -> [K,C,R,S], R = H + 2 pad - P + 1
      if (a[0] != b[0]) throw usage_error(shape_error(rank, pass, ln, a, rn, b, "batches differ"));
      if (b[2] == 0 || b[3] == 0 || b[2] > a[2] + 2 * pad || b[3] > a[3] + 2 * pad)
        throw usage_error(shape_error(rank, pass, ln, a, rn, b, "no kernel of this padding gives that output"));
      return {b[1], a[1], a[2] + 2 * pad - b[2] + 1, a[3] + 2 * pad - b[3] + 1};
  }
  return {};
}

/// The geometry of one convolution pass on the shards: `la`, `lb` are the local boxes' extents, `out`
/// the local output extents. @throws usage_error when the shards do not fit together (e.g. unequal
/// channel splits).
inline local::conv2d_geometry conv_geometry_of(int rank, conv_pass pass, const shape_t& la, const shape_t& lb,
                                               const shape_t& out, std::size_t pad) {
  local::conv2d_geometry g;
  g.pad_h = g.pad_w = pad;
  const shape_t& x = pass == conv_pass::grad_input ? out : la;
  const shape_t& w = pass == conv_pass::forward ? lb : (pass == conv_pass::grad_input ? lb : out);
  g.batch = x[0];
  g.in_channels = x[1];
  g.height = x[2];
  g.width = x[3];
  g.out_channels = w[0];
  g.kernel_h = w[2];
  g.kernel_w = w[3];
  const shape_t y{g.batch, g.out_channels, g.out_height(), g.out_width()};
  const shape_t& dy = pass == conv_pass::forward ? out : (pass == conv_pass::grad_input ? la : lb);
  if (w[1] != g.in_channels || dy != y)
    throw usage_error(shape_error(rank, pass, "local shard", la, "local shard", lb, "the shards do not fit together"));
  return g;
}

/// One convolution pass on my shards in memory M (geometry as conv_geometry_of): the backend's kernel,
/// its result from the placement's pool (every pass writes every element).
template <class M, class T, class Where>
typename backend<M>::template shard<T> conv_shard(const Where& where, int rank, conv_pass pass, const shape_t& la,
                                                  typename backend<M>::template span<const T> a, const shape_t& lb,
                                                  typename backend<M>::template span<const T> b, const shape_t& out,
                                                  std::size_t pad) {
  const local::conv2d_geometry g = conv_geometry_of(rank, pass, la, lb, out, pad);
  auto c = backend<M>::template acquire<T>(where, elements_of(out));
  backend<M>::template conv<T>(where, pass, g, a, b, backend<M>::elements(c));
  return c;
}

template <conv_pass Pass, element T, sbp_type A, sbp_type B, class M>
auto conv_static(const global_tensor<T, A, M>& a, const global_tensor<T, B, M>& b, std::size_t pad) {
  using Rule = std::conditional_t<
      Pass == conv_pass::forward, conv2d_rule,
      std::conditional_t<Pass == conv_pass::grad_input, conv2d_grad_input_rule, conv2d_grad_weight_rule>>;
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double>) {
    (void)sizeof(diagnostic::conv2d_needs_f32_or_f64<T>);
    return;
  } else if constexpr (!same_mesh_rank<A, B>()) {
    return;
  } else {
    constexpr nd_signature_result sig = nd_signature(Rule{}, nd_of<A>::value, nd_of<B>::value);
    if constexpr (!sig.ok) {
      if constexpr (Pass == conv_pass::forward)
        (void)sizeof(diagnostic::conv2d_has_no_signature<A, B, fix_type<Rule, A, B>>);
      else
        (void)sizeof(diagnostic::conv2d_grad_has_no_signature<A, B, fix_type<Rule, A, B>>);
      return;
    } else {
      using Out = sbp_type_of<sig.out, both_one_axis<A, B>>;
      const int rank = a.where().parent().rank();
      require_same_placement(a, b, name_of(Pass));
      const shape_t out_shape = conv_out_shape(rank, Pass, a.shape(), b.shape(), pad);
      if (!a.where().contains_me()) return global_tensor<T, Out, M>::adopt(a.where(), out_shape, {});
      const shape_t out_local = shard_box(out_shape, sig.out, a.where().shape(), a.where().coords()).extent;
      return global_tensor<T, Out, M>::adopt(a.where(), out_shape,
                                             conv_shard<M, T>(a.where(), rank, Pass, a.local_shape(), a.to_local(),
                                                              b.local_shape(), b.to_local(), out_local, pad));
    }
  }
}

}  // namespace detail

/// 2-D convolution, stride 1, `pad` zeros on every side: x [N, C, H, W] (NCHW) with w [K, C, R, S]
/// (KCRS) -> [N, K, H + 2 pad - R + 1, W + 2 pad - S + 1] (signatures in the header; "same" padding for
/// an odd kernel is pad = (R - 1) / 2). Local: im2col + one GEMM per sample through the BLAS; float and
/// double only. A combination of SBPs without a signature is a compile error naming a boxing that fixes it.
/// @throws usage_error naming the rank, the op and both shapes when they do not convolve.
template <element T, sbp_type X, sbp_type W, class M>
auto conv2d(const global_tensor<T, X, M>& x, const global_tensor<T, W, M>& w, std::size_t pad) {
  return detail::conv_static<detail::conv_pass::forward>(x, w, pad);
}

/// The input gradient of conv2d for the output gradient dy [N, K, P, Q] and the weight [K, C, R, S]:
/// dx [N, C, P + R - 1 - 2 pad, Q + S - 1 - 2 pad] (GEMM + col2im on the shards; signatures in the header).
template <element T, sbp_type D, sbp_type W, class M>
auto conv2d_grad_input(const global_tensor<T, D, M>& dy, const global_tensor<T, W, M>& w, std::size_t pad) {
  return detail::conv_static<detail::conv_pass::grad_input>(dy, w, pad);
}

/// The weight gradient of conv2d for the input x [N, C, H, W] and the output gradient dy [N, K, P, Q]:
/// dw [K, C, H + 2 pad - P + 1, W + 2 pad - Q + 1] (im2col + GEMM on the shards; signatures in the header).
template <element T, sbp_type X, sbp_type D, class M>
auto conv2d_grad_weight(const global_tensor<T, X, M>& x, const global_tensor<T, D, M>& dy, std::size_t pad) {
  return detail::conv_static<detail::conv_pass::grad_weight>(x, dy, pad);
}

}  // namespace flexpar::sbp
