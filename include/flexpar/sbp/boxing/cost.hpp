// flexpar/sbp/boxing/cost.hpp — what a boxing costs, from the collectives' cost functions: per
// mesh-axis step (ring collectives; local transforms count their copies), per route, and for the
// route to<NewSbp>(t) takes on a placement (what the strategy search adds up).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/sbp/boxing/route.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/sbp/placement.hpp>

namespace flexpar::sbp {

/// The cost of one mesh-axis step on a group of p ranks holding `bytes` jointly (ring collectives).
inline cost axis_step_cost(const parallel& from, const parallel& to, int p, double bytes) noexcept {
  if (from == to) return {};
  if (from.is_partial() && to.is_broadcast()) return allreduce_ring_cost(p, bytes);
  if (from.is_partial() && to.is_split()) return reduce_scatter_ring_cost(p, bytes);
  if (from.is_split() && to.is_broadcast()) return allgather_ring_cost(p, bytes);
  if (from.is_split() && to.is_split()) return alltoall_pairwise_cost(p, bytes / p);
  cost local;  // slices, zero fills, pads: memory only
  local.copy_bytes = to.is_split() ? bytes / p : bytes;
  return local;
}

/// The cost of the route `r` for a logical `shape` of `element_bytes`-byte elements on a mesh.
inline cost route_cost(const route& r, const shape_t& shape, std::span<const int> mesh_shape,
                       std::size_t element_bytes) {
  cost total;
  const std::vector<int> origin(mesh_shape.size(), 0);
  for (std::size_t k = 0; k < r.count; ++k) {
    const route_step& s = r.steps[k];
    const box held = shard_box(shape, r.before[k], mesh_shape, origin, s.axis);
    total =
        total + axis_step_cost(s.from, s.to, mesh_shape[s.axis], static_cast<double>(held.elements() * element_bytes));
  }
  return total;
}

/// The cost of boxing a tensor of `shape` (elements of `element_bytes`) from From to To on
/// `where`, from the collectives' cost functions (what the strategy search adds up).
template <sbp_type From, sbp_type To, std::size_t MeshRank>
cost boxing_cost(const shape_t& shape, const placement<MeshRank>& where, std::size_t element_bytes = 4) {
  detail::check_mesh_rank<From, To>();
  return route_cost(plan(nd_of<From>::value, nd_of<To>::value, extents_of(where.shape())), shape, where.shape(),
                    element_bytes);
}

}  // namespace flexpar::sbp
