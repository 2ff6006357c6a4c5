// The device intra-node path (device_path::ipc) on one GPU with threads as ranks over the in-process
// transport: every collective against a serial oracle (small integers: exact in every dtype and in
// any order), in both barrier modes, with rounds far smaller than the tensors (64 KiB) so that every
// script runs several rounds and uneven parts; random floats for bitwise identity across ranks;
// mismatched calls and a rank that never arrives end in flexpar errors on every rank, never a hang.
// The same path across processes is test_device_collectives_mpi.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/cuda/collective.hpp>

#include "gpu/device_io.hpp"
#include "support/test_config.hpp"

namespace fc = flexpar::cuda;
using flexpar::reduce_op;
using flexpar::testing_support::download;
using flexpar::testing_support::upload;
using namespace std::chrono_literals;

namespace {

fc::device_options ipc_options(fc::ipc_sync sync, fc::ipc_allreduce script = fc::ipc_allreduce::automatic) {
  fc::device_options o;
  o.use_nccl = false;  // NCCL holds one rank per GPU; these ranks share one
  o.ipc_round_bytes = std::size_t{64} << 10;
  o.ipc_sync_mode = sync;
  o.ipc_allreduce_script = script;
  return o;
}

const fc::ipc_allreduce both_scripts[] = {fc::ipc_allreduce::one_shot, fc::ipc_allreduce::two_step};
const char* name_of(fc::ipc_allreduce a) { return a == fc::ipc_allreduce::one_shot ? "one shot" : "two steps"; }

// Small integers, different on every rank and element; `scale` makes every value a multiple of the
// ranks where avg must divide exactly.
template <class T>
std::vector<T> input_of(int rank, std::size_t n, int scale = 1) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<T>(
        static_cast<float>((static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 11) - 5) * scale));
  return v;
}

double as_double(auto v) { return static_cast<double>(static_cast<float>(v)); }

double combine(double a, double b, reduce_op op) {
  switch (op) {
    case reduce_op::max: return std::max(a, b);
    case reduce_op::min: return std::min(a, b);
    case reduce_op::prod: return a * b;
    default: return a + b;
  }
}

const fc::ipc_sync both_modes[] = {fc::ipc_sync::events, fc::ipc_sync::host};
const char* name_of(fc::ipc_sync m) { return m == fc::ipc_sync::events ? "events" : "host"; }

template <class T>
void check_allreduce(int world, fc::ipc_sync mode, fc::ipc_allreduce script, reduce_op op, std::size_t n) {
  const int scale = op == reduce_op::avg ? world : 1;
  flexpar::run_in_process(
      world,
      [&](flexpar::communicator& comm) {
        fc::device_communicator gpu(comm, 0, ipc_options(mode, script));
        ASSERT_TRUE(gpu.has_ipc());
        fc::stream s;
        auto d = upload(input_of<T>(comm.rank(), n, scale), s);
        gpu.allreduce(d.span(), op, s, fc::device_path::ipc);
        const std::vector<T> got = download(fc::device_span<const T>(d.span()), s);
        std::vector<std::vector<T>> inputs;
        for (int r = 0; r < world; ++r) inputs.push_back(input_of<T>(r, n, scale));
        for (std::size_t i = 0; i < n; ++i) {
          double want = as_double(inputs[0][i]);
          for (int r = 1; r < world; ++r) want = combine(want, as_double(inputs[static_cast<std::size_t>(r)][i]), op);
          if (op == reduce_op::avg) want /= world;
          ASSERT_EQ(as_double(got[i]), want) << "world " << world << " " << name_of(mode) << " " << name_of(script)
                                             << " " << flexpar::name_of(op) << " n " << n << " i " << i;
        }
      },
      flexpar::testing_support::with_timeout(60s));
}

}  // namespace

TEST(DeviceIpc, AllreduceEveryDtypeAndOpMatchesTheSerialOracle) {
  const std::size_t sizes[] = {0, 1, 7, 1001, (std::size_t{64} << 10) / 4 * 3 + 5};  // the last: 4 rounds of f32
  for (fc::ipc_sync mode : both_modes) {
    for (fc::ipc_allreduce script : both_scripts) {
      for (int world : {2, 3, 4}) {
        for (std::size_t n : sizes) check_allreduce<float>(world, mode, script, reduce_op::sum, n);
        check_allreduce<float>(world, mode, script, reduce_op::avg, 40001);
        check_allreduce<double>(world, mode, script, reduce_op::max, 30001);
        check_allreduce<std::int32_t>(world, mode, script, reduce_op::min, 50001);
        check_allreduce<flexpar::half>(world, mode, script, reduce_op::sum, 70001);
        check_allreduce<flexpar::bfloat16>(world, mode, script, reduce_op::sum, 3001);
        check_allreduce<std::int8_t>(world, mode, script, reduce_op::max, 100003);
        check_allreduce<float>(world, mode, script, reduce_op::prod, 20001);
      }
    }
  }
}

