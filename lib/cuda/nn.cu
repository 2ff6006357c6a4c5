// lib/cuda/nn.cu — flexpar/cuda/nn.hpp: the small kernels of a dense network (grid-stride loops, one
// warp per row for the softmax).
#include <flexpar/cuda/kernel_math.hpp>
#include <flexpar/cuda/nn.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

#include "launch.cuh"

namespace flexpar::cuda {
namespace detail {
namespace {

__global__ void fill_rows_kernel(float* z, const float* row, std::size_t rows, std::size_t cols) {
  const std::size_t total = rows * cols;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    z[i] = row[i % cols];
}

// One block per row; bytes copied four at a time where both rows are 4-byte aligned.
__global__ void gather_rows_kernel(std::byte* dst, const std::byte* src, std::size_t row_bytes,
                                   const std::uint32_t* indices, std::size_t rows) {
  for (std::size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::byte* from = src + static_cast<std::size_t>(indices[r]) * row_bytes;
    std::byte* to = dst + r * row_bytes;
    if (row_bytes % 4 == 0 && reinterpret_cast<std::uintptr_t>(from) % 4 == 0 &&
        reinterpret_cast<std::uintptr_t>(to) % 4 == 0) {
      for (std::size_t i = threadIdx.x; i < row_bytes / 4; i += blockDim.x)
        reinterpret_cast<std::uint32_t*>(to)[i] = reinterpret_cast<const std::uint32_t*>(from)[i];
    } else {
      for (std::size_t i = threadIdx.x; i < row_bytes; i += blockDim.x) to[i] = from[i];
    }
  }
}

__global__ void relu_kernel(float* z, std::size_t n) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    z[i] = z[i] > 0.0f ? z[i] : 0.0f;
}

__global__ void relu_backward_kernel(const float* da, const float* a, float* dz, std::size_t n) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dz[i] = a[i] > 0.0f ? da[i] : 0.0f;
}

// One warp per row: the maximum and its first index, the sum of exp(x - max) in double, then the
// loss and (with a scale) the gradient written over the row.
__global__ void softmax_xent_kernel(float* logits, const std::uint8_t* labels, std::size_t rows, std::size_t classes,
                                    float scale, score_sums* sums) {
  const unsigned lane = threadIdx.x % 32;
  const std::size_t warps = static_cast<std::size_t>(gridDim.x) * (blockDim.x / 32);
  for (std::size_t r = (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    float* row = logits + r * classes;
    float top = -INFINITY;
    std::size_t arg = classes;
    for (std::size_t c = lane; c < classes; c += 32)
      if (row[c] > top) top = row[c], arg = c;  // first maximum of my lane's columns
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, top, offset);
      const auto other_arg =
          static_cast<std::size_t>(__shfl_xor_sync(0xffffffffu, static_cast<unsigned long long>(arg), offset));
      if (other > top || (other == top && other_arg < arg)) top = other, arg = other_arg;
    }
    double total = 0;
    for (std::size_t c = lane; c < classes; c += 32) total += exp(static_cast<double>(row[c] - top));
    total = warp_sum(total);
    const double log_total = log(total);
    const std::uint8_t label = labels[r];
    if (lane == 0) {
      atomicAdd(&sums->loss, log_total - static_cast<double>(row[label] - top));
      if (arg == label) atomicAdd(&sums->correct, 1ull);
    }
    __syncwarp();
    if (scale != 0.0f)
      for (std::size_t c = lane; c < classes; c += 32) {
        const auto p = static_cast<float>(exp(static_cast<double>(row[c] - top) - log_total));
        row[c] = math::mul_rn(math::sub_rn(p, c == label ? 1.0f : 0.0f), scale);
      }
  }
}

__global__ void sgd_momentum_kernel(float* weight, float* buffer, const float* gradient, std::size_t n, float lr,
                                    float mu, float factor) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float g = factor == 1.0f ? gradient[i] : math::mul_rn(gradient[i], factor);
    if (mu != 0.0f) {
      g = math::add_rn(math::mul_rn(mu, buffer[i]), g);
      buffer[i] = g;
    }
    weight[i] = math::sub_rn(weight[i], math::mul_rn(lr, g));
  }
}

template <class Kernel>
unsigned grid_of(Kernel kernel, std::size_t work) {
  return grid_for(work, static_cast<std::size_t>(block_threads), blocks_per_sm(kernel, block_threads));
}

