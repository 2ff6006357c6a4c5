// The engine with device tensors on a GPU (flexpar/cuda/engine.hpp): thread ranks on one GPU (the ipc
// path), then processes under mpiexec (test_engine_device_mpi). Many small device gradients submitted
// in a different order on every rank, fused, reduced and unpacked on the device, mixed with host
// tensors in the same engine; the results read back on the caller's stream after order_after(), with
// no host wait in between; every result against the serial sum; the timeline names the device path.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include <flexpar/collective.hpp>
#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/cuda/engine.hpp>
#include <flexpar/engine/gradient_sync.hpp>

#include "gpu/device_io.hpp"

namespace fc = flexpar::cuda;
using flexpar::reduce_op;
using flexpar::testing_support::download;

namespace {

flexpar::config engine_config() {
  flexpar::config c;
  c.timeout = std::chrono::seconds(60);
  c.cycle_time = std::chrono::microseconds(500);
  c.fusion_threshold = std::size_t{4} << 20;
  return c;
}

float value(int rank, int tensor, std::size_t i) {
  return static_cast<float>(
      static_cast<int>((i + static_cast<std::size_t>(tensor) * 3 + static_cast<std::size_t>(rank) * 5) % 9) - 4);
}

/// Every rank submits `n` device allreduces (sizes from one shared seed) and as many host ones, in its
/// own order, then checks every result.
void fused_gradients(flexpar::communicator& comm, int gpu_index, fc::device_options options, int n) {
  const int p = comm.size(), me = comm.rank();
  fc::device_communicator gpu(comm, gpu_index, options);
  fc::engine_backend backend(gpu);
  flexpar::engine eng(comm, engine_config(), {}, &backend);
  fc::stream s;
  std::mt19937 shared(42);
  std::vector<std::size_t> sizes(static_cast<std::size_t>(n));
  for (auto& c : sizes) c = std::uniform_int_distribution<std::size_t>(1, 4096)(shared);
  std::vector<fc::device_buffer<float>> device(static_cast<std::size_t>(n));
  std::vector<std::vector<float>> host(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t) {
    const auto k = static_cast<std::size_t>(t);
    std::vector<float> mine(sizes[k]);
    for (std::size_t i = 0; i < sizes[k]; ++i) mine[i] = value(me, t, i);
    device[k] = fc::device_buffer<float>(sizes[k]);
    fc::copy_async(device[k].span(), std::span<const float>(mine), s);  // no host wait: the marker orders
    host[k] = mine;
  }
  std::vector<int> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(7u + static_cast<unsigned>(me));
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<flexpar::handle> dh(static_cast<std::size_t>(n)), hh(static_cast<std::size_t>(n));
  for (int t : order) {
    const auto k = static_cast<std::size_t>(t);
    std::string name = std::to_string(t);  // "g<t>" / "h<t>", built without "g" + (GCC 12's -Wrestrict)
    dh[k] = fc::allreduce_async(eng, std::string(name).insert(0, 1, 'g'), device[k].span(), reduce_op::sum, s);
    hh[k] = eng.allreduce_async(name.insert(0, 1, 'h'), std::span(host[k]), reduce_op::sum);
  }
  for (int t = 0; t < n; ++t) fc::order_after(dh[static_cast<std::size_t>(t)], s);
  for (int t = 0; t < n; ++t) {
    const auto k = static_cast<std::size_t>(t);
    const auto got = download(fc::device_span<const float>(device[k].span()), s);
    hh[k].wait();
    for (std::size_t i = 0; i < sizes[k]; ++i) {
      float want = 0;
      for (int r = 0; r < p; ++r) want += value(r, t, i);
      ASSERT_EQ(got[i], want) << "device tensor " << t << " element " << i;
      ASSERT_EQ(host[k][i], want) << "host tensor " << t << " element " << i;
    }
    dh[k].wait();  // completes once the GPU is done
    EXPECT_EQ(dh[k].memory(), flexpar::memory_kind::cuda);
  }
  if (p > 1) {
    EXPECT_GT(eng.stats().fused_collectives, 0u);
  }
}

}  // namespace

