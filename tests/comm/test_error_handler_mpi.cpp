// Issue 40, row 9: with MPI_COMM_WORLD's default handler (MPI_ERRORS_ARE_FATAL), a ring allreduce
// whose ranks disagree about the count aborted the job in MPICH ("Message truncated", raised by
// MPI_Test through the world's handler) before flexpar could say anything. Now every rank ends in a
// flexpar exception: the rank that receives the longer message a transport_error saying so, a
// rank that receives a shorter one a mismatch_error (collectives receive exactly), the others a
// timeout_error; nothing aborts. This program never touches the world's handler.
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
    const int receiver = 2 % p;
    std::string what;
    bool flexpar_error = false, truncated = false;
    try {
      allreduce(comm, std::span(data), reduce_op::sum, algorithm::ring);
    } catch (const transport_error& e) {
      flexpar_error = true;
      what = e.what();
      truncated = what.find("Message truncated") != std::string::npos;
    } catch (const mismatch_error& e) {  // a shorter message than this rank computed
      flexpar_error = true;
      what = e.what();
    } catch (const timeout_error& e) {
      flexpar_error = true;
      what = e.what();
    }
    EXPECT_TRUE(flexpar_error) << "the mismatched allreduce returned";
    EXPECT_NE(what.find("[rank " + std::to_string(me) + "]"), std::string::npos) << what;
    if (me == receiver) {
      EXPECT_TRUE(truncated) << what;
    }
  }
  // The world is still usable (GoogleTest's main agrees on the exit status through it).
  int one = 1, all = 0;
  MPI_Allreduce(&one, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(all, world);
}

}  // namespace
}  // namespace flexpar
