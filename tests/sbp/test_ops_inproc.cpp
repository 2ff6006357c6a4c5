// Every op signature against a serial computation of the same logical op, threads as ranks on 1-4
// ranks and on 2 x 2 meshes. Inputs are small integers, so float GEMMs and sums are exact; partial
// inputs hold different summands on every rank (boxing_checks.hpp's distinct_partials).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "support/test_config.hpp"

#include "boxing_checks.hpp"

namespace flexpar::sbp {
namespace {

template <class T>
std::vector<T> values(std::size_t n, int salt) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<T>(static_cast<int>((i * 5 + static_cast<std::size_t>(salt) * 3) % 11) - 5);
  return v;
}

// serial references
std::vector<float> serial_matmul(const std::vector<float>& a, const std::vector<float>& b, std::size_t m, std::size_t k,
                                 std::size_t n) {
  std::vector<float> c(m * n, 0.0f);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = 0; p < k; ++p)
      for (std::size_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + p] * b[p * n + j];
  return c;
}

template <class... S>
struct list {};

template <class A, class B, std::size_t N>
void check_matmul(const placement<N>& mesh, std::size_t m, std::size_t k, std::size_t n, int salt) {
  const auto a = values<float>(m * k, salt), b = values<float>(k * n, salt + 1);
  auto ta = testing_support::distinct_source<float, A>(mesh, {m, k}, a, salt);  // P: rank-distinct summands
  auto tb = testing_support::distinct_source<float, B>(mesh, {k, n}, b, salt + 1);
  auto c = matmul(ta, tb);
  EXPECT_EQ(c.to_full(), serial_matmul(a, b, m, k, n))
      << "matmul " << to_string<A>() << " x " << to_string<B>() << " -> " << to_string<typename decltype(c)::sbp_type>()
      << " [" << m << "," << k << "] x [" << k << "," << n << "]";
}

class ops_1d : public ::testing::TestWithParam<int> {};

