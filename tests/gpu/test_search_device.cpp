// The run-time SBP form in device memory (flexpar/cuda/sbp_dynamic.hpp) and the strategy executor on
// the GPU (flexpar/cuda/search.hpp), threads as ranks on one GPU:
// - every pair of run-time SBPs on 1-4 ranks (and of 2-D ones on a 2 x 2 mesh), from sources whose
//   partial values differ by rank, gives back the logical tensor (gathered by to_full, which does not
//   box) and the same shard as the host form's boxing of the same source;
// - boxing_seconds prices a route by the paths the axis communicators choose;
// - matmul and the convolutions on run-time SBPs equal the host form's on the same operands;
// - every executable strategy of a small MLP and of reference::cnn_small on 1-3 ranks computes the
//   serial model's output and updated weights exactly (values in {-1, 0, 1}: every sum is an integer
//   far below 2^24, so any order of summation gives the same float), and a placement that is not the
//   1-D mesh of all ranks is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/cuda/sbp_dynamic.hpp>
#include <flexpar/cuda/search.hpp>
#include <flexpar/search/execute.hpp>

#include "sbp/boxing_checks.hpp"
#include "search/cnn_fixtures.hpp"
#include "support/test_config.hpp"

namespace flexpar::sbp {
namespace {

using namespace testing_support;
using namespace std::chrono_literals;
using device_tensor = dynamic_tensor<std::int32_t, 1, memory::cuda>;

const std::vector<parallel>& one_axis_values() {
  static const std::vector<parallel> all{parallel::S(0), parallel::S(1), parallel::S(2),
                                         parallel::B(),  parallel::P(),  parallel::P(reduce_op::max)};
  return all;
}

/// One run-time pair on the device against the host form's boxing of the same source.
template <std::size_t N>
void check_dynamic_pair(const cuda::device_placement<N>& gpu, const shape_t& shape, const nd_parallel& from,
                        const nd_parallel& target, int salt) {
  const std::string what = to_string(from) + " -> " + to_string(target) + " " + to_string(shape) + " on rank " +
                           std::to_string(gpu.parent().rank());
  const std::vector<std::int32_t> full = logical<std::int32_t>(shape, salt);
  const auto source = dynamic_tensor<std::int32_t, N>::from_local(
      gpu.host(), shape, from, distinct_partials<std::int32_t>(gpu.host(), shape, from, full, salt));
  const auto on_host = to(source.clone(), target);
  const std::vector<std::int32_t> host_shard(on_host.to_local().begin(), on_host.to_local().end());
  auto device = to_device(source, gpu);
  EXPECT_EQ(device.download(), std::vector<std::int32_t>(source.to_local().begin(), source.to_local().end())) << what;
  auto boxed = to(std::move(device), target);
  EXPECT_EQ(boxed.layout(), target) << what;
  EXPECT_EQ(boxed.to_local().size(), boxed.my_box().elements()) << what;
  EXPECT_EQ(boxed.download(), host_shard) << what << ": the device shard differs from the host boxing's";
  EXPECT_EQ(boxed.to_full(), full) << what;
}

class dynamic_device_boxing : public ::testing::TestWithParam<int> {};

TEST_P(dynamic_device_boxing, every_pair_gives_back_the_logical_tensor_and_the_host_shard) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        int salt = 0;
        for (const shape_t& shape : shapes())
          for (const parallel& a : one_axis_values())
            for (const parallel& b : one_axis_values())
              check_dynamic_pair(gpu, shape, nd_parallel{a}, nd_parallel{b}, ++salt);
      },
      flexpar::testing_support::with_timeout(120s));
}

INSTANTIATE_TEST_SUITE_P(ranks, dynamic_device_boxing, ::testing::Values(1, 2, 3, 4));

TEST(dynamic_device_boxing_2x2, every_pair_of_two_axis_sbps_gives_back_the_logical_tensor) {
  run_in_process(
      4,
      [](communicator& comm) {
        placement<2> mesh(comm, {2, 2});
        cuda::device_placement gpu(mesh, 0);
        const std::vector<parallel> some{parallel::S(0), parallel::S(1), parallel::B(), parallel::P()};
        std::vector<nd_parallel> all;
        for (const parallel& a : some)
          for (const parallel& b : some) all.push_back(nd_parallel{a, b});
        int salt = 0;
        for (const shape_t& shape : {shape_t{4, 6}, shape_t{5, 3}})
          for (const nd_parallel& a : all)
            for (const nd_parallel& b : all) check_dynamic_pair(gpu, shape, a, b, ++salt);
      },
      flexpar::testing_support::with_timeout(180s));
}

TEST(dynamic_device_boxing, a_bad_target_is_refused_naming_it) {
  run_in_process(
      2,
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        auto t = dynamic_tensor<float, 1, memory::cuda>::from_full(gpu, {4, 2}, nd_parallel{parallel::S(0)},
                                                                   logical<float>({4, 2}, 1));
        try {
          (void)to(std::move(t), nd_parallel{parallel::S(0), parallel::B()});
          ADD_FAILURE() << "a 2-D target on a 1-D mesh was accepted";
        } catch (const usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("has 2 entries; the placement mesh has 1 axes"), std::string::npos)
              << e.what();
        }
      },
      flexpar::testing_support::with_timeout(60s));
}

