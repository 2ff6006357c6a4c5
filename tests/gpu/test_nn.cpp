// flexpar/cuda/blas.hpp and flexpar/cuda/nn.hpp against host computations on the same inputs:
// GEMM in every transpose combination (f32 against a double-precision loop, within f32 rounding of
// k terms; bf16 with f32 accumulation against the same loop on the bf16 values), column sums, and the
// small kernels exactly (fill_rows, relu, relu_backward, gather_rows), softmax cross-entropy within
// float rounding of the host's, SGD with momentum bit for bit against relax::sgd, max pooling and its
// gradient exactly against serial loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <flexpar/cuda/blas.hpp>
#include <flexpar/cuda/nn.hpp>
#include <flexpar/relax/optimizer.hpp>

#include "gpu/device_io.hpp"

namespace fc = flexpar::cuda;
using flexpar::testing_support::download;
using flexpar::testing_support::upload;

namespace {

std::vector<float> random_floats(std::size_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// C = alpha op(A) op(B) + beta C in double, row-major; A stored k x m when transposed, B n x k.
std::vector<double> reference_gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, double alpha,
                                   const std::vector<double>& a, const std::vector<double>& b, double beta,
                                   const std::vector<double>& c) {
  std::vector<double> out(m * n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::size_t p = 0; p < k; ++p)
        sum += (ta ? a[p * m + i] : a[i * k + p]) * (tb ? b[j * k + p] : b[p * n + j]);
      out[i * n + j] = alpha * sum + beta * c[i * n + j];
    }
  return out;
}

template <class T>
std::vector<double> widened(const std::vector<T>& v) {
  std::vector<double> w(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) w[i] = static_cast<double>(static_cast<float>(v[i]));
  return w;
}

}  // namespace

TEST(CudaBlas, GemmEveryTransposeMatchesTheHostWithinRounding) {
  fc::stream s;
  fc::blas la;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (auto [m, n, k] : {std::array<std::size_t, 3>{1, 1, 1}, {64, 256, 784}, {37, 5, 129}, {0, 3, 4}}) {
        const auto a = random_floats(m * k, 1 + m), b = random_floats(k * n, 2 + n), c0 = random_floats(m * n, 3 + k);
        auto da = upload(a, s);
        auto db = upload(b, s);
        auto dc = upload(c0, s);
        la.gemm(ta ? fc::transpose::yes : fc::transpose::no, tb ? fc::transpose::yes : fc::transpose::no, m, n, k, 0.5f,
                fc::device_span<const float>(da.span()), fc::device_span<const float>(db.span()), 2.0f, dc.span(), s);
        const auto got = download(fc::device_span<const float>(dc.span()), s);
        const auto want = reference_gemm(ta, tb, m, n, k, 0.5, widened(a), widened(b), 2.0, widened(c0));
        for (std::size_t i = 0; i < m * n; ++i)  // k products below 1 in magnitude: |error| <= k * 2^-23 or so
          ASSERT_NEAR(got[i], want[i], 2e-7 * static_cast<double>(k + 4))
              << "ta " << ta << " tb " << tb << " m " << m << " n " << n << " k " << k << " i " << i;
      }
}

TEST(CudaBlas, Bf16GemmAccumulatesInFloat) {
  fc::stream s;
  fc::blas la;
  const std::size_t m = 33, n = 17, k = 300;
  std::vector<flexpar::bfloat16> a(m * k), b(k * n), c(m * n, flexpar::bfloat16(0.0f));
  const auto fa = random_floats(m * k, 7), fb = random_floats(k * n, 8);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = flexpar::bfloat16(fa[i]);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = flexpar::bfloat16(fb[i]);
  auto da = upload(a, s);
  auto db = upload(b, s);
  auto dc = upload(c, s);
  la.gemm(fc::transpose::no, fc::transpose::no, m, n, k, 1.0f, fc::device_span<const flexpar::bfloat16>(da.span()),
          fc::device_span<const flexpar::bfloat16>(db.span()), 0.0f, dc.span(), s);
  const auto got = download(fc::device_span<const flexpar::bfloat16>(dc.span()), s);
  const auto want = reference_gemm(false, false, m, n, k, 1.0, widened(a), widened(b), 0.0, std::vector<double>(m * n));
  for (std::size_t i = 0; i < m * n; ++i)  // one rounding to bf16 (2^-8 relative) of an f32 sum
    ASSERT_NEAR(static_cast<float>(got[i]), want[i], std::abs(want[i]) * 4e-3 + 1e-4) << "i " << i;
}

