// flexpar/actor/pipeline_sbp.hpp — a pipeline stage on an SBP placement, from the SBP types of its
// activations:
//
//   flexpar::sbp::placement<2> mesh(comm, {2, 2}, {4, 5, 6, 7});      // data x tensor
//   builder.stage(flexpar::stage_on<sbp<split<0>, broadcast>, sbp<split<0>, split<1>>>(mesh), stage);
//
// The stage's body can make global tensors of the same types from the boxes it is given
// (global_tensor::from_local on `mesh`) and use the SBP ops and the mesh's axis communicators inside.
#pragma once

#include <cstddef>
#include <vector>

#include <flexpar/actor/pipeline.hpp>
#include <flexpar/sbp/placement.hpp>

namespace flexpar {

/// The mesh of a stage on `where`, its input activation laid out as `In` and its output as `Out`
/// (SBP types with one entry per mesh axis, split or broadcast).
template <sbp::sbp_type In, sbp::sbp_type Out, std::size_t N>
stage_mesh stage_on(const sbp::placement<N>& where) {
  static_assert(sbp::nd_of<In>::mesh_rank == N && sbp::nd_of<Out>::mesh_rank == N,
                "flexpar::stage_on<In, Out>(placement): each layout needs one entry per axis of the placement's mesh");
  static_assert(!sbp::nd_of<In>::value.any_partial() && !sbp::nd_of<Out>::value.any_partial(),
                "flexpar::stage_on<In, Out>: an activation between stages is split or broadcast, never partial "
                "(reduce it inside the stage)");
  const auto ranks = where.ranks();
  const auto& shape = where.shape();
  return {std::vector<int>(ranks.begin(), ranks.end()), std::vector<int>(shape.begin(), shape.end()),
          sbp::nd_of<In>::value, sbp::nd_of<Out>::value};
}

}  // namespace flexpar
