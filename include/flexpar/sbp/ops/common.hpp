// flexpar/sbp/ops/common.hpp — what every SBP op shares: the compile-time diagnostics (each names
// the operands and, in its template arguments, a boxing that fixes the call), the per-axis rules as
// function objects, the one setup of a binary op's signature (binary_ok, binary_out), the run-time
// checks of placement and shape, and the error for operands in different memories.
//
// An op is written once for every memory: its signature and checks here and in its file under ops/,
// its local computation a kernel of the tensor's backend (backend<M>::gelu, ... : host_kernels.hpp on
// the host, flexpar/cuda/sbp.hpp on a GPU). An op with a host kernel only is constrained to host
// memory (its requires-clause says so: to_host(t) first).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include <flexpar/sbp/boxing.hpp>
#include <flexpar/sbp/global_tensor.hpp>
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

template <class Sbp>
struct transpose_has_no_signature {
  static_assert(detail::dependent_false<Sbp>,
                "flexpar::sbp::transpose is for 2-D tensors: it has S(0), S(1), B and P, and no split of a third "
                "axis.");
};

template <class X, class Dy, class Fix>
struct elementwise_grad_has_no_signature {
  static_assert(detail::dependent_false<X>,
                "flexpar::sbp::gelu_grad / layer_norm_grad / softmax_grad has no signature for these (x, dy) SBPs "
                "(named in this template's arguments). Per mesh axis: (S(i), S(i)) -> S(i), (B, B) -> B, "
                "(B, P(sum)) -> P(sum) (linear in dy); layer_norm_grad<A> and softmax_grad<A> need axis A whole "
                "(no S(A)). Box an operand first: the try_to<Left, Right> argument is a boxing that compiles.");
};

template <class Q, class K, class V>
struct causal_attention_needs_q_k_v_alike {
  static_assert(detail::dependent_false<Q>,
                "flexpar::sbp::causal_attention needs q, k and v (and dout) laid out by the same SBP: each rank "
                "attends with its own sequences (S(0)) or its own heads (S(1)). Box the odd one out first.");
};

template <class Sbp>
struct causal_attention_has_no_signature {
  static_assert(detail::dependent_false<Sbp>,
                "flexpar::sbp::causal_attention has S(0) (whole sequences), S(1) (whole heads) and B per mesh axis; "
                "not P: the softmax of a partial sum is not the sum of the softmaxes. Box first: "
                "to<broadcast>(q) (an allreduce) or to a split.");
};

template <class Logits, class Labels, class Fix>
struct cross_entropy_has_no_signature {
  static_assert(detail::dependent_false<Logits>,
                "flexpar::sbp::cross_entropy / cross_entropy_grad has (logits S(0), labels S(0)) -> S(0) and "
                "(B, B) -> B per mesh axis: every rank needs its rows' classes whole (the row maximum and the sum "
                "of exponentials). Logits split by classes (S(1), as a vocabulary-parallel output layer gives) "
                "box to S(0) (an all-to-all) or to B (an allgather) first; the try_to argument compiles.");
};

template <class W, class Ids, class Dy>
struct embedding_grad_has_no_signature {
  static_assert(detail::dependent_false<W>,
                "flexpar::sbp::embedding_grad(weight, ids, dy) has, per mesh axis, (S(0), B, B) -> S(0), "
                "(S(1), B, S(1)) -> S(1), (B, S(0), S(0)) -> P(sum), (B, B, B) -> B, (B, B, P(sum)) -> P(sum): "
                "the transposes of embedding's rows. Box ids or dy to the layout the forward's output had.");
};

/// Instantiated when an op is given tensors in two memories (one host and one device tensor).
template <class Left, class Right>
struct operands_in_different_memory {
  static_assert(detail::dependent_false<Left>,
                "flexpar::sbp: one operand lives in host memory and the other in device memory (memory::cuda). "
                "Bring them together first: to_device(host_tensor, device_placement) copies a host tensor to "
                "the GPU, to_host(device_tensor) copies a device tensor back.");
};

}  // namespace diagnostic

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

/// The per-axis rule `F` (a function of signature.hpp) as a function object: what nd_signature and
/// fix_for take, and what names an op's rule in the diagnostics.
template <auto F>
struct rule_of {
  template <class... P>
  constexpr signature_result operator()(const P&... p) const noexcept {
    return F(p...);
  }
};