TEST(CudaBlas, ColumnSumsAndTooSmallSpans) {
  fc::stream s;
  fc::blas la;
  const std::size_t m = 64, n = 10;
  std::vector<float> a(m * n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i % 7) - 3);  // exact sums
  auto da = upload(a, s);
  fc::device_buffer<float> y(n);
  la.column_sums(m, n, fc::device_span<const float>(da.span()), y.span(), s);
  const auto got = download(fc::device_span<const float>(y.span()), s);
  for (std::size_t j = 0; j < n; ++j) {
    float want = 0;
    for (std::size_t i = 0; i < m; ++i) want += a[i * n + j];
    EXPECT_EQ(got[j], want) << "column " << j;
  }
  EXPECT_THROW(la.gemm(fc::transpose::no, fc::transpose::no, 8, 10, 8, 1.0f, fc::device_span<const float>(da.span()),
                       fc::device_span<const float>(da.span()), 0.0f, y.span(), s),
               flexpar::usage_error);
}

TEST(CudaNn, SmallKernelsAreExact) {
  fc::stream s;
  const std::size_t rows = 37, cols = 129;
  const auto row = random_floats(cols, 11);
  fc::device_buffer<float> z(rows * cols);
  fc::fill_rows(z.span(), fc::device_span<const float>(upload(row, s).span()), rows, cols, s);
  auto filled = download(fc::device_span<const float>(z.span()), s);
  for (std::size_t i = 0; i < rows * cols; ++i) ASSERT_EQ(filled[i], row[i % cols]);

  const auto values = random_floats(rows * cols, 12), grads = random_floats(rows * cols, 13);
  auto dv = upload(values, s);
  fc::relu(dv.span(), s);
  const auto relued = download(fc::device_span<const float>(dv.span()), s);
  for (std::size_t i = 0; i < values.size(); ++i) ASSERT_EQ(relued[i], std::max(values[i], 0.0f));
  auto dg = upload(grads, s);
  fc::relu_backward(fc::device_span<const float>(dg.span()), fc::device_span<const float>(dv.span()), dg.span(), s);
  const auto masked = download(fc::device_span<const float>(dg.span()), s);
  for (std::size_t i = 0; i < grads.size(); ++i) ASSERT_EQ(masked[i], relued[i] > 0.0f ? grads[i] : 0.0f);

  // gather rows of floats (aligned) and of bytes (any alignment)
  const std::vector<std::uint32_t> index{5, 0, 36, 5, 17};
  auto di = upload(index, s);
  fc::device_buffer<float> picked(index.size() * cols);
  fc::gather_rows(picked.span().as_bytes(), fc::device_span<const float>(upload(values, s).span()).as_bytes(),
                  cols * sizeof(float), fc::device_span<const std::uint32_t>(di.span()), s);
  const auto got = download(fc::device_span<const float>(picked.span()), s);
  for (std::size_t r = 0; r < index.size(); ++r)
    for (std::size_t c = 0; c < cols; ++c) ASSERT_EQ(got[r * cols + c], values[index[r] * cols + c]);
  std::vector<std::uint8_t> bytes(rows * 3);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(i * 7);
  fc::device_buffer<std::uint8_t> picked_bytes(index.size() * 3);
  fc::gather_rows(picked_bytes.span().as_bytes(),
                  fc::device_span<const std::uint8_t>(upload(bytes, s).span()).as_bytes(), 3,
                  fc::device_span<const std::uint32_t>(di.span()), s);
  const auto got_bytes = download(fc::device_span<const std::uint8_t>(picked_bytes.span()), s);
  for (std::size_t r = 0; r < index.size(); ++r)
    for (std::size_t c = 0; c < 3; ++c) ASSERT_EQ(got_bytes[r * 3 + c], bytes[index[r] * 3 + c]);
  EXPECT_THROW(fc::relu_backward(fc::device_span<const float>(dg.span()),
                                 fc::device_span<const float>(z.span().first(3)), dg.span(), s),
               flexpar::usage_error);
}

