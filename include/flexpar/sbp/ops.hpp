// flexpar/sbp/ops.hpp — ops on global tensors whose output SBP is deduced from the inputs' SBPs.
//
// Each op has a signature table per mesh axis (below; as values in signature.hpp); an nd-SBP input works when every
// mesh axis has a signature, and the output takes each axis's result. For static SBPs the output type is computed at
// compile time; a combination with no signature is a compile error that says what is missing and names, in its template
// arguments, the boxing that would fix it (try_to<Left, Right>). The local math runs on the shards (GEMM through the
// BLAS for f32/f64); ops never communicate — boxing does. An op's result shard comes from the inputs' placement's
// buffer_pool, as a boxing's does: a training loop whose tensors die each step reuses their buffers instead of mapping
// fresh ones (every op writes each element of its result, so a reused buffer's old values never show).
//
//   matmul(a [m,k], b [k,n])    (S(0), B) -> S(0)   (B, S(1)) -> S(1)   (S(1), S(0)) -> P(sum)
//                               (P(sum), B) -> P(sum)   (B, P(sum)) -> P(sum)   (B, B) -> B
//   add(a, b)                   (S(i), S(i)) -> S(i)   (B, B) -> B   (P(sum), P(sum)) -> P(sum)
//   mul(a, b)                   (S(i), S(i)) -> S(i)   (B, B) -> B   (P(sum), B) -> P(sum)   (B, P(sum)) -> P(sum)
//   relu(t)                     S(i) -> S(i)   B -> B                (not P: relu(a + b) != relu(a) + relu(b))
//   gelu(t)                     S(i) -> S(i)   B -> B                (not P: gelu is not additive either)
//   softmax<A>(t)               S(i) -> S(i) for i != A   B -> B     (not S(A), not P)
//   layer_norm<A>(t, eps)       S(i) -> S(i) for i != A   B -> B     (not S(A), not P: the axis's mean and variance)
//   embedding(w [V,D], ids [N]) (S(0), B) -> P(sum)   (S(1), B) -> S(1)   (B, S(0)) -> S(0)   (B, B) -> B
//   reduce_sum<A>(t)            S(A) -> P(sum)   S(i) -> S(i < A ? i : i - 1)   B -> B   P(sum) -> P(sum)
//   conv2d(x [N,C,H,W], w [K,C,R,S], pad)                     stride 1, `pad` zeros on every side
//                               (S(0), B) -> S(0)      sample parallel
//                               (B, S(0)) -> S(1)      output channels (the weight's K) split
//                               (S(1), S(1)) -> P(sum) input channels (the reduced C) split on both
//                               (P(sum), B) -> P(sum)   (B, P(sum)) -> P(sum)   (B, B) -> B
//   conv2d_grad_input(dy [N,K,P,Q], w, pad) -> dx [N,C,H,W]
//                               (S(0), B) -> S(0)   (S(1), S(0)) -> P(sum)   (B, S(1)) -> S(1)
//                               (P(sum), B) -> P(sum)   (B, P(sum)) -> P(sum)   (B, B) -> B
//   conv2d_grad_weight(x, dy, pad) -> dw [K,C,R,S]
//                               (S(0), S(0)) -> P(sum)   (B, S(1)) -> S(0)   (S(1), B) -> S(1)
//                               (P(sum), B) -> P(sum)   (B, P(sum)) -> P(sum)   (B, B) -> B
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <flexpar/sbp/boxing.hpp>
#include <flexpar/sbp/global_tensor.hpp>
#include <flexpar/sbp/local_math.hpp>
#include <flexpar/sbp/parallel.hpp>
#include <flexpar/sbp/signature.hpp>