using matmul_rule = rule_of<&signature::matmul>;
using add_rule = rule_of<&signature::add>;
using mul_rule = rule_of<&signature::mul>;
using embedding_rule = rule_of<&signature::embedding>;

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

using elementwise_grad_rule = rule_of<&signature::elementwise_grad>;
template <int Axis>
struct along_axis_grad_rule {
  constexpr signature_result operator()(const parallel& x, const parallel& dy) const noexcept {
    return signature::along_axis_grad(x, dy, Axis);
  }
};
using cross_entropy_rule = rule_of<&signature::cross_entropy>;
using embedding_grad_rule = rule_of<&signature::embedding_grad>;

/// The output SBP type of a binary rule, or void after the diagnostic `Diag<X, Dy, try_to<...>>`.
template <class Rule, template <class, class, class> class Diag, sbp_type X, sbp_type D>
constexpr bool binary_ok() {
  if constexpr (!same_mesh_rank<X, D>()) {
    return false;
  } else {
    constexpr nd_signature_result sig = nd_signature(Rule{}, nd_of<X>::value, nd_of<D>::value);
    if constexpr (!sig.ok) (void)sizeof(Diag<X, D, fix_type<Rule, X, D>>);
    return sig.ok;
  }
}
template <class Rule, sbp_type X, sbp_type D>
using binary_out = sbp_type_of<nd_signature(Rule{}, nd_of<X>::value, nd_of<D>::value).out, both_one_axis<X, D>>;

/// @throws usage_error naming `op` when `axis` is not an axis of `shape`.
inline void require_axis(int rank, const shape_t& shape, int axis, const char* op) {
  if (static_cast<std::size_t>(axis) >= shape.size())
    throw error_on<usage_error>(rank, op, "axis ", axis, " of a tensor of shape ", to_string(shape));
}

template <class MA, class MB>
constexpr bool different_memory = !std::is_same_v<MA, MB>;

}  // namespace detail

/// An op given tensors in two memories: a compile error naming to_device / to_host.
template <element T, sbp_type A, sbp_type B, class MA, class MB>
requires(detail::different_memory<MA, MB>) void matmul(const global_tensor<T, A, MA>&, const global_tensor<T, B, MB>&) {
  (void)sizeof(diagnostic::operands_in_different_memory<global_tensor<T, A, MA>, global_tensor<T, B, MB>>);
}
/// An op given tensors in two memories: a compile error naming to_device / to_host.
template <element T, sbp_type A, sbp_type B, class MA, class MB>
requires(detail::different_memory<MA, MB>) void add(const global_tensor<T, A, MA>&, const global_tensor<T, B, MB>&) {
  (void)sizeof(diagnostic::operands_in_different_memory<global_tensor<T, A, MA>, global_tensor<T, B, MB>>);
}
/// An op given tensors in two memories: a compile error naming to_device / to_host.
template <element T, sbp_type A, sbp_type B, class MA, class MB>
requires(detail::different_memory<MA, MB>) void mul(const global_tensor<T, A, MA>&, const global_tensor<T, B, MB>&) {
  (void)sizeof(diagnostic::operands_in_different_memory<global_tensor<T, A, MA>, global_tensor<T, B, MB>>);
}
/// An op given tensors in two memories: a compile error naming to_device / to_host.
template <element T, sbp_type W, sbp_type I, class MW, class MI>
requires(detail::different_memory<MW, MI>) void embedding(const global_tensor<T, W, MW>&,
                                                          const global_tensor<std::int64_t, I, MI>&) {
  (void)sizeof(diagnostic::operands_in_different_memory<global_tensor<T, W, MW>, global_tensor<std::int64_t, I, MI>>);
}
/// An op given tensors in two memories: a compile error naming to_device / to_host.
template <element T, sbp_type A, sbp_type B, class MA, class MB>
requires(detail::different_memory<MA, MB>) void conv2d(const global_tensor<T, A, MA>&, const global_tensor<T, B, MB>&,
                                                       std::size_t) {
  (void)sizeof(diagnostic::operands_in_different_memory<global_tensor<T, A, MA>, global_tensor<T, B, MB>>);
}

}  // namespace flexpar::sbp