// max pooling against serial loops (the first maximum of each window in row-major order; the
// gradient added at it in output order), over overlapping windows (stride < window), a stride that
// leaves a remainder, and values in {-1, 0, 1} so that windows tie often.
TEST(CudaNn, MaxPoolAndItsGradientEqualSerialLoops) {
  fc::stream s;
  for (const fc::pool_geometry g : {fc::pool_geometry{6, 9, 7, 3, 1}, fc::pool_geometry{6, 9, 7, 3, 2},
                                    fc::pool_geometry{4, 8, 8, 2, 2}, fc::pool_geometry{2, 5, 5, 5, 3}}) {
    const std::size_t ph = g.out_height(), pw = g.out_width(), plane = g.height * g.width;
    std::vector<float> x(g.planes * plane), dy(g.planes * ph * pw);
    std::mt19937 rng(static_cast<std::uint32_t>(g.window * 10 + g.stride));
    for (float& e : x) e = static_cast<float>(static_cast<int>(rng() % 3) - 1);
    for (float& e : dy) e = static_cast<float>(static_cast<int>(rng() % 7) - 3) / 4.0f;
    std::vector<float> y(dy.size()), dx(x.size(), 0.0f);
    for (std::size_t p = 0; p < g.planes; ++p)
      for (std::size_t i = 0; i < ph; ++i)
        for (std::size_t j = 0; j < pw; ++j) {
          std::size_t best = i * g.stride * g.width + j * g.stride;
          for (std::size_t r = 0; r < g.window; ++r)
            for (std::size_t c = 0; c < g.window; ++c) {
              const std::size_t at = (i * g.stride + r) * g.width + j * g.stride + c;
              if (x[p * plane + at] > x[p * plane + best]) best = at;
            }
          const std::size_t k = (p * ph + i) * pw + j;
          y[k] = x[p * plane + best];
          dx[p * plane + best] += dy[k];
        }
    auto dxin = upload(x, s), ddy = upload(dy, s);
    fc::device_buffer<float> dyout(y.size()), ddx(x.size());
    fc::max_pool(g, fc::device_span<const float>(dxin.span()), dyout.span(), s);
    fc::max_pool_backward(g, fc::device_span<const float>(dxin.span()), fc::device_span<const float>(ddy.span()),
                          ddx.span(), s);
    const std::string what = std::to_string(g.window) + "x" + std::to_string(g.window) + " stride " +
                             std::to_string(g.stride) + " over " + std::to_string(g.height) + "x" +
                             std::to_string(g.width);
    EXPECT_EQ(download(fc::device_span<const float>(dyout.span()), s), y) << what;
    EXPECT_EQ(download(fc::device_span<const float>(ddx.span()), s), dx) << what;
  }
  fc::device_buffer<float> small(3), out(1);
  EXPECT_THROW(
      fc::max_pool(fc::pool_geometry{1, 2, 2, 2, 2}, fc::device_span<const float>(small.span()), out.span(), s),
      flexpar::usage_error);
  EXPECT_THROW(
      fc::max_pool(fc::pool_geometry{1, 1, 3, 1, 0}, fc::device_span<const float>(small.span()), out.span(), s),
      flexpar::usage_error);
}

