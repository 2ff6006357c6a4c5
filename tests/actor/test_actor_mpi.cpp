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
    for (int m : {1, 4, 8}) pipeline_matches_serial(comm, {placement, m, 257, schedule});
}

TEST(pipeline_mpi, interleaved_stages_and_one_register_each) {
  communicator comm = world();
  pipeline_case c{{}, 6, 1000, pipeline_schedule::one_f_one_b};
  for (int s = 0; s < 2 * comm.size(); ++s) c.placement.push_back(s % comm.size());
  pipeline_matches_serial(comm, c);
  c.stash.assign(c.placement.size(), 1);
  c.gradient_registers = 1;
  pipeline_matches_serial(comm, c, pipeline_drive::pool, 1, 3);
  pipeline_matches_serial(comm, c, pipeline_drive::random, 5, 2);
}

TEST(pipeline_mpi, stages_on_sub_meshes_with_collectives_inside) {
  communicator comm = world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  // Two ranks: both stages on the mesh {0, 1}; four: meshes {0, 1} and {2, 3} alternating.
  auto layout = [](sbp::parallel a) {
    sbp::nd_parallel l;
    l[0] = a;
    return l;
  };
  const std::vector<int> first{0, 1}, second = comm.size() >= 4 ? std::vector<int>{2, 3} : first;
  mesh_case c{{{first, {}, layout(sbp::parallel::B()), layout(sbp::parallel::S(0))},
               {second, {}, layout(sbp::parallel::S(1)), layout(sbp::parallel::S(1))},
               {first, {}, layout(sbp::parallel::B()), layout(sbp::parallel::S(0))}},
              5,
              3,
              6};
  for (bool collective : {false, true}) {
    c.collective = collective;
    mesh_pipeline_matches_serial(comm, c);
  }
}

}  // namespace
}  // namespace flexpar
