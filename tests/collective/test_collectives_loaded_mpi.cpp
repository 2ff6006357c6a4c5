// The collectives while every rank's process also runs a thread that never stops computing (a
// competing load on the ranks' cores: with 2-4 ranks on 2 cores each rank shares its core with a
// busy thread), against MPI's own collectives on the same inputs. ctest runs it on one node (the
// shared-memory rounds), with every rank a node of its own (FLEXPAR_RANKS_PER_NODE=1: the transport
// algorithms and their clear-to-send hand-shake, collective/context.hpp) and as 2 nodes of 2 ranks
// (hierarchical with its shared-memory steps). Sizes cross the hand-shake's rendezvous threshold,
// uneven and zero counts included.
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <thread>
#include <vector>

#include <flexpar/collective.hpp>

#include "oracle.hpp"

namespace flexpar {
namespace {

using namespace testing_support;

/// A thread that spins until destroyed: the competing load.
class busy_thread {
 public:
  busy_thread()
      : worker_([this] {
          std::uint64_t x = 1;
          while (!stop_.load(std::memory_order_relaxed)) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
          sink_.store(x, std::memory_order_relaxed);
        }) {}
  ~busy_thread() {
    stop_.store(true);
    worker_.join();
  }
  busy_thread(const busy_thread&) = delete;
  busy_thread& operator=(const busy_thread&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> sink_{0};
  std::thread worker_;
};

communicator make_comm() {
  config cfg = config::from_environment();
  cfg.timeout = std::chrono::seconds(60);
  return communicator::from_mpi(MPI_COMM_WORLD, cfg);
}

/// Element counts: empty, tiny, odd, and past the 64 KiB hand-shake threshold with remainders.
constexpr std::size_t counts[] = {0, 1, 7, (std::size_t{64} << 10) / sizeof(float) + 3, (std::size_t{1} << 20) + 5};

std::vector<float> mpi_sum(const communicator& comm, const std::vector<float>& in) {
  std::vector<float> out(in.size());
  EXPECT_EQ(
      MPI_Allreduce_c(in.data(), out.data(), static_cast<MPI_Count>(in.size()), MPI_FLOAT, MPI_SUM, comm.mpi_comm()),
      MPI_SUCCESS);
  return out;
}

std::vector<algorithm> allreduce_algorithms(const communicator& comm) {
  std::vector<algorithm> a{algorithm::ring, algorithm::halving_doubling, algorithm::automatic};
  if (comm.topology().node_count() == 1) a.push_back(algorithm::shared_memory);
  if (comm.topology().uniform() && comm.topology().node_count() > 1) a.push_back(algorithm::hierarchical);
  return a;
}

TEST(loaded_collectives, allreduce_matches_mpi_with_a_busy_thread_on_every_rank) {
  communicator comm = make_comm();
  const busy_thread load;
  for (std::size_t n : counts) {
    const std::vector<float> input = make_input<float>(reduce_op::sum, comm.rank(), n);
    const std::vector<float> want = mpi_sum(comm, input);
    for (algorithm a : allreduce_algorithms(comm)) {
      for (int repeat = 0; repeat < 3; ++repeat) {
        std::vector<float> data = input;
        allreduce(comm, std::span(data), reduce_op::sum, a);
        ASSERT_EQ(data, want) << "allreduce(" << name_of(a) << ") of " << n << " f32, call " << repeat << ", rank "
                              << comm.rank();
      }
    }
  }
}

TEST(loaded_collectives, reduce_scatter_and_allgather_match_mpi_with_a_busy_thread_on_every_rank) {
  communicator comm = make_comm();
  const busy_thread load;
  const auto p = static_cast<std::size_t>(comm.size());
  for (std::size_t n : counts) {
    // reduce_scatter_v of uneven blocks (block q has n + q elements), then allgather_v back
    std::vector<std::size_t> blocks(p);
    for (std::size_t q = 0; q < p; ++q) blocks[q] = n + q;
    const std::size_t total = std::accumulate(blocks.begin(), blocks.end(), std::size_t{0});
    const std::vector<float> input = make_input<float>(reduce_op::sum, comm.rank(), total);
    const std::vector<float> want = mpi_sum(comm, input);
    for (algorithm a : {algorithm::ring, algorithm::automatic}) {
      std::vector<float> data = input;
      const std::span<float> mine =
          reduce_scatter_v(comm, std::span(data), std::span<const std::size_t>(blocks), reduce_op::sum, a);
      const std::size_t at = std::accumulate(blocks.begin(), blocks.begin() + comm.rank(), std::size_t{0});
      ASSERT_TRUE(std::equal(mine.begin(), mine.end(), want.begin() + static_cast<std::ptrdiff_t>(at)))
          << "reduce_scatter_v(" << name_of(a) << ") of " << total << " f32, rank " << comm.rank();
      std::vector<float> gathered(total, -1.0f);
      allgather_v(comm, std::span<const float>(mine), std::span(gathered), std::span<const std::size_t>(blocks), a);
      ASSERT_EQ(gathered, want) << "allgather_v(" << name_of(a) << ") of " << total << " f32, rank " << comm.rank();
    }
  }
}

}  // namespace
}  // namespace flexpar
