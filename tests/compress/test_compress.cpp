// Compressors: round-trip error within the stated bound on random data, edge cases, error feedback.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <flexpar/compress/cast.hpp>
#include <flexpar/compress/minmax_uint8.hpp>
#include <flexpar/compress/onebit.hpp>

namespace flexpar::compress {
namespace {

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(cast, fp16_and_bf16_round_trip_within_their_relative_error) {
  for (float magnitude : {1e-3f, 1.0f, 1e3f}) {
    const auto x = random_values(10000, 7, magnitude);
    std::vector<half> h(x.size());
    std::vector<bfloat16> b(x.size());
    std::vector<float> y(x.size()), z(x.size());
    fp16::encode(x, h);
    fp16::decode(h, y);
    bf16::encode(x, b);
    bf16::decode(b, z);
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::abs(x[i]) >= 6.2e-5f) {  // normal half range
        EXPECT_LE(std::abs(y[i] - x[i]), fp16::relative_error * std::abs(x[i])) << x[i];
      }
      EXPECT_LE(std::abs(z[i] - x[i]), bf16::relative_error * std::abs(x[i])) << x[i];
    }
  }
}

TEST(cast, non_finite_and_overflow_are_documented_behaviour) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x{nan, inf, -inf, 70000.0f, -1e6f, 65504.0f};
  std::vector<half> h(x.size());
  std::vector<float> y(x.size());
  fp16::encode(x, h);
  fp16::decode(h, y);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], inf);
  EXPECT_EQ(y[2], -inf);
  EXPECT_EQ(y[3], inf);  // beyond 65504: Inf, as documented
  EXPECT_EQ(y[4], -inf);
  EXPECT_EQ(y[5], 65504.0f);
  std::vector<bfloat16> b(x.size());
  bf16::encode(x, b);
  bf16::decode(b, y);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], inf);
  EXPECT_NEAR(y[4], -1e6f, 1e6f / 256);  // bf16 keeps the f32 range
  std::vector<half> wrong(2);
  EXPECT_THROW(fp16::encode(x, wrong), usage_error);
}

TEST(minmax_uint8, round_trip_within_the_bound_of_each_chunk) {
  const minmax_uint8 q{.chunk = 100};
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{99}, std::size_t{100}, std::size_t{101}, std::size_t{12345}}) {
    auto x = random_values(n, n + 1, 3.0f);
    for (std::size_t i = 0; i < n; ++i)
      x[i] += static_cast<float>((i / 100) % 5) * 10.0f;  // chunks at different offsets
    std::vector<std::byte> wire(q.encoded_size(n));
    std::vector<float> y(n);
    q.encode(x, wire);
    q.decode(wire, y);
    EXPECT_EQ(wire.size(), n + 8 * ((n + 99) / 100));
    for (std::size_t begin = 0; begin < n; begin += 100) {
      const std::size_t end = std::min(n, begin + 100);
      const float lo = *std::min_element(x.begin() + static_cast<std::ptrdiff_t>(begin),
                                         x.begin() + static_cast<std::ptrdiff_t>(end));
      const float hi = *std::max_element(x.begin() + static_cast<std::ptrdiff_t>(begin),
                                         x.begin() + static_cast<std::ptrdiff_t>(end));
      for (std::size_t i = begin; i < end; ++i)
        ASSERT_LE(std::abs(y[i] - x[i]), minmax_uint8::error_bound(lo, hi)) << "n " << n << " i " << i;
    }
  }
}

TEST(minmax_uint8, constant_chunks_decode_exactly_and_extremes_are_kept) {
  const minmax_uint8 q{.chunk = 4};
  const std::vector<float> x{2.5f, 2.5f, 2.5f, 2.5f, -1.0f, 7.0f, 3.0f, -1.0f, 42.0f};
  std::vector<std::byte> wire(q.encoded_size(x.size()));
  std::vector<float> y(x.size());
  q.encode(x, wire);
  q.decode(wire, y);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[static_cast<std::size_t>(i)], 2.5f);
  EXPECT_EQ(y[4], -1.0f);
  EXPECT_EQ(y[5], 7.0f);
  EXPECT_EQ(y[8], 42.0f);  // a one-element chunk is constant
}