namespace flexpar::sbp {

// ---- from values back to types -----------------------------------------------------------------

namespace detail {
template <class T>
inline constexpr bool dependent_false = false;
}  // namespace detail

/// Compile-time diagnostics: each is instantiated only when an op has no signature; its template
/// arguments name the operands and the boxing that fixes the call.
namespace diagnostic {

/// Names the boxing that makes a binary op compile: op(to<Left>(a), to<Right>(b)).
template <class Left, class Right>
struct try_to {};

template <class Left, class Right, class Fix>
struct matmul_has_no_signature {
  static_assert(detail::dependent_false<Left>,
                "flexpar::sbp::matmul has no signature for these operand SBPs (named in this template's arguments). "
                "Per mesh axis it has (S(0), B) -> S(0), (B, S(1)) -> S(1), (S(1), S(0)) -> P(sum), "
                "(P(sum), B) -> P(sum), (B, P(sum)) -> P(sum), (B, B) -> B. Box an operand first: the "
                "try_to<Left, Right> argument is a boxing that compiles, matmul(to<Left>(a), to<Right>(b)).");
};

template <class Left, class Right, class Fix>
struct add_has_no_signature {
  static_assert(detail::dependent_false<Left>,
                "flexpar::sbp::add has no signature for these operand SBPs (named in this template's arguments). "
                "Per mesh axis it has (S(i), S(i)) -> S(i), (B, B) -> B, (P(sum), P(sum)) -> P(sum); B + P would "
                "add the broadcast value once per rank. Box an operand first: add(to<Left>(a), to<Right>(b)) "
                "with the try_to<Left, Right> argument compiles.");
};

template <class Left, class Right, class Fix>
struct mul_has_no_signature {
  static_assert(detail::dependent_false<Left>,
                "flexpar::sbp::mul has no signature for these operand SBPs (named in this template's arguments). "
                "Per mesh axis it has (S(i), S(i)) -> S(i), (B, B) -> B, (P(sum), B) -> P(sum), (B, P(sum)) -> "
                "P(sum); P * P is not allowed: a product of two partial sums is not a partial sum. Box an operand "
                "first: mul(to<Left>(a), to<Right>(b)) with the try_to<Left, Right> argument compiles, e.g. "
                "mul(a, to<broadcast>(b)).");
};

template <class Sbp>
struct relu_has_no_signature_for_partial {
  static_assert(detail::dependent_false<Sbp>,
                "flexpar::sbp::relu has no signature for P: relu of a partial sum is not the sum of the relus. "
                "relu keeps S(i) and B; box first: relu(to<broadcast>(t)), or to a split (a reduce-scatter, "
                "cheaper).");
};

template <class Sbp, int Axis>
struct softmax_has_no_signature {
  static_assert(detail::dependent_false<Sbp>,
                "flexpar::sbp::softmax<Axis> needs the softmax axis whole on every rank: it has no signature for "
                "S(Axis) or for P. Box first: softmax<Axis>(to<broadcast>(t)) or split another axis.");
};

template <class Sbp>
struct gelu_has_no_signature_for_partial {
  static_assert(detail::dependent_false<Sbp>,
                "flexpar::sbp::gelu has no signature for P: gelu of a partial sum is not the sum of the gelus. "
                "gelu keeps S(i) and B; box first: gelu(to<broadcast>(t)), or to a split (a reduce-scatter, "
                "cheaper).");
};

template <class Sbp, int Axis>
struct layer_norm_has_no_signature {
  static_assert(detail::dependent_false<Sbp>,
                "flexpar::sbp::layer_norm<Axis> needs the normalized axis whole on every rank (its mean and "
                "variance): it has no signature for S(Axis) or for P. Box first: "
                "layer_norm<Axis>(to<broadcast>(t)) or split another axis.");
};

template <class Weight, class Indices, class Fix>
struct embedding_has_no_signature {
  static_assert(detail::dependent_false<Weight>,
                "flexpar::sbp::embedding has no signature for these SBPs (named in this template's arguments). "
                "Per mesh axis it has (weight S(0), ids B) -> P(sum), (S(1), B) -> S(1), (B, S(0)) -> S(0), "
                "(B, B) -> B. Box first: embedding(to<Left>(weight), to<Right>(ids)) with the try_to argument.");
};

template <class Sbp, int Axis>
struct reduce_sum_has_no_signature {
  static_assert(detail::dependent_false<Sbp>,
                "flexpar::sbp::reduce_sum has no signature for P(max) or P(min): a sum of partial maxima is not "
                "the sum. Box first: reduce_sum<Axis>(to<broadcast>(t)).");
};

template <class Input, class Weight, class Fix>
struct conv2d_has_no_signature {
  static_assert(detail::dependent_false<Input>,
                "flexpar::sbp::conv2d has no signature for these (input, weight) SBPs (named in this template's "
                "arguments). Per mesh axis it has (S(0), B) -> S(0) (sample), (B, S(0)) -> S(1) (output channels), "
                "(S(1), S(1)) -> P(sum) (input channels), (P(sum), B) -> P(sum), (B, P(sum)) -> P(sum), (B, B) -> B; "
                "a split of H or W (S(2), S(3)) would need halos. Box an operand first: the try_to<Left, Right> "
                "argument is a boxing that compiles, conv2d(to<Left>(x), to<Right>(w), pad).");
};

template <class Left, class Right, class Fix>
struct conv2d_grad_has_no_signature {
  static_assert(detail::dependent_false<Left>,
                "flexpar::sbp::conv2d_grad_input / conv2d_grad_weight has no signature for these SBPs (named in this "
                "template's arguments); the tables are in flexpar/sbp/ops.hpp. Box an operand first: the "
                "try_to<Left, Right> argument is a boxing that compiles.");
};

template <class T>
struct conv2d_needs_f32_or_f64 {
  static_assert(detail::dependent_false<T>,
                "flexpar::sbp::conv2d runs im2col + the BLAS GEMM: its element type must be float or double.");
};

template <class A, class B>
struct operands_on_meshes_of_different_rank {
  static_assert(detail::dependent_false<A>,
                "flexpar::sbp: the operands' SBPs have different numbers of mesh axes; both operands of an op "
                "live on one placement, so their nd-SBPs have one entry per mesh axis of it.");
};

}  // namespace diagnostic

// ---- the ops -----------------------------------------------------------------------------------

namespace detail {

template <sbp_type A, sbp_type B>
constexpr bool both_one_axis = one_axis_sbp<A>&& one_axis_sbp<B>;

template <sbp_type A, sbp_type B>
constexpr bool same_mesh_rank() {
  if constexpr (nd_of<A>::mesh_rank != nd_of<B>::mesh_rank) {
    (void)sizeof(diagnostic::operands_on_meshes_of_different_rank<A, B>);
    return false;
  } else {
    return true;
  }
}

template <class Rule, sbp_type A, sbp_type B>
using fix_type = diagnostic::try_to<sbp_type_of<fix_for(Rule{}, nd_of<A>::value, nd_of<B>::value).first, false>,
                                    sbp_type_of<fix_for(Rule{}, nd_of<A>::value, nd_of<B>::value).second, false>>;

struct matmul_rule {
  constexpr signature_result operator()(const parallel& a, const parallel& b) const noexcept {
    return signature::matmul(a, b);
  }
};
struct add_rule {
  constexpr signature_result operator()(const parallel& a, const parallel& b) const noexcept {
    return signature::add(a, b);
  }
};
struct mul_rule {
  constexpr signature_result operator()(const parallel& a, const parallel& b) const noexcept {
    return signature::mul(a, b);
  }
};
struct embedding_rule {
  constexpr signature_result operator()(const parallel& w, const parallel& ids) const noexcept {
    return signature::embedding(w, ids);
  }
};

template <class TA, class TB>
void require_same_placement(const TA& a, const TB& b, const char* op) {
  if (!(a.where() == b.where()))
    throw error_on<usage_error>(a.where().parent().rank(), op, "the operands live on different placements (",
                                a.where().describe(), " and ", b.where().describe(),
                                "); box one with a placement change");
}

template <class TA, class TB>
void require_same_shape(const TA& a, const TB& b, const char* op) {
  if (a.shape() != b.shape())
    throw error_on<usage_error>(a.where().parent().rank(), op, "shapes ", to_string(a.shape()), " and ",
                                to_string(b.shape()), " differ");
}

struct conv2d_rule {
  constexpr signature_result operator()(const parallel& a, const parallel& b) const noexcept {
    return signature::conv2d(a, b);
  }
};
struct conv2d_grad_input_rule {
  constexpr signature_result operator()(const parallel& a, const parallel& b) const noexcept {
    return signature::conv2d_grad_input(a, b);
  }
};
struct conv2d_grad_weight_rule {
  constexpr signature_result operator()(const parallel& a, const parallel& b) const noexcept {
    return signature::conv2d_grad_weight(a, b);
  }
};

/// Which of the three convolution computations a conv2d call runs.
enum class conv_pass : unsigned char { forward, grad_input, grad_weight };

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

/// One convolution pass on the shards (geometry as conv_geometry_of), its result from `pool`.
template <class T>
aligned_vector<T> conv_local(buffer_pool& pool, int rank, conv_pass pass, const shape_t& la, const T* a,
                             const shape_t& lb, const T* b, const shape_t& out, std::size_t pad) {
  const local::conv2d_geometry g = conv_geometry_of(rank, pass, la, lb, out, pad);
  aligned_vector<T> c = pool.template acquire<T>(elements_of(out));  // every pass writes every element
  if (pass == conv_pass::forward)
    local::conv2d_forward(g, a, b, c.data());
  else if (pass == conv_pass::grad_input)
    local::conv2d_backward_data(g, a, b, c.data());
  else
    local::conv2d_backward_weight(g, a, b, c.data());
  return c;
}

/// conv_static's local pass on host shards (the device form is in flexpar/cuda/sbp.hpp; found by the
/// argument conv_pass wherever the call is instantiated).
template <class T, std::size_t N>
aligned_vector<T> conv_shard(const placement<N>& where, int rank, conv_pass pass, const shape_t& la,
                             std::span<const T> a, const shape_t& lb, std::span<const T> b, const shape_t& out,
                             std::size_t pad) {
  return conv_local<T>(where.pool(), rank, pass, la, a.data(), lb, b.data(), out, pad);
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
                                             conv_shard<T>(a.where(), rank, Pass, a.local_shape(), a.to_local(),
                                                           b.local_shape(), b.to_local(), out_local, pad));
    }
  }
}

}  // namespace detail

