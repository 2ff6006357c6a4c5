// flexpar/sbp/ops_nn.hpp — the ops a transformer adds to ops.hpp, and the backward passes that
// training needs, with output SBPs deduced from the inputs' as in ops.hpp (the tables as values in
// signature.hpp; a combination with no signature is a compile error that says what to box).
//
// The backward of an op that is linear in its output gradient keeps a partial dy partial: a
// Megatron column-parallel block's input gradient comes out P(sum) and one boxing (P -> B, an
// allreduce) ends it, and a data-parallel weight gradient comes out P(sum) over the data axis —
// the gradient allreduce of data parallelism is a boxing the types ask for, not a separate step.
//
//   transpose(t [m,n]) -> [n,m]             S(0) -> S(1)   S(1) -> S(0)   B -> B   P -> P
//   gelu_grad(x, dy)                        (S(i), S(i)) -> S(i)   (B, B) -> B   (B, P(sum)) -> P(sum)
//   layer_norm_grad<A>(x, dy, eps)          as gelu_grad, without S(A)
//   softmax_grad<A>(y, dy)                  as gelu_grad, without S(A)      (y the softmax's output)
//   causal_attention(q, k, v, heads, seq)   q, k, v [N, heads * d] laid out alike, N = sequences * seq:
//                                           S(0) -> S(0) (whole sequences)  S(1) -> S(1) (whole heads)  B -> B
//   causal_attention_grad(q, k, v, dout, heads, seq) -> {dq, dk, dv}        the same table
//   cross_entropy(logits [N,V], labels [N]) -> loss per row [N]   (S(0), S(0)) -> S(0)   (B, B) -> B
//   cross_entropy_grad(logits, labels, scale) -> [N,V]            the same table
//   embedding_grad(w [V,D], ids [N], dy [N,D]) -> dW [V,D]
//                                           (S(0), B, B) -> S(0)   (S(1), B, S(1)) -> S(1)
//                                           (B, S(0), S(0)) -> P(sum)   (B, B, B) -> B   (B, B, P(sum)) -> P(sum)
//
// causal_attention is one op (the softmax of a query's scores over the keys at or before it, then
// the weighted values, per sequence and head) rather than a batched matmul, a mask and a softmax:
// the scores never leave the op, and its two splits are the two that need no communication. Every
// (sequence, head) is computed alike in every layout, so a split run equals the whole run bit for bit.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <type_traits>
#include <vector>

#include <flexpar/sbp/ops.hpp>

