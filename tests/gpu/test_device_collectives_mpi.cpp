// flexpar/cuda/collective.hpp under mpiexec: every device path (nccl, flexpar's ring over NCCL
// point-to-point, staged, and ipc between the processes of the node) against the serial oracle on
// small integers, uneven sizes. NCCL puts one rank
// per GPU: where a node has fewer GPUs than ranks, the ranks share them (device = local rank modulo the
// GPUs) and only the paths without NCCL run (staged, and automatic's choice among them), so a
// one-GPU machine still runs the staged path across processes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/cuda/collective.hpp>

#include "gpu/device_io.hpp"

namespace fc = flexpar::cuda;
using flexpar::reduce_op;
using flexpar::testing_support::download;
using namespace std::chrono_literals;

namespace {

float value(int rank, std::size_t i) { return static_cast<float>(static_cast<int>((i * 5 + rank * 7) % 13) - 6); }

}  // namespace

TEST(DeviceCollectivesMpi, EveryPathMatchesTheSerialOracle) {
  flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  const int devices = fc::device_count();  // at least one: the gpu tests' main skips without
  fc::device_options options;
  options.use_nccl = devices >= comm.topology().local_size();
  const int device = comm.topology().local_rank() % devices;
  const fc::device_guard on(device);
  fc::device_communicator gpu(comm, device, options);
  if (comm.rank() == 0 && !options.use_nccl)
    std::printf("%d ranks on %d GPU(s) of this node: the staged and automatic paths only (no NCCL)\n",
                comm.topology().local_size(), devices);
  fc::stream s;
  const int p = comm.size();
  std::vector<fc::device_path> paths{fc::device_path::staged, fc::device_path::automatic};
  if (gpu.has_nccl()) paths.insert(paths.end(), {fc::device_path::nccl, fc::device_path::ring});
  if (gpu.has_ipc()) paths.push_back(fc::device_path::ipc);
  ASSERT_TRUE(gpu.has_ipc()) << "every rank of this test is on one node: the ipc path must exist";
  for (fc::device_path path : paths) {
    for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::avg}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1001}, std::size_t{(1 << 20) + 3}}) {
        std::vector<float> mine(n);
        for (std::size_t i = 0; i < n; ++i) mine[i] = value(comm.rank(), i) * static_cast<float>(p);
        fc::device_buffer<float> d(n);
        fc::copy_async(d.span(), std::span(mine), s);
        gpu.allreduce(d.span(), op, s, path);
        std::vector<float> got(n);
        fc::copy_async(std::span(got), fc::device_span<const float>(d.span()), s);
        gpu.synchronize(s, "allreduce");
        for (std::size_t i = 0; i < n; ++i) {
          float want = op == reduce_op::max ? -1e9f : 0.0f;
          for (int r = 0; r < p; ++r) {
            const float v = value(r, i) * static_cast<float>(p);
            want = op == reduce_op::max ? std::max(want, v) : want + v;
          }
          if (op == reduce_op::avg) want /= static_cast<float>(p);  // exact: every term is a multiple of p
          ASSERT_EQ(got[i], want) << fc::name_of(path) << " " << flexpar::name_of(op) << " n " << n << " i " << i;
        }
      }
    }
  }
}

namespace {

fc::device_communicator make_gpu(flexpar::communicator& comm, fc::ipc_sync mode, std::size_t round_bytes,
                                 fc::ipc_allreduce script = fc::ipc_allreduce::automatic) {
  const int devices = fc::device_count();
  fc::device_options options;
  options.use_nccl = devices >= comm.topology().local_size();
  options.ipc_sync_mode = mode;
  options.ipc_round_bytes = round_bytes;
  options.ipc_allreduce_script = script;
  const int device = comm.topology().local_rank() % devices;
  const fc::device_guard on(device);
  return fc::device_communicator(comm, device, options);
}

}  // namespace

