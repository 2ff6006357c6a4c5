// flexpar/sbp/boxing/equal_blocks.hpp — the boxing of one mesh axis by collectives of equal blocks,
// for any memory whose axis view has them (the view's allreduce, reduce_scatter, allgather and
// alltoall take one block per rank, as NCCL's do). An uneven split pads every rank's block to the
// largest one; the padding is packed and dropped locally and never reaches a result.
//
//   P(op) -> S(i)   the destinations' blocks packed one after another (nothing to pack when they are
//                   equal and outermost), one reduce_scatter, my block is the result
//   S(i) -> B       my shard padded to the common block, one allgather, each block placed (nothing to
//                   place when they are equal and outermost)
//   S(i) -> S(j)    block k of mine packed at k x block, one alltoall, rank k's block placed at its
//                   rows of i
//
// The device boxing runs these (flexpar/cuda/sbp.hpp); the host has its own overloads in axis.hpp
// (uneven collectives, placed exchanges, the shared-memory rounds) and runs these only in the tests,
// which hold both to the same oracle on host memory.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include <flexpar/sbp/boxing/strided_copy.hpp>
#include <flexpar/sbp/layout.hpp>

namespace flexpar::sbp::equal_blocks {

/// The box of block `k` along `axis` of `shape`.
inline box axis_block(const shape_t& shape, std::size_t axis, const part& k) {
  shape_t at(shape.size(), 0);
  at[axis] = k.offset;
  return box{at, with_extent(shape, axis, k.count)};
}

/// The largest block when `shape`'s axis is cut by `parts` (every rank's padded block size).
inline std::size_t largest_block(const shape_t& shape, std::size_t axis, const std::vector<part>& parts) {
  std::size_t most = 0;
  for (const part& k : parts) most = std::max(most, k.count);
  return elements_of(with_extent(shape, axis, most));
}

/// True when the blocks along `axis` are equal and lie one after another in row-major order.
inline bool contiguous_equal_blocks(const shape_t& shape, std::size_t axis, const std::vector<part>& parts) {
  for (const part& k : parts)
    if (k.count != parts.front().count) return false;
  return detail::around(shape, axis).outer == 1;
}

/// P(op) -> S(i) (header above).
template <class View>
void partial_to_split(View& v, reduce_op op, std::size_t i) {
  const int p = v.size();
  if (p == 1) return;
  const auto parts = detail::parts_of(v.group_shape[i], p);
  const std::size_t block = largest_block(v.group_shape, i, parts);
  const shape_t zero(v.group_shape.size(), 0);
  typename View::shard packed{};
  const bool pack = !contiguous_equal_blocks(v.group_shape, i, parts);
  if (pack) {
    packed = v.acquire(block * static_cast<std::size_t>(p));
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const box b = axis_block(v.group_shape, i, parts[k]);
      v.copy_box(v.elements(v.local), v.group_shape, b.offset, v.elements(packed).subspan(k * block, b.elements()),
                 b.extent, zero, b.extent);
    }
  }
  typename View::shard mine = v.acquire(block);
  v.reduce_scatter(pack ? v.elements(packed) : v.elements(v.local), v.elements(mine), op);
  View::truncate(mine, axis_block(v.group_shape, i, parts[static_cast<std::size_t>(v.rank())]).elements());
  v.recycle(std::move(packed));
  v.replace(std::move(mine));
}

/// S(i) -> B (header above).
template <class View>
void split_to_broadcast(View& v, std::size_t i) {
  const int p = v.size();
  const auto parts = detail::parts_of(v.group_shape[i], p);
  const std::size_t block = largest_block(v.group_shape, i, parts);
  const std::size_t mine = v.elements(v.local).size();
  typename View::shard send{};
  if (mine != block) {  // padded to the common block size
    send = v.acquire(block);
    v.copy(v.elements(send).first(mine), v.elements(v.local));
  }
  typename View::shard gathered = v.acquire(block * static_cast<std::size_t>(p));
  v.allgather(mine != block ? v.elements(send) : v.elements(v.local), v.elements(gathered));
  v.recycle(std::move(send));
  if (contiguous_equal_blocks(v.group_shape, i, parts)) {
    v.replace(std::move(gathered));
    return;
  }
  typename View::shard out = v.acquire(elements_of(v.group_shape));
  const shape_t zero(v.group_shape.size(), 0);
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const box b = axis_block(v.group_shape, i, parts[k]);
    v.copy_box(v.elements(gathered).subspan(k * block, b.elements()), b.extent, zero, v.elements(out), v.group_shape,
               b.offset, b.extent);
  }
  v.recycle(std::move(gathered));
  v.replace(std::move(out));
}

/// S(i) -> S(j), i != j (header above).
template <class View>
void split_to_split(View& v, std::size_t i, std::size_t j) {
  const int p = v.size();
  const auto me = static_cast<std::size_t>(v.rank());
  const auto rows_i = detail::parts_of(v.group_shape[i], p), rows_j = detail::parts_of(v.group_shape[j], p);
  const shape_t mine_now = with_extent(v.group_shape, i, rows_i[me].count);
  const shape_t mine_next = with_extent(v.group_shape, j, rows_j[me].count);
  std::size_t most_i = 0, most_j = 0;
  for (const part& k : rows_i) most_i = std::max(most_i, k.count);
  for (const part& k : rows_j) most_j = std::max(most_j, k.count);
  const std::size_t block = elements_of(with_extent(with_extent(v.group_shape, i, most_i), j, most_j));
  const shape_t zero(v.group_shape.size(), 0);
  typename View::shard send = v.acquire(block * static_cast<std::size_t>(p));
  for (std::size_t k = 0; k < rows_j.size(); ++k) {
    const box b = axis_block(mine_now, j, rows_j[k]);
    v.copy_box(v.elements(v.local), mine_now, b.offset, v.elements(send).subspan(k * block, b.elements()), b.extent,
               zero, b.extent);
  }
  typename View::shard received = v.acquire(block * static_cast<std::size_t>(p));
  v.alltoall(v.elements(send), v.elements(received));
  v.recycle(std::move(send));
  typename View::shard next = v.acquire(elements_of(mine_next));
  for (std::size_t k = 0; k < rows_i.size(); ++k) {
    const box b = axis_block(mine_next, i, rows_i[k]);
    v.copy_box(v.elements(received).subspan(k * block, b.elements()), b.extent, zero, v.elements(next), mine_next,
               b.offset, b.extent);
  }
  v.recycle(std::move(received));
  v.replace(std::move(next));
}

}  // namespace flexpar::sbp::equal_blocks
