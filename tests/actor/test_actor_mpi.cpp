// Cross-rank actor graphs under mpiexec (one process per rank), over the transport FLEXPAR_TRANSPORT.
#include <gtest/gtest.h>
#include <mpi.h>

#include "cross_rank_scenarios.hpp"
#include "pipeline_scenarios.hpp"

namespace flexpar {
namespace {

using namespace testing_support;

communicator world() {
  config c = config::from_environment();
  c.timeout = std::chrono::seconds(30);
  return communicator::from_mpi(MPI_COMM_WORLD, c);
}

TEST(actor_mpi, chain_equals_the_serial_result) {
  communicator comm = world();
  for (std::size_t width : {std::size_t{0}, std::size_t{1}, std::size_t{4099}, (std::size_t{1} << 20) + 3})
    for (drive how : {drive::pool, drive::deterministic}) chain_across_ranks(comm, width > 10000 ? 8 : 300, width, how);
}

TEST(actor_mpi, diamond_equals_the_serial_result) {
  communicator comm = world();
  for (drive how : {drive::pool, drive::deterministic}) diamond_across_ranks(comm, 2000, how);
}

TEST(actor_mpi, a_failure_on_one_rank_ends_every_rank) {
  communicator comm = world();
  for (drive how : {drive::pool, drive::deterministic}) failure_across_ranks(comm, how);
}

TEST(pipeline_mpi, one_stage_per_rank_equals_the_serial_result) {
  communicator comm = world();
  std::vector<int> placement(static_cast<std::size_t>(comm.size()));
  for (int s = 0; s < comm.size(); ++s) placement[static_cast<std::size_t>(s)] = comm.size() - 1 - s;
  for (pipeline_schedule schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b})
    for (int m : {1, 4, 8}) pipeline_matches_serial(comm, placement, m, 257, schedule);
}

}  // namespace
}  // namespace flexpar
