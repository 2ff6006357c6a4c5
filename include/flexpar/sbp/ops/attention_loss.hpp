// flexpar/sbp/ops/attention_loss.hpp — a transformer's attention and loss on global tensors, with
// their backward passes (tables in signature.hpp; host memory: their device kernels are the GPU GPT's):
//
//   causal_attention(q, k, v, heads, seq)   q, k, v [N, heads * d] laid out alike, N = sequences * seq:
//                                           S(0) -> S(0) (whole sequences)  S(1) -> S(1) (whole heads)  B -> B
//   causal_attention_grad(q, k, v, dout, heads, seq) -> {dq, dk, dv}        the same table
//   cross_entropy(logits [N,V], labels [N]) -> loss per row [N]   (S(0), S(0)) -> S(0)   (B, B) -> B
//   cross_entropy_grad(logits, labels, scale) -> [N,V]            the same table
//
// causal_attention is one op (the softmax of a query's scores over the keys at or before it, then
// the weighted values, per sequence and head) rather than a batched matmul, a mask and a softmax:
// the scores never leave the op, and its two splits are the two that need no communication. Every
// (sequence, head) is computed alike in every layout, so a split run equals the whole run bit for bit.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <flexpar/sbp/ops/common.hpp>

namespace flexpar::sbp {

/// The three gradients of causal_attention, laid out as its inputs.
template <element T, sbp_type Sbp, class M = host>
struct attention_grads {
  global_tensor<T, Sbp, M> dq;  ///< d(loss)/d(q)
  global_tensor<T, Sbp, M> dk;  ///< d(loss)/d(k)
  global_tensor<T, Sbp, M> dv;  ///< d(loss)/d(v)
};

namespace detail {

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

/// Causal multi-head self-attention: per sequence of `seq` rows and per head of width d = columns /
/// heads, out_i = sum over j <= i of softmax_j(q_i . k_j / sqrt(d)) v_j (scores in double). q, k, v
/// [sequences * seq, heads * d] share one SBP (table in the header).
/// @throws usage_error naming the rank when the shapes disagree or a shard cuts a sequence or a head.
template <element T, sbp_type Q, sbp_type K, sbp_type V, class M>
requires(backend<M>::host_memory) auto causal_attention(const global_tensor<T, Q, M>& q,
                                                        const global_tensor<T, K, M>& k,
                                                        const global_tensor<T, V, M>& v, std::size_t heads,
                                                        std::size_t seq) {
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
requires(backend<M>::host_memory) auto causal_attention_grad(const global_tensor<T, Q, M>& q,
                                                             const global_tensor<T, K, M>& k,
                                                             const global_tensor<T, V, M>& v,
                                                             const global_tensor<T, D, M>& dout, std::size_t heads,
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
requires(backend<M>::host_memory) auto cross_entropy(const global_tensor<T, L, M>& logits,
                                                     const global_tensor<std::int64_t, I, M>& labels) {
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
requires(backend<M>::host_memory) auto cross_entropy_grad(const global_tensor<T, L, M>& logits,
                                                          const global_tensor<std::int64_t, I, M>& labels,
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

}  // namespace flexpar::sbp
