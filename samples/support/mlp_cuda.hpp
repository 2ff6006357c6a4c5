// samples/support/mlp_cuda.hpp — the MLP of samples/support/mlp.hpp on the GPU: the same layers, the
// same initial weights (drawn on the host from the same seed), GEMMs through cuBLAS
// (flexpar/cuda/blas.hpp) and the small kernels of flexpar/cuda/nn.hpp.
//
// Every parameter lives in ONE device buffer, [W_1, b_1, W_2, b_2, ...], and every gradient in a
// second buffer of the same layout: a data-parallel step reduces all gradients with one collective
// and updates all parameters with one kernel. The arithmetic is the host model's:
//
//   forward   Z_l = 1 b_l^T, then Z_l += A_{l-1} W_l      (fill_rows, then gemm with beta 1)
//             A_l = relu(Z_l) (l < last);  the softmax cross-entropy of Z_last
//   backward  dZ_last = (P - onehot(y)) / B
//             dW_l = A_{l-1}^T dZ_l,  db_l = 1^T dZ_l,  dZ_{l-1} = (dZ_l W_l^T) where A_{l-1} > 0
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <vector>

#include <flexpar/cuda/blas.hpp>
#include <flexpar/cuda/nn.hpp>
#include <flexpar/cuda/runtime.hpp>