/// The output SBP type of an op on static SBPs (void when there is no signature).
template <sbp_type A, sbp_type B>
using matmul_sbp = detail::sbp_type_of<nd_signature(detail::matmul_rule{}, nd_of<A>::value, nd_of<B>::value).out,
                                       detail::both_one_axis<A, B>>;

/// Matrix product of a [m, k] and b [k, n] (signatures in the header). Local: one GEMM on the shards.
template <element T, sbp_type A, sbp_type B, class M>
auto matmul(const global_tensor<T, A, M>& a, const global_tensor<T, B, M>& b) {
  if constexpr (!detail::same_mesh_rank<A, B>()) {
    return;
  } else {
    constexpr nd_signature_result sig = nd_signature(detail::matmul_rule{}, nd_of<A>::value, nd_of<B>::value);
    if constexpr (!sig.ok) {
      (void)sizeof(diagnostic::matmul_has_no_signature<A, B, detail::fix_type<detail::matmul_rule, A, B>>);
      return;
    } else {
      using Out = detail::sbp_type_of<sig.out, detail::both_one_axis<A, B>>;
      detail::require_same_placement(a, b, "matmul");
      if (a.shape().size() != 2 || b.shape().size() != 2 || a.shape()[1] != b.shape()[0])
        throw error_on<usage_error>(a.where().parent().rank(), "matmul", "shapes ", to_string(a.shape()), " x ",
                                    to_string(b.shape()), " do not multiply ([m, k] x [k, n])");
      const shape_t out_shape{a.shape()[0], b.shape()[1]};
      if (!a.where().contains_me()) return global_tensor<T, Out, M>::adopt(a.where(), out_shape, {});
      const shape_t la = a.local_shape(), lb = b.local_shape();
      if (la[1] != lb[0])
        throw error_on<usage_error>(a.where().parent().rank(), "matmul", "local shards ", to_string(la), " x ",
                                    to_string(lb), " do not multiply");
      aligned_vector<T> c = a.where().pool().template acquire<T>(la[0] * lb[1]);  // gemm writes every element
      local::gemm(la[0], lb[1], la[1], a.to_local().data(), b.to_local().data(), c.data());
      return global_tensor<T, Out, M>::adopt(a.where(), out_shape, std::move(c));
    }
  }
}

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

