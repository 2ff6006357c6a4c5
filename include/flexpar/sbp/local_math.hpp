// flexpar/sbp/local_math.hpp — the local kernels of the SBP ops: GEMM through the BLAS libflexpar was
// built with (OpenBLAS on Debian) for f32 and f64, a plain loop for the other element types; the 2-D
// convolution as im2col + one GEMM per sample (backward: GEMM + col2im for the data gradient, GEMM
// with the BLAS transposing for the weight gradient).
#pragma once

#include <cstddef>

#include <flexpar/core/dtype.hpp>

namespace flexpar::sbp::local {

/// c[m x n] = a[m x k] * b[k x n], row-major, through the BLAS (cblas_sgemm).
void gemm(std::size_t m, std::size_t n, std::size_t k, const float* a, const float* b, float* c);
/// c[m x n] = a[m x k] * b[k x n], row-major, through the BLAS (cblas_dgemm).
void gemm(std::size_t m, std::size_t n, std::size_t k, const double* a, const double* b, double* c);

/// c[m x n] = a[m x k] * b[k x n] for element types the BLAS has no routine for (integers; f16 and
/// bf16 accumulate in float), row-major, i-k-j order.
template <element T>
void gemm(std::size_t m, std::size_t n, std::size_t k, const T* a, const T* b, T* c) {
  using A = accumulate_t<T>;
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) c[i * n + j] = T(A(0));
    for (std::size_t p = 0; p < k; ++p) {
      const A aip = A(a[i * k + p]);
      for (std::size_t j = 0; j < n; ++j) c[i * n + j] = T(A(c[i * n + j]) + aip * A(b[p * n + j]));
    }
  }
}

/// The geometry of a stride-1 2-D convolution on one shard: input [batch, in_channels, height, width]
/// (NCHW), weight [out_channels, in_channels, kernel_h, kernel_w] (KCRS), zero padding pad_h / pad_w on
/// both sides, output [batch, out_channels, out_height(), out_width()].
struct conv2d_geometry {
  std::size_t batch = 0;         ///< N
  std::size_t in_channels = 0;   ///< C
  std::size_t height = 0;        ///< H
  std::size_t width = 0;         ///< W
  std::size_t out_channels = 0;  ///< K
  std::size_t kernel_h = 1;      ///< R
  std::size_t kernel_w = 1;      ///< S
  std::size_t pad_h = 0;         ///< rows of zeros above and below
  std::size_t pad_w = 0;         ///< columns of zeros left and right

  /// H + 2 pad_h - R + 1 (0 when the kernel is larger than the padded input).
  [[nodiscard]] std::size_t out_height() const noexcept {
    return height + 2 * pad_h >= kernel_h ? height + 2 * pad_h - kernel_h + 1 : 0;
  }
  /// W + 2 pad_w - S + 1 (0 when the kernel is larger than the padded input).
  [[nodiscard]] std::size_t out_width() const noexcept {
    return width + 2 * pad_w >= kernel_w ? width + 2 * pad_w - kernel_w + 1 : 0;
  }
};

/// y = conv(x, w) on a shard (geometry above): per sample, im2col of x into [C*R*S, P*Q], then
/// y_n [K, P*Q] = w [K, C*R*S] * col through the BLAS. C = 0 gives zeros.
void conv2d_forward(const conv2d_geometry& g, const float* x, const float* w, float* y);
/// f64 form of conv2d_forward.
void conv2d_forward(const conv2d_geometry& g, const double* x, const double* w, double* y);
/// dx = the input gradient of y = conv(x, w) for dy: per sample dcol = w^T dy_n (the BLAS transposing),
/// then col2im adds dcol's columns back into dx's padded windows. dx is overwritten.
void conv2d_backward_data(const conv2d_geometry& g, const float* dy, const float* w, float* dx);
/// f64 form of conv2d_backward_data.
void conv2d_backward_data(const conv2d_geometry& g, const double* dy, const double* w, double* dx);
/// dw = the weight gradient of y = conv(x, w) for dy: the sum over samples of dy_n [K, P*Q] * col_n^T
/// (the BLAS transposing, accumulating in place). dw is overwritten.
void conv2d_backward_weight(const conv2d_geometry& g, const float* x, const float* dy, float* dw);
/// f64 form of conv2d_backward_weight.
void conv2d_backward_weight(const conv2d_geometry& g, const double* x, const double* dy, double* dw);

}  // namespace flexpar::sbp::local
