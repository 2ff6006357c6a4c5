// flexpar/core/check_ucx.hpp — FLEXPAR_CHECK_UCX(rank, call): a failed UCX call becomes a transport_error.
#pragma once

#include <ucs/type/status.h>

#include <flexpar/core/error.hpp>

namespace flexpar::detail {

[[noreturn]] inline void throw_ucx_failure(int rank, ucs_status_t status, const char* call,
                                           const std::source_location& loc) {
  throw transport_error("UCX", static_cast<long>(status),
                        api_failure_text(rank, call, ucs_status_string(status), static_cast<long>(status), loc));
}

}  // namespace flexpar::detail

/// Runs a UCX call returning ucs_status_t; on an error (anything but UCS_OK / UCS_INPROGRESS) throws
/// flexpar::transport_error with `rank`, the call as written, ucs_status_string() and file:line.
#define FLEXPAR_CHECK_UCX(rank, call)                                                                            \
  do {                                                                                                           \
    if (const ucs_status_t flexpar_ucx_status_ = (call); UCS_STATUS_IS_ERR(flexpar_ucx_status_))                 \
      ::flexpar::detail::throw_ucx_failure((rank), flexpar_ucx_status_, #call, std::source_location::current()); \
  } while (0)