/// Element-wise sum (signatures in the header).
template <element T, sbp_type A, sbp_type B, class M>
auto add(const global_tensor<T, A, M>& a, const global_tensor<T, B, M>& b) {
  if constexpr (!detail::same_mesh_rank<A, B>()) {
    return;
  } else {
    constexpr nd_signature_result sig = nd_signature(detail::add_rule{}, nd_of<A>::value, nd_of<B>::value);
    if constexpr (!sig.ok) {
      (void)sizeof(diagnostic::add_has_no_signature<A, B, detail::fix_type<detail::add_rule, A, B>>);
      return;
    } else {
      detail::require_same_placement(a, b, "add");
      detail::require_same_shape(a, b, "add");
      aligned_vector<T> out = a.where().pool().template acquire<T>(a.to_local().size());
      const auto x = a.to_local(), y = b.to_local();
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = T(accumulate_t<T>(x[i]) + accumulate_t<T>(y[i]));
      return global_tensor<T, A, M>::adopt(a.where(), a.shape(), std::move(out));
    }
  }
}

/// Element-wise product (signatures in the header).
template <element T, sbp_type A, sbp_type B, class M>
auto mul(const global_tensor<T, A, M>& a, const global_tensor<T, B, M>& b) {
  if constexpr (!detail::same_mesh_rank<A, B>()) {
    return;
  } else {
    constexpr nd_signature_result sig = nd_signature(detail::mul_rule{}, nd_of<A>::value, nd_of<B>::value);
    if constexpr (!sig.ok) {
      (void)sizeof(diagnostic::mul_has_no_signature<A, B, detail::fix_type<detail::mul_rule, A, B>>);
      return;
    } else {
      using Out = detail::sbp_type_of<sig.out, detail::both_one_axis<A, B>>;
      detail::require_same_placement(a, b, "mul");
      detail::require_same_shape(a, b, "mul");
      aligned_vector<T> out = a.where().pool().template acquire<T>(a.to_local().size());
      const auto x = a.to_local(), y = b.to_local();
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = T(accumulate_t<T>(x[i]) * accumulate_t<T>(y[i]));
      return global_tensor<T, Out, M>::adopt(a.where(), a.shape(), std::move(out));
    }
  }
}

