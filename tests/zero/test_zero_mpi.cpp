// Sharded data parallelism under mpiexec (MPI transport, the communication thread calling MPI while
// the test's thread may too): every stage against the serial data-parallel oracle, and the hybrid mesh.
#include <gtest/gtest.h>
#include <mpi.h>

#include <flexpar/comm/communicator.hpp>

#include "zero_scenarios.hpp"

namespace flexpar {
namespace {

struct zero_mpi : ::testing::Test {
  config cfg = [] {
    config c = config::from_environment();
    c.timeout = std::chrono::seconds(60);
    return c;
  }();
  communicator comm = communicator::from_mpi(MPI_COMM_WORLD, cfg);
  communicator& world() { return comm; }
};

TEST_F(zero_mpi, every_stage_matches_data_parallel) {
  for (int stage : {1, 2, 3})
    for (bool overlap : {false, true}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " overlap " + std::to_string(overlap));
      testing_support::zero_case c;
      c.options = {.stage = stage, .bucket_bytes = 144, .overlap = overlap, .prefetch = 2};
      c.adam = stage != 2;
      testing_support::zero_matches_data_parallel<1>(world(), {world().size()}, c);
    }
}

TEST_F(zero_mpi, passes_and_unused_parameters) {
  for (int stage : {1, 2}) {
    testing_support::zero_case c;
    c.options = {.stage = stage, .bucket_bytes = 136, .backward_passes_per_step = 3};
    c.skip_some = true;
    testing_support::zero_matches_data_parallel<1>(world(), {world().size()}, c);
  }
}

TEST_F(zero_mpi, hybrid_mesh) {
  const int p = world().size();
  const int nodes = p % 2 == 0 ? 2 : p;
  testing_support::zero_case c;
  c.options = {.stage = 3, .bucket_bytes = 140};
  c.adam = true;
  testing_support::zero_matches_data_parallel<2>(world(), {nodes, p / nodes}, c);
}

TEST_F(zero_mpi, quantized_weights_and_gradients_within_bounds) {
  testing_support::zero_quantized_within_bounds<1>(world(), {world().size()}, 3, true, true);
  testing_support::zero_quantized_within_bounds<1>(world(), {world().size()}, 1, true, false);
}

TEST_F(zero_mpi, destroyed_with_gathers_queued) { testing_support::zero_destroyed_with_gathers_queued(world()); }

TEST_F(zero_mpi, memory_accounting) {
  for (int stage : {1, 2, 3}) testing_support::zero_memory_accounting(world(), stage);
}

}  // namespace
}  // namespace flexpar