/// boxing_seconds: identity is free; a collective step is the price of the path its axis communicator
/// picks; layout changes cost more than the collective alone; 2 x the bytes costs more.
TEST(dynamic_device_boxing, boxing_seconds_prices_the_chosen_device_path) {
  run_in_process(
      2,
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        const shape_t shape{64, 32};
        const nd_parallel s0{parallel::S(0)}, s1{parallel::S(1)}, b{parallel::B()}, p{parallel::P()};
        EXPECT_EQ(boxing_seconds(shape, s0, s0, gpu), 0.0);
        const auto c = gpu.axis(0).choose("allreduce", 64 * 32 * 4);
        const double chosen = std::min({c.nccl_seconds, c.ring_seconds, c.staged_seconds, c.ipc_seconds});
        EXPECT_EQ((boxing_seconds<partial_sum, broadcast>(shape, gpu)), chosen);
        EXPECT_GT(boxing_seconds(shape, s1, b, gpu), boxing_seconds(shape, s0, b, gpu)) << "S(1) -> B places";
        EXPECT_GT(boxing_seconds(shape, p, s1, gpu), boxing_seconds(shape, p, s0, gpu)) << "P -> S(1) packs";
        EXPECT_GT(boxing_seconds({128, 32}, s0, s1, gpu), boxing_seconds(shape, s0, s1, gpu));
        EXPECT_GT(boxing_seconds(shape, b, p, gpu), 0.0) << "B -> P(sum) zeros off coordinate 0";
        EXPECT_EQ(boxing_seconds(shape, b, nd_parallel{parallel::P(reduce_op::max)}, gpu), 0.0) << "B -> P(max) keeps";
        EXPECT_THROW((void)boxing_seconds(shape, nd_parallel{parallel::S(0), parallel::B()}, b, gpu), usage_error);
      },
      flexpar::testing_support::with_timeout(60s));
}

/// matmul and the convolutions on run-time SBPs: the device result gathered equals the host form's on
/// the same operands (small integers: exact in f32).
TEST(dynamic_device_ops, matmul_and_convolutions_equal_the_host_form) {
  run_in_process(
      3,
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        using host_t = dynamic_tensor<float, 1>;
        const std::vector<parallel> layouts{parallel::S(0), parallel::S(1), parallel::B(), parallel::P()};
        int salt = 0;
        for (const parallel& la : layouts)
          for (const parallel& lb : layouts) {
            const shape_t sa{5, 7}, sb{7, 4};
            const int salt_a = ++salt, salt_b = ++salt;
            const auto a = host_t::from_local(
                mesh, sa, nd_parallel{la},
                distinct_partials<float>(mesh, sa, nd_parallel{la}, logical<float>(sa, salt_a), salt_a));
            const auto b = host_t::from_local(
                mesh, sb, nd_parallel{lb},
                distinct_partials<float>(mesh, sb, nd_parallel{lb}, logical<float>(sb, salt_b), salt_b));
            const std::string what = "matmul " + to_string(nd_parallel{la}) + " x " + to_string(nd_parallel{lb});
            const auto on_host = matmul(a, b);
            const auto on_device = matmul(to_device(a, gpu), to_device(b, gpu));
            EXPECT_EQ(on_device.layout(), on_host.layout()) << what;
            EXPECT_EQ(on_device.to_full(), on_host.to_full()) << what;
          }
        // conv2d [N, C, H, W] x [K, C, 3, 3], pad 1, and its gradients, from the sample, output- and
        // input-channel layouts (the signatures the executor uses) and one that must be boxed first
        const shape_t sx{3, 4, 5, 5}, sw{6, 4, 3, 3}, sy{3, 6, 5, 5};
        const std::vector<std::pair<parallel, parallel>> pairs{{parallel::S(0), parallel::B()},
                                                               {parallel::B(), parallel::S(0)},
                                                               {parallel::S(1), parallel::S(1)},
                                                               {parallel::S(2), parallel::S(1)}};
        for (const auto& [lx, lw] : pairs) {
          const std::string what = "conv2d " + to_string(nd_parallel{lx}) + ", " + to_string(nd_parallel{lw});
          const auto x = host_t::from_full(mesh, sx, nd_parallel{lx}, logical<float>(sx, ++salt));
          const auto w = host_t::from_full(mesh, sw, nd_parallel{lw}, logical<float>(sw, ++salt));
          const auto dy = host_t::from_full(mesh, sy, nd_parallel{parallel::S(0)}, logical<float>(sy, ++salt));
          const auto gx = to_device(x, gpu), gw = to_device(w, gpu), gdy = to_device(dy, gpu);
          EXPECT_EQ(conv2d(gx, gw, 1).to_full(), conv2d(x, w, 1).to_full()) << what;
          EXPECT_EQ(conv2d_grad_input(gdy, gw, 1).to_full(), conv2d_grad_input(dy, w, 1).to_full()) << what;
          EXPECT_EQ(conv2d_grad_weight(gx, gdy, 1).to_full(), conv2d_grad_weight(x, dy, 1).to_full()) << what;
        }
      },
      flexpar::testing_support::with_timeout(120s));
}

}  // namespace
}  // namespace flexpar::sbp

