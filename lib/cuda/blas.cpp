// lib/cuda/blas.cpp — flexpar/cuda/blas.hpp: row-major GEMM and column sums through cuBLAS.
#include <flexpar/cuda/blas.hpp>

#include <cublas_v2.h>

#include <string>
#include <vector>

#include <flexpar/core/error.hpp>

namespace flexpar::cuda {
namespace {

[[noreturn]] void throw_cublas(cublasStatus_t code, const char* call) {
  throw transport_error("cuBLAS", static_cast<long>(code),
                        error_text(no_rank, "cuBLAS", call, " failed: ", cublasGetStatusName(code), " (",
                                   cublasGetStatusString(code), ")"));
}

#define FLEXPAR_CHECK_CUBLAS(call)                                                                         \
  do {                                                                                                     \
    if (const cublasStatus_t flexpar_cublas_code_ = (call); flexpar_cublas_code_ != CUBLAS_STATUS_SUCCESS) \
      throw_cublas(flexpar_cublas_code_, #call);                                                           \
  } while (0)

cublasOperation_t op_of(transpose t) { return t == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

void check_matrix(const char* what, std::size_t have, std::size_t rows, std::size_t cols) {
  if (have >= rows * cols) return;
  throw error_on<usage_error>(no_rank, "cuda::blas::gemm", what, " holds ", have, " elements; a ", rows, " x ", cols,
                              " matrix needs ", rows * cols);
}

int as_int(std::size_t v, const char* what) {
  if (v > static_cast<std::size_t>(INT32_MAX))
    throw error_on<usage_error>(no_rank, "cuda::blas", what, " of ", v, " exceeds cuBLAS's int range");
  return static_cast<int>(v);
}

}  // namespace

struct blas::state {
  cublasHandle_t handle = nullptr;
  cublasComputeType_t f32_compute = CUBLAS_COMPUTE_32F;
  device_buffer<float> ones;  // for column_sums
};

blas::blas(bool allow_tf32) : s_(std::make_unique<state>()) {
  FLEXPAR_CHECK_CUBLAS(cublasCreate(&s_->handle));
  if (allow_tf32) s_->f32_compute = CUBLAS_COMPUTE_32F_FAST_TF32;
}

blas::~blas() {
  if (s_ && s_->handle) (void)cublasDestroy(s_->handle);
}
blas::blas(blas&&) noexcept = default;
blas& blas::operator=(blas&& other) noexcept {
  if (this != &other) {
    if (s_ && s_->handle) (void)cublasDestroy(s_->handle);
    s_ = std::move(other.s_);
  }
  return *this;
}

namespace {

// Row-major C[m x n] = op(A) op(B) is column-major C^T[n x m] = op(B)^T op(A)^T: swap the operands and
// the sizes; the leading dimensions are the row-major row lengths.
template <class T>
void row_major_gemm(cublasHandle_t h, cudaStream_t s, transpose ta, transpose tb, std::size_t m, std::size_t n,
                    std::size_t k, float alpha, device_span<const T> a, device_span<const T> b, float beta,
                    device_span<T> c, cudaDataType_t type, cublasComputeType_t compute) {
  check_matrix("A", a.size(), m, k);
  check_matrix("B", b.size(), k, n);
  check_matrix("C", c.size(), m, n);
  if (m == 0 || n == 0) return;
  FLEXPAR_CHECK_CUBLAS(cublasSetStream(h, s));
  const int lda = as_int(ta == transpose::yes ? m : k, "lda"), ldb = as_int(tb == transpose::yes ? k : n, "ldb");
  FLEXPAR_CHECK_CUBLAS(cublasGemmEx(h, op_of(tb), op_of(ta), as_int(n, "n"), as_int(m, "m"), as_int(k, "k"), &alpha,
                                    b.data(), type, ldb, a.data(), type, lda, &beta, c.data(), type, as_int(n, "ldc"),
                                    compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void blas::gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                device_span<const float> a, device_span<const float> b, float beta, device_span<float> c,
                cudaStream_t s) {
  row_major_gemm(s_->handle, s, ta, tb, m, n, k, alpha, a, b, beta, c, CUDA_R_32F, s_->f32_compute);
}

void blas::gemm(transpose ta, transpose tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                device_span<const bfloat16> a, device_span<const bfloat16> b, float beta, device_span<bfloat16> c,
                cudaStream_t s) {
  row_major_gemm(s_->handle, s, ta, tb, m, n, k, alpha, a, b, beta, c, CUDA_R_16BF, CUBLAS_COMPUTE_32F);
}

void blas::column_sums(std::size_t m, std::size_t n, device_span<const float> a, device_span<float> y, cudaStream_t s,
                       float beta) {
  check_matrix("A", a.size(), m, n);
  if (y.size() < n)
    throw error_on<usage_error>(no_rank, "cuda::blas::column_sums", "y holds ", y.size(), " elements; it needs ", n);
  if (n == 0) return;
  if (s_->ones.size() < m) {
    device_buffer<float> ones(std::max<std::size_t>(m, 1024));
    const std::vector<float> host(ones.size(), 1.0f);
    copy_async(ones.span(), std::span<const float>(host), s);
    synchronize(s, std::chrono::seconds(60), "cuda::blas::column_sums: a vector of ones");
    s_->ones = std::move(ones);
  }
  FLEXPAR_CHECK_CUBLAS(cublasSetStream(s_->handle, s));
  const float alpha = 1.0f;
  // row-major A[m x n] is column-major A^T[n x m] with leading dimension n: y = A^T(col-major) * ones
  FLEXPAR_CHECK_CUBLAS(cublasSgemv(s_->handle, CUBLAS_OP_N, as_int(n, "n"), as_int(m, "m"), &alpha, a.data(),
                                   as_int(n, "lda"), s_->ones.data(), 1, &beta, y.data(), 1));
}

}  // namespace flexpar::cuda
