// samples/support/mlp.hpp — a small fully connected classifier (ReLU hidden layers, softmax
// cross-entropy) whose forward and backward passes are single-precision GEMMs through CBLAS.
//
// Header-only, for the samples (link BLAS::BLAS). Layout: activations are row-major [batch x width];
// layer l has weight W_l [in x out] (row-major) and bias b_l [out]:
//
//   forward   Z_l = A_{l-1} W_l + 1 b_l^T          (cblas_sgemm, A_0 = the input batch)
//             A_l = relu(Z_l)  (l < last),   P = softmax(Z_last)
//   loss      L = -(1/B) sum_i log P[i, y_i]
//   backward  dZ_last = (P - onehot(y)) / B
//             dW_l = A_{l-1}^T dZ_l,   db_l = 1^T dZ_l,   dA_{l-1} = dZ_l W_l^T,   dZ_{l-1} = dA_{l-1} * [Z_{l-1} > 0]
//
// The gradient is the mean over the local batch; a data-parallel run averages it over ranks.
//
// Where the passes find the parameters and put the gradients is a parameter_source: the mlp's own
// vectors by default; a sharded model (samples/fashion_mnist_zero.cpp) gathers each layer's just in
// time, and reduces each layer's gradients as soon as backward has made them.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace flexpar::samples {

/// Loss and accuracy over some examples.
struct batch_result {
  double loss_sum = 0;       ///< sum over examples of -log p(label)
  std::size_t correct = 0;   ///< examples whose arg-max class is the label
  std::size_t examples = 0;  ///< how many examples
};

/// Where forward and backward read layer l's parameters and write its gradients.
class parameter_source {
 public:
  virtual ~parameter_source() = default;
  /// Layer l's weights [in x out] and biases, valid until done(l).
  virtual std::span<const float> weight(std::size_t l) = 0;
  virtual std::span<const float> bias(std::size_t l) = 0;
  /// The pass no longer reads layer l's parameters.
  virtual void done(std::size_t l) { (void)l; }
  /// The buffers backward writes layer l's gradients into (overwriting them).
  virtual std::span<float> weight_grad(std::size_t l) = 0;
  virtual std::span<float> bias_grad(std::size_t l) = 0;
  /// Layer l's gradients are final for this pass.
  virtual void gradients_ready(std::size_t l) { (void)l; }
};