TEST(DeviceIpc, RandomFloatsAreBitwiseIdenticalOnEveryRankAndCloseToTheSerialSum) {
  for (fc::ipc_allreduce script : both_scripts) {
    for (int world : {2, 3}) {
      const fc::ipc_sync mode = world == 2 ? fc::ipc_sync::events : fc::ipc_sync::host;
      const std::size_t n = 100000;
      std::vector<std::vector<float>> results(static_cast<std::size_t>(world));
      auto input = [&](int rank) {
        std::mt19937 rng(1234u + static_cast<unsigned>(rank));
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        std::vector<float> v(n);
        for (float& x : v) x = dist(rng);
        return v;
      };
      flexpar::run_in_process(
          world,
          [&](flexpar::communicator& comm) {
            fc::device_communicator gpu(comm, 0, ipc_options(mode, script));
            fc::stream s;
            auto d = upload(input(comm.rank()), s);
            gpu.allreduce(d.span(), reduce_op::sum, s, fc::device_path::ipc);
            results[static_cast<std::size_t>(comm.rank())] = download(fc::device_span<const float>(d.span()), s);
          },
          flexpar::testing_support::with_timeout(60s));
      std::vector<double> serial(n, 0.0);
      for (int r = 0; r < world; ++r) {
        const auto v = input(r);
        for (std::size_t i = 0; i < n; ++i) serial[i] += v[i];
      }
      for (int r = 1; r < world; ++r)
        ASSERT_EQ(0, std::memcmp(results[0].data(), results[static_cast<std::size_t>(r)].data(), n * sizeof(float)))
            << "rank " << r << " differs from rank 0 (" << name_of(mode) << ", " << name_of(script) << ", world "
            << world << ")";
      for (std::size_t i = 0; i < n; ++i)  // world - 1 roundings of values below world in magnitude
        ASSERT_NEAR(results[0][i], serial[i], world * world * 6e-8) << "i " << i;
    }
  }
}

TEST(DeviceIpc, ReduceScatterAllgatherBroadcastAlltoallMatchTheSerialOracle) {
  for (fc::ipc_sync mode : both_modes) {
    for (int world : {2, 3, 4}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{777}, std::size_t{40003}}) {
        flexpar::run_in_process(
            world,
            [&](flexpar::communicator& comm) {
              const auto p = static_cast<std::size_t>(world), me = static_cast<std::size_t>(comm.rank());
              fc::device_communicator gpu(comm, 0, ipc_options(mode));
              fc::stream s;
              const std::string where =
                  std::string(name_of(mode)) + " world " + std::to_string(world) + " n " + std::to_string(n);
              // reduce_scatter (sum, f32)
              {
                auto send = upload(input_of<float>(comm.rank(), n * p), s);
                fc::device_buffer<float> recv(n);
                gpu.reduce_scatter(fc::device_span<const float>(send.span()), recv.span(), reduce_op::sum, s,
                                   fc::device_path::ipc);
                const auto got = download(fc::device_span<const float>(recv.span()), s);
                std::vector<std::vector<float>> inputs;
                for (int r = 0; r < world; ++r) inputs.push_back(input_of<float>(r, n * p));
                for (std::size_t i = 0; i < n; ++i) {
                  float want = 0;
                  for (int r = 0; r < world; ++r) want += inputs[static_cast<std::size_t>(r)][me * n + i];
                  ASSERT_EQ(got[i], want) << "reduce_scatter " << where << " i " << i;
                }
              }
              // allgather (i32), out of place and in place
              {
                auto send = upload(input_of<std::int32_t>(comm.rank(), n), s);
                fc::device_buffer<std::int32_t> recv(n * p);
                gpu.allgather(fc::device_span<const std::int32_t>(send.span()), recv.span(), s, fc::device_path::ipc);
                auto got = download(fc::device_span<const std::int32_t>(recv.span()), s);
                std::vector<std::int32_t> want;
                for (int r = 0; r < world; ++r) {
                  const auto b = input_of<std::int32_t>(r, n);
                  want.insert(want.end(), b.begin(), b.end());
                }
                ASSERT_EQ(got, want) << "allgather " << where;
                std::vector<std::int32_t> mine_in_place(n * p, -99);
                std::copy_n(input_of<std::int32_t>(comm.rank(), n).begin(), n, mine_in_place.begin() + me * n);
                auto all = upload(mine_in_place, s);
                gpu.allgather(fc::device_span<const std::int32_t>(all.data() + me * n, n), all.span(), s,
                              fc::device_path::ipc);
                ASSERT_EQ(download(fc::device_span<const std::int32_t>(all.span()), s), want)
                    << "allgather in place " << where;
              }
              // broadcast from the last rank (f64)
              {
                auto data = upload(input_of<double>(comm.rank(), n), s);
                gpu.broadcast(data.span(), world - 1, s, fc::device_path::ipc);
                ASSERT_EQ(download(fc::device_span<const double>(data.span()), s), input_of<double>(world - 1, n))
                    << "broadcast " << where;
              }
              // alltoall (i32): block q of rank r's input is r * 1000 + q + the element's pattern
              {
                auto block_of = [&](int from, std::size_t to) {
                  std::vector<std::int32_t> b = input_of<std::int32_t>(from, n);
                  for (auto& x : b) x += from * 1000 + static_cast<std::int32_t>(to) * 100;
                  return b;
                };
                std::vector<std::int32_t> mine;
                for (std::size_t q = 0; q < p; ++q) {
                  const auto b = block_of(comm.rank(), q);
                  mine.insert(mine.end(), b.begin(), b.end());
                }
                auto send = upload(mine, s);
                fc::device_buffer<std::int32_t> recv(n * p);
                gpu.alltoall(fc::device_span<const std::int32_t>(send.span()), recv.span(), s, fc::device_path::ipc);
                const auto got = download(fc::device_span<const std::int32_t>(recv.span()), s);
                for (int r = 0; r < world; ++r) {
                  const auto want = block_of(r, me);
                  for (std::size_t i = 0; i < n; ++i)
                    ASSERT_EQ(got[static_cast<std::size_t>(r) * n + i], want[i]) << "alltoall " << where;
                }
                // in place: the same result
                gpu.alltoall(fc::device_span<const std::int32_t>(send.span()), send.span(), s, fc::device_path::ipc);
                ASSERT_EQ(download(fc::device_span<const std::int32_t>(send.span()), s), got)
                    << "alltoall in place " << where;
              }
            },
            flexpar::testing_support::with_timeout(60s));
      }
    }
  }
}