namespace flexpar::sbp {

namespace diagnostic {

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

}  // namespace diagnostic

/// The three gradients of causal_attention, laid out as its inputs.
template <element T, sbp_type Sbp, class M = host>
struct attention_grads {
  global_tensor<T, Sbp, M> dq;  ///< d(loss)/d(q)
  global_tensor<T, Sbp, M> dk;  ///< d(loss)/d(k)
  global_tensor<T, Sbp, M> dv;  ///< d(loss)/d(v)
};

namespace detail {

struct elementwise_grad_rule {
  constexpr signature_result operator()(const parallel& x, const parallel& dy) const noexcept {
    return signature::elementwise_grad(x, dy);
  }
};
template <int Axis>
struct along_axis_grad_rule {
  constexpr signature_result operator()(const parallel& x, const parallel& dy) const noexcept {
    return signature::along_axis_grad(x, dy, Axis);
  }
};
struct cross_entropy_rule {
  constexpr signature_result operator()(const parallel& logits, const parallel& labels) const noexcept {
    return signature::cross_entropy(logits, labels);
  }
};
struct embedding_grad_rule {
  constexpr signature_result operator()(const parallel& w, const parallel& ids, const parallel& dy) const noexcept {
    return signature::embedding_grad(w, ids, dy);
  }
};

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

/// dx = `row(dx_row, x_row, dy_row, rows, step)` on every row of tensor axis `axis` of two shards of
/// one shape (a fresh buffer from the pool; `row` writes every element of its row).
template <element T, sbp_type X, sbp_type D, class M, class Row>
aligned_vector<T> along_axis_pair(const global_tensor<T, X, M>& x, const global_tensor<T, D, M>& dy, int axis,
                                  const char* op, Row row) {
  require_same_placement(x, dy, op);
  require_same_shape(x, dy, op);
  if (static_cast<std::size_t>(axis) >= x.shape().size())
    throw error_on<usage_error>(x.where().parent().rank(), op, "axis ", axis, " of a tensor of shape ",
                                to_string(x.shape()));
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
template <element T, sbp_type A, class M>
std::size_t attention_geometry(const global_tensor<T, A, M>& q, std::size_t heads, std::size_t seq, const char* op) {
  const int rank = q.where().parent().rank();
  if (q.shape().size() != 2 || heads == 0 || seq == 0 || q.shape()[1] % heads != 0 || q.shape()[0] % seq != 0)
    throw error_on<usage_error>(rank, op, "q of shape ", to_string(q.shape()), " with ", heads, " heads and ", seq,
                                " positions per sequence: it needs [sequences * ", seq, ", ", heads, " * head width]");
  const std::size_t width = q.shape()[1] / heads;
  // Every mesh rank's box, so that every rank throws alike (ops do not communicate: a check of one's
  // own shard only would leave the other ranks to wait in the next boxing).
  for (int index = 0; index < q.where().size(); ++index) {
    const box b = shard_box(q.shape(), nd_of<A>::value, q.where().shape(), q.where().coords_of(index));
    if (b.offset[0] % seq != 0 || b.extent[0] % seq != 0)
      throw error_on<usage_error>(rank, op, "mesh rank ", q.where().parent_rank(index), " would hold rows [",
                                  b.offset[0], ", ", b.offset[0] + b.extent[0], "), which cut a sequence of ", seq,
                                  " positions: split whole sequences (", q.shape()[0] / seq,
                                  " sequences that the mesh axis divides) or use B");
    if (b.offset[1] % width != 0 || b.extent[1] % width != 0)
      throw error_on<usage_error>(rank, op, "mesh rank ", q.where().parent_rank(index), " would hold columns [",
                                  b.offset[1], ", ", b.offset[1] + b.extent[1], "), which cut a head of width ", width,
                                  ": split whole heads (", heads, " heads that the mesh axis divides) or use B");
  }
  return width;
}

/// The causal softmax of one query row's scores against keys 0..i of one (sequence, head): p[0..i].
template <element T>
void causal_probabilities(const T* q, const T* k, std::size_t i, std::size_t width, std::size_t stride, double scale,
                          std::vector<double>& p) {
  p.assign(i + 1, 0.0);
  double hi = -INFINITY;
  for (std::size_t j = 0; j <= i; ++j) {
    double s = 0;
    for (std::size_t c = 0; c < width; ++c)
      s += double(accumulate_t<T>(q[c])) * double(accumulate_t<T>(k[j * stride + c]));
    p[j] = s * scale;
    hi = std::max(hi, p[j]);
  }
  double sum = 0;
  for (std::size_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - hi));
  for (std::size_t j = 0; j <= i; ++j) p[j] /= sum;
}

}  // namespace detail

/// Transpose of a 2-D tensor; a split moves to the other axis. Local: the shard transposed.
template <element T, sbp_type A, class M>
auto transpose(const global_tensor<T, A, M>& t) {
  constexpr nd_signature_result sig = nd_signature(signature::transpose, nd_of<A>::value);
  if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::transpose_has_no_signature<A>);
    return;
  } else {
    using Out = detail::sbp_type_of<sig.out, one_axis_sbp<A>>;
    if (t.shape().size() != 2)
      throw error_on<usage_error>(t.where().parent().rank(), "transpose", "a tensor of shape ", to_string(t.shape()),
                                  " is not 2-D");
    const shape_t ls = t.local_shape();
    aligned_vector<T> out = t.where().pool().template acquire<T>(t.to_local().size());
    const T* in = t.to_local().data();
    for (std::size_t r = 0; r < ls[0]; ++r)
      for (std::size_t c = 0; c < ls[1]; ++c) out[c * ls[0] + r] = in[r * ls[1] + c];
    return global_tensor<T, Out, M>::adopt(t.where(), shape_t{t.shape()[1], t.shape()[0]}, std::move(out));
  }
}

