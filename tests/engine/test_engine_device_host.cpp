// The engine's device path without a GPU: device tensors (host memory behind a test backend,
// host_device_backend.hpp) and host tensors in one engine, over threads as ranks. What is checked
// here is the engine's side, which the CUDA backend shares: the memory kind is negotiated (ranks that
// disagree get a mismatch), fused runs never mix host and device tensors, a joined rank contributes
// the identity, an output too small fails its handle alone, handles complete and order_after()
// reaches the backend. The CUDA backend itself: tests/gpu/test_engine_backend and test_engine_device.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include <flexpar/comm/run_in_process.hpp>

#include <flexpar/engine/gradient_sync.hpp>

#include "engine_scenarios.hpp"
#include "host_device_backend.hpp"

namespace flexpar {
namespace {

using testing_support::host_device_backend;
using testing_support::tensor_name;
using testing_support::what_of;

config test_config() {
  config c;
  c.timeout = std::chrono::seconds(60);
  c.fusion_threshold = std::size_t{1} << 20;
  c.cycle_time = std::chrono::microseconds(500);
  return c;
}

handle device_allreduce(engine& eng, std::string name, std::span<float> data, reduce_op op) {
  return eng.submit_device(std::move(name), collective_kind::allreduce, dtype::f32, op, -1, data.data(), data.data(),
                           data.size(), data.size(), nullptr);
}

class engine_device_host : public ::testing::TestWithParam<int> {};

TEST_P(engine_device_host, host_and_device_tensors_in_one_engine_never_fuse_together) {
  run_in_process(GetParam(), [](communicator& comm) {
    host_device_backend backend(comm);
    engine eng(comm, test_config(), {}, &backend);
    const int p = comm.size(), me = comm.rank(), n = 120;
    std::vector<std::vector<float>> data(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
      data[static_cast<std::size_t>(i)].assign(static_cast<std::size_t>(1 + (i * 37) % 500),
                                               static_cast<float>((me + 1) * (i % 5 + 1)));
    std::vector<int> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(77u + static_cast<unsigned>(me));
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<handle> handles(static_cast<std::size_t>(n));
    for (int i : order) {  // even tensors on the "device", odd ones on the host
      auto& d = data[static_cast<std::size_t>(i)];
      handles[static_cast<std::size_t>(i)] = i % 2 == 0
                                                 ? device_allreduce(eng, tensor_name(i), d, reduce_op::sum)
                                                 : eng.allreduce_async(tensor_name(i), std::span(d), reduce_op::sum);
    }
    const float ranks = static_cast<float>(p * (p + 1) / 2);
    for (int i = 0; i < n; ++i) {
      handles[static_cast<std::size_t>(i)].wait();
      EXPECT_EQ(handles[static_cast<std::size_t>(i)].memory(), i % 2 == 0 ? memory_kind::cuda : memory_kind::host);
      for (float v : data[static_cast<std::size_t>(i)]) ASSERT_EQ(v, ranks * static_cast<float>(i % 5 + 1)) << i;
    }
    // every device tensor went through the backend, and only device tensors did
    const auto runs = backend.items_per_run();
    EXPECT_EQ(std::accumulate(runs.begin(), runs.end(), std::size_t{0}), static_cast<std::size_t>(n / 2));
    EXPECT_EQ(backend.captures(), n / 2);
    if (p > 1) {
      EXPECT_GT(eng.stats().fused_collectives, 0u);
    }
    handles[0].order_after(nullptr);
    EXPECT_EQ(backend.orders(), 1);
    EXPECT_THROW(handles[1].order_after(nullptr), usage_error);
  });
}

TEST_P(engine_device_host, the_steady_state_captures_once_per_bucket_and_runs_a_bucket_per_backend_call) {
  run_in_process(GetParam(), [](communicator& comm) {
    host_device_backend backend(comm);
    engine eng(comm, test_config(), {}, &backend);
    const int p = comm.size(), me = comm.rank(), n = 64, steps = 8;
    std::vector<std::vector<float>> data(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) data[static_cast<std::size_t>(i)].resize(static_cast<std::size_t>(1 + (i * 29) % 300));
    int captures_before = 0;
    std::size_t runs_before = 0;
    for (int step = 0; step < steps; ++step) {
      if (step == steps - 1) {
        captures_before = backend.captures();
        runs_before = backend.items_per_run().size();
      }
      std::vector<handle> handles;
      for (int i = 0; i < n; ++i) {
        auto& d = data[static_cast<std::size_t>(i)];
        std::fill(d.begin(), d.end(), static_cast<float>((me + 1) * ((i + step) % 5 + 1)));
        handles.push_back(device_allreduce(eng, tensor_name(i), d, reduce_op::sum));
      }
      eng.end_step();
      for (int i = 0; i < n; ++i) {
        handles[static_cast<std::size_t>(i)].wait();
        const float want = static_cast<float>(p * (p + 1) / 2 * ((i + step) % 5 + 1));
        for (float v : data[static_cast<std::size_t>(i)]) ASSERT_EQ(v, want) << "step " << step << " tensor " << i;
      }
    }
    const engine::statistics s = eng.stats();
    ASSERT_EQ(s.plans_frozen, 1u);
    ASSERT_GT(s.plan_buckets, 0u);
    // the last step ran under the plan: one producer position per bucket (one stream here), not one
    // per tensor, and one backend run per bucket
    EXPECT_EQ(backend.captures() - captures_before, static_cast<int>(s.plan_buckets));
    EXPECT_EQ(backend.items_per_run().size() - runs_before, s.plan_buckets);
    barrier(comm);  // every rank has read its counters before one shuts its engine down
  });
}

TEST_P(engine_device_host, every_device_collective_and_a_joined_rank) {
  run_in_process(GetParam(), [](communicator& comm) {
    host_device_backend backend(comm);
    engine eng(comm, test_config(), {}, &backend);
    const int p = comm.size(), me = comm.rank();
    // allgather, a different count per rank
    std::vector<std::int32_t> mine(static_cast<std::size_t>(me + 2), me * 10);
    std::vector<std::int32_t> all(static_cast<std::size_t>(p * (p + 3) / 2), -1);
    handle g = eng.submit_device("gather", collective_kind::allgather, dtype::i32, reduce_op::sum, -1, mine.data(),
                                 all.data(), mine.size(), all.size(), nullptr);
    // reduce_scatter of 2p + 1 elements (uneven blocks)
    const std::size_t n = static_cast<std::size_t>(2 * p + 1);
    std::vector<std::int64_t> in(n), out(3, -1);
    for (std::size_t k = 0; k < n; ++k) in[k] = static_cast<std::int64_t>(k) * (me + 1);
    handle rs = eng.submit_device("rs", collective_kind::reduce_scatter, dtype::i64, reduce_op::sum, -1, in.data(),
                                  out.data(), n, out.size(), nullptr);
    // broadcast from the last rank, alltoall
    std::vector<double> b(5, me == p - 1 ? 2.5 : 0.0);
    handle bc = eng.submit_device("bcast", collective_kind::broadcast, dtype::f64, reduce_op::sum, p - 1, b.data(),
                                  b.data(), b.size(), b.size(), nullptr);
    std::vector<std::int32_t> a_in(static_cast<std::size_t>(2 * p)), a_out(static_cast<std::size_t>(2 * p));
    for (int j = 0; j < p; ++j)
      for (int e = 0; e < 2; ++e) a_in[static_cast<std::size_t>(2 * j + e)] = 100 * me + 10 * j + e;
    handle aa = eng.submit_device("a2a", collective_kind::alltoall, dtype::i32, reduce_op::sum, -1, a_in.data(),
                                  a_out.data(), a_in.size(), a_out.size(), nullptr);
    g.wait();
    std::size_t at = 0;
    for (int r = 0; r < p; ++r)
      for (int k = 0; k < r + 2; ++k) EXPECT_EQ(all[at++], r * 10);
    EXPECT_EQ(g.result_count(), at);
    rs.wait();
    const std::size_t base = n / static_cast<std::size_t>(p), extra = n % static_cast<std::size_t>(p);
    const std::size_t count = base + (static_cast<std::size_t>(me) < extra ? 1 : 0);
    const std::size_t first =
        static_cast<std::size_t>(me) * base + std::min<std::size_t>(static_cast<std::size_t>(me), extra);
    EXPECT_EQ(rs.result_count(), count);
    for (std::size_t k = 0; k < count; ++k) EXPECT_EQ(out[k], static_cast<std::int64_t>(first + k) * p * (p + 1) / 2);
    bc.wait();
    EXPECT_EQ(b, std::vector<double>(5, 2.5));
    aa.wait();
    for (int i = 0; i < p; ++i)
      for (int e = 0; e < 2; ++e) EXPECT_EQ(a_out[static_cast<std::size_t>(2 * i + e)], 100 * i + 10 * me + e);

    // the last rank joins; the others' device allreduces get its identity (zeros of a sum)
    if (me == p - 1) {
      eng.join();
      return;
    }
    std::vector<float> x(1000, static_cast<float>(me + 1));
    handle h = device_allreduce(eng, "after join", x, reduce_op::sum);
    h.wait();
    const float others = static_cast<float>((p - 1) * p / 2);
    for (float v : x) ASSERT_EQ(v, p == 1 ? 1.0f : others);
    eng.join();
  });
}

// gradient_sync with device parameters (and one host parameter beside them): two backward passes
// per step, average and sum, no compression, fp16 and bf16; the values are chosen to round in 16
// bits, and the result is compared with the same casts and scalings done serially.
TEST_P(engine_device_host, gradient_sync_of_device_parameters) {
  run_in_process(GetParam(), [](communicator& comm) {
    const int p = comm.size(), me = comm.rank();
    for (auto reduction : {gradient_reduction::average, gradient_reduction::sum})
      for (auto compression : {wire_compression::none, wire_compression::fp16, wire_compression::bf16}) {
        host_device_backend backend(comm);
        engine eng(comm, test_config(), {}, &backend);
        gradient_sync sync(eng, {.reduction = reduction, .compression = compression, .backward_passes_per_step = 2});
        const std::vector<std::size_t> sizes{5, 1000, 3};
        std::vector<std::vector<float>> weight(sizes.size()), grad(sizes.size());
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          weight[k].assign(sizes[k], static_cast<float>(me));  // rank 0's after broadcast_parameters
          grad[k].assign(sizes[k], 0.0f);
          std::string name = std::to_string(k);
          name.insert(0, 1, 'w');
          if (k == 2)
            sync.register_parameter(name, std::span(weight[k]), std::span(grad[k]));  // a host parameter
          else
            sync.register_device_parameter(name, dtype::f32, weight[k].data(), sizes[k], grad[k].data(), sizes[k]);
        }
        sync.broadcast_parameters(0, nullptr);
        for (auto& w : weight)
          for (float v : w) ASSERT_EQ(v, 0.0f);
        // two passes: the gradient accumulates 1/4 + (rank + 1) / 8 + (i % 5) / 16 per element in the
        // caller's buffers. Sixteenths up to 8: exact in f32, fp16 and bf16 (8 significant bits), so the
        // sum is the same in every order — the algorithm `automatic` picks (the measured machine, which
        // varies with the load) sums in its own order, not in rank order.
        auto value = [](int rank, std::size_t i) {
          return 0.25f + static_cast<float>(rank + 1) / 8.0f + static_cast<float>(i % 5) / 16.0f;
        };
        for (std::size_t k = 0; k < sizes.size(); ++k)
          for (std::size_t i = 0; i < sizes[k]; ++i) grad[k][i] = value(me, i);
        EXPECT_FALSE(sync.synchronize(nullptr));  // first pass: nothing moves
        for (std::size_t k = 0; k < sizes.size(); ++k)
          for (std::size_t i = 0; i < sizes[k]; ++i) grad[k][i] += value(me, i);
        sync.on_gradient_ready("w0", nullptr);
        EXPECT_THROW(sync.on_gradient_ready("w1"), usage_error);  // a device parameter needs its stream
        EXPECT_THROW(sync.synchronize(), usage_error);
        EXPECT_TRUE(sync.synchronize(nullptr));
        const double factor = reduction == gradient_reduction::average ? 1.0 / (2.0 * p) : 1.0;
        for (std::size_t k = 0; k < sizes.size(); ++k)
          for (std::size_t i = 0; i < sizes[k]; ++i) {
            // the serial rule: each rank's accumulated gradient cast to the wire type, summed in f32 and
            // rounded to the wire type per step (exact here, in any order), then scaled back in double
            auto wire = [&](float v) -> float {
              if (compression == wire_compression::fp16) return static_cast<float>(half(v));
              if (compression == wire_compression::bf16) return static_cast<float>(bfloat16(v));
              return v;
            };
            float sum = wire(value(0, i) + value(0, i));
            for (int r = 1; r < p; ++r) sum = wire(sum + wire(value(r, i) + value(r, i)));
            const auto want = static_cast<float>(static_cast<double>(sum) * factor);
            ASSERT_EQ(grad[k][i], want) << "parameter " << k << " element " << i;
          }
        if (compression != wire_compression::none) {
          EXPECT_GT(backend.converts(), 0);
        }
      }
  });
}

INSTANTIATE_TEST_SUITE_P(world, engine_device_host, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::string("p").append(std::to_string(info.param)); });

TEST(engine_device_host_errors, a_memory_kind_that_differs_is_a_mismatch_on_every_rank) {
  std::vector<std::string> texts(3);
  run_in_process(3, [&](communicator& comm) {
    host_device_backend backend(comm);
    engine eng(comm, test_config(), {}, &backend);
    std::vector<float> t(64, 1.0f);
    handle h = comm.rank() == 0 ? eng.allreduce_async("t", std::span(t), reduce_op::sum)
                                : device_allreduce(eng, "t", t, reduce_op::sum);
    texts[static_cast<std::size_t>(comm.rank())] = what_of(h);
    // the engine goes on
    std::vector<float> u(8, 1.0f);
    device_allreduce(eng, "u", u, reduce_op::sum).wait();
    EXPECT_EQ(u[0], 3.0f);
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(texts[static_cast<std::size_t>(r)].find(
                  "[rank " + std::to_string(r) + "] allreduce \"t\": memory host on rank {0} but cuda on ranks {1,2}"),
              std::string::npos)
        << texts[static_cast<std::size_t>(r)];
}

TEST(engine_device_host_errors, an_output_too_small_fails_its_handle_alone) {
  run_in_process(2, [&](communicator& comm) {
    host_device_backend backend(comm);
    engine eng(comm, test_config(), {}, &backend);
    std::vector<std::int32_t> mine(4, comm.rank()), all(comm.rank() == 1 ? 5 : 8);  // rank 1's holds 5 of 8
    handle g = eng.submit_device("gather", collective_kind::allgather, dtype::i32, reduce_op::sum, -1, mine.data(),
                                 all.data(), mine.size(), all.size(), nullptr);
    if (comm.rank() == 1) {
      EXPECT_NE(what_of(g).find("[rank 1] allgather \"gather\": the output holds 5 elements but the result has 8"),
                std::string::npos)
          << what_of(g);
    } else {
      g.wait();
      EXPECT_EQ(all, (std::vector<std::int32_t>{0, 0, 0, 0, 1, 1, 1, 1}));
    }
    std::vector<float> x(16, 1.0f);
    device_allreduce(eng, "after", x, reduce_op::sum).wait();
    EXPECT_EQ(x[0], 2.0f);
  });
}

TEST(engine_device_host_errors, a_device_tensor_without_a_backend_is_a_usage_error) {
  run_in_process(1, [&](communicator& comm) {
    engine eng(comm, test_config());
    std::vector<float> x(4);
    try {
      eng.submit_device("x", collective_kind::allreduce, dtype::f32, reduce_op::sum, -1, x.data(), x.data(), 4, 4,
                        nullptr);
      ADD_FAILURE() << "no error";
    } catch (const usage_error& e) {
      EXPECT_NE(std::string(e.what()).find("\"x\" is a device tensor, but this engine has no device backend"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(eng.device(), nullptr);
  });
}

}  // namespace
}  // namespace flexpar