TEST(DeviceIpc, CallsQueueWithoutHostWaitsAndKeepTheCallersStreamOrder) {
  // Twenty allreduces in a row on one stream, no synchronization between them: each doubles the sum
  // of the previous, so an out-of-order step or a staging buffer overwritten too early shows.
  for (fc::ipc_allreduce script : both_scripts)
    flexpar::run_in_process(
        3,
        [&](flexpar::communicator& comm) {
          fc::device_communicator gpu(comm, 0, ipc_options(fc::ipc_sync::events, script));
          fc::stream s;
          const std::size_t n = 50001;  // 4 rounds of 64 KiB
          std::vector<float> ones(n, 1.0f);
          auto d = upload(ones, s);
          for (int k = 0; k < 20; ++k) gpu.allreduce(d.span(), reduce_op::sum, s, fc::device_path::ipc);
          const auto got = download(fc::device_span<const float>(d.span()), s);
          const float want = 3486784401.0f;  // 3^20, exact in float
          for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want) << "i " << i;
        },
        flexpar::testing_support::with_timeout(60s));
}

TEST(DeviceIpc, AutomaticTakesIpcForLargeBuffersOnASharedGpu) {
  flexpar::run_in_process(
      2,
      [&](flexpar::communicator& comm) {
        fc::device_options defaults;
        defaults.use_nccl = false;
        fc::device_communicator gpu(comm, 0, defaults);  // rounds of 64 MiB
        const auto c = gpu.choose("allreduce", std::size_t{64} << 20);
        EXPECT_EQ(c.path, fc::device_path::ipc);
        EXPECT_LT(c.ipc_seconds, c.staged_seconds);
        for (const char* op : {"allgather", "reduce_scatter", "broadcast", "alltoall"})
          EXPECT_EQ(gpu.choose(op, std::size_t{64} << 20).path, fc::device_path::ipc) << op;
      },
      flexpar::testing_support::with_timeout(60s));
}