namespace flexpar::samples {

/// A multilayer perceptron with ReLU hidden layers and a softmax cross-entropy output, on the device.
class mlp_cuda {
 public:
  /// widths = {inputs, hidden..., classes}; the weights are mlp(widths, seed)'s (He-uniform from the
  /// same generator, biases zero), uploaded on `s`; `max_batch` sizes the activations.
  mlp_cuda(std::vector<std::size_t> widths, std::uint64_t seed, std::size_t max_batch, cudaStream_t s)
      : widths_(std::move(widths)), max_batch_(max_batch) {
    if (widths_.size() < 2) throw std::invalid_argument("mlp_cuda: needs at least an input and an output width");
    std::size_t total = 0;
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
      weight_at_.push_back(total);
      total += widths_[l] * widths_[l + 1];
      bias_at_.push_back(total);
      total += widths_[l + 1];
    }
    std::vector<float> host(total, 0.0f);
    std::mt19937_64 rng(seed);
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
      const float bound = std::sqrt(6.0f / static_cast<float>(widths_[l]));
      std::uniform_real_distribution<float> dist(-bound, bound);
      for (std::size_t i = 0; i < widths_[l] * widths_[l + 1]; ++i) host[weight_at_[l] + i] = dist(rng);
    }
    parameters_ = cuda::device_buffer<float>(total);
    gradients_ = cuda::device_buffer<float>(total);
    cuda::copy_async(parameters_.span(), std::span<const float>(host), s);
    cuda::synchronize(s, std::chrono::seconds(60), "mlp_cuda: upload of the initial weights");
    for (std::size_t l = 1; l < widths_.size(); ++l) activations_.emplace_back(max_batch_ * widths_[l]);
    std::size_t widest = 0;
    for (std::size_t w : widths_) widest = std::max(widest, w);
    delta_ = cuda::device_buffer<float>(max_batch_ * widest);
  }

  /// Number of dense layers.
  [[nodiscard]] std::size_t layers() const noexcept { return weight_at_.size(); }
  /// All parameters, [W_1, b_1, W_2, b_2, ...].
  [[nodiscard]] cuda::device_span<float> parameters() const noexcept { return parameters_.span(); }
  /// All gradients of the last train_step(), in the parameters' layout.
  [[nodiscard]] cuda::device_span<float> gradients() const noexcept { return gradients_.span(); }
  /// Layer l's weights (in x out, row-major) and biases, views into parameters().
  [[nodiscard]] cuda::device_span<float> weight(std::size_t l) const {
    return parameters_.span().subspan(weight_at_[l], widths_[l] * widths_[l + 1]);
  }
  [[nodiscard]] cuda::device_span<float> bias(std::size_t l) const {
    return parameters_.span().subspan(bias_at_[l], widths_[l + 1]);
  }
  /// Layer l's weight and bias gradients, views into gradients().
  [[nodiscard]] cuda::device_span<float> weight_grad(std::size_t l) const {
    return gradients_.span().subspan(weight_at_[l], widths_[l] * widths_[l + 1]);
  }
  [[nodiscard]] cuda::device_span<float> bias_grad(std::size_t l) const {
    return gradients_.span().subspan(bias_at_[l], widths_[l + 1]);
  }

  /// Forward pass of `batch` examples (x: batch * inputs, labels: batch) without gradients; adds the
  /// loss and the correct count to *sums (device memory).
  void evaluate(cuda::device_span<const float> x, cuda::device_span<const std::uint8_t> labels, std::size_t batch,
                cuda::score_sums* sums, cudaStream_t s) {
    forward(x, batch, s);
    cuda::softmax_cross_entropy(logits(batch), labels, batch, widths_.back(), 0.0f, sums, s);
  }

  /// Called during the backward pass with a layer whose gradients are queued on the stream (last
  /// layer first): where a data-parallel step starts that layer's reduction.
  using layer_done = std::function<void(std::size_t layer)>;

  /// Forward and backward pass of one batch: the gradients hold the batch mean; adds the batch's loss
  /// and accuracy (before the update) to *sums.
  void train_step(cuda::device_span<const float> x, cuda::device_span<const std::uint8_t> labels, std::size_t batch,
                  cuda::score_sums* sums, cudaStream_t s, const layer_done& done = {}) {
    forward(x, batch, s);
    cuda::softmax_cross_entropy(logits(batch), labels, batch, widths_.back(), 1.0f / static_cast<float>(batch), sums,
                                s);
    backward(x, batch, s, done);
  }

 private:
  [[nodiscard]] cuda::device_span<float> activation(std::size_t l, std::size_t batch) const {
    return activations_[l].span().first(batch * widths_[l + 1]);
  }
  [[nodiscard]] cuda::device_span<float> logits(std::size_t batch) const { return activation(layers() - 1, batch); }

  void forward(cuda::device_span<const float> x, std::size_t batch, cudaStream_t s) {
    if (batch > max_batch_ || x.size() != batch * widths_.front())
      throw std::invalid_argument("mlp_cuda: the input is not batch * inputs, or batch exceeds max_batch");
    for (std::size_t l = 0; l < layers(); ++l) {
      const std::size_t in = widths_[l], out = widths_[l + 1];
      const cuda::device_span<float> z = activation(l, batch);
      const cuda::device_span<const float> a = l == 0 ? x : cuda::device_span<const float>(activation(l - 1, batch));
      cuda::fill_rows(z, cuda::device_span<const float>(bias(l)), batch, out, s);
      blas_.gemm(cuda::transpose::no, cuda::transpose::no, batch, out, in, 1.0f, a,
                 cuda::device_span<const float>(weight(l)), 1.0f, z, s);
      if (l + 1 < layers()) cuda::relu(z, s);
    }
  }

  void backward(cuda::device_span<const float> x, std::size_t batch, cudaStream_t s, const layer_done& done) {
    for (std::size_t l = layers(); l-- > 0;) {
      const std::size_t in = widths_[l], out = widths_[l + 1];
      const cuda::device_span<const float> dz(activation(l, batch));
      const cuda::device_span<const float> a = l == 0 ? x : cuda::device_span<const float>(activation(l - 1, batch));
      blas_.gemm(cuda::transpose::yes, cuda::transpose::no, in, out, batch, 1.0f, a, dz, 0.0f, weight_grad(l), s);
      blas_.column_sums(batch, out, dz, bias_grad(l), s);
      if (done) done(l);
      if (l == 0) break;
      const cuda::device_span<float> delta = delta_.span().first(batch * in);
      blas_.gemm(cuda::transpose::no, cuda::transpose::yes, batch, in, out, 1.0f, dz,
                 cuda::device_span<const float>(weight(l)), 0.0f, delta, s);
      const cuda::device_span<float> prev = activation(l - 1, batch);
      cuda::relu_backward(cuda::device_span<const float>(delta), cuda::device_span<const float>(prev), prev, s);
    }
  }

  std::vector<std::size_t> widths_;
  std::size_t max_batch_;
  std::vector<std::size_t> weight_at_, bias_at_;
  cuda::device_buffer<float> parameters_, gradients_, delta_;
  std::vector<cuda::device_buffer<float>> activations_;  // per layer: Z/A in forward, dZ in backward
  cuda::blas blas_;
};

}  // namespace flexpar::samples