/// A multilayer perceptron with ReLU hidden layers and a softmax cross-entropy output.
class mlp {
 public:
  /// widths = {inputs, hidden..., classes}; weights drawn from `seed` (the same seed gives the same
  /// weights on every rank and every run): He-uniform U(-sqrt(6/in), sqrt(6/in)), biases zero.
  mlp(std::vector<std::size_t> widths, std::uint64_t seed) : widths_(std::move(widths)) {
    if (widths_.size() < 2) throw std::invalid_argument("mlp: needs at least an input and an output width");
    std::mt19937_64 rng(seed);
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
      const std::size_t in = widths_[l], out = widths_[l + 1];
      weight_.emplace_back(in * out);
      bias_.emplace_back(out, 0.0f);
      weight_grad_.emplace_back(in * out, 0.0f);
      bias_grad_.emplace_back(out, 0.0f);
      const float bound = std::sqrt(6.0f / static_cast<float>(in));
      std::uniform_real_distribution<float> dist(-bound, bound);
      for (float& w : weight_.back()) w = dist(rng);
    }
  }

  mlp(const mlp&) = delete;  ///< the passes' default source refers to this object
  mlp& operator=(const mlp&) = delete;

  /// Number of dense layers.
  [[nodiscard]] std::size_t layers() const noexcept { return widths_.size() - 1; }
  /// {inputs, hidden..., classes}: layer l is widths()[l] x widths()[l + 1].
  [[nodiscard]] const std::vector<std::size_t>& widths() const noexcept { return widths_; }
  /// Input width (784 for Fashion-MNIST).
  [[nodiscard]] std::size_t inputs() const noexcept { return widths_.front(); }
  /// Output width (number of classes).
  [[nodiscard]] std::size_t classes() const noexcept { return widths_.back(); }
  /// Weights of layer l, [in x out] row-major.
  [[nodiscard]] std::span<float> weight(std::size_t l) { return weight_.at(l); }
  /// Biases of layer l.
  [[nodiscard]] std::span<float> bias(std::size_t l) { return bias_.at(l); }
  /// Gradient of the weights of layer l from the last backward().
  [[nodiscard]] std::span<float> weight_grad(std::size_t l) { return weight_grad_.at(l); }
  /// Gradient of the biases of layer l from the last backward().
  [[nodiscard]] std::span<float> bias_grad(std::size_t l) { return bias_grad_.at(l); }
  /// Total number of trainable values.
  [[nodiscard]] std::size_t parameter_count() const noexcept {
    std::size_t n = 0;
    for (std::size_t l = 0; l < layers(); ++l) n += (widths_[l] + 1) * widths_[l + 1];
    return n;
  }

  /// Forward pass of `batch` examples (`x` holds batch * inputs() values) without gradients; adds
  /// to `result`. Parameters from `src` (default: this mlp's own).
  void evaluate(std::span<const float> x, std::span<const std::uint8_t> labels, std::size_t batch, batch_result& result,
                parameter_source* src = nullptr) {
    forward(x, batch, src ? *src : own_);
    score(labels, batch, result, /*gradient=*/false);
  }

  /// Forward and backward pass of one batch: fills every gradient with the batch mean, and adds
  /// the batch's loss and accuracy (before the update) to `result`. Parameters from and gradients
  /// to `src` (default: this mlp's own).
  void train_step(std::span<const float> x, std::span<const std::uint8_t> labels, std::size_t batch,
                  batch_result& result, parameter_source* src = nullptr) {
    forward(x, batch, src ? *src : own_);
    score(labels, batch, result, /*gradient=*/true);
    backward(x, batch, src ? *src : own_);
  }

  /// Frees the mlp's own parameters and gradients (a sharded model holds them instead); the passes
  /// then need a parameter_source.
  void drop_parameters() {
    weight_ = {};
    bias_ = {};
    weight_grad_ = {};
    bias_grad_ = {};
  }

 private:
  /// The mlp's own vectors as a parameter_source.
  class own_parameters final : public parameter_source {
   public:
    explicit own_parameters(mlp& m) : m_(m) {}
    std::span<const float> weight(std::size_t l) override { return m_.weight_.at(l); }
    std::span<const float> bias(std::size_t l) override { return m_.bias_.at(l); }
    std::span<float> weight_grad(std::size_t l) override { return m_.weight_grad_.at(l); }
    std::span<float> bias_grad(std::size_t l) override { return m_.bias_grad_.at(l); }

   private:
    mlp& m_;
  };

  void forward(std::span<const float> x, std::size_t batch, parameter_source& src) {
    if (x.size() != batch * inputs()) throw std::invalid_argument("mlp: input size is not batch * inputs");
    activation_.resize(layers());
    for (std::size_t l = 0; l < layers(); ++l) {
      const std::size_t in = widths_[l], out = widths_[l + 1];
      std::vector<float>& z = activation_[l];
      z.resize(batch * out);
      const std::span<const float> w = src.weight(l), b = src.bias(l);
      for (std::size_t i = 0; i < batch; ++i)
        std::copy(b.begin(), b.end(), z.begin() + static_cast<std::ptrdiff_t>(i * out));
      const float* a = l == 0 ? x.data() : activation_[l - 1].data();
      // Z = A W + Z (Z preloaded with the bias rows)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(batch), static_cast<int>(out),
                  static_cast<int>(in), 1.0f, a, static_cast<int>(in), w.data(), static_cast<int>(out), 1.0f, z.data(),
                  static_cast<int>(out));
      src.done(l);
      if (l + 1 < layers())
        for (float& v : z) v = std::max(v, 0.0f);  // relu in place: A_l (Z_l > 0 iff A_l > 0)
    }
  }

  /// Softmax of the logits in place (they become probabilities), loss/accuracy; with `gradient`,
  /// the logits' buffer becomes dZ_last = (P - onehot) / batch.
  void score(std::span<const std::uint8_t> labels, std::size_t batch, batch_result& result, bool gradient) {
    if (labels.size() != batch) throw std::invalid_argument("mlp: label count is not batch");
    std::vector<float>& z = activation_.back();
    const std::size_t k = classes();
    for (std::size_t i = 0; i < batch; ++i) {
      float* row = z.data() + i * k;
      const float top = *std::max_element(row, row + k);
      const auto arg = static_cast<std::size_t>(std::max_element(row, row + k) - row);
      double total = 0;
      for (std::size_t c = 0; c < k; ++c) total += std::exp(static_cast<double>(row[c] - top));
      const double log_total = std::log(total);
      result.loss_sum += log_total - static_cast<double>(row[labels[i]] - top);
      result.correct += arg == labels[i] ? 1 : 0;
      if (gradient) {
        const float inv_batch = 1.0f / static_cast<float>(batch);
        for (std::size_t c = 0; c < k; ++c) {
          const auto p = static_cast<float>(std::exp(static_cast<double>(row[c] - top) - log_total));
          row[c] = (p - (c == labels[i] ? 1.0f : 0.0f)) * inv_batch;
        }
      }
    }
    result.examples += batch;
  }

  void backward(std::span<const float> x, std::size_t batch, parameter_source& src) {
    delta_.resize(batch * *std::max_element(widths_.begin(), widths_.end()));
    for (std::size_t l = layers(); l-- > 0;) {
      const std::size_t in = widths_[l], out = widths_[l + 1];
      const float* dz = activation_[l].data();  // dZ_l, computed in place of Z_l
      const float* a = l == 0 ? x.data() : activation_[l - 1].data();
      const std::span<float> dw = src.weight_grad(l), db = src.bias_grad(l);
      // dW = A^T dZ
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(in), static_cast<int>(out),
                  static_cast<int>(batch), 1.0f, a, static_cast<int>(in), dz, static_cast<int>(out), 0.0f, dw.data(),
                  static_cast<int>(out));
      // db = column sums of dZ
      std::fill(db.begin(), db.end(), 0.0f);
      for (std::size_t i = 0; i < batch; ++i)
        for (std::size_t c = 0; c < out; ++c) db[c] += dz[i * out + c];
      src.gradients_ready(l);
      if (l == 0) break;
      // dA_{l-1} = dZ W^T, then dZ_{l-1} = dA_{l-1} where A_{l-1} > 0, written over A_{l-1}
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(batch), static_cast<int>(in),
                  static_cast<int>(out), 1.0f, dz, static_cast<int>(out), src.weight(l).data(), static_cast<int>(out),
                  0.0f, delta_.data(), static_cast<int>(in));
      src.done(l);
      std::vector<float>& prev = activation_[l - 1];
      for (std::size_t i = 0; i < batch * in; ++i) prev[i] = prev[i] > 0.0f ? delta_[i] : 0.0f;
    }
  }

  std::vector<std::size_t> widths_;
  std::vector<std::vector<float>> weight_, bias_, weight_grad_, bias_grad_;
  std::vector<std::vector<float>> activation_;  // per layer: Z/A in forward, dZ in backward
  std::vector<float> delta_;
  own_parameters own_{*this};
};

}  // namespace flexpar::samples