TEST(DeviceIpc, MismatchedCallsAreMismatchErrorsOnEveryRankNamingBothSides) {
  for (fc::ipc_sync mode : both_modes) {
    std::vector<std::string> messages(3);
    flexpar::run_in_process(
        3,
        [&](flexpar::communicator& comm) {
          fc::device_communicator gpu(comm, 0, ipc_options(mode));
          fc::stream s;
          const std::size_t n = comm.rank() == 2 ? 3000 : 1000;
          fc::device_buffer<float> d(n);
          try {
            gpu.allreduce(d.span(), reduce_op::sum, s, fc::device_path::ipc);
            ADD_FAILURE() << "rank " << comm.rank() << ": no error";
          } catch (const flexpar::mismatch_error& e) {
            messages[static_cast<std::size_t>(comm.rank())] = e.what();
          }
          // the path is unusable afterwards, and says why
          try {
            gpu.allreduce(d.span(), reduce_op::sum, s, fc::device_path::ipc);
            ADD_FAILURE() << "rank " << comm.rank() << ": a broken path ran";
          } catch (const flexpar::usage_error& e) {
            EXPECT_NE(std::string(e.what()).find("unusable after an earlier failure"), std::string::npos) << e.what();
          }
        },
        flexpar::testing_support::with_timeout(60s));
    for (int r = 0; r < 3; ++r) {
      const std::string& m = messages[static_cast<std::size_t>(r)];
      EXPECT_NE(m.find("[rank " + std::to_string(r) +
                       "] device allreduce (ipc): the ranks disagree on call #1: "
                       "allreduce of 1000 f32 (sum) on ranks {0,1}, but allreduce of 3000 f32 (sum) on rank {2}"),
                std::string::npos)
          << name_of(mode) << ": " << m;
    }
  }
}

TEST(DeviceIpc, ARankThatNeverArrivesIsATimeoutNamingIt) {
  std::vector<std::string> messages(3);
  const auto start = std::chrono::steady_clock::now();
  flexpar::run_in_process(
      3,
      [&](flexpar::communicator& comm) {
        fc::device_communicator gpu(comm, 0, ipc_options(fc::ipc_sync::events));
        fc::stream s;
        fc::device_buffer<float> d(4096);
        if (comm.rank() == 1) return;  // skips the call (its communicator is torn down at once)
        try {
          gpu.allreduce(d.span(), reduce_op::sum, s, fc::device_path::ipc);
        } catch (const flexpar::timeout_error& e) {
          messages[static_cast<std::size_t>(comm.rank())] = e.what();
        }
      },
      flexpar::testing_support::with_timeout(2s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  for (int r : {0, 2})
    EXPECT_NE(messages[static_cast<std::size_t>(r)].find("[rank " + std::to_string(r) +
                                                         "] device allreduce (ipc): rank 1 did not reach step 'ready' "
                                                         "of call #1 within 2000 ms"),
              std::string::npos)
        << messages[static_cast<std::size_t>(r)];
}

TEST(DeviceIpc, UnavailablePathAndBadBuffersAreUsageErrors) {
  flexpar::run_in_process(
      2,
      [&](flexpar::communicator& comm) {
        fc::device_options off = ipc_options(fc::ipc_sync::events);
        off.use_ipc = false;
        fc::device_communicator gpu(comm, 0, off);
        EXPECT_FALSE(gpu.has_ipc());
        fc::stream s;
        fc::device_buffer<float> d(10), other(15);
        try {
          gpu.allreduce(d.span(), reduce_op::sum, s, fc::device_path::ipc);
          ADD_FAILURE() << "no error";
        } catch (const flexpar::usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("device_options::use_ipc is false"), std::string::npos) << e.what();
        }
        EXPECT_THROW(gpu.alltoall(fc::device_span<const float>(other.span()), other.span(), s), flexpar::usage_error);
        EXPECT_THROW(gpu.alltoall(fc::device_span<const float>(d.span()), other.span(), s), flexpar::usage_error);
      },
      flexpar::testing_support::with_timeout(60s));
}

TEST(DeviceIpc, StagedAlltoallMatchesTheIpcOne) {
  for (int world : {1, 2, 3}) {
    flexpar::run_in_process(
        world,
        [&](flexpar::communicator& comm) {
          fc::device_communicator gpu(comm, 0, ipc_options(fc::ipc_sync::events));
          fc::stream s;
          const std::size_t n = 1237 * static_cast<std::size_t>(world);
          auto send = upload(input_of<std::int32_t>(comm.rank(), n), s);
          std::vector<fc::device_path> paths{fc::device_path::staged};
          if (gpu.has_ipc()) paths.push_back(fc::device_path::ipc);
          std::vector<std::vector<std::int32_t>> results;
          for (fc::device_path path : paths) {
            fc::device_buffer<std::int32_t> recv(n);
            gpu.alltoall(fc::device_span<const std::int32_t>(send.span()), recv.span(), s, path);
            results.push_back(download(fc::device_span<const std::int32_t>(recv.span()), s));
          }
          const std::size_t block = n / static_cast<std::size_t>(world);
          for (int r = 0; r < world; ++r) {
            const auto theirs = input_of<std::int32_t>(r, n);
            for (std::size_t i = 0; i < block; ++i)
              ASSERT_EQ(results[0][static_cast<std::size_t>(r) * block + i],
                        theirs[static_cast<std::size_t>(comm.rank()) * block + i]);
          }
          for (std::size_t k = 1; k < results.size(); ++k) EXPECT_EQ(results[k], results[0]);
        },
        flexpar::testing_support::with_timeout(60s));
  }
}