TEST_P(ops_1d, every_signature_matches_the_serial_op) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        int salt = 0;
        for (auto [m, k, n] : {std::array<std::size_t, 3>{5, 3, 4}, {7, 6, 2}, {1, 1, 1}, {0, 3, 2}, {4, 0, 3}}) {
          check_matmul<split<0>, broadcast>(mesh, m, k, n, ++salt);
          check_matmul<broadcast, split<1>>(mesh, m, k, n, ++salt);
          check_matmul<split<1>, split<0>>(mesh, m, k, n, ++salt);
          check_matmul<partial_sum, broadcast>(mesh, m, k, n, ++salt);
          check_matmul<broadcast, partial_sum>(mesh, m, k, n, ++salt);
          check_matmul<broadcast, broadcast>(mesh, m, k, n, ++salt);
        }
        // the deduced types
        using c1 = decltype(matmul(std::declval<global_tensor<float, split<1>>&>(),
                                   std::declval<global_tensor<float, split<0>>&>()));
        static_assert(std::is_same_v<c1, global_tensor<float, partial_sum>>);

        const shape_t shape{5, 3};
        const auto x = values<float>(15, 1), y = values<float>(15, 2);
        std::vector<float> sum(15), prod(15), rel(15);
        for (std::size_t i = 0; i < 15; ++i) {
          sum[i] = x[i] + y[i];
          prod[i] = x[i] * y[i];
          rel[i] = std::max(0.0f, x[i]);
        }
        auto check2 = [&]<class A, class B>(A, B, auto op, const std::vector<float>& want, const char* what) {
          auto ta = testing_support::distinct_source<float, A>(mesh, shape, x, 1);
          auto tb = testing_support::distinct_source<float, B>(mesh, shape, y, 2);
          EXPECT_EQ(op(ta, tb).to_full(), want) << what << " " << to_string<A>() << ", " << to_string<B>();
        };
        auto add_op = [](auto& a, auto& b) { return add(a, b); };
        auto mul_op = [](auto& a, auto& b) { return mul(a, b); };
        check2(split<0>{}, split<0>{}, add_op, sum, "add");
        check2(split<1>{}, split<1>{}, add_op, sum, "add");
        check2(broadcast{}, broadcast{}, add_op, sum, "add");
        check2(partial_sum{}, partial_sum{}, add_op, sum, "add");
        check2(split<1>{}, split<1>{}, mul_op, prod, "mul");
        check2(broadcast{}, broadcast{}, mul_op, prod, "mul");
        check2(partial_sum{}, broadcast{}, mul_op, prod, "mul");
        check2(broadcast{}, partial_sum{}, mul_op, prod, "mul");

        auto check1 = [&]<class A>(A, auto op, const std::vector<float>& want, const char* what) {
          auto ta = testing_support::distinct_source<float, A>(mesh, shape, x, 3);
          EXPECT_EQ(op(ta).to_full(), want) << what << " " << to_string<A>();
        };
        auto relu_op = [](auto& a) { return relu(a); };
        check1(split<0>{}, relu_op, rel, "relu");
        check1(split<1>{}, relu_op, rel, "relu");
        check1(broadcast{}, relu_op, rel, "relu");

        // softmax over axis 1: rows whole (S(0) or B)
        std::vector<float> soft(15);
        for (std::size_t r = 0; r < 5; ++r) {
          double hi = -INFINITY, s = 0;
          for (std::size_t c = 0; c < 3; ++c) hi = std::max(hi, double(x[r * 3 + c]));
          for (std::size_t c = 0; c < 3; ++c) s += std::exp(double(x[r * 3 + c]) - hi);
          for (std::size_t c = 0; c < 3; ++c) soft[r * 3 + c] = float(std::exp(double(x[r * 3 + c]) - hi) / s);
        }
        auto softmax_op = [](auto& a) { return softmax<1>(a); };
        check1(split<0>{}, softmax_op, soft, "softmax<1>");
        check1(broadcast{}, softmax_op, soft, "softmax<1>");

        // gelu element-wise; layer_norm over axis 1 (rows whole) and axis 0 (columns whole)
        std::vector<float> gel(15), norm1(15), norm0(15);
        for (std::size_t i = 0; i < 15; ++i)
          gel[i] = float(0.5 * double(x[i]) * (1.0 + std::erf(double(x[i]) / std::sqrt(2.0))));
        auto normalize = [&](std::vector<float>& out, std::size_t count, std::size_t stride, std::size_t start) {
          double mean = 0, var = 0;
          for (std::size_t k = 0; k < count; ++k) mean += double(x[start + k * stride]);
          mean /= double(count);
          for (std::size_t k = 0; k < count; ++k) {
            const double d = double(x[start + k * stride]) - mean;
            var += d * d;
          }
          const double scale = 1.0 / std::sqrt(var / double(count) + 1e-5);
          for (std::size_t k = 0; k < count; ++k)
            out[start + k * stride] = float((double(x[start + k * stride]) - mean) * scale);
        };
        for (std::size_t r = 0; r < 5; ++r) normalize(norm1, 3, 1, r * 3);
        for (std::size_t c = 0; c < 3; ++c) normalize(norm0, 5, 3, c);
        auto gelu_op = [](auto& a) { return gelu(a); };
        check1(split<0>{}, gelu_op, gel, "gelu");
        check1(split<1>{}, gelu_op, gel, "gelu");
        check1(broadcast{}, gelu_op, gel, "gelu");
        auto norm1_op = [](auto& a) { return layer_norm<1>(a); };
        auto norm0_op = [](auto& a) { return layer_norm<0>(a); };
        check1(split<0>{}, norm1_op, norm1, "layer_norm<1>");
        check1(broadcast{}, norm1_op, norm1, "layer_norm<1>");
        check1(split<1>{}, norm0_op, norm0, "layer_norm<0>");
        check1(broadcast{}, norm0_op, norm0, "layer_norm<0>");

        // reduce_sum over axis 0 and 1
        std::vector<float> cols(3, 0.0f), rows(5, 0.0f);
        for (std::size_t r = 0; r < 5; ++r)
          for (std::size_t c = 0; c < 3; ++c) {
            cols[c] += x[r * 3 + c];
            rows[r] += x[r * 3 + c];
          }
        auto sum0 = [](auto& a) { return reduce_sum<0>(a); };
        auto sum1 = [](auto& a) { return reduce_sum<1>(a); };
        check1(split<0>{}, sum0, cols, "reduce_sum<0>");  // -> P(sum)
        check1(split<1>{}, sum0, cols, "reduce_sum<0>");  // -> S(0)
        check1(broadcast{}, sum0, cols, "reduce_sum<0>");
        check1(partial_sum{}, sum0, cols, "reduce_sum<0>");
        check1(split<0>{}, sum1, rows, "reduce_sum<1>");
        static_assert(std::is_same_v<decltype(reduce_sum<0>(std::declval<global_tensor<float, split<1>>&>())),
                                     global_tensor<float, split<0>>>);

        // embedding: vocabulary of 7 rows of 3, 5 ids (two repeated)
        const auto w = values<float>(21, 4);
        const std::vector<std::int64_t> ids{6, 0, 3, 3, 5};
        std::vector<float> looked(15);
        for (std::size_t i = 0; i < 5; ++i)
          for (std::size_t c = 0; c < 3; ++c) looked[i * 3 + c] = w[static_cast<std::size_t>(ids[i]) * 3 + c];
        auto check_embedding = [&]<class W, class I>(W, I) {
          auto tw = global_tensor<float, W>::from_full(mesh, {7, 3}, w);
          auto ti = global_tensor<std::int64_t, I>::from_full(mesh, {5}, ids);
          EXPECT_EQ(embedding(tw, ti).to_full(), looked) << "embedding " << to_string<W>() << ", " << to_string<I>();
        };
        check_embedding(split<0>{}, broadcast{});
        check_embedding(split<1>{}, broadcast{});
        check_embedding(broadcast{}, split<0>{});
        check_embedding(broadcast{}, broadcast{});
        static_assert(std::is_same_v<decltype(embedding(std::declval<global_tensor<float, split<0>>&>(),
                                                        std::declval<global_tensor<std::int64_t, broadcast>&>())),
                                     global_tensor<float, partial_sum>>);
        auto bad_ids = global_tensor<std::int64_t, broadcast>::from_full(mesh, {1}, std::vector<std::int64_t>{7});
        auto tw = global_tensor<float, split<0>>::from_full(mesh, {7, 3}, w);
        EXPECT_THROW((void)embedding(tw, bad_ids), usage_error);
        auto ta = global_tensor<float, broadcast>::from_full(mesh, {2, 3}, values<float>(6, 1));
        EXPECT_THROW((void)matmul(ta, ta), usage_error);  // [2,3] x [2,3]
      },
      flexpar::testing_support::with_timeout());
}

