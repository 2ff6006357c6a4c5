// SBP under mpiexec (MPICH): every 1-D boxing pair on the world, nd routes on a 2 x 2 mesh when there
// are 4 ranks, a placement change between halves of the world, and the Megatron block's
// collectives checked against MPI_Allreduce of the same partial sums.
#include <gtest/gtest.h>
#include <mpi.h>

#include <flexpar/sbp/sbp.hpp>

#include "boxing_checks.hpp"

namespace flexpar::sbp {
namespace {

using namespace testing_support;

communicator make_comm() { return communicator::from_mpi(MPI_COMM_WORLD); }

TEST(sbp_mpi, every_1d_boxing_pair_gives_back_the_logical_tensor) {
  communicator comm = make_comm();
  placement<1> mesh(comm, {comm.size()});
  int salt = 0;
  for (const shape_t& shape : shapes())
    for_each_pair(one_axis{},
                  [&]<class From, class To>(From, To) { check_pair<float, From, To>(mesh, shape, ++salt); });
}

// Big enough that S(1) -> B streams several chunks of its default size and that the reduce-scatter of
// P -> S lands its last step in the front (blocks of 4 chunks and more on 2 and 3 ranks), in MPI's
// rendezvous range.
TEST(sbp_mpi, one_axis_boxings_of_a_tensor_of_several_chunks) {
  communicator comm = communicator::from_mpi(MPI_COMM_WORLD);
  placement<1> mesh(comm, {comm.size()});
  int salt = 0;
  for_each_pair(list<split<0>, split<1>, broadcast, partial_sum>{}, [&]<class From, class To>(From, To) {
    check_pair<float, From, To>(mesh, {1201, 997}, ++salt);
  });
}

TEST(sbp_mpi, nd_routes_on_a_mesh) {
  communicator comm = make_comm();
  if (comm.size() != 4) GTEST_SKIP() << "needs 4 ranks for a 2 x 2 mesh";
  placement<2> mesh(comm, {2, 2});
  int salt = 0;
  for (const shape_t& shape : {shape_t{5, 3, 4}, shape_t{2, 5, 3}})
    for_each_pair(two_axes{},
                  [&]<class From, class To>(From, To) { check_pair<double, From, To>(mesh, shape, ++salt); });
}

TEST(sbp_mpi, placement_change_and_the_partial_sum_match_mpi) {
  communicator comm = make_comm();
  const int p = comm.size();
  std::vector<int> low, high;
  for (int r = 0; r < p; ++r) (r < (p + 1) / 2 ? low : high).push_back(r);
  if (high.empty()) high = low;
  placement<1> all(comm, {p}), a(comm, {static_cast<int>(low.size())}, low),
      b(comm, {static_cast<int>(high.size())}, high);
  const shape_t shape{7, 5};
  const std::vector<float> full = logical<float>(shape, 5);
  auto t = global_tensor<float, split<0>>::from_full(a, shape, full);
  auto moved = to<split<1>>(t, b);
  if (b.contains_me()) {
    EXPECT_EQ(moved.to_full(), full);
  }

  // P(sum) -> B is MPI_Allreduce of the rank's summands
  std::vector<float> mine(35);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = float((static_cast<int>(i) + comm.rank()) % 9);
  std::vector<float> want(35);
  ASSERT_EQ(MPI_Allreduce(mine.data(), want.data(), 35, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS);
  auto partial_x = global_tensor<float, partial_sum>::from_local(all, shape, mine);
  auto summed = to<broadcast>(std::move(partial_x));
  EXPECT_EQ(std::vector<float>(summed.to_local().begin(), summed.to_local().end()), want);
}

}  // namespace
}  // namespace flexpar::sbp
