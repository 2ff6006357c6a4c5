// flexpar/cuda/collective.hpp under mpiexec: every device path (nccl, flexpar's ring over NCCL
// point-to-point, staged) against the serial oracle on small integers, uneven sizes. NCCL puts one rank
// per GPU: where a node has fewer GPUs than ranks, the ranks share them (device = local rank modulo the
// GPUs) and only the paths without NCCL run (staged, and automatic's choice among them), so a
// one-GPU machine still runs the staged path across processes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/cuda/collective.hpp>

namespace fc = flexpar::cuda;
using flexpar::reduce_op;
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
