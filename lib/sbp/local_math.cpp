// The BLAS calls of the SBP ops (flexpar/sbp/local_math.hpp). Kept out of the headers so that code
// including flexpar never needs cblas.h.
#include <cblas.h>

#include <climits>
#include <string>

#include <flexpar/core/error.hpp>
#include <flexpar/sbp/local_math.hpp>

namespace flexpar::sbp::local {
namespace {
int checked(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX)) {
    std::string text = "sbp gemm: ";
    text.append(what).append(" = ").append(std::to_string(n)).append(" exceeds the BLAS's 32-bit index range");
    throw usage_error(text);
  }
  return static_cast<int>(n);
}
}  // namespace

void gemm(std::size_t m, std::size_t n, std::size_t k, const float* a, const float* b, float* c) {
  if (m == 0 || n == 0) return;
  const int M = checked(m, "m"), N = checked(n, "n"), K = checked(k, "k");
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K > 0 ? K : 1, b, N, 0.0f, c, N);
}

void gemm(std::size_t m, std::size_t n, std::size_t k, const double* a, const double* b, double* c) {
  if (m == 0 || n == 0) return;
  const int M = checked(m, "m"), N = checked(n, "n"), K = checked(k, "k");
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0, a, K > 0 ? K : 1, b, N, 0.0, c, N);
}

}  // namespace flexpar::sbp::local
