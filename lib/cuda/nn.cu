// lib/cuda/nn.cu — flexpar/cuda/nn.hpp: the small kernels of a dense network. The element-wise ones
// are cub::DeviceFor::Bulk over their indices (launch.cuh: for_each_index); the softmax takes one warp
// per row with cub::WarpReduce for its arg-max and its sum; the row gather one block per row.
#include <flexpar/cuda/kernel_math.hpp>
#include <flexpar/cuda/nn.hpp>

#include <algorithm>
#include <cstdint>
#include <string>

#include "launch.cuh"

namespace flexpar::cuda {
namespace detail {
namespace {

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
    // the first maximum of the row: cub::ArgMax keeps the larger value, and the smaller column on a tie
    const auto best = warp_reduce(cub::KeyValuePair<int, float>(static_cast<int>(arg), top), cub::ArgMax{});
    top = best.value;
    arg = static_cast<std::size_t>(best.key);
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

template <class Kernel>
unsigned grid_of(Kernel kernel, std::size_t work) {
  return grid_for(work, static_cast<std::size_t>(block_threads), blocks_per_sm(kernel, block_threads));
}

void check_length(const char* op, const char* what, std::size_t have, std::size_t need) {
  if (have == need) return;
  throw error_on<usage_error>(no_rank, std::string("cuda::").append(op), what, " holds ", have, " elements; it needs ",
                              need);
}

}  // namespace
}  // namespace detail

void fill_rows(device_span<float> z, device_span<const float> row, std::size_t rows, std::size_t cols, cudaStream_t s) {
  detail::check_length("fill_rows", "z", z.size(), rows * cols);
  detail::check_length("fill_rows", "row", row.size(), cols);
  detail::for_each_index(
      z.size(), [z = z.data(), row = row.data(), cols] __device__(std::size_t i) { z[i] = row[i % cols]; }, s,
      "cuda::fill_rows");
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
  detail::for_each_index(
      z.size(), [z = z.data()] __device__(std::size_t i) { z[i] = z[i] > 0.0f ? z[i] : 0.0f; }, s, "cuda::relu");
}

void relu_backward(device_span<const float> da, device_span<const float> a, device_span<float> dz, cudaStream_t s) {
  detail::check_length("relu_backward", "a", a.size(), da.size());
  detail::check_length("relu_backward", "dz", dz.size(), da.size());
  detail::for_each_index(
      da.size(),
      [da = da.data(), a = a.data(), dz = dz.data()] __device__(std::size_t i) { dz[i] = a[i] > 0.0f ? da[i] : 0.0f; },
      s, "cuda::relu_backward");
}

namespace detail {
namespace {
/// The input index (within its plane) of the first maximum of output (i, j)'s window.
__device__ inline std::size_t pool_argmax(const pool_geometry& g, const float* plane, std::size_t i, std::size_t j) {
  std::size_t best = i * g.stride * g.width + j * g.stride;
  for (std::size_t r = 0; r < g.window; ++r)
    for (std::size_t c = 0; c < g.window; ++c) {
      const std::size_t at = (i * g.stride + r) * g.width + j * g.stride + c;
      if (plane[at] > plane[best]) best = at;
    }
  return best;
}

void check_pool(const char* op, const pool_geometry& g, std::size_t x, std::size_t y) {
  if (g.window == 0 || g.stride == 0)
    throw error_on<usage_error>(no_rank, std::string("cuda::").append(op),
                                "a window and a stride of at least 1 are needed");
  check_length(op, "x", x, g.planes * g.height * g.width);
  check_length(op, "y", y, g.planes * g.out_height() * g.out_width());
}
}  // namespace
}  // namespace detail

void max_pool(const pool_geometry& g, device_span<const float> x, device_span<float> y, cudaStream_t s) {
  detail::check_pool("max_pool", g, x.size(), y.size());
  const std::size_t ph = g.out_height(), pw = g.out_width();
  detail::for_each_index(
      y.size(),
      [g, ph, pw, x = x.data(), y = y.data()] __device__(std::size_t k) {
        const std::size_t p = k / (ph * pw), i = k / pw % ph, j = k % pw;
        const float* plane = x + p * g.height * g.width;
        y[k] = plane[detail::pool_argmax(g, plane, i, j)];
      },
      s, "cuda::max_pool");
}

void max_pool_backward(const pool_geometry& g, device_span<const float> x, device_span<const float> dy,
                       device_span<float> dx, cudaStream_t s) {
  detail::check_pool("max_pool_backward", g, x.size(), dy.size());
  detail::check_length("max_pool_backward", "dx", dx.size(), x.size());
  const std::size_t ph = g.out_height(), pw = g.out_width();
  detail::for_each_index(
      dx.size(),
      [g, ph, pw, x = x.data(), dy = dy.data(), dx = dx.data()] __device__(std::size_t e) {
        const std::size_t plane_size = g.height * g.width, p = e / plane_size, at = e % plane_size;
        const std::size_t r = at / g.width, c = at % g.width;
        // the outputs whose window holds (r, c): i * stride <= r < i * stride + window, i < ph
        const std::size_t i0 = r + 1 > g.window ? (r + 1 - g.window + g.stride - 1) / g.stride : 0;
        const std::size_t j0 = c + 1 > g.window ? (c + 1 - g.window + g.stride - 1) / g.stride : 0;
        const float* plane = x + p * plane_size;
        float sum = 0.0f;
        for (std::size_t i = i0; i < ph && i * g.stride <= r; ++i)
          for (std::size_t j = j0; j < pw && j * g.stride <= c; ++j)
            if (detail::pool_argmax(g, plane, i, j) == at) sum += dy[(p * ph + i) * pw + j];
        dx[e] = sum;
      },
      s, "cuda::max_pool_backward");
}

void softmax_cross_entropy(device_span<float> logits, device_span<const std::uint8_t> labels, std::size_t rows,
                           std::size_t classes, float gradient_scale, score_sums* sums, cudaStream_t s) {
  detail::check_length("softmax_cross_entropy", "logits", logits.size(), rows * classes);
  detail::check_length("softmax_cross_entropy", "labels", labels.size(), rows);
  if (classes == 0 || classes > 1024)
    throw error_on<usage_error>(no_rank, "cuda::softmax_cross_entropy", classes, " classes; 1 to 1024 are supported");
  if (rows == 0) return;
  const std::size_t threads = rows * 32;
  detail::softmax_xent_kernel<<<detail::grid_of(&detail::softmax_xent_kernel, threads), detail::block_threads, 0, s>>>(
      logits.data(), labels.data(), rows, classes, gradient_scale, sums);
  detail::check_launch("softmax_xent_kernel<<<...>>>");
}

void reset(score_sums* sums, cudaStream_t s) { FLEXPAR_CHECK_CUDA(-1, cudaMemsetAsync(sums, 0, sizeof *sums, s)); }

void sgd_momentum(device_span<float> weight, device_span<float> buffer, device_span<const float> gradient,
                  float learning_rate, float momentum, float factor, cudaStream_t s, float weight_decay) {
  detail::check_length("sgd_momentum", "gradient", gradient.size(), weight.size());
  if (momentum != 0.0f) detail::check_length("sgd_momentum", "buffer", buffer.size(), weight.size());
  // relax::sgd's rule on factor * g, each product and sum rounded on its own (kernel_math.hpp)
  detail::for_each_index(
      weight.size(),
      [w = weight.data(), buf = buffer.data(), g0 = gradient.data(), lr = learning_rate, mu = momentum, factor,
       wd = weight_decay] __device__(std::size_t i) {
        float g = factor == 1.0f ? g0[i] : math::mul_rn(g0[i], factor);
        if (wd != 0.0f) g = math::add_rn(g, math::mul_rn(wd, w[i]));
        if (mu != 0.0f) {
          g = math::add_rn(math::mul_rn(mu, buf[i]), g);
          buf[i] = g;
        }
        w[i] = math::sub_rn(w[i], math::mul_rn(lr, g));
      },
      s, "cuda::sgd_momentum");
}

}  // namespace flexpar::cuda