/// max(0, x) element-wise; keeps S and B (not P).
template <element T, sbp_type A, class M>
auto relu(const global_tensor<T, A, M>& t) {
  constexpr nd_signature_result sig = nd_signature(signature::relu, nd_of<A>::value);
  if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::relu_has_no_signature_for_partial<A>);
    return;
  } else {
    aligned_vector<T> out = t.where().pool().acquire_copy(t.to_local());
    for (T& x : out)
      if (accumulate_t<T>(x) < accumulate_t<T>(0)) x = T(accumulate_t<T>(0));
    return global_tensor<T, A, M>::adopt(t.where(), t.shape(), std::move(out));
  }
}

namespace detail {
/// A copy of `t`'s shard (from the pool) with `row(first, rows, step)` applied to every row along
/// tensor axis `axis` (rows elements `step` apart): what the ops that need an axis whole share.
/// @throws usage_error naming `op` when `axis` is not an axis of the tensor.
template <element T, sbp_type A, class M, class Row>
aligned_vector<T> along_axis(const global_tensor<T, A, M>& t, int axis, const char* op, Row row) {
  if (static_cast<std::size_t>(axis) >= t.shape().size())
    throw error_on<usage_error>(t.where().parent().rank(), op, "axis ", axis, " of a tensor of shape ",
                                to_string(t.shape()));
  const shape_t ls = t.local_shape();
  aligned_vector<T> out = t.where().pool().acquire_copy(t.to_local());
  if (!out.empty()) {
    const around v(ls, axis);
    for (std::size_t o = 0; o < v.outer; ++o)
      for (std::size_t i = 0; i < v.inner; ++i) row(out.data() + o * v.rows * v.inner + i, v.rows, v.inner);
  }
  return out;
}
}  // namespace detail

