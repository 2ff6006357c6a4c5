// The engine under mpiexec, over the transport FLEXPAR_TRANSPORT names.
#include <gtest/gtest.h>

#include "engine_scenarios.hpp"
#include "gradient_sync_scenarios.hpp"
#include "plan_scenarios.hpp"

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

TEST_F(mpi_engine, gradient_sync_arena_and_own_buffers_agree_bit_for_bit) {
  testing_support::arena_and_own_buffers_agree(comm, cfg);
}

TEST_F(mpi_engine, gradient_sync_frozen_and_added_parameters) {
  for (bool in_arena : {false, true}) testing_support::frozen_and_added_parameters(comm, cfg, in_arena);
}

TEST_F(mpi_engine, mismatch_matrix) {
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  testing_support::mismatch_matrix(comm, cfg);
}

TEST_F(mpi_engine, join_with_uneven_steps) { testing_support::uneven_steps_with_join(comm, cfg); }

TEST_F(mpi_engine, a_frozen_plan_replays_steps_in_any_order) { testing_support::plan_replays_in_any_order(comm, cfg); }

TEST_F(mpi_engine, a_new_tensor_drops_the_plan_and_it_freezes_again) {
  testing_support::a_new_tensor_drops_the_plan_and_freezes_again(comm, cfg);
}

TEST_F(mpi_engine, a_changed_count_under_a_plan_is_a_mismatch_naming_both_sides) {
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  testing_support::a_changed_count_is_a_mismatch_naming_both_sides(comm, cfg);
}

TEST_F(mpi_engine, a_rank_that_ends_its_step_without_a_tensor_is_named_at_once) {
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  cfg.plan_patience = std::chrono::seconds(3);
  testing_support::a_rank_that_skips_a_tensor_is_named_at_once(comm, cfg);
}

TEST_F(mpi_engine, a_frozen_parameter_is_left_out) {
  cfg.plan_patience = std::chrono::milliseconds(200);
  testing_support::a_tensor_no_rank_submits_is_left_out(comm, cfg, true);
}

TEST_F(mpi_engine, a_withheld_tensor_under_a_plan_times_out_naming_the_rank) {
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  cfg.plan_patience = std::chrono::milliseconds(200);
  cfg.stall_warning = std::chrono::milliseconds(200);
  cfg.stall_shutdown = std::chrono::milliseconds(500);
  testing_support::a_withheld_tensor_times_out_after_the_patience(comm, cfg);
}

TEST_F(mpi_engine, quiet_engines_sleep_and_wait_past_the_timeout) {
  cfg.timeout = std::chrono::milliseconds(700);  // the communicator's deadline, which the engine's waits take
  communicator short_deadline = communicator::from_mpi(MPI_COMM_WORLD, cfg, thread_need::multiple);
  testing_support::quiet_engines_sleep_and_wait_past_the_timeout(short_deadline, cfg);
}

}  // namespace
}  // namespace flexpar
