// flexpar/sbp/local_math.hpp — the local kernels of the SBP ops: GEMM through the BLAS libflexpar was
// built with (OpenBLAS on Debian) for f32 and f64, a plain loop for the other element types.
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

}  // namespace flexpar::sbp::local