/// The gradient of gelu: dx = dy (Φ(x) + x φ(x)) element-wise (in double, rounded once).
template <element T, sbp_type X, sbp_type D, class M>
auto gelu_grad(const global_tensor<T, X, M>& x, const global_tensor<T, D, M>& dy) {
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

/// The gradient of layer_norm<Axis>(x, eps) (no gain or bias): along each row x̂ = (x - mean) r with
/// r = 1 / sqrt(var + eps), dx = r (dy - mean(dy) - x̂ mean(dy x̂)) (in double, rounded once).
template <int Axis, element T, sbp_type X, sbp_type D, class M>
auto layer_norm_grad(const global_tensor<T, X, M>& x, const global_tensor<T, D, M>& dy, double eps = 1e-5) {
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
auto softmax_grad(const global_tensor<T, Y, M>& y, const global_tensor<T, D, M>& dy) {
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

/// Causal multi-head self-attention: per sequence of `seq` rows and per head of width d = columns /
/// heads, out_i = sum over j <= i of softmax_j(q_i . k_j / sqrt(d)) v_j (scores in double). q, k, v
/// [sequences * seq, heads * d] share one SBP (table in the header).
/// @throws usage_error naming the rank when the shapes disagree or a shard cuts a sequence or a head.
template <element T, sbp_type Q, sbp_type K, sbp_type V, class M>
auto causal_attention(const global_tensor<T, Q, M>& q, const global_tensor<T, K, M>& k, const global_tensor<T, V, M>& v,
                      std::size_t heads, std::size_t seq) {
  if constexpr (!std::is_same_v<Q, K> || !std::is_same_v<Q, V>) {
    (void)sizeof(diagnostic::causal_attention_needs_q_k_v_alike<Q, K, V>);
    return;
  } else if constexpr (!nd_signature(signature::causal_attention, nd_of<Q>::value).ok) {
    (void)sizeof(diagnostic::causal_attention_has_no_signature<Q>);
    return;
  } else {
    detail::require_same_placement(q, k, "causal_attention");
    detail::require_same_placement(q, v, "causal_attention");
    detail::require_same_shape(q, k, "causal_attention");
    detail::require_same_shape(q, v, "causal_attention");
    const std::size_t width = detail::attention_geometry(q, heads, seq, "causal_attention");
    const shape_t ls = q.local_shape();
    aligned_vector<T> out = q.where().pool().template acquire<T>(q.to_local().size());
    const T *qs = q.to_local().data(), *ks = k.to_local().data(), *vs = v.to_local().data();
    const std::size_t stride = ls[1];
    const double scale = 1.0 / std::sqrt(static_cast<double>(width));
    std::vector<double> p, acc(width);
    for (std::size_t s0 = 0; s0 < ls[0]; s0 += seq)
      for (std::size_t c0 = 0; c0 < stride; c0 += width) {
        const std::size_t base = s0 * stride + c0;
        for (std::size_t i = 0; i < seq; ++i) {
          detail::causal_probabilities(qs + base + i * stride, ks + base, i, width, stride, scale, p);
          std::fill(acc.begin(), acc.end(), 0.0);
          for (std::size_t j = 0; j <= i; ++j)
            for (std::size_t c = 0; c < width; ++c) acc[c] += p[j] * double(accumulate_t<T>(vs[base + j * stride + c]));
          for (std::size_t c = 0; c < width; ++c) out[base + i * stride + c] = T(accumulate_t<T>(acc[c]));
        }
      }
    return global_tensor<T, Q, M>::adopt(q.where(), q.shape(), std::move(out));
  }
}

/// The gradients of causal_attention(q, k, v, heads, seq) for the output gradient dout (laid out as
/// q): the probabilities are recomputed from q and k, then dv = Pᵀ dout, dS = P ∘ (dout vᵀ - rowsum),
/// dq = dS k / sqrt(d), dk = dSᵀ q / sqrt(d), per sequence and head, in double.
template <element T, sbp_type Q, sbp_type K, sbp_type V, sbp_type D, class M>
auto causal_attention_grad(const global_tensor<T, Q, M>& q, const global_tensor<T, K, M>& k,
                           const global_tensor<T, V, M>& v, const global_tensor<T, D, M>& dout, std::size_t heads,
                           std::size_t seq) {
  if constexpr (!std::is_same_v<Q, K> || !std::is_same_v<Q, V> || !std::is_same_v<Q, D>) {
    (void)sizeof(diagnostic::causal_attention_needs_q_k_v_alike<Q, K, V>);
    return;
  } else if constexpr (!nd_signature(signature::causal_attention, nd_of<Q>::value).ok) {
    (void)sizeof(diagnostic::causal_attention_has_no_signature<Q>);
    return;
  } else {
    for (const auto* t : {&k, &v, &dout}) {
      detail::require_same_placement(q, *t, "causal_attention_grad");
      detail::require_same_shape(q, *t, "causal_attention_grad");
    }
    const std::size_t width = detail::attention_geometry(q, heads, seq, "causal_attention_grad");
    const shape_t ls = q.local_shape();
    const std::size_t n = q.to_local().size(), stride = ls[1];
    std::vector<double> dq(n, 0.0), dk(n, 0.0), dv(n, 0.0), p, ds;
    const T *qs = q.to_local().data(), *ks = k.to_local().data(), *vs = v.to_local().data(),
            *gs = dout.to_local().data();
    auto at = [](const T* a, std::size_t i) { return double(accumulate_t<T>(a[i])); };
    const double scale = 1.0 / std::sqrt(static_cast<double>(width));
    for (std::size_t s0 = 0; s0 < ls[0]; s0 += seq)
      for (std::size_t c0 = 0; c0 < stride; c0 += width) {
        const std::size_t base = s0 * stride + c0;
        for (std::size_t i = 0; i < seq; ++i) {
          const std::size_t qi = base + i * stride;
          detail::causal_probabilities(qs + qi, ks + base, i, width, stride, scale, p);
          ds.assign(i + 1, 0.0);
          double dot = 0;
          for (std::size_t j = 0; j <= i; ++j) {
            const std::size_t vj = base + j * stride;
            double dp = 0;
            for (std::size_t c = 0; c < width; ++c) {
              dp += at(gs, qi + c) * at(vs, vj + c);
              dv[vj + c] += p[j] * at(gs, qi + c);
            }
            ds[j] = dp;
            dot += p[j] * dp;
          }
          for (std::size_t j = 0; j <= i; ++j) {
            const std::size_t kj = base + j * stride;
            const double g = p[j] * (ds[j] - dot) * scale;
            for (std::size_t c = 0; c < width; ++c) {
              dq[qi + c] += g * at(ks, kj + c);
              dk[kj + c] += g * at(qs, qi + c);
            }
          }
        }
      }
    auto adopt = [&](const std::vector<double>& g) {
      aligned_vector<T> out = q.where().pool().template acquire<T>(n);
      for (std::size_t i = 0; i < n; ++i) out[i] = T(accumulate_t<T>(g[i]));
      return global_tensor<T, Q, M>::adopt(q.where(), q.shape(), std::move(out));
    };
    return attention_grads<T, Q, M>{adopt(dq), adopt(dk), adopt(dv)};
  }
}

namespace detail {
/// cross_entropy's work on one shard: per row, the loss and (when dlogits is given) its gradient.
template <element T, sbp_type L, sbp_type I, class M>
void cross_entropy_rows(const global_tensor<T, L, M>& logits, const global_tensor<std::int64_t, I, M>& labels,
                        const char* op, T* loss, T* dlogits, double scale) {
  require_same_placement(logits, labels, op);
  const int rank = logits.where().parent().rank();
  if (logits.shape().size() != 2 || labels.shape().size() != 1 || labels.shape()[0] != logits.shape()[0])
    throw error_on<usage_error>(rank, op, "logits ", to_string(logits.shape()), " and labels ",
                                to_string(labels.shape()), ": it needs logits [N, V] and labels [N]");
  const std::size_t classes = logits.shape()[1], rows = labels.to_local().size();
  const T* z = logits.to_local().data();
  for (std::size_t r = 0; r < rows; ++r) {
    const std::int64_t label = labels.to_local()[r];
    if (label < 0 || static_cast<std::size_t>(label) >= classes)
      throw error_on<usage_error>(rank, op, "label ", label, " of row ", labels.my_box().offset[0] + r,
                                  " is outside the ", classes, " classes");
    const T* row = z + r * classes;
    double hi = -INFINITY, sum = 0;
    for (std::size_t c = 0; c < classes; ++c) hi = std::max(hi, double(accumulate_t<T>(row[c])));
    for (std::size_t c = 0; c < classes; ++c) sum += std::exp(double(accumulate_t<T>(row[c])) - hi);
    const auto y = static_cast<std::size_t>(label);
    if (loss != nullptr) loss[r] = T(accumulate_t<T>(std::log(sum) + hi - double(accumulate_t<T>(row[y]))));
    if (dlogits != nullptr)
      for (std::size_t c = 0; c < classes; ++c)
        dlogits[r * classes + c] =
            T(accumulate_t<T>((std::exp(double(accumulate_t<T>(row[c])) - hi) / sum - (c == y ? 1.0 : 0.0)) * scale));
  }
}
}  // namespace detail

/// Softmax cross-entropy per row: loss_i = log sum_c exp(z_ic) - z_i,label_i (in double, rounded
/// once) -> [N], laid out by rows as the logits. The mean over a batch is reduce_sum<0> and a scale.
/// @throws usage_error naming the rank and the row for a label outside [0, V).
template <element T, sbp_type L, sbp_type I, class M>
auto cross_entropy(const global_tensor<T, L, M>& logits, const global_tensor<std::int64_t, I, M>& labels) {
  if constexpr (!detail::binary_ok<detail::cross_entropy_rule, diagnostic::cross_entropy_has_no_signature, L, I>()) {
    return;
  } else {
    using Out = detail::binary_out<detail::cross_entropy_rule, L, I>;
    aligned_vector<T> loss = logits.where().pool().template acquire<T>(labels.to_local().size());
    detail::cross_entropy_rows(logits, labels, "cross_entropy", loss.data(), static_cast<T*>(nullptr), 1.0);
    return global_tensor<T, Out, M>::adopt(logits.where(), shape_t{logits.shape()[0]}, std::move(loss));
  }
}

/// The gradient of scale * sum_i cross_entropy_i: scale (softmax(z_i) - onehot(label_i)) -> [N, V]
/// (scale = 1 / batch for the mean).
template <element T, sbp_type L, sbp_type I, class M>
auto cross_entropy_grad(const global_tensor<T, L, M>& logits, const global_tensor<std::int64_t, I, M>& labels,
                        double scale) {
  if constexpr (!detail::binary_ok<detail::cross_entropy_rule, diagnostic::cross_entropy_has_no_signature, L, I>()) {
    return;
  } else {
    using Out = detail::binary_out<detail::cross_entropy_rule, L, I>;
    aligned_vector<T> grad = logits.where().pool().template acquire<T>(logits.to_local().size());
    detail::cross_entropy_rows(logits, labels, "cross_entropy_grad", static_cast<T*>(nullptr), grad.data(), scale);
    return global_tensor<T, Out, M>::adopt(logits.where(), logits.shape(), std::move(grad));
  }
}

/// The weight gradient of embedding(weight, ids) for the output gradient dy [N, D]: dW [V, D], row
/// ids_i accumulating dy_i (ids in order), laid out as the weight's SBP says (table in the header).
/// @throws usage_error for an id outside [0, V) or shapes that disagree.
template <element T, sbp_type W, sbp_type I, sbp_type D, class M>
auto embedding_grad(const global_tensor<T, W, M>& weight, const global_tensor<std::int64_t, I, M>& ids,
                    const global_tensor<T, D, M>& dy) {
  constexpr nd_signature_result sig =
      nd_signature(detail::embedding_grad_rule{}, nd_of<W>::value, nd_of<I>::value, nd_of<D>::value);
  if constexpr (nd_of<W>::mesh_rank != nd_of<I>::mesh_rank || nd_of<W>::mesh_rank != nd_of<D>::mesh_rank) {
    (void)sizeof(diagnostic::operands_on_meshes_of_different_rank<W, D>);
    return;
  } else if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::embedding_grad_has_no_signature<W, I, D>);
    return;
  } else {
    using Out = detail::sbp_type_of<sig.out, one_axis_sbp<W> && one_axis_sbp<I> && one_axis_sbp<D>>;
    detail::require_same_placement(weight, ids, "embedding_grad");
    detail::require_same_placement(weight, dy, "embedding_grad");
    const int rank = weight.where().parent().rank();
    if (weight.shape().size() != 2 || ids.shape().size() != 1 || dy.shape().size() != 2 ||
        dy.shape()[0] != ids.shape()[0] || dy.shape()[1] != weight.shape()[1])
      throw error_on<usage_error>(rank, "embedding_grad", "weight ", to_string(weight.shape()), ", ids ",
                                  to_string(ids.shape()), " and dy ", to_string(dy.shape()),
                                  ": it needs weight [V, D], ids [N] and dy [N, D]");
    // In every row of the table the gradient's shard has the weight's local shape.
    const shape_t ls = weight.local_shape();
    aligned_vector<T> out = weight.where().pool().template acquire<T>(ls[0] * ls[1], T{});
    if (weight.where().contains_me() && !out.empty()) {
      const std::size_t first = weight.my_box().offset[0], cols = ls[1];
      if (dy.local_shape()[1] != cols || dy.local_shape()[0] != ids.to_local().size())
        throw error_on<usage_error>(rank, "embedding_grad", "dy's shard ", to_string(dy.local_shape()),
                                    " does not match ", ids.to_local().size(), " ids of rows of ", cols, " columns");
      const T* g = dy.to_local().data();
      const auto local_ids = ids.to_local();
      for (std::size_t i = 0; i < local_ids.size(); ++i) {
        const std::int64_t id = local_ids[i];
        if (id < 0 || static_cast<std::size_t>(id) >= weight.shape()[0])
          throw error_on<usage_error>(rank, "embedding_grad", "id ", id, " is outside the vocabulary of ",
                                      weight.shape()[0], " rows");
        const auto row = static_cast<std::size_t>(id);
        if (row < first || row >= first + ls[0]) continue;
        T* dst = out.data() + (row - first) * cols;
        for (std::size_t c = 0; c < cols; ++c) dst[c] = T(accumulate_t<T>(dst[c]) + accumulate_t<T>(g[i * cols + c]));
      }
    }
    return global_tensor<T, Out, M>::adopt(weight.where(), weight.shape(), std::move(out));
  }
}

}  // namespace flexpar::sbp
