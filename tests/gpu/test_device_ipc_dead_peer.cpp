// A rank whose process exits in the middle of the device intra-node path: every survivor's blocked
// ipc allreduce ends with peer_failure naming that rank within a second (its pid is checked every
// 200 ms while a survivor waits), whatever the communicator's timeout (300 s here). Run under
// `mpiexec -disable-auto-cleanup -n 3` (MPICH's launcher otherwise kills the survivors when a process
// exits without MPI_Finalize); the survivors leave with _exit, since MPI_Finalize would wait for the
// rank that is gone.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/cuda/collective.hpp>

namespace fc = flexpar::cuda;
using flexpar::reduce_op;

TEST(DeviceIpcDeadPeer, EverySurvivorNamesTheRankWhoseProcessExited) {
  flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  ASSERT_EQ(comm.settings().timeout, std::chrono::milliseconds(300000))
      << "the default timeout: set no FLEXPAR_TIMEOUT";
  const int devices = fc::device_count();
  const int device = comm.topology().local_rank() % devices;
  const fc::device_guard on(device);
  fc::device_options options;
  options.use_nccl = false;
  {
    fc::device_communicator gpu(comm, device, options);
    ASSERT_TRUE(gpu.has_ipc());
    fc::stream s;
    fc::device_buffer<float> d(1 << 20);
    gpu.allreduce(d.span(), reduce_op::sum, s, fc::device_path::ipc);  // one call that works
    gpu.synchronize(s, "warm-up");
    if (comm.rank() == 1) {
      std::fflush(stdout);
      _exit(0);  // dies between two collectives: never reaches the next one
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      gpu.allreduce(d.span(), reduce_op::sum, s, fc::device_path::ipc);
      ADD_FAILURE() << "rank " << comm.rank() << ": no error";
    } catch (const flexpar::peer_failure& e) {
      const std::string text = e.what();
      EXPECT_NE(text.find("[rank " + std::to_string(comm.rank()) + "] device allreduce (ipc): rank 1 (pid "),
                std::string::npos)
          << text;
      EXPECT_NE(text.find(") has exited; it did not reach step 'ready' of call #2"), std::string::npos) << text;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 3.0);
    std::printf("rank %d: the death of rank 1 was named after %.3f s\n", comm.rank(), seconds);
  }  // the teardown does not wait for the dead rank either
  std::fflush(stdout);
  _exit(::testing::Test::HasFailure() ? 1 : 0);
}
