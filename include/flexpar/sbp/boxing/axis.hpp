// flexpar/sbp/boxing/axis.hpp — the boxing of one mesh axis: one overload of box_axis per pair
// (From, To), each a script of named steps over the mesh-axis group (axis_view):
//
//   | from \ to | B                     | S(j)                          | P(op)                    |
//   |-----------|-----------------------|-------------------------------|--------------------------|
//   | B         | free                  | slice my rows (local)         | keep at coord 0, zeros   |
//   |           |                       |                               | elsewhere (sum); keep    |
//   |           |                       |                               | everywhere (max, min)    |
//   | S(i)      | allgather_v (inner i: | i == j: free; else            | pad with the op's        |
//   |           | placed, unpacked      | pairwise alltoall, packing    | identity (local)         |
//   |           | through cache slots)  | folded into its steps         |                          |
//   | P(op)     | allreduce(op)         | pack -> reduce_scatter_v(op,  | same op: free; else via B|
//   |           |                       | result at the front)          |                          |
//
// Costs (ring collectives, n = bytes the mesh-axis group holds jointly, p = its ranks):
//   allreduce 2(p-1)/p n, reduce_scatter and allgather (p-1)/p n, alltoall (p-1)/p n / p; the local
//   transforms move no bytes on the wire (boxing_cost counts what they copy as copy_bytes).
// Each transform calls public collectives only: the plain ones of collective.hpp, allgather_v_placed
// and alltoall_v_placed across nodes, the round exchange of collective/shared_memory_rounds.hpp on
// one node when its blocks are strided (boxing/strided_rounds.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/sbp/boxing/equal_blocks.hpp>
#include <flexpar/sbp/boxing/strided_copy.hpp>
#include <flexpar/sbp/boxing/strided_rounds.hpp>
#include <flexpar/sbp/global_tensor.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/sbp/parallel.hpp>
#include <flexpar/sbp/placement.hpp>

