// SBP global tensors in device memory (flexpar/cuda/sbp.hpp), threads as ranks on one GPU: every
// boxing pair on 1-4 ranks and on a 2 x 2 mesh gives back the logical tensor it started from (gathered
// by to_full, which does not box) and the same shard as the host boxing of the same source; identity
// boxing allocates and copies nothing; the device ops against the host ops on the same inputs (small
// integers: exact in f32 and bf16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/cuda/sbp.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "sbp/boxing_checks.hpp"
#include "support/test_config.hpp"

namespace flexpar::sbp {
namespace {

using namespace testing_support;
using namespace std::chrono_literals;

/// One pair on the device: the host source (distinct partials), its device copy boxed by the consuming
/// and by the const form, each compared with the logical tensor and with the host boxing's shard.
template <class T, class From, class To, std::size_t N>
void check_device_pair(const cuda::device_placement<N>& gpu, const shape_t& shape, int salt) {
  const std::string what = to_string<From>() + " -> " + to_string<To>() + " " + to_string(shape) + " on rank " +
                           std::to_string(gpu.parent().rank());
  const std::vector<T> full = logical<T>(shape, salt);
  const auto source = distinct_source<T, From>(gpu.host(), shape, full, salt);
  auto&& on_host = to<To>(source);
  const std::vector<T> host_shard(on_host.to_local().begin(), on_host.to_local().end());

  auto device = to_device(source, gpu);
  auto&& kept = to<To>(device);  // the const form: device stays usable
  EXPECT_EQ(kept.to_full(), full) << what << " (const form)";
  EXPECT_EQ(device.to_full(), full) << what << ": the source changed";
  auto boxed = to<To>(std::move(device));
  EXPECT_EQ(boxed.local_shape(), boxed.my_box().extent) << what;
  EXPECT_EQ(boxed.to_local().size(), elements_of(boxed.local_shape())) << what;
  EXPECT_EQ(boxed.download(), host_shard) << what << ": the device shard differs from the host boxing's";
  EXPECT_EQ(boxed.to_full(), full) << what;
}

class device_boxing_1d : public ::testing::TestWithParam<int> {};

TEST_P(device_boxing_1d, every_pair_gives_back_the_logical_tensor_and_the_host_shard) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        int salt = 0;
        for (const shape_t& shape : shapes())
          for_each_pair(one_axis{}, [&]<class From, class To>(From, To) {
            check_device_pair<std::int32_t, From, To>(gpu, shape, ++salt);
          });
        for_each_pair(list<split<1>, partial_sum, broadcast>{}, [&]<class From, class To>(From, To) {
          check_device_pair<double, From, To>(gpu, {3, 5}, ++salt);
          check_device_pair<float, From, To>(gpu, {6, 2}, ++salt);
        });
      },
      flexpar::testing_support::with_timeout(120s));
}

INSTANTIATE_TEST_SUITE_P(ranks, device_boxing_1d, ::testing::Values(1, 2, 3, 4));

TEST(device_boxing_2x2, every_nd_route_gives_back_the_logical_tensor_and_the_host_shard) {
  run_in_process(
      4,
      [](communicator& comm) {
        placement<2> mesh(comm, {2, 2});
        cuda::device_placement gpu(mesh, 0);
        int salt = 0;
        for (const shape_t& shape : {shape_t{4, 6, 2}, shape_t{5, 3, 7}, shape_t{3, 1, 4}})
          for_each_pair(two_axes{}, [&]<class From, class To>(From, To) {
            check_device_pair<std::int32_t, From, To>(gpu, shape, ++salt);
          });
      },
      flexpar::testing_support::with_timeout(180s));
}

TEST(device_boxing, identity_allocates_and_copies_nothing) {
  run_in_process(
      2,
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        const shape_t shape{6, 4};
        auto t = global_tensor<float, split<0>, memory::cuda>::from_full(gpu, shape, logical<float>(shape, 1));
        const auto before = gpu.pool().stats();
        const float* data = t.to_local().data();
        auto&& same = to<split<0>>(t);
        auto moved = to<split<0>>(std::move(t));
        const auto after = gpu.pool().stats();
        EXPECT_EQ(&same, &t);
        EXPECT_EQ(moved.to_local().data(), data);
        EXPECT_EQ(after.allocations, before.allocations);
        EXPECT_EQ(after.reuses, before.reuses);
      },
      flexpar::testing_support::with_timeout(60s));
}

