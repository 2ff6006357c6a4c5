// flexpar/cuda/collective.hpp on one GPU: threads as ranks over the in-process transport, every rank
// on device 0, the staged path (D2H, host collective, H2D) against a serial oracle; small integers
// so every reduction is exact. One rank also through NCCL (a single GPU holds one NCCL rank).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/cuda/collective.hpp>

#include "gpu/device_io.hpp"
#include "support/test_config.hpp"

namespace fc = flexpar::cuda;
using flexpar::reduce_op;
using flexpar::testing_support::download;
using namespace std::chrono_literals;

namespace {

fc::device_options staged_only() {
  fc::device_options o;
  o.use_nccl = false;
  o.staging_chunk_bytes = 4096;  // several chunks even for small tensors: the pipeline is exercised
  return o;
}

template <class T>
std::vector<T> input_of(int rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(static_cast<int>((i * 7 + rank * 3) % 11) - 5);
  return v;
}

}  // namespace

TEST(DeviceCollectives, StagedAllreduceMatchesTheSerialSum) {
  for (int world : {1, 2, 3}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{3 * 1024 + 5}}) {
      flexpar::run_in_process(
          world,
          [&](flexpar::communicator& comm) {
            fc::device_communicator gpu(comm, 0, staged_only());
            fc::stream s;
            const std::vector<float> mine = input_of<float>(comm.rank(), n);
            fc::device_buffer<float> d(n);
            fc::copy_async(d.span(), std::span(mine), s);
            gpu.allreduce(d.span(), reduce_op::sum, s, fc::device_path::staged);
            const std::vector<float> got = download(fc::device_span<const float>(d.span()), s);
            for (std::size_t i = 0; i < n; ++i) {
              float expected = 0;
              for (int r = 0; r < world; ++r) expected += input_of<float>(r, n)[i];
              ASSERT_EQ(got[i], expected) << "world " << world << " n " << n << " i " << i;
            }
          },
          flexpar::testing_support::with_timeout(60s));
    }
  }
}

TEST(DeviceCollectives, StagedAllgatherReduceScatterBroadcast) {
  for (int world : {2, 3}) {
    const std::size_t n = 777;
    flexpar::run_in_process(
        world,
        [&](flexpar::communicator& comm) {
          const auto p = static_cast<std::size_t>(world);
          fc::device_communicator gpu(comm, 0, staged_only());
          fc::stream s;
          // allgather
          const std::vector<std::int32_t> mine = input_of<std::int32_t>(comm.rank(), n);
          fc::device_buffer<std::int32_t> in(n), all(n * p);
          fc::copy_async(in.span(), std::span(mine), s);
          gpu.allgather(fc::device_span<const std::int32_t>(in.span()), all.span(), s);
          const auto gathered = download(fc::device_span<const std::int32_t>(all.span()), s);
          for (int r = 0; r < world; ++r)
            for (std::size_t i = 0; i < n; ++i)
              ASSERT_EQ(gathered[static_cast<std::size_t>(r) * n + i], input_of<std::int32_t>(r, n)[i]);
          // reduce_scatter (max)
          const std::vector<double> big = input_of<double>(comm.rank(), n * p);
          fc::device_buffer<double> send(n * p), recv(n);
          fc::copy_async(send.span(), std::span(big), s);
          gpu.reduce_scatter(fc::device_span<const double>(send.span()), recv.span(), reduce_op::max, s);
          const auto block = download(fc::device_span<const double>(recv.span()), s);
          for (std::size_t i = 0; i < n; ++i) {
            double expected = -1e9;
            for (int r = 0; r < world; ++r)
              expected = std::max(expected, input_of<double>(r, n * p)[static_cast<std::size_t>(comm.rank()) * n + i]);
            ASSERT_EQ(block[i], expected);
          }
          // broadcast from the last rank
          fc::device_buffer<float> b(n);
          const std::vector<float> own = input_of<float>(comm.rank(), n);
          fc::copy_async(b.span(), std::span(own), s);
          gpu.broadcast(b.span(), world - 1, s);
          EXPECT_EQ(download(fc::device_span<const float>(b.span()), s), input_of<float>(world - 1, n));
        },
        flexpar::testing_support::with_timeout(60s));
  }
}

