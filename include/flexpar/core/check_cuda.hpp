// flexpar/core/check_cuda.hpp — FLEXPAR_CHECK_CUDA(rank, call) and FLEXPAR_CHECK_NCCL(rank, call).
// Only for builds with FLEXPAR_WITH_CUDA (they include the CUDA runtime and NCCL headers).
#pragma once

#include <cuda_runtime_api.h>

#include <flexpar/core/error.hpp>

#if __has_include(<nccl.h>)
#include <nccl.h>
#define FLEXPAR_DETAIL_HAVE_NCCL_H 1
#endif

namespace flexpar::detail {

[[noreturn]] inline void throw_cuda_failure(int rank, cudaError_t code, const char* call,
                                            const std::source_location& loc) {
  std::string message = std::string(cudaGetErrorName(code)) + ": " + cudaGetErrorString(code);
  throw transport_error("CUDA", static_cast<long>(code), api_failure_text(rank, call, message, code, loc));
}

#ifdef FLEXPAR_DETAIL_HAVE_NCCL_H
[[noreturn]] inline void throw_nccl_failure(int rank, ncclResult_t code, const char* call,
                                            const std::source_location& loc) {
  throw transport_error("NCCL", static_cast<long>(code),
                        api_failure_text(rank, call, ncclGetErrorString(code), code, loc));
}
#endif

}  // namespace flexpar::detail

/// Runs a CUDA runtime call; on anything but cudaSuccess throws flexpar::transport_error with
/// `rank`, the call text, cudaGetErrorName/String and file:line.
#define FLEXPAR_CHECK_CUDA(rank, call)                                                                           \
  do {                                                                                                           \
    if (const cudaError_t flexpar_cuda_code_ = (call); flexpar_cuda_code_ != cudaSuccess)                        \
      ::flexpar::detail::throw_cuda_failure((rank), flexpar_cuda_code_, #call, std::source_location::current()); \
  } while (0)

#ifdef FLEXPAR_DETAIL_HAVE_NCCL_H
/// Runs an NCCL call; on anything but ncclSuccess (ncclInProgress included: callers of non-blocking
/// communicators poll for that themselves) throws flexpar::transport_error with ncclGetErrorString.
#define FLEXPAR_CHECK_NCCL(rank, call)                                                                           \
  do {                                                                                                           \
    if (const ncclResult_t flexpar_nccl_code_ = (call); flexpar_nccl_code_ != ncclSuccess)                       \
      ::flexpar::detail::throw_nccl_failure((rank), flexpar_nccl_code_, #call, std::source_location::current()); \
  } while (0)
#endif
