// flexpar/sbp/ops/linear_algebra.hpp — products, transposes and row lookups on global tensors of
// any memory (tables in signature.hpp; a combination without a signature is a compile error naming a
// boxing that fixes it):
//
//   matmul(a [m,k], b [k,n])      (S(0), B) -> S(0)   (B, S(1)) -> S(1)   (S(1), S(0)) -> P(sum)
//                                 (P(sum), B) -> P(sum)   (B, P(sum)) -> P(sum)   (B, B) -> B
//   transpose(t [m,n]) -> [n,m]   S(0) -> S(1)   S(1) -> S(0)   B -> B   P -> P
//   embedding(w [V,D], ids [N])   (S(0), B) -> P(sum)   (S(1), B) -> S(1)   (B, S(0)) -> S(0)   (B, B) -> B
//   embedding_grad(w [V,D], ids [N], dy [N,D]) -> dW [V,D]                                         (host)
//                                 (S(0), B, B) -> S(0)   (S(1), B, S(1)) -> S(1)
//                                 (B, S(0), S(0)) -> P(sum)   (B, B, B) -> B   (B, B, P(sum)) -> P(sum)
//
// The local pass is the backend's kernel: one GEMM (the BLAS; cuBLAS in f32 or bf16 on a GPU), a
// transpose, a lookup whose ids are all checked. Ops never communicate: boxing does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include <flexpar/sbp/ops/common.hpp>

namespace flexpar::sbp {

/// The output SBP type of matmul on static SBPs (void when there is no signature).
template <sbp_type A, sbp_type B>
using matmul_sbp = detail::sbp_type_of<nd_signature(detail::matmul_rule{}, nd_of<A>::value, nd_of<B>::value).out,
                                       detail::both_one_axis<A, B>>;

namespace detail {
/// c [m, n] = a [m, k] b [k, n] on shards in memory M, c from the placement's pool (the static and the
/// run-time matmul's local pass).
template <class M, class T, class Where>
typename backend<M>::template shard<T> local_matmul(const Where& where, std::size_t m, std::size_t n, std::size_t k,
                                                    typename backend<M>::template span<const T> a,
                                                    typename backend<M>::template span<const T> b) {
  auto c = backend<M>::template acquire<T>(where, m * n);  // the kernel writes every element
  backend<M>::template gemm<T>(where, m, n, k, a, b, backend<M>::elements(c));
  return c;
}
}  // namespace detail

/// Matrix product of a [m, k] and b [k, n] (signatures in the header). Local: one GEMM on the shards.
template <element T, sbp_type A, sbp_type B, class M>
auto matmul(const global_tensor<T, A, M>& a, const global_tensor<T, B, M>& b) {
  if constexpr (!detail::binary_ok<detail::matmul_rule, diagnostic::matmul_has_no_signature, A, B>()) {
    return;
  } else {
    using result = global_tensor<T, detail::binary_out<detail::matmul_rule, A, B>, M>;
    const int rank = a.where().parent().rank();
    detail::require_same_placement(a, b, "matmul");
    if (a.shape().size() != 2 || b.shape().size() != 2 || a.shape()[1] != b.shape()[0])
      throw error_on<usage_error>(rank, "matmul", "shapes ", to_string(a.shape()), " x ", to_string(b.shape()),
                                  " do not multiply ([m, k] x [k, n])");
    const shape_t out_shape{a.shape()[0], b.shape()[1]};
    if (!a.where().contains_me()) return result::adopt(a.where(), out_shape, {});
    const shape_t la = a.local_shape(), lb = b.local_shape();
    if (la[1] != lb[0])
      throw error_on<usage_error>(rank, "matmul", "local shards ", to_string(la), " x ", to_string(lb),
                                  " do not multiply");
    return result::adopt(a.where(), out_shape,
                         detail::local_matmul<M, T>(a.where(), la[0], lb[1], la[1], a.to_local(), b.to_local()));
  }
}

/// Transpose of a 2-D tensor; a split moves to the other axis. Local: the shard transposed.
template <element T, sbp_type A, class M>
auto transpose(const global_tensor<T, A, M>& t) {
  constexpr nd_signature_result sig = nd_signature(signature::transpose, nd_of<A>::value);
  if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::transpose_has_no_signature<A>);
    return;
  } else {
    using result = global_tensor<T, detail::sbp_type_of<sig.out, one_axis_sbp<A>>, M>;
    if (t.shape().size() != 2)
      throw error_on<usage_error>(t.where().parent().rank(), "transpose", "a tensor of shape ", to_string(t.shape()),
                                  " is not 2-D");
    const shape_t ls = t.local_shape();
    typename result::shard_type out = result::acquire(t.where(), t.to_local().size());
    backend<M>::transpose(t.where(), t.to_local(), backend<M>::elements(out), ls[0], ls[1]);
    return result::adopt(t.where(), shape_t{t.shape()[1], t.shape()[0]}, std::move(out));
  }
}

/// Row lookup: out[i, :] = weight[ids[i], :]. With the weight split by rows (S(0)) each rank looks up
/// the ids in its rows and writes zeros for the others: the model-parallel embedding, P(sum).
/// @throws usage_error naming the first id outside [0, V) and its position among my ids.
template <element T, sbp_type W, sbp_type I, class M>
auto embedding(const global_tensor<T, W, M>& weight, const global_tensor<std::int64_t, I, M>& ids) {
  if constexpr (!detail::binary_ok<detail::embedding_rule, diagnostic::embedding_has_no_signature, W, I>()) {
    return;
  } else {
    using result = global_tensor<T, detail::binary_out<detail::embedding_rule, W, I>, M>;
    detail::require_same_placement(weight, ids, "embedding");
    const int rank = weight.where().parent().rank();
    if (weight.shape().size() != 2 || ids.shape().size() != 1)
      throw error_on<usage_error>(rank, "embedding", "weight ", to_string(weight.shape()), " and ids ",
                                  to_string(ids.shape()), ": it needs weight [V, D] and ids [N]");
    const shape_t out_shape{ids.shape()[0], weight.shape()[1]};
    if (!weight.where().contains_me()) return result::adopt(weight.where(), out_shape, {});
    const box rows = weight.my_box();
    const std::size_t n = ids.to_local().size(), cols = rows.extent[1];
    typename result::shard_type out = result::acquire(weight.where(), n * cols);
    if (n > 0) {
      const std::optional<std::size_t> bad =
          backend<M>::embedding(weight.where(), weight.to_local(), ids.to_local(), backend<M>::elements(out), cols,
                                static_cast<std::int64_t>(rows.offset[0]), static_cast<std::int64_t>(rows.extent[0]),
                                static_cast<std::int64_t>(weight.shape()[0]));
      if (bad) {
        backend<M>::give_back(weight.where(), std::move(out));
        throw error_on<usage_error>(rank, "embedding", "id ", backend<M>::read(weight.where(), ids.to_local(), *bad),
                                    " (position ", *bad, " of my ids) is outside the vocabulary of ", weight.shape()[0],
                                    " rows");
      }
    }
    return result::adopt(weight.where(), out_shape, std::move(out));
  }
}

/// The weight gradient of embedding(weight, ids) for the output gradient dy [N, D]: dW [V, D], row
/// ids_i accumulating dy_i (ids in order), laid out as the weight's SBP says (table in the header).
/// @throws usage_error for an id outside [0, V) or shapes that disagree.
template <element T, sbp_type W, sbp_type I, sbp_type D, class M>
requires(backend<M>::host_memory) auto embedding_grad(const global_tensor<T, W, M>& weight,
                                                      const global_tensor<std::int64_t, I, M>& ids,
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