TEST(DeviceCollectives, MismatchedSizesAndBadRootAreUsageErrors) {
  flexpar::run_in_process(
      2,
      [&](flexpar::communicator& comm) {
        fc::device_communicator gpu(comm, 0, staged_only());
        fc::stream s;
        fc::device_buffer<float> in(10), out(19);
        EXPECT_THROW(gpu.allgather(fc::device_span<const float>(in.span()), out.span(), s), flexpar::usage_error);
        EXPECT_THROW(gpu.broadcast(in.span(), 2, s), flexpar::usage_error);
        EXPECT_THROW(gpu.allreduce(in.span(), reduce_op::sum, s, fc::device_path::nccl), flexpar::usage_error);
      },
      flexpar::testing_support::with_timeout(60s));
}

// A stream of another GPU than the communicator's: a usage_error naming the rank, the op, both GPUs
// and the size, before any work is queued (needs two GPUs: skipped on a machine with one).
TEST(DeviceCollectives, AStreamOfAnotherGpuIsAUsageError) {
  if (fc::device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  flexpar::run_in_process(
      1,
      [&](flexpar::communicator& comm) {
        fc::device_communicator gpu(comm, 0, staged_only());
        fc::device_buffer<float> data(10);
        cudaStream_t other = nullptr;
        {
          const fc::device_guard on(1);
          FLEXPAR_CHECK_CUDA(0, cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
        }
        try {
          gpu.allreduce(data.span(), reduce_op::sum, other);
          ADD_FAILURE() << "a stream of GPU 1 was accepted by a communicator of GPU 0";
        } catch (const flexpar::usage_error& e) {
          const std::string text = e.what();
          for (const char* part : {"[rank 0] device allreduce", "GPU 1", "GPU 0", "10 elements of f32"})
            EXPECT_NE(text.find(part), std::string::npos) << part << " not in: " << text;
        }
        const fc::device_guard on(1);
        FLEXPAR_CHECK_CUDA(0, cudaStreamDestroy(other));
      },
      flexpar::testing_support::with_timeout(60s));
}

TEST(DeviceCollectives, AutomaticChoosesByCost) {
  flexpar::run_in_process(
      1,
      [&](flexpar::communicator& comm) {
        fc::device_communicator gpu(comm, 0);
        const auto c = gpu.choose("allreduce", 64 << 20);
        if (gpu.has_nccl()) {
          EXPECT_EQ(c.path, fc::device_path::nccl);
          EXPECT_LT(c.nccl_seconds, c.staged_seconds);
        } else {
          EXPECT_EQ(c.path, fc::device_path::staged);
        }
      },
      flexpar::testing_support::with_timeout(60s));
}

TEST(DeviceCollectives, EveryPathOnOneRankReturnsItsInput) {
  flexpar::run_in_process(
      1,
      [&](flexpar::communicator& comm) {
        fc::device_communicator gpu(comm, 0);
        fc::stream s;
        std::vector<fc::device_path> paths{fc::device_path::staged, fc::device_path::automatic};
        if (gpu.has_nccl()) paths.insert(paths.end(), {fc::device_path::nccl, fc::device_path::ring});
        const std::vector<float> mine = input_of<float>(0, 5000);
        for (fc::device_path path : paths) {
          fc::device_buffer<float> d(mine.size());
          fc::copy_async(d.span(), std::span(mine), s);
          gpu.allreduce(d.span(), reduce_op::avg, s, path);
          EXPECT_EQ(download(fc::device_span<const float>(d.span()), s), mine) << fc::name_of(path);
        }
        if (gpu.has_nccl()) {
          fc::device_buffer<float> d(8);
          EXPECT_THROW(gpu.broadcast(d.span(), 0, s, fc::device_path::ring), flexpar::usage_error);
        }
      },
      flexpar::testing_support::with_timeout(60s));
}
