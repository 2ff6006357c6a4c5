// flexpar/sbp/boxing/route.hpp — the route planner of nd-SBP boxing: which mesh axes change, in
// which order, each step one mesh-axis transform (boxing/axis.hpp). All constexpr: for static SBPs
// every candidate is a compile-time value.
//
// Changing axis d is sound when no mesh axis after d splits a tensor axis that d's old or new SBP
// splits (those inner pieces would not be contiguous in d's group). The candidate routes are every
// sound order of the axes that differ and the route through B (inner axes to B first, then outer
// axes to their targets); plan() takes the one that moves the fewest wire bytes on the mesh's
// extents (route_score), the nominal 2-per-axis mesh when they are not known.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include <flexpar/sbp/parallel.hpp>

namespace flexpar::sbp {

/// One step of a route: mesh axis `axis` goes from `from` to `to`.
struct route_step {
  std::size_t axis = 0;  ///< the mesh axis
  parallel from{};       ///< its SBP before
  parallel to{};         ///< its SBP after
};

/// A boxing route: steps in order, and the nd-SBP before each step.
struct route {
  static constexpr std::size_t max_steps = 3 * max_mesh_rank;  ///< to B and back, plus P(a)->B->P(b)
  std::array<route_step, max_steps> steps{};                   ///< [0, count) are used
  std::array<nd_parallel, max_steps> before{};                 ///< the nd-SBP before each step
  std::size_t count = 0;                                       ///< steps
  bool through_broadcast = false;                              ///< the route through B (candidates())
  double nominal_cost = 0;                                     ///< the planner's score (see plan())
};

/// Mesh extents as the route planner reads them: one per mesh axis (entries past the mesh rank unused).
using mesh_extents = std::array<int, max_mesh_rank>;

/// The nominal mesh, 2 ranks on every axis: what route_of plans on when the extents are not known.
inline constexpr mesh_extents nominal_mesh{2, 2, 2, 2};

/// The extents of a run-time mesh shape (a placement's shape()), for plan().
/// @pre mesh.size() <= max_mesh_rank
constexpr mesh_extents extents_of(std::span<const int> mesh) noexcept {
  mesh_extents m = nominal_mesh;
  for (std::size_t d = 0; d < mesh.size() && d < max_mesh_rank; ++d) m[d] = mesh[d];
  return m;
}

namespace detail {

/// Changing mesh axis d of `cur` to `to` is sound (the rule at the top of this file).
constexpr bool step_sound(const nd_parallel& cur, std::size_t d, const parallel& to) noexcept {
  for (std::size_t e = d + 1; e < cur.rank; ++e) {
    if (!cur[e].is_split()) continue;
    if (cur[d].is_split() && cur[d].axis == cur[e].axis) return false;
    if (to.is_split() && to.axis == cur[e].axis) return false;
  }
  return true;
}

/// Wire bytes of one step as a fraction of the logical tensor, on a mesh of extents `m`: the group of
/// axis d (p = m[d] ranks) holds 1 / (extents of the other split axes) of the tensor, and the ring
/// collectives move 2 (p-1)/p (allreduce), (p-1)/p (reduce-scatter, allgather) or (p-1)/p^2
/// (alltoall) of that; local steps move nothing.
constexpr double step_cost(const nd_parallel& cur, std::size_t d, const parallel& to, const mesh_extents& m) noexcept {
  const parallel& from = cur[d];
  if (from == to) return 0;
  double held = 1.0;  // what d's group holds jointly
  for (std::size_t e = 0; e < cur.rank; ++e)
    if (e != d && cur[e].is_split()) held /= m[e];
  const double p = m[d], moved = (p - 1) / p * held;
  if (from.is_partial() && to.is_broadcast()) return 2 * moved;  // allreduce
  if (from.is_partial() && to.is_split()) return moved;          // reduce-scatter
  if (from.is_split() && to.is_broadcast()) return moved;        // allgather
  if (from.is_split() && to.is_split()) return moved / p;        // alltoall
  return 0;                                                      // local
}

/// Appends the step (d: cur[d] -> to) to r, as two steps through B for P(a) -> P(b).
constexpr bool append_step(route& r, nd_parallel& cur, std::size_t d, const parallel& to) noexcept {
  if (cur[d] == to) return true;
  if (cur[d].is_partial() && to.is_partial()) {
    if (!append_step(r, cur, d, parallel::B())) return false;
    return append_step(r, cur, d, to);
  }
  if (!step_sound(cur, d, to) || r.count == route::max_steps) return false;
  r.nominal_cost += step_cost(cur, d, to, nominal_mesh);
  r.before[r.count] = cur;
  r.steps[r.count++] = {d, cur[d], to};
  cur[d] = to;
  return true;
}

/// The same steps in the same order.
constexpr bool same_steps(const route& a, const route& b) noexcept {
  if (a.count != b.count) return false;
  for (std::size_t k = 0; k < a.count; ++k)
    if (a.steps[k].axis != b.steps[k].axis || !(a.steps[k].from == b.steps[k].from) ||
        !(a.steps[k].to == b.steps[k].to))
      return false;
  return true;
}

}  // namespace detail

/// The score of route `r` on a mesh of extents `m`: its wire bytes as a fraction of the logical tensor.
constexpr double route_score(const route& r, const mesh_extents& m) noexcept {
  double total = 0;
  for (std::size_t k = 0; k < r.count; ++k) total += detail::step_cost(r.before[k], r.steps[k].axis, r.steps[k].to, m);
  return total;
}

/// Every route the planner weighs for from -> to: each sound order of the mesh axes that differ (in
/// lexicographic order of the axes), then the route through B. At most 4! + 1 for a 4-axis mesh.
struct route_candidates {
  static constexpr std::size_t max_count = 24 + 1;  ///< 4! orders + through B
  std::array<route, max_count> routes{};            ///< [0, count) are used
  std::size_t count = 0;                            ///< candidates
};

/// The candidates for from -> to (same mesh rank); see route_candidates.
constexpr route_candidates candidates(const nd_parallel& from, const nd_parallel& to) noexcept {
  route_candidates out{};
  std::array<std::size_t, max_mesh_rank> order{};
  std::size_t n = 0;
  for (std::size_t d = 0; d < from.rank; ++d)
    if (!(from[d] == to[d])) order[n++] = d;
  if (n == 0) {
    out.count = 1;  // the empty route
    return out;
  }
  do {  // every permutation of the differing axes (sorted to start)
    route r{};
    nd_parallel cur = from;
    bool ok = true;
    for (std::size_t k = 0; k < n && ok; ++k) ok = detail::append_step(r, cur, order[k], to[order[k]]);
    if (ok) out.routes[out.count++] = r;
  } while (std::next_permutation(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n)));
  // through B: inner axes to B first, then outer axes to their targets
  route via{};
  via.through_broadcast = true;
  nd_parallel cur = from;
  bool ok = true;
  for (std::size_t d = from.rank; d-- > 0 && ok;) ok = detail::append_step(via, cur, d, parallel::B());
  for (std::size_t d = 0; d < from.rank && ok; ++d) ok = detail::append_step(via, cur, d, to[d]);
  bool known = false;  // with one differing axis, through B can be a step list we already have
  for (std::size_t i = 0; i < out.count && ok; ++i) known = known || detail::same_steps(out.routes[i], via);
  if (ok && !known) out.routes[out.count++] = via;
  return out;
}

