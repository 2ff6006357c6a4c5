// The engine under mpiexec, over the transport FLEXPAR_TRANSPORT names.
#include <gtest/gtest.h>

#include "engine_scenarios.hpp"
#include "gradient_sync_scenarios.hpp"

namespace flexpar {
namespace {

struct mpi_engine : ::testing::Test {
  config cfg = [] {
    config c = config::from_environment();
    c.timeout = std::chrono::seconds(60);
    return c;
  }();
  communicator comm = communicator::from_mpi(MPI_COMM_WORLD, cfg, thread_need::multiple);
};

TEST_F(mpi_engine, thousand_random_tensors_random_order_fused) {
  cfg.fusion_threshold = std::size_t{1} << 20;
  testing_support::random_order_allreduces(comm, cfg, 1000, 4096);
}

TEST_F(mpi_engine, thousand_random_tensors_random_order_unfused) {
  cfg.fusion_threshold = 0;
  testing_support::random_order_allreduces(comm, cfg, 1000, 512);
}

TEST_F(mpi_engine, every_collective) { testing_support::every_collective(comm, cfg); }

TEST_F(mpi_engine, mismatches) {
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  testing_support::mismatches(comm, cfg);
}

TEST_F(mpi_engine, gradient_sync) {
  testing_support::gradient_sync_steps(comm, cfg, gradient_reduction::average, wire_compression::none);
  testing_support::gradient_sync_steps(comm, cfg, gradient_reduction::sum, wire_compression::fp16);
  testing_support::gradient_sync_fp16_rounds(comm, cfg);
}

TEST_F(mpi_engine, mismatch_matrix) {
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  testing_support::mismatch_matrix(comm, cfg);
}

TEST_F(mpi_engine, join_with_uneven_steps) { testing_support::uneven_steps_with_join(comm, cfg); }

}  // namespace
}  // namespace flexpar