TEST(CudaNn, SoftmaxCrossEntropyMatchesTheHost) {
  fc::stream s;
  for (std::size_t classes : {std::size_t{10}, std::size_t{1}, std::size_t{40}}) {
    const std::size_t rows = 300;
    auto logits = random_floats(rows * classes, 21 + classes, -4.0f, 4.0f);
    if (classes >= 10) logits[3 * classes + 2] = logits[3 * classes + 7] = 9.0f;  // a tie: the first maximum counts
    std::vector<std::uint8_t> labels(rows);
    for (std::size_t i = 0; i < rows; ++i) labels[i] = static_cast<std::uint8_t>((i * 3) % classes);
    labels[3] = classes >= 10 ? 2 : 0;
    auto dl = upload(logits, s);
    auto dy = upload(labels, s);
    fc::device_buffer<fc::score_sums> sums(1);
    fc::reset(sums.data(), s);
    const float scale = 1.0f / static_cast<float>(rows);
    fc::softmax_cross_entropy(dl.span(), fc::device_span<const std::uint8_t>(dy.span()), rows, classes, scale,
                              sums.data(), s);
    const auto grad = download(fc::device_span<const float>(dl.span()), s);
    const auto got = download(fc::device_span<const fc::score_sums>(sums.span()), s)[0];
    // the host's computation (samples/support/mlp.hpp, mlp::score)
    double loss = 0;
    unsigned long long correct = 0;
    for (std::size_t i = 0; i < rows; ++i) {
      const float* row = logits.data() + i * classes;
      const float top = *std::max_element(row, row + classes);
      const auto arg = static_cast<std::size_t>(std::max_element(row, row + classes) - row);
      double total = 0;
      for (std::size_t c = 0; c < classes; ++c) total += std::exp(static_cast<double>(row[c] - top));
      loss += std::log(total) - static_cast<double>(row[labels[i]] - top);
      correct += arg == labels[i] ? 1 : 0;
      for (std::size_t c = 0; c < classes; ++c) {
        const auto p = static_cast<float>(std::exp(static_cast<double>(row[c] - top) - std::log(total)));
        ASSERT_NEAR(grad[i * classes + c], (p - (c == labels[i] ? 1.0f : 0.0f)) * scale, 1e-9)
            << "classes " << classes << " row " << i;
      }
    }
    EXPECT_EQ(got.correct, correct) << "classes " << classes;
    EXPECT_NEAR(got.loss, loss, 1e-9 * rows) << "classes " << classes;
  }
}

TEST(CudaNn, SgdWithMomentumIsBitIdenticalToRelaxSgd) {
  fc::stream s;
  const std::size_t n = 100003;
  auto weight = random_floats(n, 31), momentum_buffer = std::vector<float>(n, 0.0f);
  flexpar::relax::sgd host({.learning_rate = 0.05f, .momentum = 0.9f});
  auto dw = upload(weight, s);
  auto db = upload(momentum_buffer, s);
  for (int step = 0; step < 5; ++step) {
    const auto g = random_floats(n, 40 + static_cast<std::uint64_t>(step));
    const float factor = 0.5f * (1.0f + std::cos(3.14159265f * static_cast<float>(step) / 5.0f));
    std::vector<float> scaled(n);
    for (std::size_t i = 0; i < n; ++i) scaled[i] = step == 0 ? g[i] : g[i] * factor;  // factor 1 at step 0
    host.apply(0, weight, scaled);
    fc::sgd_momentum(dw.span(), db.span(), fc::device_span<const float>(upload(g, s).span()), 0.05f, 0.9f, factor, s);
  }
  const auto got = download(fc::device_span<const float>(dw.span()), s);
  EXPECT_EQ(0, std::memcmp(got.data(), weight.data(), n * sizeof(float)));
}