void check_length(const char* op, const char* what, std::size_t have, std::size_t need) {
  if (have == need) return;
  throw usage_error(std::string("cuda::") + op + ": " + what + " holds " + std::to_string(have) +
                    " elements; it needs " + std::to_string(need));
}

}  // namespace
}  // namespace detail

void fill_rows(device_span<float> z, device_span<const float> row, std::size_t rows, std::size_t cols, cudaStream_t s) {
  detail::check_length("fill_rows", "z", z.size(), rows * cols);
  detail::check_length("fill_rows", "row", row.size(), cols);
  if (z.empty()) return;
  detail::fill_rows_kernel<<<detail::grid_of(&detail::fill_rows_kernel, z.size()), detail::block_threads, 0, s>>>(
      z.data(), row.data(), rows, cols);
  detail::check_launch("fill_rows_kernel<<<...>>>");
}

void gather_rows(device_span<std::byte> dst, device_span<const std::byte> src, std::size_t row_bytes,
                 device_span<const std::uint32_t> indices, cudaStream_t s) {
  detail::check_length("gather_rows", "dst (bytes)", dst.size(), indices.size() * row_bytes);
  if (indices.empty() || row_bytes == 0) return;
  const auto grid = static_cast<unsigned>(std::min<std::size_t>(indices.size(), 65535));
  detail::gather_rows_kernel<<<grid, detail::block_threads, 0, s>>>(dst.data(), src.data(), row_bytes, indices.data(),
                                                                    indices.size());
  detail::check_launch("gather_rows_kernel<<<...>>>");
}

void relu(device_span<float> z, cudaStream_t s) {
  if (z.empty()) return;
  detail::relu_kernel<<<detail::grid_of(&detail::relu_kernel, z.size()), detail::block_threads, 0, s>>>(z.data(),
                                                                                                        z.size());
  detail::check_launch("relu_kernel<<<...>>>");
}

void relu_backward(device_span<const float> da, device_span<const float> a, device_span<float> dz, cudaStream_t s) {
  detail::check_length("relu_backward", "a", a.size(), da.size());
  detail::check_length("relu_backward", "dz", dz.size(), da.size());
  if (da.empty()) return;
  detail::
      relu_backward_kernel<<<detail::grid_of(&detail::relu_backward_kernel, da.size()), detail::block_threads, 0, s>>>(
          da.data(), a.data(), dz.data(), da.size());
  detail::check_launch("relu_backward_kernel<<<...>>>");
}

void softmax_cross_entropy(device_span<float> logits, device_span<const std::uint8_t> labels, std::size_t rows,
                           std::size_t classes, float gradient_scale, score_sums* sums, cudaStream_t s) {
  detail::check_length("softmax_cross_entropy", "logits", logits.size(), rows * classes);
  detail::check_length("softmax_cross_entropy", "labels", labels.size(), rows);
  if (classes == 0 || classes > 1024)
    throw usage_error("cuda::softmax_cross_entropy: " + std::to_string(classes) + " classes; 1 to 1024 are supported");
  if (rows == 0) return;
  const std::size_t threads = rows * 32;
  detail::softmax_xent_kernel<<<detail::grid_of(&detail::softmax_xent_kernel, threads), detail::block_threads, 0, s>>>(
      logits.data(), labels.data(), rows, classes, gradient_scale, sums);
  detail::check_launch("softmax_xent_kernel<<<...>>>");
}

void reset(score_sums* sums, cudaStream_t s) { FLEXPAR_CHECK_CUDA(-1, cudaMemsetAsync(sums, 0, sizeof *sums, s)); }

void sgd_momentum(device_span<float> weight, device_span<float> buffer, device_span<const float> gradient,
                  float learning_rate, float momentum, float factor, cudaStream_t s) {
  detail::check_length("sgd_momentum", "gradient", gradient.size(), weight.size());
  if (momentum != 0.0f) detail::check_length("sgd_momentum", "buffer", buffer.size(), weight.size());
  if (weight.empty()) return;
  detail::sgd_momentum_kernel<<<detail::grid_of(&detail::sgd_momentum_kernel, weight.size()), detail::block_threads, 0,
                                s>>>(weight.data(), buffer.data(), gradient.data(), weight.size(), learning_rate,
                                     momentum, factor);
  detail::check_launch("sgd_momentum_kernel<<<...>>>");
}

}  // namespace flexpar::cuda