/// A gradient_sync of device parameters on thread ranks sharing GPU 0 (the ipc path, no NCCL).
struct device_sync {
  device_sync(flexpar::communicator& comm, flexpar::gradient_sync_options options)
      : gpu(comm, 0,
            [] {
              fc::device_options o;
              o.use_nccl = false;
              return o;
            }()),
        backend(gpu),
        eng(comm, engine_config(), {}, &backend),
        sync(eng, options) {}
  fc::device_communicator gpu;
  fc::engine_backend backend;
  flexpar::engine eng;
  flexpar::gradient_sync sync;
};

bool under_mpiexec() { return std::getenv("PMI_RANK") != nullptr || std::getenv("PMI_FD") != nullptr; }

TEST(EngineDevice, FusedDeviceGradientsBesideHostTensorsOnThreadRanks) {
  if (under_mpiexec()) GTEST_SKIP() << "the thread-rank form runs without mpiexec";
  for (int world : {1, 2, 3}) {
    flexpar::run_in_process(
        world,
        [&](flexpar::communicator& comm) {
          fc::device_options o;
          o.use_nccl = world == 1;  // one GPU: NCCL holds one rank
          fused_gradients(comm, 0, o, 200);
        },
        engine_config());
  }
}

TEST(EngineDevice, TheTimelineNamesTheDevicePath) {
  if (under_mpiexec()) GTEST_SKIP() << "the thread-rank form runs without mpiexec";
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "flexpar_engine_device_timeline.json";
  std::filesystem::remove(file);
  flexpar::run_in_process(
      2,
      [&](flexpar::communicator& comm) {
        flexpar::config c = engine_config();
        c.timeline_path = file.string();
        fc::device_options o;
        o.use_nccl = false;
        fc::device_communicator gpu(comm, 0, o);
        fc::engine_backend backend(gpu);
        fc::stream s;
        fc::device_buffer<float> a(1000), b(3000);
        {
          flexpar::engine eng(comm, c, {}, &backend);
          auto ha = fc::allreduce_async(eng, "a", a.span(), reduce_op::sum, s);
          auto hb = fc::allreduce_async(eng, "b", b.span(), reduce_op::sum, s);
          ha.wait();
          hb.wait();
        }
      },
      engine_config());
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  // the path by cost: ipc or staged for two thread ranks sharing the GPU
  EXPECT_TRUE(text.str().find("\"cuda ipc\"") != std::string::npos ||
              text.str().find("\"cuda staged\"") != std::string::npos)
      << text.str().substr(0, 2000);
  EXPECT_NE(text.str().find("ALLREDUCE"), std::string::npos);
}

// Under mpiexec: processes that share a GPU (ipc path) or hold one each (NCCL).
TEST(EngineDevice, FusedDeviceGradientsAcrossProcesses) {
  if (!under_mpiexec()) GTEST_SKIP() << "runs under mpiexec (test_engine_device_mpi)";
  int provided = 0;
  MPI_Query_thread(&provided);
  ASSERT_EQ(provided, MPI_THREAD_MULTIPLE);
  flexpar::communicator comm =
      flexpar::communicator::from_mpi(MPI_COMM_WORLD, engine_config(), flexpar::thread_need::multiple);
  const int devices = fc::device_count();
  fc::device_options o;
  o.use_nccl = devices >= comm.topology().local_size();
  const int device = comm.topology().local_rank() % devices;
  const fc::device_guard on(device);
  fused_gradients(comm, device, o, 300);
}