/// The GELU, x Φ(x) = x (1 + erf(x / sqrt 2)) / 2 element-wise (computed in double, rounded once);
/// keeps S and B (not P).
template <element T, sbp_type A, class M>
auto gelu(const global_tensor<T, A, M>& t) {
  constexpr nd_signature_result sig = nd_signature(signature::gelu, nd_of<A>::value);
  if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::gelu_has_no_signature_for_partial<A>);
    return;
  } else {
    aligned_vector<T> out = t.where().pool().acquire_copy(t.to_local());
    for (T& x : out) {
      const double v = double(accumulate_t<T>(x));
      x = T(accumulate_t<T>(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)))));
    }
    return global_tensor<T, A, M>::adopt(t.where(), t.shape(), std::move(out));
  }
}

/// Layer normalization over tensor axis Axis (which must be whole on every rank): each row along
/// the axis becomes (x - mean) / sqrt(var + eps), mean and (population) variance in double, rounded
/// once. The affine part (gain and bias) is a mul and an add of the caller's.
/// @throws usage_error when Axis is not an axis of the tensor.
template <int Axis, element T, sbp_type A, class M>
auto layer_norm(const global_tensor<T, A, M>& t, double eps = 1e-5) {
  constexpr nd_signature_result sig =
      nd_signature([](const parallel& p) { return signature::layer_norm(p, Axis); }, nd_of<A>::value);
  if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::layer_norm_has_no_signature<A, Axis>);
    return;
  } else {
    aligned_vector<T> out =
        detail::along_axis(t, Axis, "layer_norm", [eps](T* row, std::size_t rows, std::size_t step) {
          double mean = 0, var = 0;
          for (std::size_t r = 0; r < rows; ++r) mean += double(accumulate_t<T>(row[r * step]));
          mean /= static_cast<double>(rows);
          for (std::size_t r = 0; r < rows; ++r) {
            const double d = double(accumulate_t<T>(row[r * step])) - mean;
            var += d * d;
          }
          const double scale = 1.0 / std::sqrt(var / static_cast<double>(rows) + eps);
          for (std::size_t r = 0; r < rows; ++r)
            row[r * step] = T(accumulate_t<T>((double(accumulate_t<T>(row[r * step])) - mean) * scale));
        });
    return global_tensor<T, A, M>::adopt(t.where(), t.shape(), std::move(out));
  }
}

/// Softmax over tensor axis Axis (which must be whole on every rank).
template <int Axis, element T, sbp_type A, class M>
auto softmax(const global_tensor<T, A, M>& t) {
  constexpr nd_signature_result sig =
      nd_signature([](const parallel& p) { return signature::softmax(p, Axis); }, nd_of<A>::value);
  if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::softmax_has_no_signature<A, Axis>);
    return;
  } else {
    aligned_vector<T> out = detail::along_axis(t, Axis, "softmax", [](T* row, std::size_t rows, std::size_t step) {
      double hi = -INFINITY, sum = 0;
      for (std::size_t r = 0; r < rows; ++r) hi = std::max(hi, double(accumulate_t<T>(row[r * step])));
      for (std::size_t r = 0; r < rows; ++r) sum += std::exp(double(accumulate_t<T>(row[r * step])) - hi);
      for (std::size_t r = 0; r < rows; ++r)
        row[r * step] = T(accumulate_t<T>(std::exp(double(accumulate_t<T>(row[r * step])) - hi) / sum));
    });
    return global_tensor<T, A, M>::adopt(t.where(), t.shape(), std::move(out));
  }
}