/// Which of `c` the planner takes on a mesh of extents `m`: the lowest score, ties to the first.
constexpr std::size_t cheapest(const route_candidates& c, const mesh_extents& m) noexcept {
  std::size_t best = 0;
  for (std::size_t i = 1; i < c.count; ++i)
    if (route_score(c.routes[i], m) < route_score(c.routes[best], m)) best = i;
  return best;
}

/// The route from `from` to `to` (same mesh rank) on a mesh of extents `m` (the nominal 2-per-axis
/// mesh by default): the cheapest of candidates(from, to) by route_score.
constexpr route plan(const nd_parallel& from, const nd_parallel& to, const mesh_extents& m = nominal_mesh) noexcept {
  const route_candidates c = candidates(from, to);
  return c.routes[cheapest(c, m)];
}

namespace detail {

template <parallel V>
using type_of = std::conditional_t<V.what == kind::split, split<V.axis>,
                                   std::conditional_t<V.what == kind::broadcast, broadcast, partial<V.op>>>;

template <nd_parallel V, std::size_t D>
struct axis_type_of {
  static constexpr parallel value = V.axes[D];
  using type = type_of<value>;
};
template <nd_parallel V, class Seq>
struct nd_type_of_impl;
template <nd_parallel V, std::size_t... D>
struct nd_type_of_impl<V, std::index_sequence<D...>> {
  using type = sbp<typename axis_type_of<V, D>::type...>;
};
template <nd_parallel V, bool OneAxis>
struct sbp_type_of_impl {
  using type = typename nd_type_of_impl<V, std::make_index_sequence<V.rank>>::type;
};
template <nd_parallel V>
struct sbp_type_of_impl<V, true> {
  using type = typename axis_type_of<V, 0>::type;
};

/// The static SBP type of a value: a one-axis type when `OneAxis`, else sbp<...>.
template <nd_parallel V, bool OneAxis>
using sbp_type_of = typename sbp_type_of_impl<V, OneAxis>::type;

}  // namespace detail

/// Every route a boxing From -> To may take (a compile-time value): to<To>(t) instantiates each and
/// runs the one plan() takes on the tensor's mesh.
template <sbp_type From, sbp_type To>
inline constexpr route_candidates candidates_of = candidates(nd_of<From>::value, nd_of<To>::value);

/// The static route of a boxing From -> To on the nominal 2-per-axis mesh (a compile-time value).
template <sbp_type From, sbp_type To>
inline constexpr route route_of = plan(nd_of<From>::value, nd_of<To>::value);

/// The static route of a boxing From -> To on a mesh whose extents are in its type, e.g.
/// route_on<From, To, static_mesh<2, 8>> (a compile-time value; what to<To>(t) runs on that mesh).
template <sbp_type From, sbp_type To, class StaticMesh>
inline constexpr route route_on = plan(nd_of<From>::value, nd_of<To>::value, extents_of(StaticMesh::extents));

/// Same layout: boxing is free.
template <sbp_type A, sbp_type B>
inline constexpr bool same_layout = nd_of<A>::mesh_rank == nd_of<B>::mesh_rank&& nd_of<A>::value == nd_of<B>::value;

namespace detail {
template <sbp_type From, sbp_type To>
constexpr void check_mesh_rank() {
  static_assert(nd_of<From>::mesh_rank == nd_of<To>::mesh_rank,
                "flexpar::sbp::to<Sbp>: the target SBP has another number of entries than the tensor's placement "
                "mesh has axes; an nd-SBP needs one entry per mesh axis (use placement changes to move between "
                "meshes)");
}
}  // namespace detail

}  // namespace flexpar::sbp
