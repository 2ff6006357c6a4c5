// flexpar/cuda/blas.hpp — dense linear algebra on device memory through cuBLAS: row-major GEMM in f32
// and bf16 with f32 accumulation, and the column sums of a matrix (a bias gradient).
//
// Part of flexpar::cuda; cuBLAS itself stays inside lib/ (this header does not include it).
//
//   flexpar::cuda::blas la;                                   // a cuBLAS handle, owned
//   la.gemm(transpose::no, transpose::no, m, n, k, 1.0f, a, b, 0.0f, c, stream);  // C = A B
//
// Row-major throughout, as the host code of flexpar (sbp::local::gemm, the samples' CBLAS calls):
// cuBLAS is column-major, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T, which reads the
// same memory without a copy.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include <flexpar/core/dtype.hpp>
#include <flexpar/cuda/runtime.hpp>

namespace flexpar::cuda {

/// Whether a GEMM operand is used as stored or transposed.
enum class transpose : bool {
  no,   ///< op(X) = X
  yes,  ///< op(X) = X^T
};

/// A cuBLAS handle of the current device, owned (one per thread that issues work; each call names
/// the stream it runs on). Move-only.
class blas {
 public:
  /// A handle on the current device. f32 GEMMs use true f32 arithmetic (CUBLAS_COMPUTE_32F), unless
  /// `allow_tf32`: then the tensor cores' TF32 (10-bit mantissa products, f32 sums) may be used.
  /// @throws transport_error (library "cuBLAS") when cuBLAS cannot start (no device, no memory).
  explicit blas(bool allow_tf32 = false);
  ~blas();
  blas(blas&&) noexcept;             ///< takes ownership
  blas& operator=(blas&&) noexcept;  ///< takes ownership
  blas(const blas&) = delete;        ///< not copyable

  /// C[m x n] = alpha op(A) op(B) + beta C, row-major; op(A) is m x k, op(B) is k x n (A is stored
  /// k x m when transposed, B n x k). cublasGemmEx with f32 storage and f32 accumulation.
  /// @throws usage_error when a span is shorter than its matrix.
  void gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
            device_span<const float> a, device_span<const float> b, float beta, device_span<float> c, cudaStream_t s);
  /// The bf16 form: bf16 storage of A, B and C, f32 accumulation (the sum is rounded to bf16 once).
  void gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
            device_span<const bfloat16> a, device_span<const bfloat16> b, float beta, device_span<bfloat16> c,
            cudaStream_t s);

  /// y[n] = beta y + sum over the m rows of A[m x n] (row-major): the bias gradient of a dense layer.
  /// One cublasSgemv against a vector of ones that this object keeps.
  void column_sums(std::size_t m, std::size_t n, device_span<const float> a, device_span<float> y, cudaStream_t s,
                   float beta = 0.0f);

 private:
  struct state;
  std::unique_ptr<state> s_;
};

}  // namespace flexpar::cuda
