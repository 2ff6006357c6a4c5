// lib/sbp/local_math.cpp — the BLAS calls of the SBP ops (flexpar/sbp/local_math.hpp). Kept out of the headers so that
// code including flexpar never needs cblas.h.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>
#include <vector>

#include <flexpar/core/error.hpp>
#include <flexpar/sbp/local_math.hpp>

namespace flexpar::sbp::local {

namespace {
int checked(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX)) {
    throw error_on<usage_error>(no_rank, "sbp gemm", what, " = ", n, " exceeds the BLAS's 32-bit index range");
  }
  return static_cast<int>(n);
}

enum class transpose : bool { no, yes };
enum class into : bool { overwrite, accumulate };

/// c[m x n] (=|+=) op(a) op(b), row-major, op(a) [m x k], op(b) [k x n]; zero sizes handled here.
template <class T>
void blas_gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, const T* a, const T* b, T* c,
               into mode) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (mode == into::overwrite) std::fill_n(c, m * n, T(0));
    return;
  }
  const int M = checked(m, "m"), N = checked(n, "n"), K = checked(k, "k");
  const int lda = ta == transpose::yes ? M : K, ldb = tb == transpose::yes ? K : N;
  const CBLAS_TRANSPOSE opa = ta == transpose::yes ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE opb = tb == transpose::yes ? CblasTrans : CblasNoTrans;
  const T beta = mode == into::accumulate ? T(1) : T(0);
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, opa, opb, M, N, K, 1.0f, a, lda, b, ldb, beta, c, N);
  else
    cblas_dgemm(CblasRowMajor, opa, opb, M, N, K, 1.0, a, lda, b, ldb, beta, c, N);
}

/// col [C*R*S, P*Q]: row (c, r, s) holds x[c, p + r - pad_h, q + s - pad_w] over the output positions
/// (p, q), zero where that falls into the padding.
template <class T>
void im2col(const conv2d_geometry& g, const T* x, T* col) {
  const std::size_t P = g.out_height(), Q = g.out_width();
  for (std::size_t c = 0; c < g.in_channels; ++c)
    for (std::size_t r = 0; r < g.kernel_h; ++r)
      for (std::size_t s = 0; s < g.kernel_w; ++s) {
        T* row = col + ((c * g.kernel_h + r) * g.kernel_w + s) * P * Q;
        for (std::size_t p = 0; p < P; ++p) {
          const std::size_t h = p + r;  // row in the padded input
          T* out = row + p * Q;
          if (h < g.pad_h || h >= g.pad_h + g.height) {
            std::fill_n(out, Q, T(0));
            continue;
          }
          const T* in = x + (c * g.height + (h - g.pad_h)) * g.width;
          for (std::size_t q = 0; q < Q; ++q) {
            const std::size_t w = q + s;
            out[q] = w < g.pad_w || w >= g.pad_w + g.width ? T(0) : in[w - g.pad_w];
          }
        }
      }
}

/// The adjoint of im2col: adds each entry of col to the input position it was read from.
template <class T>
void col2im(const conv2d_geometry& g, const T* col, T* x) {
  const std::size_t P = g.out_height(), Q = g.out_width();
  for (std::size_t c = 0; c < g.in_channels; ++c)
    for (std::size_t r = 0; r < g.kernel_h; ++r)
      for (std::size_t s = 0; s < g.kernel_w; ++s) {
        const T* row = col + ((c * g.kernel_h + r) * g.kernel_w + s) * P * Q;
        for (std::size_t p = 0; p < P; ++p) {
          const std::size_t h = p + r;
          if (h < g.pad_h || h >= g.pad_h + g.height) continue;
          T* out = x + (c * g.height + (h - g.pad_h)) * g.width;
          for (std::size_t q = 0; q < Q; ++q) {
            const std::size_t w = q + s;
            if (w >= g.pad_w && w < g.pad_w + g.width) out[w - g.pad_w] += row[p * Q + q];
          }
        }
      }
}

template <class T>
void forward(const conv2d_geometry& g, const T* x, const T* w, T* y) {
  const std::size_t crs = g.in_channels * g.kernel_h * g.kernel_w, pq = g.out_height() * g.out_width();
  std::vector<T> col(crs * pq);
  for (std::size_t n = 0; n < g.batch; ++n) {
    im2col(g, x + n * g.in_channels * g.height * g.width, col.data());
    blas_gemm(transpose::no, transpose::no, g.out_channels, pq, crs, w, col.data(), y + n * g.out_channels * pq,
              into::overwrite);
  }
}

template <class T>
void backward_data(const conv2d_geometry& g, const T* dy, const T* w, T* dx) {
  const std::size_t crs = g.in_channels * g.kernel_h * g.kernel_w, pq = g.out_height() * g.out_width();
  const std::size_t chw = g.in_channels * g.height * g.width;
  std::fill_n(dx, g.batch * chw, T(0));
  std::vector<T> col(crs * pq);
  for (std::size_t n = 0; n < g.batch; ++n) {
    blas_gemm(transpose::yes, transpose::no, crs, pq, g.out_channels, w, dy + n * g.out_channels * pq, col.data(),
              into::overwrite);
    col2im(g, col.data(), dx + n * chw);
  }
}

template <class T>
void backward_weight(const conv2d_geometry& g, const T* x, const T* dy, T* dw) {
  const std::size_t crs = g.in_channels * g.kernel_h * g.kernel_w, pq = g.out_height() * g.out_width();
  std::fill_n(dw, g.out_channels * crs, T(0));
  std::vector<T> col(crs * pq);
  for (std::size_t n = 0; n < g.batch; ++n) {
    im2col(g, x + n * g.in_channels * g.height * g.width, col.data());
    blas_gemm(transpose::no, transpose::yes, g.out_channels, crs, pq, dy + n * g.out_channels * pq, col.data(), dw,
              into::accumulate);
  }
}
}  // namespace

void gemm(std::size_t m, std::size_t n, std::size_t k, const float* a, const float* b, float* c) {
  blas_gemm(transpose::no, transpose::no, m, n, k, a, b, c, into::overwrite);
}

void gemm(std::size_t m, std::size_t n, std::size_t k, const double* a, const double* b, double* c) {
  blas_gemm(transpose::no, transpose::no, m, n, k, a, b, c, into::overwrite);
}

void conv2d_forward(const conv2d_geometry& g, const float* x, const float* w, float* y) { forward(g, x, w, y); }
void conv2d_forward(const conv2d_geometry& g, const double* x, const double* w, double* y) { forward(g, x, w, y); }
void conv2d_backward_data(const conv2d_geometry& g, const float* dy, const float* w, float* dx) {
  backward_data(g, dy, w, dx);
}
void conv2d_backward_data(const conv2d_geometry& g, const double* dy, const double* w, double* dx) {
  backward_data(g, dy, w, dx);
}
void conv2d_backward_weight(const conv2d_geometry& g, const float* x, const float* dy, float* dw) {
  backward_weight(g, x, dy, dw);
}
void conv2d_backward_weight(const conv2d_geometry& g, const double* x, const double* dy, double* dw) {
  backward_weight(g, x, dy, dw);
}

}  // namespace flexpar::sbp::local
