// flexpar/sbp/host_kernels.hpp — the local computations of the SBP ops on host shards: loops (in the
// element's accumulation type, or in double rounded once where the op says so) and the BLAS for GEMM
// and the convolutions (local_math.hpp). backend<memory::host> is these kernels and host memory; the
// device's kernels are the same members of backend<memory::cuda> (flexpar/cuda/sbp.hpp).
//
// Every kernel takes the placement first (a device kernel needs its stream and its cuBLAS handle; the
// host ones need nothing of it) and writes every element of its output.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include <flexpar/core/dtype.hpp>
#include <flexpar/sbp/boxing/strided_copy.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/sbp/local_math.hpp>

namespace flexpar::sbp {

namespace detail {
/// Which of the three convolution computations a conv2d call runs.
enum class conv_pass : unsigned char { forward, grad_input, grad_weight };
}  // namespace detail

/// The SBP ops' kernels on host memory (header above).
struct host_kernels {
  /// c [m, n] = a [m, k] b [k, n], row-major (the BLAS for f32 and f64, a loop for the others).
  template <class T, class Where>
  static void gemm(const Where&, std::size_t m, std::size_t n, std::size_t k, std::span<const T> a,
                   std::span<const T> b, std::span<T> c) {
    local::gemm(m, n, k, a.data(), b.data(), c.data());
  }

  /// out = x + y element-wise.
  template <class T, class Where>
  static void add(const Where&, std::span<const T> x, std::span<const T> y, std::span<T> out) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = T(accumulate_t<T>(x[i]) + accumulate_t<T>(y[i]));
  }
  /// out = x * y element-wise.
  template <class T, class Where>
  static void mul(const Where&, std::span<const T> x, std::span<const T> y, std::span<T> out) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = T(accumulate_t<T>(x[i]) * accumulate_t<T>(y[i]));
  }
  /// out = max(x, 0) element-wise.
  template <class T, class Where>
  static void relu(const Where&, std::span<const T> x, std::span<T> out) {
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = accumulate_t<T>(x[i]) < accumulate_t<T>(0) ? T(accumulate_t<T>(0)) : x[i];
  }
  /// out = x Φ(x) = x (1 + erf(x / sqrt 2)) / 2 element-wise, in double rounded once.
  template <class T, class Where>
  static void gelu(const Where&, std::span<const T> x, std::span<T> out) {
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double v = double(accumulate_t<T>(x[i]));
      out[i] = T(accumulate_t<T>(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)))));
    }
  }

  /// The softmax of every line of x seen as [outer, rows, inner] along its rows, in double rounded once.
  template <class T, class Where>
  static void softmax(const Where&, std::span<const T> x, std::span<T> out, const detail::around& v) {
    each_line(x, out, v, [](T* row, std::size_t rows, std::size_t step) {
      double hi = -INFINITY, sum = 0;
      for (std::size_t r = 0; r < rows; ++r) hi = std::max(hi, double(accumulate_t<T>(row[r * step])));
      for (std::size_t r = 0; r < rows; ++r) sum += std::exp(double(accumulate_t<T>(row[r * step])) - hi);
      for (std::size_t r = 0; r < rows; ++r)
        row[r * step] = T(accumulate_t<T>(std::exp(double(accumulate_t<T>(row[r * step])) - hi) / sum));
    });
  }
  /// (x - mean) / sqrt(var + eps) along every line (as softmax; population variance, in double).
  template <class T, class Where>
  static void layer_norm(const Where&, std::span<const T> x, std::span<T> out, const detail::around& v, double eps) {
    each_line(x, out, v, [eps](T* row, std::size_t rows, std::size_t step) {
      double mean = 0, var = 0;
      for (std::size_t r = 0; r < rows; ++r) mean += double(accumulate_t<T>(row[r * step]));
      mean /= static_cast<double>(rows);
      for (std::size_t r = 0; r < rows; ++r) {
        const double d = double(accumulate_t<T>(row[r * step])) - mean;
        var += d * d;
      }
      const double scale = 1.0 / std::sqrt(var / static_cast<double>(rows) + eps);
      for (std::size_t r = 0; r < rows; ++r)
        row[r * step] = T(accumulate_t<T>((double(accumulate_t<T>(row[r * step])) - mean) * scale));
    });
  }
  /// out [outer, inner] = the sum of each line of x in row order (in the accumulation type).
  template <class T, class Where>
  static void sum_lines(const Where&, std::span<const T> x, std::span<T> out, const detail::around& v) {
    std::vector<accumulate_t<T>> acc(v.outer * v.inner, accumulate_t<T>(0));
    for (std::size_t o = 0; o < v.outer; ++o)
      for (std::size_t r = 0; r < v.rows; ++r)
        for (std::size_t i = 0; i < v.inner; ++i)
          acc[o * v.inner + i] += accumulate_t<T>(x[(o * v.rows + r) * v.inner + i]);
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = T(acc[i]);
  }

  /// out[i, :] = row ids[i] - lo of w ([rows, cols]) when lo <= ids[i] < lo + rows, else zeros. Returns
  /// the first position whose id is outside [0, vocab) (out is then unspecified), or none.
  template <class T, class Where>
  static std::optional<std::size_t> embedding(const Where&, std::span<const T> w, std::span<const std::int64_t> ids,
                                              std::span<T> out, std::size_t cols, std::int64_t lo, std::int64_t rows,
                                              std::int64_t vocab) {
    std::fill(out.begin(), out.end(), T{});
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::int64_t id = ids[i];
      if (id < 0 || id >= vocab) return i;
      if (id < lo || id >= lo + rows) continue;
      std::copy_n(w.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(id - lo) * cols), cols,
                  out.begin() + static_cast<std::ptrdiff_t>(i * cols));
    }
    return std::nullopt;
  }

  /// out [cols, rows] = in [rows, cols] transposed.
  template <class T, class Where>
  static void transpose(const Where&, std::span<const T> in, std::span<T> out, std::size_t rows, std::size_t cols) {
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }

  /// One convolution pass of geometry g on one shard (float or double): forward y = conv(a = x, b = w),
  /// grad_input dx = conv2d_backward_data(a = dy, b = w), grad_weight dw = conv2d_backward_weight(a = x,
  /// b = dy); im2col + the BLAS.
  template <class T, class Where>
  static void conv(const Where&, detail::conv_pass pass, const local::conv2d_geometry& g, std::span<const T> a,
                   std::span<const T> b, std::span<T> c) {
    if (pass == detail::conv_pass::forward)
      local::conv2d_forward(g, a.data(), b.data(), c.data());
    else if (pass == detail::conv_pass::grad_input)
      local::conv2d_backward_data(g, a.data(), b.data(), c.data());
    else
      local::conv2d_backward_weight(g, a.data(), b.data(), c.data());
  }

 private:
  /// out = x, then row(first, rows, step) on every line of out along the rows of v.
  template <class T, class Row>
  static void each_line(std::span<const T> x, std::span<T> out, const detail::around& v, Row row) {
    std::copy(x.begin(), x.end(), out.begin());
    if (out.empty()) return;
    for (std::size_t o = 0; o < v.outer; ++o)
      for (std::size_t i = 0; i < v.inner; ++i) row(out.data() + o * v.rows * v.inner + i, v.rows, v.inner);
  }
};

}  // namespace flexpar::sbp