INSTANTIATE_TEST_SUITE_P(worlds, ops_1d, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::string("p").append(std::to_string(info.param)); });

TEST(ops_2d, nd_signatures_compose_per_mesh_axis) {
  run_in_process(
      4,
      [](communicator& comm) {
        placement<2> mesh(comm, {2, 2});
        int salt = 0;
        for (auto [m, k, n] : {std::array<std::size_t, 3>{5, 3, 4}, {6, 5, 7}}) {
          // data x model: rows by data, Megatron's column then row parallel
          check_matmul<sbp<split<0>, broadcast>, sbp<broadcast, split<1>>>(mesh, m, k, n, ++salt);     // (S0, S1)
          check_matmul<sbp<split<0>, split<1>>, sbp<broadcast, split<0>>>(mesh, m, k, n, ++salt);      // (S0, P)
          check_matmul<sbp<split<1>, split<1>>, sbp<split<0>, split<0>>>(mesh, m, k, n, ++salt);       // (P, P)
          check_matmul<sbp<partial_sum, split<0>>, sbp<broadcast, broadcast>>(mesh, m, k, n, ++salt);  // (P, S0)
          check_matmul<sbp<split<0>, split<0>>, sbp<broadcast, broadcast>>(mesh, m, k, n, ++salt);     // (S0, S0)
        }
        using out = decltype(matmul(std::declval<global_tensor<float, sbp<split<0>, split<1>>>&>(),
                                    std::declval<global_tensor<float, sbp<broadcast, split<0>>>&>()));
        static_assert(std::is_same_v<out::sbp_type, sbp<split<0>, partial_sum>>);
      },
      flexpar::testing_support::with_timeout());
}

}  // namespace
}  // namespace flexpar::sbp
