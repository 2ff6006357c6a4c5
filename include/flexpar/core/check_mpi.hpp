// flexpar/core/check_mpi.hpp — FLEXPAR_CHECK_MPI(call): a failed MPI call becomes a transport_error.
//
// The communicator the call ran on must have MPI_ERRORS_RETURN set (flexpar sets it on the
// communicators it duplicates), otherwise MPI aborts before the code is returned.
#pragma once

#include <mpi.h>

#include <flexpar/core/error.hpp>

namespace flexpar::detail {

/// Rank in MPI_COMM_WORLD, or -1 when MPI is not initialized (or already finalized).
inline int mpi_world_rank_or_unknown() noexcept {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

[[noreturn]] inline void throw_mpi_failure(int code, const char* call, const std::source_location& loc) {
  char message[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, message, &length) != MPI_SUCCESS) length = 0;
  throw transport_error(
      "MPI", code, api_failure_text(mpi_world_rank_or_unknown(), call, std::string_view(message, length), code, loc));
}

}  // namespace flexpar::detail

/// Runs an MPI call; on a return code other than MPI_SUCCESS throws flexpar::transport_error whose
/// text holds the world rank, the call as written, MPI's own error string and file:line.
#define FLEXPAR_CHECK_MPI(call)                                                                        \
  do {                                                                                                 \
    if (const int flexpar_mpi_code_ = (call); flexpar_mpi_code_ != MPI_SUCCESS)                        \
      ::flexpar::detail::throw_mpi_failure(flexpar_mpi_code_, #call, std::source_location::current()); \
  } while (0)
