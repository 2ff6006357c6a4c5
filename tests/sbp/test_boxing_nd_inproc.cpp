// Every nd-SBP route on 2 x 2, 1 x 3, 3 x 1 and 2 x 1 meshes, threads as ranks: box, gather with
// to_full (no boxing inside) and compare with the serial logical tensor (boxing_checks.hpp). A file of
// its own so that the many instantiations compile in parallel with the 1-D ones.
#include <gtest/gtest.h>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "support/test_config.hpp"

#include "boxing_checks.hpp"

namespace flexpar::sbp {
namespace {

using namespace testing_support;

class boxing_2d : public ::testing::TestWithParam<std::array<int, 2>> {};

TEST_P(boxing_2d, every_nd_route_gives_back_the_logical_tensor) {
  const auto mesh_shape = GetParam();
  run_in_process(
      mesh_shape[0] * mesh_shape[1],
      [&](communicator& comm) {
        placement<2> mesh(comm, mesh_shape);
        int salt = 0;
        for (const shape_t& shape : {shape_t{5, 3, 4}, shape_t{2, 5, 3}, shape_t{0, 2, 3}})
          for_each_pair(two_axes{}, [&]<class From, class To>(From, To) {
            check_pair<std::int64_t, From, To>(mesh, shape, ++salt);
          });
      },
      flexpar::testing_support::with_timeout());
}

INSTANTIATE_TEST_SUITE_P(
    meshes, boxing_2d,
    ::testing::Values(std::array<int, 2>{2, 2}, std::array<int, 2>{1, 3}, std::array<int, 2>{3, 1},
                      std::array<int, 2>{2, 1}),
    [](const auto& info) {
      return std::string("m").append(std::to_string(info.param[0])).append("x").append(std::to_string(info.param[1]));
    });

}  // namespace
}  // namespace flexpar::sbp
