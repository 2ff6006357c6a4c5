// The GPU model of the Fashion-MNIST sample (mlp_cuda.hpp) against the CPU model (mlp.hpp) on the same
// initial weights and the same batch: the same loss and accuracy, and every gradient within the float
// rounding of GEMM sums taken in another order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gpu/device_io.hpp"
#include "mlp.hpp"
#include "mlp_cuda.hpp"

namespace fc = flexpar::cuda;
namespace fm = flexpar::samples;

TEST(MlpCuda, OneTrainingStepMatchesTheCpuModel) {
  fc::stream s;
  const std::vector<std::size_t> widths{784, 256, 128, 10};
  const std::size_t batch = 64;
  fm::mlp host(widths, 7);
  fm::mlp_cuda device(widths, 7, batch, s);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> x(batch * widths[0]);
  for (float& v : x) v = pixel(rng);
  std::vector<std::uint8_t> y(batch);
  for (std::size_t i = 0; i < batch; ++i) y[i] = static_cast<std::uint8_t>(rng() % 10);

  // the same initial parameters, bit for bit
  const auto params = flexpar::testing_support::download(fc::device_span<const float>(device.parameters()), s);
  std::size_t at = 0;
  for (std::size_t l = 0; l < host.layers(); ++l) {
    for (float w : host.weight(l)) ASSERT_EQ(params[at++], w) << "layer " << l;
    for (float b : host.bias(l)) ASSERT_EQ(params[at++], b) << "layer " << l;
  }

  fm::batch_result host_result;
  host.train_step(x, y, batch, host_result);
  auto dx = flexpar::testing_support::upload(x, s);
  auto dy = flexpar::testing_support::upload(y, s);
  fc::device_buffer<fc::score_sums> sums(1);
  fc::reset(sums.data(), s);
  device.train_step(fc::device_span<const float>(dx.span()), fc::device_span<const std::uint8_t>(dy.span()), batch,
                    sums.data(), s);
  const auto got = flexpar::testing_support::download(fc::device_span<const fc::score_sums>(sums.span()), s)[0];
  EXPECT_EQ(got.correct, host_result.correct);
  EXPECT_NEAR(got.loss, host_result.loss_sum, 1e-4 * host_result.loss_sum);

  const auto grads = flexpar::testing_support::download(fc::device_span<const float>(device.gradients()), s);
  at = 0;
  for (std::size_t l = 0; l < host.layers(); ++l) {
    for (auto part : {host.weight_grad(l), host.bias_grad(l)}) {
      float scale = 0;
      for (float g : part) scale = std::max(scale, std::abs(g));
      for (float g : part) {
        ASSERT_NEAR(grads[at], g, 1e-4f * scale + 1e-7f) << "layer " << l << " element " << at;
        ++at;
      }
    }
  }
}
