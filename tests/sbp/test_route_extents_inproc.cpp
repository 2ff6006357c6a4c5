// The route planner reads the mesh's extents: plan(from, to, extents) weighs every candidate route
// (candidates()) by the wire bytes it moves on that mesh, to<To>(t) runs the one it takes on the
// tensor's placement, static_mesh<E...> makes that choice a compile-time value (route_on), and the
// run-time form (dynamic_tensor) takes the same route. Also: dynamic_tensor gives its buffers back
// to the placement's pool. Threads as ranks.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "support/test_config.hpp"

#include "boxing_checks.hpp"

namespace flexpar::sbp {
namespace {

using namespace testing_support;

// (S(0), P) -> (B, S(0)): axis 0 first (allgather over axis 0, then reduce-scatter over axis 1) is
// sound and, on the nominal 2 x 2 mesh, as cheap as anything: 1/2 + 1/2 of the tensor. Axis 1 first
// is unsound (axis 0's S(0) pieces would not be contiguous), so the other candidate goes through B:
// allreduce over axis 1 of 1/e0 of the tensor, allgather over axis 0, slice. On 3 x 2 that is
// 1/3 + 2/3 = 1 against 2/3 + 1/2 = 7/6: the real extents pick the route through B.
using from_t = sbp<split<0>, partial_sum>;
using to_t = sbp<broadcast, split<0>>;

static_assert(candidates_of<from_t, to_t>.count == 2);
static_assert(!route_of<from_t, to_t>.through_broadcast, "nominal 2 x 2: the direct order (ties go to it)");
static_assert(route_on<from_t, to_t, static_mesh<3, 2>>.through_broadcast, "3 x 2: through B is cheaper");
static_assert(route_on<from_t, to_t, static_mesh<8, 2>>.through_broadcast);
static_assert(!route_on<from_t, to_t, static_mesh<2, 2>>.through_broadcast);
static_assert(route_score(route_on<from_t, to_t, static_mesh<3, 2>>, mesh_extents{3, 2}) == 1.0);
static_assert(route_score(route_of<from_t, to_t>, mesh_extents{3, 2}) > 1.16 &&
              route_score(route_of<from_t, to_t>, mesh_extents{3, 2}) < 1.17);
// on the nominal mesh the score is the planner's old fixed rule
static_assert(route_score(route_of<from_t, to_t>, nominal_mesh) == route_of<from_t, to_t>.nominal_cost);
// one axis: a single candidate whatever the extent
static_assert(candidates_of<split<1>, broadcast>.count == 1);
static_assert(candidates_of<broadcast, broadcast>.count == 1 &&
              candidates_of<broadcast, broadcast>.routes[0].count == 0);

TEST(route_extents, the_cost_of_a_boxing_is_the_cost_of_the_route_it_runs) {
  run_in_process(
      6,
      [](communicator& comm) {
        static_mesh<3, 2> mesh(comm);
        const shape_t shape{12, 4};
        const cost chosen = boxing_cost<from_t, to_t>(shape, mesh);
        const cost via_b = route_cost(route_on<from_t, to_t, static_mesh<3, 2>>, shape, mesh.shape(), 4);
        const cost direct = route_cost(route_of<from_t, to_t>, shape, mesh.shape(), 4);
        EXPECT_EQ(chosen.wire_bytes, via_b.wire_bytes);
        EXPECT_LT(chosen.wire_bytes, direct.wire_bytes) << "the direct order moves more bytes on 3 x 2";
        // the run-time planner agrees with the compile-time one, and to<To>(t) runs that route
        const route r = plan(nd_of<from_t>::value, nd_of<to_t>::value, extents_of(mesh.shape()));
        EXPECT_TRUE(r.through_broadcast);
        EXPECT_EQ(r.count, (route_on<from_t, to_t, static_mesh<3, 2>>.count));
        EXPECT_TRUE((route_for<from_t, to_t>(mesh).through_broadcast));
        placement<2> square(comm, {2, 3});
        EXPECT_FALSE((route_for<from_t, to_t>(square).through_broadcast)) << "2 x 3: 7/6 either way, ties go first";
        placement<2> line(comm, {6, 1});
        EXPECT_FALSE((route_for<from_t, to_t>(line).through_broadcast)) << "6 x 1: 5/6 either way";
      },
      flexpar::testing_support::with_timeout());
}

TEST(route_extents, the_route_through_b_gives_back_the_logical_tensor) {
  run_in_process(
      6,
      [](communicator& comm) {
        for (const std::array<int, 2> extents : {std::array<int, 2>{3, 2}, std::array<int, 2>{2, 3}}) {
          placement<2> mesh(comm, extents);
          int salt = 0;
          for (const shape_t& shape : {shape_t{7, 5}, shape_t{12, 4}, shape_t{2, 3}, shape_t{0, 3}}) {
            check_pair<std::int64_t, from_t, to_t>(mesh, shape, ++salt);
            check_pair<std::int64_t, sbp<split<1>, partial_sum>, sbp<broadcast, split<1>>>(mesh, shape, ++salt);
            check_pair<std::int64_t, to_t, from_t>(mesh, shape, ++salt);
          }
        }
      },
      flexpar::testing_support::with_timeout());
}

TEST(route_extents, the_run_time_form_takes_the_same_route_and_result) {
  run_in_process(
      6,
      [](communicator& comm) {
        placement<2> mesh(comm, {3, 2});
        const shape_t shape{7, 5};
        const std::vector<std::int64_t> full = logical<std::int64_t>(shape, 3);
        auto t = dynamic_tensor<std::int64_t, 2>::from_local(
            mesh, shape, nd_of<from_t>::value, distinct_partials(mesh, shape, nd_of<from_t>::value, full, 3));
        auto boxed = to(std::move(t), nd_of<to_t>::value);
        EXPECT_EQ(boxed.layout(), nd_of<to_t>::value);
        EXPECT_EQ(boxed.to_full(), full);
      },
      flexpar::testing_support::with_timeout());
}

TEST(dynamic_tensor_pool, a_dead_tensor_gives_its_buffer_back_and_the_next_one_reuses_it) {
  run_in_process(
      2,
      [](communicator& comm) {
        placement<1> mesh(comm, {2});
        const shape_t shape{64, 8};
        const std::vector<float> full(elements_of(shape), 1.0f);
        const nd_parallel s0 = nd_of<split<0>>::value;
        const buffer_pool::statistics before = mesh.pool().stats();
        {
          auto t = dynamic_tensor<float, 1>::from_full(mesh, shape, s0, full);
          auto u = t.clone();
        }
        const buffer_pool::statistics after_two = mesh.pool().stats();
        EXPECT_EQ(after_two.returned - before.returned, 2u) << "both shards go back to the pool";
        {
          auto t = dynamic_tensor<float, 1>::from_full(mesh, shape, s0, full);
          auto moved = std::move(t);  // moves the buffer, gives nothing back yet
          EXPECT_EQ(mesh.pool().stats().returned, after_two.returned);
          EXPECT_EQ(moved.to_full(), full);
        }
        const buffer_pool::statistics after = mesh.pool().stats();
        EXPECT_GE(after.hits - after_two.hits, 1u) << "the second tensor reused a returned buffer";
        EXPECT_EQ(after.returned - after_two.returned, 1u);
      },
      flexpar::testing_support::with_timeout());
}

}  // namespace
}  // namespace flexpar::sbp