namespace flexpar::search {
namespace {

using namespace flexpar::search::testing_support;
using namespace std::chrono_literals;

/// Every strategy execute_steps runs on p ranks.
std::vector<strategy> all_executable(const graph& g, int p) {
  std::vector<strategy> out{{}};
  for (const op& o : g.ops) {
    std::vector<strategy> next;
    for (const strategy& s : out)
      for (const soap_config& c : executable_configs(o, ranks_cluster(p), p)) {
        strategy t = s;
        t.push_back(c);
        next.push_back(std::move(t));
      }
    out = std::move(next);
  }
  return out;
}

/// Every executable strategy of `g` on p thread ranks sharing GPU 0, one device placement per rank for
/// all of them, against the serial model.
void check_every_strategy(const graph& g, const std::vector<float>& x, int p) {
  const execution_result serial = execute_serial(g, x, weights_of(g), 1.0f);
  const std::vector<strategy> all = all_executable(g, p);
  ASSERT_FALSE(all.empty()) << p;
  run_in_process(
      p,
      [&](communicator& comm) {
        sbp::placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        for (const strategy& s : all) {
          const execution_result r = cuda::execute_steps(gpu, g, s, x, weights_of(g), 1.0f);
          std::string where = g.name + ", rank " + std::to_string(comm.rank()) + " of " + std::to_string(p) + ":";
          for (std::size_t i = 0; i < s.size(); ++i) where.append(" ").append(describe(g.ops[i], s[i]));
          ASSERT_EQ(r.output, serial.output) << where;
          ASSERT_EQ(r.weights, serial.weights) << where;
          EXPECT_GT(r.median_step_seconds, 0) << where;
        }
      },
      flexpar::testing_support::with_timeout(300s));
}

/// Element-wise within float rounding of sums of a few hundred terms (relative 1e-5 of the larger
/// magnitude, at least 1e-6).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t k = 0; k < want.size(); ++k)
    EXPECT_NEAR(got[k], want[k], std::max(1e-6, 1e-5 * std::max(std::abs(got[k]), std::abs(want[k]))))
        << what << " element " << k;
}

class device_execute : public ::testing::TestWithParam<int> {};

TEST_P(device_execute, every_mlp_strategy_equals_the_serial_model) {
  const graph g = reference::mlp(5, {6, 7, 4, 3});  // uneven over 2 and 3 ranks
  check_every_strategy(g, values(5 * 6, 0), GetParam());
}

TEST_P(device_execute, every_cnn_strategy_equals_the_serial_model) {
  const graph g = reference::cnn_small(5, 8, 4, 10);  // 3 -> 4 -> 8 channels, 10 classes
  check_every_strategy(g, values(5 * 3 * 8 * 8, 0), GetParam());
}

INSTANTIATE_TEST_SUITE_P(ranks, device_execute, ::testing::Values(1, 2, 3));

TEST(device_execute, two_steps_equal_the_host_executor) {
  const graph g = reference::cnn_small(6, 8, 4, 6);
  const std::vector<float> x = values(6 * 3 * 8 * 8, 3);
  run_in_process(
      2,
      [&](communicator& comm) {
        sbp::placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        const strategy s = data_parallel(g, ranks_cluster(2));
        const execution_result host = execute_steps(comm, g, s, x, weights_of(g), 1.0f / 64, 2);
        const execution_result device = cuda::execute_steps(gpu, g, s, x, weights_of(g), 1.0f / 64, 2);
        // two steps at lr 1/64 leave the integers: float rounding, summed in cuBLAS's and OpenBLAS's orders
        expect_close(device.output, host.output, "output");
        ASSERT_EQ(device.weights.size(), host.weights.size());
        for (std::size_t i = 0; i < host.weights.size(); ++i)
          expect_close(device.weights[i], host.weights[i], "weight " + std::to_string(i));
      },
      flexpar::testing_support::with_timeout(120s));
}

TEST(device_execute, a_placement_that_is_not_every_rank_is_refused) {
  run_in_process(
      2,
      [](communicator& comm) {
        sbp::placement<1> one(comm, {1});
        cuda::device_placement gpu(one, 0);
        const graph g = reference::mlp(4, {4, 4});
        try {
          (void)cuda::execute_steps(gpu, g, data_parallel(g, ranks_cluster(2)), values(16, 0), weights_of(g), 1.0f);
          ADD_FAILURE() << "a one-rank mesh of two ranks was accepted";
        } catch (const usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("is not the 1-D mesh of all 2 ranks"), std::string::npos) << e.what();
        }
      },
      flexpar::testing_support::with_timeout(60s));
}

}  // namespace
}  // namespace flexpar::search
