// The relaxations under mpiexec: the same scenarios as the in-process test, over real processes.
#include <gtest/gtest.h>

#include "relax_scenarios.hpp"

namespace flexpar {
namespace {

struct relax_mpi : ::testing::Test {
  config cfg = [] {
    config c = config::from_environment();
    c.timeout = std::chrono::seconds(60);
    return c;
  }();
  communicator comm = communicator::from_mpi(MPI_COMM_WORLD, cfg);
};

TEST_F(relax_mpi, gradient_allreduce) {
  testing_support::gradient_allreduce_matches_reference(comm, false);
  testing_support::gradient_allreduce_matches_reference(comm, true);
}

// Run by the ctest entry test_relax.nodes.np4 with FLEXPAR_RANKS_PER_NODE=2 (and only there): the
// hierarchical allreduce over two "nodes" of this machine, not one node (where it is a plain
// intra-node allreduce).
TEST_F(relax_mpi, hierarchical_gradient_allreduce_over_nodes) {
  ASSERT_GT(comm.topology().node_count(), 1) << "needs FLEXPAR_RANKS_PER_NODE below the number of ranks";
  testing_support::gradient_allreduce_matches_reference(comm, true);
}

TEST_F(relax_mpi, bytegrad) {
  testing_support::bytegrad_matches_reference(comm, 512);
  testing_support::bytegrad_matches_reference(comm, 3);
}

TEST_F(relax_mpi, decentralized) {
  testing_support::decentralized_matches_reference(comm, "shift_one", 1);
  testing_support::decentralized_matches_reference(comm, "ring", 2);
  testing_support::decentralized_matches_reference(comm, "all", 1);
}

TEST_F(relax_mpi, local_sgd) { testing_support::local_sgd_matches_reference(comm, 3); }

TEST_F(relax_mpi, low_precision_decentralized) {
  testing_support::low_precision_decentralized_matches_reference(comm, 1, 512);
  testing_support::low_precision_decentralized_matches_reference(comm, 2, 5);
}

TEST_F(relax_mpi, onebit_adam_and_qadam) {
  testing_support::momentum_adam_matches_reference(comm, "onebit_adam", 64);
  testing_support::momentum_adam_matches_reference(comm, "qadam", 5);
  testing_support::onebit_error_feedback_tracks_the_true_sum(comm, 16);
}

TEST_F(relax_mpi, streamed_compressed_average) { testing_support::streamed_averages_are_the_averages_bitwise(comm); }

TEST_F(relax_mpi, async_model_average) { testing_support::async_abort_resume_finish(comm); }

TEST_F(relax_mpi, traffic) { testing_support::traffic_follows_the_formulas(comm); }

TEST_F(relax_mpi, every_algorithm_ends_with_one_model) { testing_support::every_algorithm_ends_with_one_model(comm); }

TEST_F(relax_mpi, bad_input) { testing_support::bad_input_is_a_usage_error(comm); }

}  // namespace
}  // namespace flexpar
