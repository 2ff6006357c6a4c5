// flexpar/sbp/boxing/same_placement.hpp — to<NewSbp>(t): boxing on the tensor's own placement. The
// route plan() takes on the mesh's extents runs one mesh axis at a time, each step the box_axis
// overload of its pair through that axis's sub-communicator (placement::axis(d)). For static SBPs
// every candidate route is instantiated at compile time and the one planned on the tensor's mesh
// runs; on a static_mesh<E...> that choice is a compile-time value too (route_on).
// X -> X is free: to<X>(t) returns t itself (no allocation, no copy). One definition for every memory:
// each step's view comes from the tensor's backend (backend.hpp).
#pragma once

#include <cstddef>
#include <utility>

#include <flexpar/sbp/boxing/axis.hpp>
#include <flexpar/sbp/boxing/route.hpp>
#include <flexpar/sbp/global_tensor.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/sbp/placement.hpp>

namespace flexpar::sbp {

namespace detail {

/// Runs mesh axis d of one route step on my shard (`local`, the shard under `before`), in memory M:
/// the box_axis overload of (From, To) on the view of that axis (backend<M>::axis).
template <element T, class M, one_axis_sbp From, one_axis_sbp To, class Where>
void run_axis(const Where& where, const shape_t& shape, const nd_parallel& before, std::size_t d,
              typename backend<M>::template shard<T>& local) {
  auto v = backend<M>::template axis<T>(where, d, shard_box(shape, before, where.shape(), where.coords(), d).extent,
                                        std::move(local));
  box_axis(v, From{}, To{});
  local = std::move(v.local);
}

/// Runs the static route R on my shard, one box_axis overload per step.
template <element T, class M, route R, class Where>
void run_route(const Where& where, const shape_t& shape, typename backend<M>::template shard<T>& local) {
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (run_axis<T, M, type_of<R.steps[K].from>, type_of<R.steps[K].to>>(where, shape, R.before[K], R.steps[K].axis,
                                                                      local),
     ...);
  }
  (std::make_index_sequence<R.count>{});
}

}  // namespace detail

/// The route to<To>(t) runs for a tensor From on `where`: the candidate plan() takes on its extents.
template <sbp_type From, sbp_type To, std::size_t MeshRank>
const route& route_for(const placement<MeshRank>& where) noexcept {
  return candidates_of<From, To>.routes[cheapest(candidates_of<From, To>, extents_of(where.shape()))];
}

/// Boxing, consuming `t`: its buffer is reused where the transform allows (P -> B allreduces in
/// place). Collective over t's mesh (every mesh rank calls it; ranks outside pass their empty tensor).
/// Returns a global_tensor<T, To, M>.
template <sbp_type To, element T, sbp_type From, class M>
requires(!same_layout<From, To>) auto to(global_tensor<T, From, M>&& t) {
  if constexpr (nd_of<From>::mesh_rank != nd_of<To>::mesh_rank) {
    detail::check_mesh_rank<From, To>();
  } else {
    const auto where = t.where();
    const shape_t shape = t.shape();
    detail::check_target_axes<From, To>(where.parent().rank(), shape);
    auto local = std::move(t).release();
    if (where.contains_me()) {
      const std::size_t chosen = cheapest(candidates_of<From, To>, extents_of(where.shape()));  // plan() here
      [&]<std::size_t... C>(std::index_sequence<C...>) {
        ((chosen == C ? detail::run_route<T, M, candidates_of<From, To>.routes[C]>(where, shape, local) : void()), ...);
      }
      (std::make_index_sequence<candidates_of<From, To>.count>{});
    }
    return global_tensor<T, To, M>::adopt(where, shape, std::move(local));
  }
}

/// Boxing of a tensor that stays usable: boxes a copy.
template <sbp_type To, element T, sbp_type From, class M>
requires(!same_layout<From, To>) auto to(const global_tensor<T, From, M>& t) { return to<To>(t.clone()); }

/// X -> X: the tensor itself (no allocation, no copy). Bind the result with auto&&.
template <sbp_type To, element T, sbp_type From, class M>
requires(same_layout<From, To>) const global_tensor<T, From, M>& to(const global_tensor<T, From, M>& t) noexcept {
  detail::check_mesh_rank<From, To>();
  return t;
}

/// X -> X on an rvalue: the tensor itself, moved through.
template <sbp_type To, element T, sbp_type From, class M>
requires(same_layout<From, To>) global_tensor<T, From, M> && to(global_tensor<T, From, M>&& t)
noexcept {
  detail::check_mesh_rank<From, To>();
  return std::move(t);
}

}  // namespace flexpar::sbp
