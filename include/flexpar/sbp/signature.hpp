// flexpar/sbp/signature.hpp — the signature tables of the SBP ops as values: for each op and each
// mesh axis, the output SBP of a pair (or one) of input SBPs, or none. One set of tables serves the
// static ops (ops.hpp, which turns a value back into a type, or into a designed compile error), the
// run-time form (dynamic.hpp) and the strategy search. ops.hpp's header lists every op's table.
//
// nd_signature applies a one-axis rule on every mesh axis; fix_for names the operands a binary op
// could be boxed to so that it has a signature (what the compile errors and the search suggest).
#pragma once

#include <cstddef>
#include <utility>

#include <flexpar/core/reduce_op.hpp>
#include <flexpar/sbp/parallel.hpp>

namespace flexpar::sbp {

/// The result of a signature lookup: the output SBP, or none.
struct signature_result {
  bool ok = false;  ///< a signature exists
  parallel out{};   ///< the output SBP (when ok)
  /// No signature.
  static constexpr signature_result none() noexcept { return {}; }
  /// The signature's output is `p`.
  static constexpr signature_result of(parallel p) noexcept { return {true, p}; }
};

/// One row of a binary op's signature table on one mesh axis: (left, right) -> out.
struct signature_row {
  parallel left;   ///< the left operand's SBP
  parallel right;  ///< the right operand's SBP
  parallel out;    ///< the output's SBP
};

/// Signature tables as rows, for the ops whose table is a plain list (the run-time form searches them).
namespace table {
/// matmul(a [m,k], b [k,n]) (the same rows as signature::matmul).
inline constexpr signature_row matmul[] = {
    {parallel::S(0), parallel::B(), parallel::S(0)}, {parallel::B(), parallel::S(1), parallel::S(1)},
    {parallel::S(1), parallel::S(0), parallel::P()}, {parallel::P(), parallel::B(), parallel::P()},
    {parallel::B(), parallel::P(), parallel::P()},   {parallel::B(), parallel::B(), parallel::B()}};
/// conv2d(x [N,C,H,W], w [K,C,R,S]): sample, output channels (the weight's K), input channels (the reduced C).
inline constexpr signature_row conv2d[] = {
    {parallel::S(0), parallel::B(), parallel::S(0)}, {parallel::B(), parallel::S(0), parallel::S(1)},
    {parallel::S(1), parallel::S(1), parallel::P()}, {parallel::P(), parallel::B(), parallel::P()},
    {parallel::B(), parallel::P(), parallel::P()},   {parallel::B(), parallel::B(), parallel::B()}};
/// conv2d_grad_input(dy [N,K,P,Q], w [K,C,R,S]) -> dx [N,C,H,W].
inline constexpr signature_row conv2d_grad_input[] = {
    {parallel::S(0), parallel::B(), parallel::S(0)}, {parallel::S(1), parallel::S(0), parallel::P()},
    {parallel::B(), parallel::S(1), parallel::S(1)}, {parallel::P(), parallel::B(), parallel::P()},
    {parallel::B(), parallel::P(), parallel::P()},   {parallel::B(), parallel::B(), parallel::B()}};
/// conv2d_grad_weight(x [N,C,H,W], dy [N,K,P,Q]) -> dw [K,C,R,S].
inline constexpr signature_row conv2d_grad_weight[] = {
    {parallel::S(0), parallel::S(0), parallel::P()}, {parallel::B(), parallel::S(1), parallel::S(0)},
    {parallel::S(1), parallel::B(), parallel::S(1)}, {parallel::P(), parallel::B(), parallel::P()},
    {parallel::B(), parallel::P(), parallel::P()},   {parallel::B(), parallel::B(), parallel::B()}};
}  // namespace table

/// The op signature tables of the header comment, one mesh axis at a time.
namespace signature {
/// The row of `rows` for (a, b), or none.
template <std::size_t N>
constexpr signature_result lookup(const signature_row (&rows)[N], const parallel& a, const parallel& b) noexcept {
  for (const signature_row& r : rows)
    if (r.left == a && r.right == b) return signature_result::of(r.out);
  return signature_result::none();
}
/// P(sum)?
constexpr bool is_sum(const parallel& p) noexcept { return p.is_partial() && p.op == reduce_op::sum; }

/// matmul(a [m,k], b [k,n]).
constexpr signature_result matmul(const parallel& a, const parallel& b) noexcept {
  if (a.is_split() && a.axis == 0 && b.is_broadcast()) return signature_result::of(parallel::S(0));
  if (a.is_broadcast() && b.is_split() && b.axis == 1) return signature_result::of(parallel::S(1));
  if (a.is_split() && a.axis == 1 && b.is_split() && b.axis == 0) return signature_result::of(parallel::P());
  if (is_sum(a) && b.is_broadcast()) return signature_result::of(parallel::P());
  if (a.is_broadcast() && is_sum(b)) return signature_result::of(parallel::P());
  if (a.is_broadcast() && b.is_broadcast()) return signature_result::of(parallel::B());
  return signature_result::none();
}
/// add(a, b), same shapes.
constexpr signature_result add(const parallel& a, const parallel& b) noexcept {
  if (a.is_split() && b.is_split() && a.axis == b.axis) return signature_result::of(a);
  if (a.is_broadcast() && b.is_broadcast()) return signature_result::of(a);
  if (is_sum(a) && is_sum(b)) return signature_result::of(a);
  return signature_result::none();
}
/// mul(a, b), element-wise, same shapes.
constexpr signature_result mul(const parallel& a, const parallel& b) noexcept {
  if (a.is_split() && b.is_split() && a.axis == b.axis) return signature_result::of(a);
  if (a.is_broadcast() && b.is_broadcast()) return signature_result::of(a);
  if (is_sum(a) && b.is_broadcast()) return signature_result::of(a);
  if (a.is_broadcast() && is_sum(b)) return signature_result::of(b);
  return signature_result::none();
}
/// relu(t).
constexpr signature_result relu(const parallel& a) noexcept {
  return a.is_partial() ? signature_result::none() : signature_result::of(a);
}
/// softmax over tensor axis `axis`.
constexpr signature_result softmax(const parallel& a, int axis) noexcept {
  if (a.is_partial() || (a.is_split() && a.axis == axis)) return signature_result::none();
  return signature_result::of(a);
}
/// gelu(t): element-wise and not additive, as relu.
constexpr signature_result gelu(const parallel& a) noexcept { return relu(a); }
/// layer_norm over tensor axis `axis`: the axis whole on every rank, as softmax.
constexpr signature_result layer_norm(const parallel& a, int axis) noexcept { return softmax(a, axis); }
/// embedding(weight [V,D], indices [N]) -> [N, D].
constexpr signature_result embedding(const parallel& w, const parallel& ids) noexcept {
  if (w.is_split() && w.axis == 0 && ids.is_broadcast()) return signature_result::of(parallel::P());
  if (w.is_split() && w.axis == 1 && ids.is_broadcast()) return signature_result::of(parallel::S(1));
  if (w.is_broadcast() && ids.is_split() && ids.axis == 0) return signature_result::of(parallel::S(0));
  if (w.is_broadcast() && ids.is_broadcast()) return signature_result::of(parallel::B());
  return signature_result::none();
}
/// reduce_sum over tensor axis `axis` (the axis is removed).
constexpr signature_result reduce_sum(const parallel& a, int axis) noexcept {
  if (a.is_split() && a.axis == axis) return signature_result::of(parallel::P());
  if (a.is_split()) return signature_result::of(parallel::S(a.axis < axis ? a.axis : a.axis - 1));
  if (a.is_broadcast() || is_sum(a)) return signature_result::of(a);
  return signature_result::none();
}
/// transpose(t [m, n]) -> [n, m]: a split moves to the other axis; B and P stay.
constexpr signature_result transpose(const parallel& a) noexcept {
  if (a.is_split()) return a.axis <= 1 ? signature_result::of(parallel::S(1 - a.axis)) : signature_result::none();
  return signature_result::of(a);
}
/// The backward of an element-wise op that is not additive (gelu): (x, dy) -> dx. dx is linear in dy,
/// so a partial dy with a broadcast x gives a partial dx.
constexpr signature_result elementwise_grad(const parallel& x, const parallel& dy) noexcept {
  if (x.is_split() && dy.is_split() && x.axis == dy.axis) return signature_result::of(x);
  if (x.is_broadcast() && dy.is_broadcast()) return signature_result::of(x);
  if (x.is_broadcast() && is_sum(dy)) return signature_result::of(dy);
  return signature_result::none();
}
/// The backward of an op over tensor axis `axis` that needs the axis whole (softmax, layer_norm):
/// (x or y, dy) -> dx, linear in dy; no split of `axis`.
constexpr signature_result along_axis_grad(const parallel& x, const parallel& dy, int axis) noexcept {
  if (x.is_split() && x.axis == axis) return signature_result::none();
  return elementwise_grad(x, dy);
}
/// causal_attention(q, k, v [N, H*d]) with q, k and v laid out alike: S(0) splits whole sequences,
/// S(1) whole heads (Megatron's head-parallel attention), B; not P (the softmax is not additive).
constexpr signature_result causal_attention(const parallel& a) noexcept {
  if (a.is_partial() || (a.is_split() && a.axis > 1)) return signature_result::none();
  return signature_result::of(a);
}
/// cross_entropy(logits [N, V], labels [N]) -> loss [N], and its gradient -> [N, V]: the classes whole
/// (a split of V would need the row maximum and sum from every rank: box first).
constexpr signature_result cross_entropy(const parallel& logits, const parallel& labels) noexcept {
  if (logits.is_split() && logits.axis == 0 && labels.is_split() && labels.axis == 0)
    return signature_result::of(parallel::S(0));
  if (logits.is_broadcast() && labels.is_broadcast()) return signature_result::of(parallel::B());
  return signature_result::none();
}
/// embedding_grad(weight [V,D], ids [N], dy [N,D]) -> dW [V,D], laid out as the weight (or P where
/// the rows were split): the transpose of embedding's table.
constexpr signature_result embedding_grad(const parallel& w, const parallel& ids, const parallel& dy) noexcept {
  if (w.is_split() && w.axis == 0 && ids.is_broadcast() && dy.is_broadcast()) return signature_result::of(w);
  if (w.is_split() && w.axis == 1 && ids.is_broadcast() && dy.is_split() && dy.axis == 1)
    return signature_result::of(w);
  if (w.is_broadcast() && ids.is_split() && ids.axis == 0 && dy.is_split() && dy.axis == 0)
    return signature_result::of(parallel::P());
  if (w.is_broadcast() && ids.is_broadcast() && dy.is_broadcast()) return signature_result::of(w);
  if (w.is_broadcast() && ids.is_broadcast() && is_sum(dy)) return signature_result::of(dy);
  return signature_result::none();
}
/// conv2d(x [N,C,H,W], w [K,C,R,S]) -> [N,K,P,Q] (the rows of table::conv2d).
constexpr signature_result conv2d(const parallel& x, const parallel& w) noexcept { return lookup(table::conv2d, x, w); }
/// conv2d_grad_input(dy [N,K,P,Q], w [K,C,R,S]) -> dx [N,C,H,W] (table::conv2d_grad_input).
constexpr signature_result conv2d_grad_input(const parallel& dy, const parallel& w) noexcept {
  return lookup(table::conv2d_grad_input, dy, w);
}
/// conv2d_grad_weight(x [N,C,H,W], dy [N,K,P,Q]) -> dw [K,C,R,S] (table::conv2d_grad_weight).
constexpr signature_result conv2d_grad_weight(const parallel& x, const parallel& dy) noexcept {
  return lookup(table::conv2d_grad_weight, x, dy);
}
}  // namespace signature

/// An nd signature: per mesh axis, or none (with the first mesh axis that has none).
struct nd_signature_result {
  bool ok = false;         ///< every mesh axis has a signature
  nd_parallel out{};       ///< the output nd-SBP (when ok)
  std::size_t failed = 0;  ///< the first mesh axis without one (when not ok)
};

/// Applies a one-axis binary signature on every mesh axis.
template <class Rule>
constexpr nd_signature_result nd_signature(Rule rule, const nd_parallel& a, const nd_parallel& b) noexcept {
  nd_signature_result r{true, {}, 0};
  r.out.rank = a.rank;
  for (std::size_t d = 0; d < a.rank; ++d) {
    const signature_result s = rule(a[d], b[d]);
    if (!s.ok) return {false, {}, d};
    r.out[d] = s.out;
  }
  return r;
}

/// Applies a one-axis ternary signature on every mesh axis.
template <class Rule>
constexpr nd_signature_result nd_signature(Rule rule, const nd_parallel& a, const nd_parallel& b,
                                           const nd_parallel& c) noexcept {
  nd_signature_result r{true, {}, 0};
  r.out.rank = a.rank;
  for (std::size_t d = 0; d < a.rank; ++d) {
    const signature_result s = rule(a[d], b[d], c[d]);
    if (!s.ok) return {false, {}, d};
    r.out[d] = s.out;
  }
  return r;
}

/// Applies a one-axis unary signature on every mesh axis.
template <class Rule>
constexpr nd_signature_result nd_signature(Rule rule, const nd_parallel& a) noexcept {
  nd_signature_result r{true, {}, 0};
  r.out.rank = a.rank;
  for (std::size_t d = 0; d < a.rank; ++d) {
    const signature_result s = rule(a[d]);
    if (!s.ok) return {false, {}, d};
    r.out[d] = s.out;
  }
  return r;
}

/// The operands a binary op could be boxed to so that it has a signature: per failing mesh axis, the
/// right operand is changed first (to B, S(1), S(0)), then the left, then both to B.
template <class Rule>
constexpr std::pair<nd_parallel, nd_parallel> fix_for(Rule rule, nd_parallel a, nd_parallel b) noexcept {
  constexpr parallel candidates[] = {parallel::B(), parallel::S(1), parallel::S(0)};
  for (std::size_t d = 0; d < a.rank; ++d) {
    if (rule(a[d], b[d]).ok) continue;
    bool fixed = false;
    for (const parallel& c : candidates)
      if (!fixed && rule(a[d], c).ok) {
        b[d] = c;
        fixed = true;
      }
    for (const parallel& c : candidates)
      if (!fixed && rule(c, b[d]).ok) {
        a[d] = c;
        fixed = true;
      }
    if (!fixed) a[d] = b[d] = parallel::B();
  }
  return {a, b};
}

}  // namespace flexpar::sbp
