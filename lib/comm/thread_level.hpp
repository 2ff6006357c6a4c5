// lib/comm/thread_level.hpp — the check of every object that runs a thread of its own calling MPI.
#pragma once

#include <mpi.h>

#include <string>
#include <string_view>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/core/error.hpp>

namespace flexpar::detail {

/// Throws usage_error("<who>: <thread> calls MPI while your threads may too, so it needs
/// MPI_THREAD_MULTIPLE; ... (or <otherwise>)") when `comm` runs over the MPI transport and MPI was
/// initialized below MPI_THREAD_MULTIPLE.
inline void require_thread_multiple(const communicator& comm, std::string_view who, std::string_view thread,
                                    std::string_view otherwise) {
  if (comm.mpi_comm() == MPI_COMM_NULL || comm.transport().kind() != transport_kind::mpi) return;
  int provided = MPI_THREAD_SINGLE;
  FLEXPAR_CHECK_MPI(MPI_Query_thread(&provided));
  if (provided >= MPI_THREAD_MULTIPLE) return;
  throw usage_error(std::string(who) + ": " + std::string(thread) +
                    " calls MPI while your threads may too, so it needs MPI_THREAD_MULTIPLE; initialize MPI with "
                    "MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) (or " +
                    std::string(otherwise) + ")");
}

}  // namespace flexpar::detail
