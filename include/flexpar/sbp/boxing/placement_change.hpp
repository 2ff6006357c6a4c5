// flexpar/sbp/boxing/placement_change.hpp — to<NewSbp>(t, placement): the tensor moves to another
// mesh of ranks of the same parent communicator (n -> m ranks, 1 -> n, n -> 1, another mesh shape)
// and takes the new SBP there. Script: partial entries -> B on the source mesh; one alltoall_v over
// the parent in which each shard that is not a broadcast copy sends each destination rank the
// intersection of their boxes; then B -> P on the destination where the new SBP is partial.
#pragma once

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/sbp/boxing/same_placement.hpp>
#include <flexpar/sbp/global_tensor.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/sbp/placement.hpp>

namespace flexpar::sbp {

namespace detail {
/// `s` with every partial entry replaced by B.
constexpr nd_parallel without_partial(nd_parallel s) noexcept {
  for (std::size_t d = 0; d < s.rank; ++d)
    if (s[d].is_partial()) s[d] = parallel::B();
  return s;
}

}  // namespace detail

/// Placement change: the tensor moves from its mesh to `dest` (another set of ranks of the same parent
/// communicator, another mesh shape or rank: n -> m ranks, 1 -> n, n -> 1) and takes the SBP To there.
/// Collective over the parent communicator (every parent rank calls it, also ranks in neither mesh).
/// Script: partial entries -> B on the source mesh (allreduce); one alltoall_v over the parent in
/// which each source shard that is not a broadcast copy sends each destination rank the intersection
/// of their boxes; then B -> P on the destination where To is partial (local).
///
/// In another memory than the host's (a device tensor and a device placement `dest`), the partial
/// entries are reduced on the source mesh by its own boxing; the pieces then go through host memory (a
/// download, the host's one alltoall_v over the parent, an upload: a device's communicators are per
/// mesh axis, none spans both meshes); B -> P where To is partial is local on the destination.
template <sbp_type To, element T, sbp_type From, class M, class Dest>
requires(std::is_same_v<memory_of<Dest>, M>) auto to(const global_tensor<T, From, M>& t, const Dest& dest) {
  constexpr std::size_t N2 = Dest::mesh_rank;
  static_assert(nd_of<To>::mesh_rank == N2,
                "flexpar::sbp::to<Sbp>(t, placement): the target SBP needs one entry per axis of the destination "
                "placement's mesh");
  constexpr std::size_t N1 = nd_of<From>::mesh_rank;
  constexpr nd_parallel src_sbp = detail::without_partial(nd_of<From>::value);
  constexpr nd_parallel dst_sbp = detail::without_partial(nd_of<To>::value);
  using Src = detail::sbp_type_of<src_sbp, false>;
  using Dst = detail::sbp_type_of<dst_sbp, false>;
  if constexpr (!backend<M>::host_memory) {
    auto&& summed = to<Src>(t);  // the source's partial entries reduced in its memory
    const global_tensor<T, Dst> moved = to<Dst>(to_host(summed), backend<M>::host_placement(dest));
    auto boxed = to<nd_of<To>>(global_tensor<T, Dst, M>::upload(dest, moved));  // B -> P: local
    return global_tensor<T, To, M>::adopt(dest, t.shape(), std::move(boxed).release());
  } else {
    communicator& parent = t.where().parent();
    if (&parent != &dest.parent())
      throw error_on<usage_error>(parent.rank(), "sbp::to(placement)", "the source mesh ", t.where().describe(),
                                  " and the destination mesh ", dest.describe(),
                                  " are built over different communicators");
    auto&& src = to<Src>(t);
    const shape_t& shape = t.shape();
    const placement<N1>& from = t.where();
    const auto P = static_cast<std::size_t>(parent.size());

    // who sends what: the box of each parent rank in each mesh (source: only shards that are not copies)
    std::vector<std::optional<box>> src_box(P), dst_box(P);
    for (int i = 0; i < from.size(); ++i) {
      const auto c = from.coords_of(i);
      bool owner = true;
      for (std::size_t d = 0; d < N1; ++d)
        if (src_sbp[d].is_broadcast() && c[d] != 0) owner = false;
      if (owner) src_box[static_cast<std::size_t>(from.parent_rank(i))] = shard_box(shape, src_sbp, from.shape(), c);
    }
    for (int j = 0; j < dest.size(); ++j)
      dst_box[static_cast<std::size_t>(dest.parent_rank(j))] =
          shard_box(shape, dst_sbp, dest.shape(), dest.coords_of(j));

    const auto me = static_cast<std::size_t>(parent.rank());
    std::vector<std::size_t> sends(P, 0), receives(P, 0);
    buffer_pool& pool = dest.pool();
    aligned_vector<T> packed;
    if (src_box[me]) {
      const std::span<const T> mine = src.to_local();
      for (std::size_t q = 0; q < P; ++q)
        if (dst_box[q]) sends[q] = intersect(*src_box[me], *dst_box[q]).elements();
      packed = pool.template acquire<T>(std::accumulate(sends.begin(), sends.end(), std::size_t{0}));
      std::size_t at = 0;
      for (std::size_t q = 0; q < P; ++q) {
        if (!dst_box[q]) continue;
        const box piece = intersect(*src_box[me], *dst_box[q]);
        copy_box<T>(mine, src_box[me]->extent, relative(piece.offset, src_box[me]->offset),
                    std::span<T>(packed).subspan(at), piece.extent, shape_t(shape.size(), 0), piece.extent);
        at += sends[q];
      }
    }
    if (dst_box[me])
      for (std::size_t q = 0; q < P; ++q)
        if (src_box[q]) receives[q] = intersect(*src_box[q], *dst_box[me]).elements();
    aligned_vector<T> incoming =
        pool.template acquire<T>(std::accumulate(receives.begin(), receives.end(), std::size_t{0}));
    alltoall_v(parent, std::span<const T>(packed), std::span<const std::size_t>(sends), std::span<T>(incoming),
               std::span<const std::size_t>(receives));
    pool.give_back(std::move(packed));

    aligned_vector<T> local;
    if (dst_box[me]) {
      local = pool.template acquire<T>(dst_box[me]->elements());
      std::size_t at = 0;
      for (std::size_t q = 0; q < P; ++q) {
        if (!src_box[q]) continue;
        const box piece = intersect(*src_box[q], *dst_box[me]);
        copy_box<T>(std::span<const T>(incoming).subspan(at), piece.extent, shape_t(shape.size(), 0), local,
                    dst_box[me]->extent, relative(piece.offset, dst_box[me]->offset), piece.extent);
        at += piece.elements();
      }
    }
    pool.give_back(std::move(incoming));
    auto landed = global_tensor<T, Dst, M>::adopt(dest, shape, std::move(local));
    auto boxed = to<nd_of<To>>(std::move(landed));  // B -> P where To is partial (local)
    return global_tensor<T, To, M>::adopt(dest, shape, std::move(boxed).release());
  }
}

}  // namespace flexpar::sbp
