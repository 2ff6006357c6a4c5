// flexpar/sbp/boxing.hpp — changing a tensor's SBP: to<NewSbp>(t), and to<NewSbp>(t, placement).
//
// One mesh axis at a time: each pair (From, To) on one axis is one overload of box_axis, a script of
// named steps over that axis's sub-communicator; an nd-SBP boxing is a route of such steps, the
// cheapest sound order of the axes that differ, or through B. Every boxing that moves bytes calls
// public collectives only. The parts:
//
//   boxing/route.hpp             the planner: route, candidates(), plan(), route_score (constexpr)
//   boxing/strided_copy.hpp      axis_view (what one axis's transform works on); the local copies
//                                between a shard's layouts when its rows are strided
//   boxing/strided_rounds.hpp    the strided transforms on one node, through the public round
//                                exchange of the communicator's shared-memory segment
//   boxing/axis.hpp              box_axis: the transform of each pair, with its table and costs
//   boxing/same_placement.hpp    to<NewSbp>(t): the planned route run on t's placement
//   boxing/placement_change.hpp  to<NewSbp>(t, placement): to another mesh of ranks
//   boxing/cost.hpp              axis_step_cost, route_cost, boxing_cost
//
// X -> X is free: to<X>(t) returns t itself (no allocation, no copy).
#pragma once

#include <flexpar/sbp/boxing/axis.hpp>
#include <flexpar/sbp/boxing/cost.hpp>
#include <flexpar/sbp/boxing/equal_blocks.hpp>
#include <flexpar/sbp/boxing/placement_change.hpp>
#include <flexpar/sbp/boxing/route.hpp>
#include <flexpar/sbp/boxing/same_placement.hpp>
#include <flexpar/sbp/boxing/strided_copy.hpp>
#include <flexpar/sbp/boxing/strided_rounds.hpp>