// reduce_scatter, allgather, broadcast and alltoall across processes on every path the node has, the
// ipc path in both barrier modes and with rounds of 64 KiB (several rounds per call) and 32 MiB.
TEST(DeviceCollectivesMpi, EveryCollectiveOnEveryPathMatchesTheSerialOracle) {
  flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  const int p = comm.size(), me = comm.rank();
  const auto P = static_cast<std::size_t>(p), ME = static_cast<std::size_t>(me);
  for (fc::ipc_sync mode : {fc::ipc_sync::events, fc::ipc_sync::host}) {
    for (std::size_t round : {std::size_t{64} << 10, std::size_t{32} << 20}) {
      fc::device_communicator gpu = make_gpu(comm, mode, round);
      const fc::device_guard on(gpu.device());
      fc::stream s;
      std::vector<fc::device_path> paths{fc::device_path::staged, fc::device_path::automatic, fc::device_path::ipc};
      if (gpu.has_nccl()) paths.push_back(fc::device_path::nccl);
      for (fc::device_path path : paths) {
        for (std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{100003}}) {
          const std::string where = std::string(fc::name_of(path)) + " n " + std::to_string(n) + " round " +
                                    std::to_string(round) + (mode == fc::ipc_sync::host ? " host" : " events");
          // reduce_scatter (sum)
          std::vector<float> in(n * P);
          for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(me, i);
          fc::device_buffer<float> send(n * P), recv(n * P);
          fc::copy_async(send.span(), std::span<const float>(in), s);
          gpu.reduce_scatter(fc::device_span<const float>(send.span()), recv.span().first(n), reduce_op::sum, s, path);
          auto got = download(fc::device_span<const float>(recv.span().first(n)), s);
          for (std::size_t i = 0; i < n; ++i) {
            float want = 0;
            for (int r = 0; r < p; ++r) want += value(r, ME * n + i);
            ASSERT_EQ(got[i], want) << "reduce_scatter " << where << " i " << i;
          }
          // allgather
          gpu.allgather(fc::device_span<const float>(send.span().first(n)), recv.span(), s, path);
          got = download(fc::device_span<const float>(recv.span()), s);
          for (int r = 0; r < p; ++r)
            for (std::size_t i = 0; i < n; ++i)
              ASSERT_EQ(got[static_cast<std::size_t>(r) * n + i], value(r, i)) << "allgather " << where;
          // broadcast from the last rank
          fc::copy_async(send.span(), std::span<const float>(in), s);
          gpu.broadcast(send.span().first(n), p - 1, s, path);
          got = download(fc::device_span<const float>(send.span().first(n)), s);
          for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], value(p - 1, i)) << "broadcast " << where;
          // alltoall: block q of rank r's input is value(r, q * n + i)
          fc::copy_async(send.span(), std::span<const float>(in), s);
          gpu.alltoall(fc::device_span<const float>(send.span()), recv.span(), s, path);
          got = download(fc::device_span<const float>(recv.span()), s);
          for (int r = 0; r < p; ++r)
            for (std::size_t i = 0; i < n; ++i)
              ASSERT_EQ(got[static_cast<std::size_t>(r) * n + i], value(r, ME * n + i)) << "alltoall " << where;
        }
      }
    }
  }
}

// The ipc allreduce's two scripts across processes, both barrier modes, several rounds.
TEST(DeviceCollectivesMpi, BothIpcAllreduceScriptsMatchTheSerialOracle) {
  flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  const int p = comm.size();
  for (fc::ipc_sync mode : {fc::ipc_sync::events, fc::ipc_sync::host}) {
    for (fc::ipc_allreduce script : {fc::ipc_allreduce::one_shot, fc::ipc_allreduce::two_step}) {
      fc::device_communicator gpu = make_gpu(comm, mode, std::size_t{64} << 10, script);
      const fc::device_guard on(gpu.device());
      fc::stream s;
      for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::avg}) {
        for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{100003}}) {
          std::vector<float> mine(n);
          for (std::size_t i = 0; i < n; ++i) mine[i] = value(comm.rank(), i) * static_cast<float>(p);
          fc::device_buffer<float> d(n);
          fc::copy_async(d.span(), std::span<const float>(mine), s);
          gpu.allreduce(d.span(), op, s, fc::device_path::ipc);
          const auto got = download(fc::device_span<const float>(d.span()), s);
          for (std::size_t i = 0; i < n; ++i) {
            float want = op == reduce_op::max ? -1e9f : 0.0f;
            for (int r = 0; r < p; ++r) {
              const float v = value(r, i) * static_cast<float>(p);
              want = op == reduce_op::max ? std::max(want, v) : want + v;
            }
            if (op == reduce_op::avg) want /= static_cast<float>(p);
            ASSERT_EQ(got[i], want) << (script == fc::ipc_allreduce::one_shot ? "one shot " : "two steps ")
                                    << (mode == fc::ipc_sync::host ? "host " : "events ") << flexpar::name_of(op)
                                    << " n " << n << " i " << i;
          }
        }
      }
    }
  }
}

// The last rank asks for three times the elements: every rank's ipc allreduce ends in a
// mismatch_error that names both sides, before any rank reads another's memory.
TEST(DeviceCollectivesMpi, AMismatchedIpcCallIsAMismatchErrorOnEveryRank) {
  flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  const int p = comm.size();
  fc::device_communicator gpu = make_gpu(comm, fc::ipc_sync::events, std::size_t{32} << 20);
  const fc::device_guard on(gpu.device());
  fc::stream s;
  const std::size_t n = comm.rank() == p - 1 ? 3000 : 1000;
  fc::device_buffer<float> d(n);
  std::string others = p == 2 ? "rank {0}" : "ranks {0,1}";
  try {
    gpu.allreduce(d.span(), reduce_op::sum, s, fc::device_path::ipc);
    ADD_FAILURE() << "no error on rank " << comm.rank();
  } catch (const flexpar::mismatch_error& e) {
    EXPECT_NE(std::string(e.what()).find("[rank " + std::to_string(comm.rank()) +
                                         "] device allreduce (ipc): the ranks disagree on call #1: allreduce of 1000 "
                                         "f32 (sum) on " +
                                         others + ", but allreduce of 3000 f32 (sum) on rank {" +
                                         std::to_string(p - 1) + "}"),
              std::string::npos)
        << e.what();
  }
}