TEST(device_tensor, round_trips_through_the_host_and_names_a_foreign_placement) {
  run_in_process(
      3,
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()}), other(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        const shape_t shape{7, 5};
        const auto full = logical<std::int32_t>(shape, 3);
        const auto h = global_tensor<std::int32_t, split<1>>::from_full(mesh, shape, full);
        const auto d = to_device(h, gpu);
        EXPECT_EQ(d.local_shape(), h.local_shape());
        const auto back = to_host(d);
        EXPECT_EQ(back.to_full(), full);
        EXPECT_TRUE(back.where() == mesh);
        const auto foreign = global_tensor<std::int32_t, split<1>>::from_full(other, shape, full);
        try {
          (void)to_device(foreign, gpu);
          ADD_FAILURE() << "a host tensor of another placement was copied";
        } catch (const usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("to_device"), std::string::npos) << e.what();
        }
        // a device shard of the wrong size is refused, naming both sizes
        cuda::device_buffer<std::int32_t> wrong(3);
        EXPECT_THROW((void)(global_tensor<std::int32_t, split<1>, memory::cuda>::from_local(
                         gpu, shape, cuda::device_span<const std::int32_t>(wrong.span()))),
                     usage_error);
      },
      flexpar::testing_support::with_timeout(60s));
}

/// Runs `body(mesh, gpu)` on `world` thread ranks sharing GPU 0: a 1-D mesh of every rank and its
/// device side.
template <class Body>
void on_one_gpu(int world, Body body) {
  run_in_process(
      world,
      [&](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        body(mesh, gpu);
      },
      flexpar::testing_support::with_timeout(std::chrono::seconds(120)));
}

template <class T, class A, class B>
void check_matmul(const cuda::device_placement<1>& gpu, const shape_t& sa, const shape_t& sb, int salt) {
  // integers in [-2, 2]: every product, partial sum and sum (|x| <= 36) is exact in f32 and in bf16
  auto small = [](const std::vector<float>& v) {
    std::vector<float> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>((static_cast<int>(v[i]) + 11) % 5 - 2);
    return out;
  };
  const auto fa = small(logical<float>(sa, salt)), fb = small(logical<float>(sb, salt + 1));
  std::vector<T> ta(fa.size()), tb(fb.size());
  for (std::size_t i = 0; i < fa.size(); ++i) ta[i] = static_cast<T>(fa[i]);
  for (std::size_t i = 0; i < fb.size(); ++i) tb[i] = static_cast<T>(fb[i]);
  const auto ha = global_tensor<float, A>::from_full(gpu.host(), sa, fa);
  const auto hb = global_tensor<float, B>::from_full(gpu.host(), sb, fb);
  const auto expected = matmul(ha, hb).to_full();
  const auto da = global_tensor<T, A, memory::cuda>::from_full(gpu, sa, ta);
  const auto db = global_tensor<T, B, memory::cuda>::from_full(gpu, sb, tb);
  const auto dc = matmul(da, db);
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(dc)>::sbp_type,
                               typename std::remove_cvref_t<decltype(matmul(ha, hb))>::sbp_type>);
  const auto got = dc.to_full();
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(static_cast<float>(got[i]), expected[i]) << to_string<A>() << " x " << to_string<B>() << " i " << i;
}