// gradient_sync of device parameters on thread ranks: the gradients written on the caller's stream,
// marked ready on it, synchronized on it (no host wait), then read back on it; average over two
// passes, without and with fp16 / bf16 on the wire; against the serial sum within the wire's rounding.
TEST(EngineDevice, GradientSyncOfDeviceParameters) {
  if (under_mpiexec()) GTEST_SKIP() << "the thread-rank form runs without mpiexec";
  for (auto compression :
       {flexpar::wire_compression::none, flexpar::wire_compression::fp16, flexpar::wire_compression::bf16}) {
    for (int world : {2, 3}) {
      flexpar::run_in_process(
          world,
          [&](flexpar::communicator& comm) {
            const int p = comm.size(), me = comm.rank();
            device_sync rig(comm, {.reduction = flexpar::gradient_reduction::average,
                                   .compression = compression,
                                   .backward_passes_per_step = 2});
            flexpar::gradient_sync& sync = rig.sync;
            fc::stream s;
            const std::vector<std::size_t> sizes{7, 100000, 1};
            std::vector<fc::device_buffer<float>> weight, grad;
            for (std::size_t k = 0; k < sizes.size(); ++k) {
              weight.emplace_back(sizes[k]);
              grad.emplace_back(sizes[k]);
              fc::copy_async(weight[k].span(), std::span<const float>(std::vector<float>(sizes[k], float(me))), s);
              fc::synchronize(s, std::chrono::seconds(60), "init");
              std::string name = std::to_string(k);
              fc::register_parameter(sync, name.insert(0, 1, 'w'), weight[k].span(), grad[k].span());
            }
            sync.broadcast_parameters(0, s);
            EXPECT_EQ(download(fc::device_span<const float>(weight[1].span()), s), std::vector<float>(sizes[1], 0.0f));
            auto value = [](int rank, std::size_t i) {
              return 1.0f / 3.0f + static_cast<float>(rank + 1) / 7.0f + static_cast<float>(i % 5) * 0.01f;
            };
            for (int pass = 0; pass < 2; ++pass) {
              for (std::size_t k = 0; k < sizes.size(); ++k) {
                std::vector<float> g(sizes[k]);
                for (std::size_t i = 0; i < sizes[k]; ++i) g[i] = value(me, i) * static_cast<float>(pass + 1);
                fc::copy_async(grad[k].span(), std::span<const float>(g), s);  // the "backward pass"
                if (pass == 1 && k == 1) {
                  std::string name = std::to_string(k);
                  fc::on_gradient_ready(sync, name.insert(0, 1, 'w'), s);
                }
              }
              const bool step = fc::synchronize(sync, s);
              EXPECT_EQ(step, pass == 1);
            }
            const double tolerance = compression == flexpar::wire_compression::none   ? 1e-6
                                     : compression == flexpar::wire_compression::fp16 ? 4e-3
                                                                                      : 3e-2;
            for (std::size_t k = 0; k < sizes.size(); ++k) {
              const auto got = download(fc::device_span<const float>(grad[k].span()), s);
              for (std::size_t i = 0; i < sizes[k]; ++i) {
                double want = 0;
                for (int r = 0; r < p; ++r) want += 2.0 * value(r, i);  // the second pass wrote 2 x value
                want /= 2.0 * p;
                ASSERT_NEAR(got[i], want, tolerance * want) << "parameter " << k << " element " << i;
              }
            }
          },
          engine_config());
    }
  }
}

// Step after step, as a training loop runs it: every parameter in an allocation of its own (sizes of
// whole 512-byte granules, so that the allocator puts them back to back), its gradient written on the
// caller's stream and marked ready there, synchronize(stream), then the result read on the same
// stream right away. Integer-valued gradients whose sums every wire format holds. Catches a
// reduction that spans two allocations (one copy over both is invalid) and a stream that is not made
// to wait for this step's reduction (it would read the previous step's or a half-reduced gradient:
// off by (p + 1) or more, where the scaling by 1/p rounds by a few units in the last place).
TEST(EngineDevice, GradientSyncStepAfterStepReadsThisStepsAverage) {
  if (under_mpiexec()) GTEST_SKIP() << "the thread-rank form runs without mpiexec";
  for (auto compression : {flexpar::wire_compression::none, flexpar::wire_compression::bf16}) {
    for (int world : {2, 3}) {
      flexpar::run_in_process(
          world,
          [&](flexpar::communicator& comm) {
            const int p = comm.size(), me = comm.rank();
            device_sync rig(comm, {.reduction = flexpar::gradient_reduction::average, .compression = compression});
            flexpar::gradient_sync& sync = rig.sync;
            fc::stream s;
            constexpr std::size_t parameters = 4, count = 512;  // 2 KiB each (1 KiB on a 16-bit wire)
            std::vector<fc::device_buffer<float>> weight, grad;
            for (std::size_t k = 0; k < parameters; ++k) {
              weight.emplace_back(count);
              grad.emplace_back(count);
              std::string name = std::to_string(k);
              fc::register_parameter(sync, name.insert(0, 1, 'w'), weight[k].span(), grad[k].span());
            }
            std::vector<float> g(count);
            for (int step = 0; step < 40; ++step) {
              const float base = static_cast<float>(step % 8 + 1);
              for (std::size_t k = parameters; k-- > 0;) {  // last layer first, as a backward pass
                for (std::size_t i = 0; i < count; ++i)
                  g[i] = base * static_cast<float>((me + 1) * 2) + static_cast<float>((i + k) % 4);
                fc::copy_async(grad[k].span(), std::span<const float>(g), s);
                std::string name = std::to_string(k);
                fc::on_gradient_ready(sync, name.insert(0, 1, 'w'), s);
              }
              ASSERT_TRUE(fc::synchronize(sync, s));
              for (std::size_t k = 0; k < parameters; ++k) {
                const auto got = download(fc::device_span<const float>(grad[k].span()), s);
                for (std::size_t i = 0; i < count; ++i) {
                  // mean over ranks of base * 2 (r + 1) + (i + k) % 4 = base (p + 1) + (i + k) % 4
                  const float want = base * static_cast<float>(p + 1) + static_cast<float>((i + k) % 4);
                  ASSERT_NEAR(got[i], want, 1e-5f * want)
                      << "step " << step << ", parameter " << k << ", element " << i;
                }
              }
            }
          },
          engine_config());
    }
  }
}

