// Issue 40, row 9: with MPI_COMM_WORLD's default handler (MPI_ERRORS_ARE_FATAL), a ring allreduce
// whose ranks disagree about the count aborted the job in MPICH ("Message truncated", raised by
// MPI_Test through the world's handler) before flexpar could say anything. Now the ranks agree on
// the call before any data moves (collective/call_agreement.hpp): every rank ends in the same
// mismatch_error. A message longer than its receive, which a collective can no longer send, still
// ends in a transport_error saying so on the receiving rank (point to point over the transport),
// not in an abort. This program never touches the world's handler (flexpar switches it only for the
// duration of each MPI_Test of a receive, and the test checks it is the default again afterwards).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <flexpar/collective.hpp>

namespace flexpar {
namespace {

TEST(mpi_error_handler, mismatched_ring_allreduce_ends_in_flexpar_errors_not_an_abort) {
  MPI_Errhandler world_handler = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &world_handler);
  EXPECT_EQ(world_handler, MPI_ERRORS_ARE_FATAL) << "this test is about the default handler";
  MPI_Errhandler_free(&world_handler);

  config cfg = config::from_environment();
  cfg.timeout = std::chrono::seconds(3);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world < 2) GTEST_SKIP() << "needs two ranks";
  {
    auto comm = communicator::from_mpi(MPI_COMM_WORLD, cfg);
    const int me = comm.rank(), p = comm.size();
    // Rank 1's blocks are longer; the rank after it in the ring receives them.
    std::vector<float> data(1000 + (me == 1 ? 3 * static_cast<std::size_t>(p) : 0), 1.0f);
    try {
      allreduce(comm, std::span(data), reduce_op::sum, algorithm::ring);
      ADD_FAILURE() << "the mismatched allreduce returned";
    } catch (const mismatch_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("[rank " + std::to_string(me) + "] allreduce: the ranks disagree about the call: "),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("of 1000 f32 (sum)"), std::string::npos) << what;
    }
    // A longer message than the receive: rank 1 sends 8 bytes more than rank 0 takes.
    std::vector<std::byte> message(me == 1 ? 72 : 64);
    if (me == 1) comm.transport().send(0, 7, message, comm.default_deadline());
    if (me == 0) {
      try {
        request r = comm.transport().irecv(1, 7, message);
        r.wait(comm.default_deadline());
        ADD_FAILURE() << "a longer message fit a shorter receive";
      } catch (const transport_error& e) {
        EXPECT_NE(std::string(e.what()).find("Message truncated"), std::string::npos) << e.what();
      }
    }
  }
  // The MPI transport tests its receives with the world's handler switched to MPI_ERRORS_RETURN for
  // each MPI_Test (mpi_transport.cpp): afterwards it is the default again.
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &world_handler);
  EXPECT_EQ(world_handler, MPI_ERRORS_ARE_FATAL) << "the world's handler was left switched";
  MPI_Errhandler_free(&world_handler);
  // The world is still usable (GoogleTest's main agrees on the exit status through it).
  int one = 1, all = 0;
  MPI_Allreduce(&one, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(all, world);
}

}  // namespace
}  // namespace flexpar
