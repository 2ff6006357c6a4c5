// Ranks that disagree about a collective under mpiexec: every case of mismatch_cases.hpp (counts,
// dtypes of equal bytes, reduce ops, roots, uneven blocks, a call the others did not make) on every
// transport algorithm ends in the same mismatch_error on every rank, with its buffers untouched.
// FLEXPAR_TRANSPORT picks MPI or UCX; FLEXPAR_RANKS_PER_NODE=1 makes every rank a node of its own, so
// the ranks agree over the transport (the dissemination of collective/call_agreement.hpp), and the
// communicator keeps working afterwards; without it they agree through the node's segment.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include <mpi.h>

#include <flexpar/collective.hpp>

#include "mismatch_cases.hpp"

namespace flexpar {
namespace {

using namespace testing_support;

TEST(call_agreement_mpi, every_case_is_a_mismatch_error_on_every_rank) {
  config cfg = config::from_environment();
  cfg.timeout = std::chrono::seconds(20);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_GE(size, 3) << "run with mpiexec -n 3 or more";
  const int odd = size - 1;
  for (const mismatch_case& mc : mismatch_cases(size, odd)) {
    SCOPED_TRACE(mc.name);
    communicator comm = communicator::from_mpi(MPI_COMM_WORLD, cfg);  // one per case: the segment's breaks
    std::string text;
    try {
      mc.call(comm, comm.rank() == odd);
      ADD_FAILURE() << "rank " << comm.rank() << ": the mismatched call returned";
    } catch (const mismatch_error& e) {
      text = e.what();
    }
    EXPECT_NE(text.find("[rank " + std::to_string(comm.rank()) + "]"), std::string::npos) << text;
    for (const side& s : mc.says)
      EXPECT_TRUE(names_side(text, s)) << s.description << " on " << s.ranks << "\n" << text;
    if (comm.topology().node_count() > 1) {  // over the transport: still in step
      std::vector<float> one(1, 1.0f);
      allreduce(comm, std::span(one), reduce_op::sum, algorithm::ring);
      EXPECT_EQ(one[0], static_cast<float>(size));
    }
  }
}

}  // namespace
}  // namespace flexpar
