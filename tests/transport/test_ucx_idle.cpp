// A UCX wait sleeps on the worker's event fd instead of spinning: while rank 0 waits ~1 s for a
// message that rank 1 sends late, rank 0's process uses far less CPU time than wall time.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <thread>
#include <vector>

#include <flexpar/comm/communicator.hpp>

namespace flexpar {
namespace {

/// CPU time (user + system) of the whole process, every thread included (UCX's own too).
double process_cpu_seconds() {
  rusage usage{};
  EXPECT_EQ(getrusage(RUSAGE_SELF, &usage), 0);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

TEST(ucx_idle, a_waiting_rank_does_not_burn_a_core) {
  config cfg = config::from_environment();
  cfg.timeout = std::chrono::seconds(60);
  communicator comm = communicator::from_mpi(MPI_COMM_WORLD, cfg);
  ASSERT_EQ(comm.transport().kind(), transport_kind::ucx) << "run with FLEXPAR_TRANSPORT=ucx";
  ASSERT_EQ(comm.size(), 2) << "run with 2 ranks";
  std::vector<std::byte> message(4096, std::byte{7});
  if (comm.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    comm.transport().send(0, 1, message, comm.default_deadline());
    return;
  }
  std::vector<std::byte> in(message.size());
  request r = comm.transport().irecv(1, 1, in);
  const double cpu_before = process_cpu_seconds();
  const auto started = clock::now();
  r.wait(comm.default_deadline());
  const double wall = std::chrono::duration<double>(clock::now() - started).count();
  const double cpu = process_cpu_seconds() - cpu_before;
  EXPECT_EQ(in, message);
  EXPECT_GE(wall, 0.5) << "rank 1 sent early: the wait measured nothing";
  EXPECT_LT(cpu, 0.5 * wall) << "waiting " << wall << " s used " << cpu << " s of CPU: the wait spins";
}

}  // namespace
}  // namespace flexpar
