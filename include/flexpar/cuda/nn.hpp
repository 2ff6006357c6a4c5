// flexpar/cuda/nn.hpp — the small kernels of a dense network on the GPU, around cuBLAS's GEMMs: bias
// rows, ReLU and its backward mask, softmax cross-entropy with its gradient, and SGD with momentum.
//
// Part of flexpar::cuda. Every function only enqueues work on the stream it is given. Each is the
// device twin of a host computation of flexpar's and says how close the two are:
//
// | kernel                      | host twin                                     | how close          |
// |-----------------------------|-----------------------------------------------|--------------------|
// | fill_rows, relu, relu_backward, gather_rows | the loops of samples/support/mlp.hpp | exact     |
// | softmax_cross_entropy       | mlp::score (samples/support/mlp.hpp)          | float rounding (exp, log) |
// | sgd_momentum                | relax::sgd on factor * g                      | bit for bit        |
// | max_pool, max_pool_backward | the search executor's pooling (lib/search)    | exact              |
//
//   flexpar::cuda::fill_rows(z, bias, batch, out, s);       // Z = 1 b^T, then Z += A W by cuBLAS
//   flexpar::cuda::relu(z, s);
//   flexpar::cuda::softmax_cross_entropy(logits, labels, batch, classes, 1.0f / batch, score, s);
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include <flexpar/cuda/runtime.hpp>

namespace flexpar::cuda {

/// z[i, j] = row[j] for the `rows` rows of z [rows x cols] (row-major).
/// @throws usage_error when z is not rows * cols or row is not cols elements.
void fill_rows(device_span<float> z, device_span<const float> row, std::size_t rows, std::size_t cols, cudaStream_t s);

/// Row i of dst = row indices[i] of src, for rows of `row_bytes` bytes (a shuffled batch gathered
/// out of a data set that stays on the device).
/// @throws usage_error when dst is not indices.size() rows.
void gather_rows(device_span<std::byte> dst, device_span<const std::byte> src, std::size_t row_bytes,
                 device_span<const std::uint32_t> indices, cudaStream_t s);

/// z = max(z, 0), in place.
void relu(device_span<float> z, cudaStream_t s);

/// dz[i] = a[i] > 0 ? da[i] : 0 (the gradient through a ReLU whose output was `a`); dz may be da.
/// @throws usage_error unless the three spans have one length.
void relu_backward(device_span<const float> da, device_span<const float> a, device_span<float> dz, cudaStream_t s);

/// Where softmax_cross_entropy adds up its batch (device memory; zero it with reset()).
struct score_sums {
  double loss = 0;                 ///< sum over rows of -log p(label)
  unsigned long long correct = 0;  ///< rows whose arg-max class is the label (the first maximum)
};

/// Per row of logits [rows x classes]: p = softmax(row) (max-subtracted, in double), adds -log p[label]
/// to sums->loss and 1 to sums->correct when the first arg-max is the label; with `gradient_scale`
/// nonzero the row becomes (p - onehot(label)) * gradient_scale (dZ of the mean loss for 1/batch),
/// otherwise it is left as the logits. One warp per row.
/// @pre classes <= 1024; labels hold `rows` values below `classes`; sums points to device memory.
void softmax_cross_entropy(device_span<float> logits, device_span<const std::uint8_t> labels, std::size_t rows,
                           std::size_t classes, float gradient_scale, score_sums* sums, cudaStream_t s);

/// Sets *sums to zero on `s`.
void reset(score_sums* sums, cudaStream_t s);

/// The geometry of a k x k max pooling with stride `stride` over `planes` planes [height, width]:
/// outputs [planes, (height - window) / stride + 1, (width - window) / stride + 1].
struct pool_geometry {
  std::size_t planes = 0;  ///< batch x channels
  std::size_t height = 0;  ///< input rows per plane
  std::size_t width = 0;   ///< input columns per plane
  std::size_t window = 1;  ///< k (a k x k window)
  std::size_t stride = 1;  ///< between windows, both directions

  /// Output rows per plane (0 when the window does not fit).
  [[nodiscard]] std::size_t out_height() const noexcept { return height < window ? 0 : (height - window) / stride + 1; }
  /// Output columns per plane (0 when the window does not fit).
  [[nodiscard]] std::size_t out_width() const noexcept { return width < window ? 0 : (width - window) / stride + 1; }
};

/// y = the maximum of each window of x, the first in row-major scan order on ties (the one whose
/// position max_pool_backward credits). @throws usage_error when a span's length is not the geometry's
/// or the window or stride is 0.
void max_pool(const pool_geometry& g, device_span<const float> x, device_span<float> y, cudaStream_t s);

/// The input gradient of max_pool: dx[i] = the sum, over the outputs whose window's first maximum is
/// input i, of their dy, added in output order from zero (as the host executor's loop, so the two are
/// bit-identical where windows overlap). dx is overwritten. @throws usage_error as max_pool.
void max_pool_backward(const pool_geometry& g, device_span<const float> x, device_span<const float> dy,
                       device_span<float> dx, cudaStream_t s);

/// SGD with momentum on every element: g = factor * gradient (+ weight_decay * weight);
/// buffer = momentum * buffer + g; weight -= learning_rate * buffer (momentum 0: weight -=
/// learning_rate * g, buffer untouched). Each product and sum rounded on its own (no fused
/// multiply-add), so the weights are bit-identical to relax::sgd's applied to factor * gradient.
/// @throws usage_error unless the spans have one length (buffer may be empty when momentum is 0).
void sgd_momentum(device_span<float> weight, device_span<float> buffer, device_span<const float> gradient,
                  float learning_rate, float momentum, float factor, cudaStream_t s, float weight_decay = 0.0f);

}  // namespace flexpar::cuda