TEST(device_ops, matmul_add_mul_relu_match_the_host_ops) {
  for (int world : {1, 2, 3})
    on_one_gpu(world, [](const placement<1>& mesh, const cuda::device_placement<1>& gpu) {
      for (const auto& [sa, sb] : {std::pair{shape_t{7, 5}, shape_t{5, 4}}, std::pair{shape_t{4, 9}, shape_t{9, 6}},
                                   std::pair{shape_t{3, 0}, shape_t{0, 2}}}) {
        check_matmul<float, split<0>, broadcast>(gpu, sa, sb, 1);
        check_matmul<float, broadcast, split<1>>(gpu, sa, sb, 2);
        check_matmul<float, split<1>, split<0>>(gpu, sa, sb, 3);
        check_matmul<bfloat16, split<0>, broadcast>(gpu, sa, sb, 4);
        check_matmul<bfloat16, split<1>, split<0>>(gpu, sa, sb, 5);
      }
      const shape_t shape{6, 5};
      const auto fa = logical<float>(shape, 7), fb = logical<float>(shape, 8);
      const auto ha = global_tensor<float, split<0>>::from_full(mesh, shape, fa);
      const auto hb = global_tensor<float, split<0>>::from_full(mesh, shape, fb);
      const auto da = to_device(ha, gpu), db = to_device(hb, gpu);
      EXPECT_EQ(add(da, db).to_full(), add(ha, hb).to_full());
      EXPECT_EQ(mul(da, db).to_full(), mul(ha, hb).to_full());
      EXPECT_EQ(relu(da).to_full(), relu(ha).to_full());
      // (P, B) -> P: a partial tensor times a whole one
      const auto whole = to<broadcast>(db);
      EXPECT_EQ(to<broadcast>(mul(to<partial_sum>(to<broadcast>(da)), whole)).to_full(), mul(ha, hb).to_full());
      // partial sums add as partial sums: P + P -> P, gathered (reduced) on the host
      const auto pa = to<partial_sum>(to<broadcast>(da)), pb = to<partial_sum>(to<broadcast>(db));
      EXPECT_EQ(to<broadcast>(add(pa, pb)).to_full(), add(ha, hb).to_full());
    });
}

/// Within float rounding: the host and the device both compute in double and round once; exp and erf
/// of the two math libraries may differ in the last bit of a double.
void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-6f * std::max(1.0f, std::fabs(want[i]))) << what << " i " << i;
}

TEST(device_ops, gelu_softmax_layer_norm_reduce_sum_match_the_host_ops) {
  for (int world : {1, 2, 3})
    on_one_gpu(world, [](const placement<1>& mesh, const cuda::device_placement<1>& gpu) {
      const shape_t shape{5, 7, 3};
      const auto full = logical<float>(shape, 9);
      const auto rows = global_tensor<float, split<0>>::from_full(mesh, shape, full);
      const auto cols = global_tensor<float, split<2>>::from_full(mesh, shape, full);
      const auto d_rows = to_device(rows, gpu);
      const auto d_cols = to_device(cols, gpu);
      expect_near_all(gelu(d_rows).to_full(), gelu(rows).to_full(), "gelu");
      expect_near_all(softmax<1>(d_rows).to_full(), softmax<1>(rows).to_full(), "softmax<1> of S(0)");
      expect_near_all(softmax<0>(d_cols).to_full(), softmax<0>(cols).to_full(), "softmax<0> of S(2)");
      expect_near_all(softmax<2>(d_rows).to_full(), softmax<2>(rows).to_full(), "softmax<2> of S(0)");
      expect_near_all(layer_norm<2>(d_rows).to_full(), layer_norm<2>(rows).to_full(), "layer_norm<2>");
      expect_near_all(layer_norm<0>(d_cols, 1e-3).to_full(), layer_norm<0>(cols, 1e-3).to_full(), "layer_norm<0>");
      // small integers: the sums are exact, in either order
      EXPECT_EQ(reduce_sum<1>(d_rows).to_full(), reduce_sum<1>(rows).to_full());
      const auto split_sum = reduce_sum<0>(d_rows);  // over the split axis: P(sum)
      static_assert(std::is_same_v<std::remove_cvref_t<decltype(split_sum)>::sbp_type, partial_sum>);
      EXPECT_EQ(split_sum.to_full(), reduce_sum<0>(rows).to_full());
      EXPECT_THROW((void)softmax<3>(d_rows), usage_error);
    });
}

}  // namespace
}  // namespace flexpar::sbp
