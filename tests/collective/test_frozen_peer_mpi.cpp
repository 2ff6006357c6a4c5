// A rank that is alive but in no flexpar call (frozen in its own code) while the others wait in a
// collective for it: every waiting rank's timeout_error names that rank, by the heartbeats that say
// it has polled no flexpar request for as long as they have waited, instead of the neighbour each
// happened to wait for. Run at 4 ranks, each a node of its own (FLEXPAR_RANKS_PER_NODE=1: the ranks
// wait in transport requests), over MPI or UCX (FLEXPAR_TRANSPORT). With 4 ranks and rank 3 frozen,
// rank 2 waits for rank 0 (who waits for rank 3): its own wait names rank 0, its stall text rank 3.
#include <gtest/gtest.h>

#include <mpi.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <flexpar/collective.hpp>

namespace flexpar {
namespace {

TEST(frozen_peer, every_waiting_rank_names_the_rank_in_no_call) {
  config cfg = config::from_environment();
  cfg.timeout = std::chrono::seconds(3);
  cfg.heartbeat_interval = std::chrono::milliseconds(100);
  communicator comm = communicator::from_mpi(MPI_COMM_WORLD, cfg);
  ASSERT_GE(comm.size(), 3) << "run with mpiexec -n 3 or more";
  ASSERT_GT(comm.topology().node_count(), 1) << "run with FLEXPAR_RANKS_PER_NODE=1";
  const int frozen = comm.size() - 1;
  std::vector<float> v(1000, 1.0f);
  allreduce(comm, std::span(v), reduce_op::sum, algorithm::ring);  // every rank takes part once
  if (comm.rank() == frozen) {
    std::this_thread::sleep_for(cfg.timeout + std::chrono::seconds(2));  // beating, but in no call
  } else {
    std::string text;
    try {
      allreduce(comm, std::span(v), reduce_op::sum, algorithm::ring);
      ADD_FAILURE() << "rank " << comm.rank() << ": the allreduce returned without rank " << frozen;
    } catch (const timeout_error& e) {
      text = e.what();
    }
    EXPECT_NE(text.find("; rank " + std::to_string(frozen) +
                        " is alive (its heartbeats arrive) but has been in no flexpar wait for "),
              std::string::npos)
        << text;
    for (int r = 0; r < frozen; ++r)
      EXPECT_EQ(text.find("; rank " + std::to_string(r) + " is alive"), std::string::npos)
          << "a waiting rank was named: " << text;
    std::printf("rank %d: %s\n", comm.rank(), text.c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace flexpar