TEST(minmax_uint8, non_finite_input_is_a_clear_error) {
  const minmax_uint8 q{.chunk = 8};
  std::vector<float> x(20, 1.0f);
  x[13] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::byte> wire(q.encoded_size(x.size()));
  try {
    q.encode(x, wire);
    FAIL() << "NaN was quantized";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("element 13 is nan"), std::string::npos) << e.what();
  }
  x[13] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(q.encode(x, wire), usage_error);
  std::vector<std::byte> small(3);
  x[13] = 0;
  EXPECT_THROW(q.encode(x, small), usage_error);
}

TEST(onebit, decodes_to_plus_minus_the_mean_magnitude_of_each_chunk) {
  onebit c(6, 3);
  const std::vector<float> x{1.0f, -2.0f, 3.0f, -4.0f, -4.0f, 4.0f};
  std::vector<std::byte> wire(c.encoded_size(x.size()));
  EXPECT_EQ(wire.size(), 2 * (4 + 1));
  std::vector<float> y(6);
  c.encode(x, wire);
  c.decode(wire, y);
  EXPECT_EQ(y, (std::vector<float>{2.0f, -2.0f, 2.0f, -4.0f, -4.0f, 4.0f}));
  // residual = x - sent
  const std::vector<float> want_residual{-1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 0.0f};
  EXPECT_TRUE(std::equal(c.residual().begin(), c.residual().end(), want_residual.begin()));
}

TEST(onebit, error_feedback_makes_the_sent_sum_track_the_true_sum) {
  const std::size_t n = 5000;
  onebit c(n, 512);
  std::vector<double> true_sum(n, 0.0), sent_sum(n, 0.0);
  std::vector<std::byte> wire(c.encoded_size(n));
  std::vector<float> y(n);
  double max_residual = 0;
  for (int step = 0; step < 200; ++step) {
    auto x = random_values(n, static_cast<std::uint64_t>(step) + 100, 0.1f);
    for (std::size_t i = 0; i < n; ++i) x[i] += 0.01f;  // a drift that plain sign compression would distort
    c.encode(x, wire);
    c.decode(wire, y);
    for (std::size_t i = 0; i < n; ++i) {
      true_sum[i] += x[i];
      sent_sum[i] += y[i];
    }
    for (float r : c.residual()) max_residual = std::max(max_residual, static_cast<double>(std::abs(r)));
  }
  // Exactly: sent + residual == true (up to float rounding of 200 steps).
  for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(sent_sum[i] + c.residual()[i], true_sum[i], 1e-3) << i;
  // And the residual stays bounded (does not grow with the steps): the drift of 2.0 over 200 steps is
  // delivered, not accumulated.
  EXPECT_LT(max_residual, 1.5);
  double mean_true = 0, mean_sent = 0;
  for (std::size_t i = 0; i < n; ++i) {
    mean_true += true_sum[i] / n;
    mean_sent += sent_sum[i] / n;
  }
  EXPECT_NEAR(mean_sent, mean_true, 0.05 * std::abs(mean_true));
}

TEST(onebit, non_finite_input_is_a_clear_error_and_leaves_the_residual_usable) {
  onebit c(4, 4);
  std::vector<std::byte> wire(c.encoded_size(4));
  c.encode(std::vector<float>{1, 2, 3, 4}, wire);
  const std::vector<float> before(c.residual().begin(), c.residual().end());
  std::vector<float> bad{1, std::numeric_limits<float>::infinity(), 3, 4};
  try {
    c.encode(bad, wire);
    FAIL() << "Inf was compressed";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("element 1 is inf"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::equal(before.begin(), before.end(), c.residual().begin()));
  EXPECT_THROW(c.encode(std::vector<float>(3), wire), usage_error);
}

}  // namespace
}  // namespace flexpar::compress