// The steady state on the device: device parameters whose gradients live in gradient_sync's device
// arena (no gradient buffers of the caller's), stepped until the engine replays its frozen plan; every
// step's average read back on the caller's stream against the serial one, and the plan in force.
TEST(EngineDevice, GradientSyncArenaOnTheDeviceInTheSteadyState) {
  if (under_mpiexec()) GTEST_SKIP() << "the thread-rank form runs without mpiexec";
  for (int world : {2, 3}) {
    flexpar::run_in_process(
        world,
        [&](flexpar::communicator& comm) {
          const int p = comm.size(), me = comm.rank();
          device_sync rig(comm, {.reduction = flexpar::gradient_reduction::sum, .bucket_bytes = 4096});
          flexpar::gradient_sync& sync = rig.sync;
          fc::stream s;
          const std::vector<std::size_t> counts{512, 3, 1500, 1, 700};
          std::vector<fc::device_buffer<float>> weight;
          std::vector<std::string> names;
          for (std::size_t k = 0; k < counts.size(); ++k) {
            weight.emplace_back(counts[k]);
            names.push_back("w" + std::to_string(k));
            fc::register_parameter(sync, names[k], weight[k].span());
          }
          std::vector<fc::device_span<float>> grad;
          for (const std::string& n : names) grad.push_back(fc::gradient<float>(sync, n));
          for (std::size_t k = 0; k < counts.size(); ++k) ASSERT_EQ(grad[k].size(), counts[k]);
          for (int step = 0; step < 10; ++step) {
            for (std::size_t k = counts.size(); k-- > 0;) {
              std::vector<float> g(counts[k]);
              for (std::size_t i = 0; i < g.size(); ++i)
                g[i] =
                    static_cast<float>((me + 1) * static_cast<int>((i + k + static_cast<std::size_t>(step)) % 5 + 1));
              fc::copy_async(grad[k], std::span<const float>(g), s);
              fc::on_gradient_ready(sync, names[k], s);
            }
            ASSERT_TRUE(fc::synchronize(sync, s));
            for (std::size_t k = 0; k < counts.size(); ++k) {
              const auto got = download(fc::device_span<const float>(grad[k]), s);
              for (std::size_t i = 0; i < got.size(); ++i)
                ASSERT_EQ(got[i],
                          static_cast<float>(p * (p + 1) / 2 *
                                             static_cast<int>((i + k + static_cast<std::size_t>(step)) % 5 + 1)))
                    << "step " << step << ", parameter " << k << ", element " << i;
            }
          }
          EXPECT_EQ(rig.eng.stats().plans_frozen, 1u);
          EXPECT_GT(rig.eng.stats().planned_tensors, 0u);
          flexpar::barrier(comm);  // every rank has read its counters before one shuts its engine down
        },
        engine_config());
  }
}