/// Row lookup: out[i, :] = weight[ids[i], :]. With the weight split by rows (S(0)) each rank looks up
/// the ids in its rows and writes zeros for the others: the model-parallel embedding, P(sum).
/// @throws usage_error for an id outside [0, V).
template <element T, sbp_type W, sbp_type I, class M>
auto embedding(const global_tensor<T, W, M>& weight, const global_tensor<std::int64_t, I, M>& ids) {
  if constexpr (!detail::same_mesh_rank<W, I>()) {
    return;
  } else {
    constexpr nd_signature_result sig = nd_signature(detail::embedding_rule{}, nd_of<W>::value, nd_of<I>::value);
    if constexpr (!sig.ok) {
      (void)sizeof(diagnostic::embedding_has_no_signature<W, I, detail::fix_type<detail::embedding_rule, W, I>>);
      return;
    } else {
      using Out = detail::sbp_type_of<sig.out, detail::both_one_axis<W, I>>;
      detail::require_same_placement(weight, ids, "embedding");
      if (weight.shape().size() != 2 || ids.shape().size() != 1)
        throw error_on<usage_error>(weight.where().parent().rank(), "embedding", "weight ", to_string(weight.shape()),
                                    " and ids ", to_string(ids.shape()), ": it needs weight [V, D] and ids [N]");
      const shape_t out_shape{ids.shape()[0], weight.shape()[1]};
      if (!weight.where().contains_me()) return global_tensor<T, Out, M>::adopt(weight.where(), out_shape, {});
      const box rows = weight.my_box();
      const std::size_t cols = rows.extent[1];
      const auto w = weight.to_local();
      aligned_vector<T> out = weight.where().pool().template acquire<T>(ids.to_local().size() * cols, T{});
      for (std::size_t i = 0; i < ids.to_local().size(); ++i) {
        const std::int64_t id = ids.to_local()[i];
        if (id < 0 || static_cast<std::size_t>(id) >= weight.shape()[0])
          throw error_on<usage_error>(weight.where().parent().rank(), "embedding", "id ", id,
                                      " is outside the vocabulary of ", weight.shape()[0], " rows");
        const auto row = static_cast<std::size_t>(id);
        if (row < rows.offset[0] || row >= rows.offset[0] + rows.extent[0]) continue;
        std::copy_n(w.begin() + static_cast<std::ptrdiff_t>((row - rows.offset[0]) * cols), cols,
                    out.begin() + static_cast<std::ptrdiff_t>(i * cols));
      }
      return global_tensor<T, Out, M>::adopt(weight.where(), out_shape, std::move(out));
    }
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
    using Out = detail::sbp_type_of<sig.out, one_axis_sbp<A>>;
    if (static_cast<std::size_t>(Axis) >= t.shape().size())
      throw error_on<usage_error>(t.where().parent().rank(), "reduce_sum", "axis ", Axis, " of a tensor of shape ",
                                  to_string(t.shape()));
    shape_t out_shape = t.shape();
    out_shape.erase(out_shape.begin() + Axis);
    if (!t.where().contains_me()) return global_tensor<T, Out, M>::adopt(t.where(), out_shape, {});
    const detail::around v(t.local_shape(), Axis);
    std::vector<accumulate_t<T>> acc(v.outer * v.inner, accumulate_t<T>(0));
    const auto x = t.to_local();
    for (std::size_t o = 0; o < v.outer; ++o)
      for (std::size_t r = 0; r < v.rows; ++r)
        for (std::size_t i = 0; i < v.inner; ++i)
          acc[o * v.inner + i] += accumulate_t<T>(x[(o * v.rows + r) * v.inner + i]);
    aligned_vector<T> out = t.where().pool().template acquire<T>(acc.size());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = T(acc[i]);
    return global_tensor<T, Out, M>::adopt(t.where(), out_shape, std::move(out));
  }
}

}  // namespace flexpar::sbp
