// Checkpoints under mpiexec (MPICH): the scenario's model saved by one world (save(), and an
// async_saver whose thread writes over MPI while the test's own allreduce runs), then loaded in a
// separate mpiexec run of another world size with every target SBP, and by 4 threads of one process.
// The directory comes from FLEXPAR_CHECKPOINT_MPI_DIR (tests/checkpoint/CMakeLists.txt); the load
// test requires the save test (a ctest fixture).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <flexpar/checkpoint/checkpoint.hpp>
#include <flexpar/comm/run_in_process.hpp>

#include "checkpoint_scenarios.hpp"
#include "support/test_config.hpp"

namespace flexpar::checkpoint {
namespace {

using namespace testing_support;

std::filesystem::path shared_directory() {
  const char* dir = std::getenv("FLEXPAR_CHECKPOINT_MPI_DIR");
  return dir ? std::filesystem::path(dir) : std::filesystem::temp_directory_path() / "flexpar_checkpoint_mpi";
}

TEST(checkpoint_mpi, save) {
  communicator comm = communicator::from_mpi(MPI_COMM_WORLD);
  const std::filesystem::path dir = shared_directory();
  save_model(comm, dir / "sync", 300 + comm.size());
  async_saver saver(comm);
  save_model(comm, dir / "async", 400 + comm.size(), {.chunk_bytes = 40}, &saver);
  EXPECT_EQ(read_contents(dir / "sync").world_size, comm.size());
  EXPECT_EQ(read_contents(dir / "async").integer("step"), 400 + comm.size());
}

TEST(checkpoint_mpi, load) {
  communicator comm = communicator::from_mpi(MPI_COMM_WORLD);
  const std::filesystem::path dir = shared_directory();
  const int saved = read_contents(dir / "sync").world_size;
  ASSERT_NE(saved, comm.size()) << "this test loads on another world size than the save's";
  for (const auto& [name, step] : {std::pair{"sync", 300 + saved}, std::pair{"async", 400 + saved}}) {
    expect_model<split<0>>(comm, dir / name, step, false);
    expect_model<split<1>>(comm, dir / name, step, false);
    expect_model<broadcast>(comm, dir / name, step, false);
    expect_model<partial_sum>(comm, dir / name, step, false);
  }
  // per-rank tensors stay with their ranks: on another world size, every rank gets the error
  std::vector<std::int64_t> mine(1);
  state s;
  s.add_per_rank("rng", std::span<std::int64_t>(mine));
  try {
    load(comm, dir / "sync", s);
    ADD_FAILURE() << "a per-rank tensor loaded on another world size";
  } catch (const mismatch_error& e) {
    EXPECT_NE(std::string(e.what()).find("per-rank tensor saved by " + std::to_string(saved)), std::string::npos)
        << e.what();
  }
  // the checkpoint of processes, loaded by threads
  if (comm.rank() == 0)
    run_in_process(
        4, [&](communicator& threads) { expect_model<split<1>>(threads, dir / "sync", 300 + saved, false); },
        flexpar::testing_support::with_timeout());
}

}  // namespace
}  // namespace flexpar::checkpoint