namespace flexpar::sbp {

/// X -> X: nothing moves (any memory's view).
template <class View, one_axis_sbp X>
void box_axis(View&, X, X) {}

/// P(op) -> B: allreduce(op) of my full-shape summand, in place in the tensor's own buffer (any
/// memory's view).
template <class View, reduce_op Op>
void box_axis(View& v, partial<Op>, broadcast) {
  v.allreduce(v.elements(v.local), Op);
}

/// P(op) -> S(i), S(i) -> B, S(i) -> S(j) on a view of another memory than the host's: the scripts of
/// equal blocks (boxing/equal_blocks.hpp). The host's overloads below are more specialized.
template <class View, reduce_op Op, int I>
void box_axis(View& v, partial<Op>, split<I>) {
  equal_blocks::partial_to_split(v, Op, I);
}
/// See the P(op) -> S(i) overload for any view.
template <class View, int I>
void box_axis(View& v, split<I>, broadcast) {
  equal_blocks::split_to_broadcast(v, I);
}
/// See the P(op) -> S(i) overload for any view.
template <class View, int I, int J>
requires(I != J) void box_axis(View& v, split<I>, split<J>) { equal_blocks::split_to_split(v, I, J); }

/// P(op) -> S(i): reduce_scatter_v(op) in place with the result at the front of the buffer (its last
/// reduction writes my block there: the ring's last step, or each shared-memory round's first
/// reduction on one node), then the buffer is cut down to my block: nothing moves beyond the bare
/// reduce-scatter. When axis i is not the outermost, the destinations' rows are strided in my
/// summand: on one node the shared-memory rounds pack them straight from where they lie
/// (detail::reduce_scatter_strided_rows); across nodes (or with v.stage.path transport) the rows of
/// each destination are first packed into one contiguous block (one pass into a pooled buffer,
/// which the ring then works in).
template <element T, reduce_op Op, int I>
void box_axis(axis_view<T>& v, partial<Op>, split<I>) {
  const detail::around a(v.group_shape, I);
  const auto parts = detail::parts_of(a.rows, v.comm.size());
  std::vector<std::size_t> counts(parts.size());
  for (std::size_t j = 0; j < parts.size(); ++j) counts[j] = a.outer * parts[j].count * a.inner;
  if (a.outer != 1 && uses_shared_memory(v.comm, v.stage, "boxing P -> S(i)")) {
    detail::reduce_scatter_strided_rows<T>(v, a, parts, counts, Op);
    v.local.resize(counts[static_cast<std::size_t>(v.comm.rank())]);  // my block is the front
    return;
  }
  if (a.outer != 1 && v.comm.size() > 1) {  // one rank: my block is all of it, in its order already
    aligned_vector<T> packed = v.pool.template acquire<T>(v.local.size());
    counts = detail::pack_rows<T>(v.local, a, parts, packed);
    v.pool.give_back(std::move(v.local));
    v.local = std::move(packed);
  }
  const std::span<T> mine =
      reduce_scatter_v(v.comm, std::span<T>(v.local), std::span<const std::size_t>(counts), Op, result_at::front);
  v.local.resize(mine.size());  // my block is the front: shrinking keeps the buffer
}

/// S(i) -> B: allgather_v of every shard into a pooled buffer, the result. When axis i is not the
/// outermost, a shard's rows are strided in the result: on one node the shared-memory rounds write
/// the result row by row (detail::allgather_rows_shared_memory); otherwise the placed allgather
/// streams each chunk through a cache-sized slot and unpacks it into the result at once (v.stage),
/// instead of gathering into a full-size staging buffer and unpacking all n bytes after.
template <element T, int I>
void box_axis(axis_view<T>& v, split<I>, broadcast) {
  const detail::around a(v.group_shape, I);
  const auto parts = detail::parts_of(a.rows, v.comm.size());
  std::vector<std::size_t> counts(parts.size());
  for (std::size_t j = 0; j < parts.size(); ++j) counts[j] = a.outer * parts[j].count * a.inner;
  aligned_vector<T> gathered = v.pool.template acquire<T>(elements_of(v.group_shape));
  if (a.outer == 1 && v.stage.path == staged_path::automatic) {  // the bare allgather_v, by its own choice
    allgather_v(v.comm, std::span<const T>(v.local), std::span<T>(gathered), std::span<const std::size_t>(counts));
  } else if (v.comm.size() > 1 && uses_shared_memory(v.comm, v.stage, "boxing S(i) -> B") &&
             detail::allgather_rows_shared_memory<T>(v, a, parts, std::span<T>(gathered))) {
    // written row by row through the segment
  } else {
    const std::span<T> out(gathered);
    allgather_v_placed<T>(
        v.comm, std::span<const T>(v.local), std::span<const std::size_t>(counts),
        [&](int block, std::size_t offset, std::span<const T> piece) {
          detail::unpack_piece<T>(piece, a, parts[static_cast<std::size_t>(block)], offset, out,
                                  v.comm.settings().streaming_min_bytes);
        },
        v.stage);
  }
  v.pool.give_back(std::move(v.local));
  v.local = std::move(gathered);
}

/// S(i) -> S(j), i != j: a pairwise alltoall (the script of flexpar's alltoall_v, with the packing
/// folded into its steps). Block k of mine is my rows of i and rank k's rows of j; I receive rank
/// k's rows of i and my rows of j.
///   step 0: my own block goes straight from my shard to its place in the result (one strided copy,
///           where the bare alltoall copies it too);
///   step s: to rank me+s, from rank me-s: pack the block for the peer (unless it is contiguous in
///           my shard: then send it from there), receive the peer's block straight into the result
///           (unless it is strided there: then into a staging block, unpacked at once).
/// So each element is copied at most once beyond what the bare alltoall moves, and only where the
/// layout is strided. Every wait has the communicator's deadline.
template <element T, int I, int J>
requires(I != J) void box_axis(axis_view<T>& v, split<I>, split<J>) {
  const int p = v.comm.size(), me = v.comm.rank();
  const auto um = static_cast<std::size_t>(me);
  const auto rows_i = detail::parts_of(v.group_shape[I], p), rows_j = detail::parts_of(v.group_shape[J], p);
  const shape_t mine_now = with_extent(v.group_shape, I, rows_i[um].count);
  const shape_t mine_next = with_extent(v.group_shape, J, rows_j[um].count);
  const detail::around send_view(mine_now, J), receive_view(mine_next, I);
  const bool pack = send_view.outer != 1, unpack = receive_view.outer != 1;
  const shape_t zero(v.group_shape.size(), 0);
  auto block_of_mine = [&](std::size_t k) {  // my rows of i, rank k's rows of j, in my shard
    shape_t at = zero;
    at[J] = rows_j[k].offset;
    return box{at, with_extent(mine_now, J, rows_j[k].count)};
  };
  auto block_of_next = [&](std::size_t k) {  // rank k's rows of i, my rows of j, in the result
    shape_t at = zero;
    at[I] = rows_i[k].offset;
    return box{at, with_extent(mine_next, I, rows_i[k].count)};
  };
  auto flat = [](const box& b, const shape_t& whole) {  // element offset of a contiguous block
    const shape_t st = strides_of(whole);
    std::size_t at = 0;
    for (std::size_t i = 0; i < st.size(); ++i) at += b.offset[i] * st[i];
    return elements_of(b.extent) == 0 ? 0 : at;
  };

  aligned_vector<T> next = v.pool.template acquire<T>(elements_of(mine_next));
  if (uses_shared_memory(v.comm, v.stage, "boxing S(i) -> S(j)")) {
    detail::alltoall_in_rounds<T>(v, std::size_t{I}, rows_i, std::size_t{J}, rows_j, send_view, receive_view, next);
    v.pool.give_back(std::move(v.local));
    v.local = std::move(next);
    return;
  }
  aligned_vector<T> out_stage = pack ? v.pool.template acquire<T>(v.local.size()) : aligned_vector<T>{};
  aligned_vector<T> in_stage = unpack ? v.pool.template acquire<T>(next.size()) : aligned_vector<T>{};
  // step 0
  const box own = block_of_mine(um);
  copy_box<T>(v.local, mine_now, own.offset, next, mine_next, block_of_next(um).offset, own.extent);
  // steps 1 .. p-1: the block for rank me+s packed unless it is contiguous in my shard; rank me-s's
  // block received straight into the result unless it is strided there
  alltoall_v_placed<T>(
      v.comm,
      [&](int to) {
        const box out_block = block_of_mine(static_cast<std::size_t>(to));
        const std::size_t out_n = out_block.elements();
        if (!pack) return std::span<const T>(v.local).subspan(flat(out_block, mine_now), out_n);
        const std::span<T> staged = std::span<T>(out_stage).first(out_n);
        copy_box<T>(v.local, mine_now, out_block.offset, staged, out_block.extent, zero, out_block.extent);
        return std::span<const T>(staged);
      },
      [&](int from) {
        const box in_block = block_of_next(static_cast<std::size_t>(from));
        const std::size_t in_n = in_block.elements();
        return unpack ? std::span<T>(in_stage).first(in_n)
                      : std::span<T>(next).subspan(flat(in_block, mine_next), in_n);
      },
      [&](int from, std::span<const T> landed) {
        if (!unpack) return;
        const box in_block = block_of_next(static_cast<std::size_t>(from));
        copy_box<T>(landed, in_block.extent, zero, next, mine_next, in_block.offset, in_block.extent);
      });
  v.pool.give_back(std::move(out_stage));
  v.pool.give_back(std::move(in_stage));
  v.pool.give_back(std::move(v.local));
  v.local = std::move(next);
}

/// B -> S(i): keep my rows (local); in the same buffer when axis i is the outermost and the view can
/// keep them there (the host moves them to the front; a device keeps them when they are the front).
template <class View, int I>
void box_axis(View& v, broadcast, split<I>) {
  const part mine = balanced_part(v.group_shape[I], v.size(), v.rank());
  const detail::around a(v.group_shape, I);
  if (a.outer == 1 && v.keep_range(mine.offset * a.inner, mine.count * a.inner)) return;
  const shape_t extent = with_extent(v.group_shape, I, mine.count);
  shape_t from(v.group_shape.size(), 0);
  from[I] = mine.offset;
  typename View::shard out = v.acquire(elements_of(extent));
  v.copy_box(v.elements(v.local), v.group_shape, from, v.elements(out), extent, shape_t(extent.size(), 0), extent);
  v.replace(std::move(out));
}

/// B -> P(op): sum keeps the values at coordinate 0 and zeros elsewhere; max and min keep them
/// everywhere (idempotent). Local, in place.
template <class View, reduce_op Op>
void box_axis(View& v, broadcast, partial<Op>) {
  if (Op == reduce_op::sum && v.rank() != 0) v.fill(v.elements(v.local), {});
}

/// S(i) -> P(op): my rows in a full-shape tensor of the op's identity (local).
template <class View, int I, reduce_op Op>
void box_axis(View& v, split<I>, partial<Op>) {
  using T = typename View::value_type;
  const part mine = balanced_part(v.group_shape[I], v.size(), v.rank());
  const shape_t extent = with_extent(v.group_shape, I, mine.count);
  shape_t to(v.group_shape.size(), 0);
  to[I] = mine.offset;
  typename View::shard out = v.acquire(elements_of(v.group_shape));
  v.fill(v.elements(out), detail::partial_identity<T>(Op));
  v.copy_box(v.elements(v.local), extent, shape_t(extent.size(), 0), v.elements(out), v.group_shape, to, extent);
  v.replace(std::move(out));
}

/// P(a) -> P(b), a != b: no one-step transform; routes go through B (this overload is reached only by
/// a hand-made dynamic route).
template <class View, reduce_op A, reduce_op B>
requires(A != B) void box_axis(View& v, partial<A>, partial<B>) {
  throw error_on<usage_error>(v.rank(), "box_axis", "P(", name_of(A), ") -> P(", name_of(B),
                              ") has no one-step transform; box through B");
}

}  // namespace flexpar::sbp
