// flexpar/comm/thread_level.hpp — the check every object that runs a thread of its own calling MPI
// makes before it starts that thread (the engine's background thread, ZeRO's communication thread):
// over the MPI transport such a thread needs MPI_THREAD_MULTIPLE, and MPI does not say so itself
// (it hangs or corrupts instead), so the object refuses to start with a sentence naming the fix.
// Over UCX, or in process (no MPI communicator), any thread level will do.
#pragma once

#include <mpi.h>

#include <string>
#include <string_view>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/core/error.hpp>

namespace flexpar {

/// Checks that `comm` can be driven from a thread of `who` while the caller's threads call MPI too.
/// @pre MPI is initialized when `comm` has an MPI communicator (as it does to have made `comm`).
/// @throws usage_error "<who>: <thread> calls MPI while your threads may too, so it needs
///         MPI_THREAD_MULTIPLE; initialize MPI with MPI_Init_thread(...) (or <otherwise>)" when `comm`
///         runs over the MPI transport and MPI was initialized below MPI_THREAD_MULTIPLE.
/// Local (no communication).
inline void require_thread_multiple(const communicator& comm, std::string_view who, std::string_view thread,
                                    std::string_view otherwise) {
  if (comm.mpi_comm() == MPI_COMM_NULL || comm.transport().kind() != transport_kind::mpi) return;
  int provided = MPI_THREAD_SINGLE;
  FLEXPAR_CHECK_MPI(MPI_Query_thread(&provided));
  if (provided >= MPI_THREAD_MULTIPLE) return;
  throw error_on<usage_error>(comm.rank(), who, thread,
                              " calls MPI while your threads may too, so it needs MPI_THREAD_MULTIPLE; initialize MPI "
                              "with MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) (or ",
                              otherwise, ")");
}

}  // namespace flexpar
