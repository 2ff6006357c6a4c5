// flexpar/core/mpi_comm.hpp — MPI communicators that flexpar owns: duplicated or split from yours,
// freed by flexpar.
//
// The layer below the transports: the MPI and UCX transports and the communicator build on these.
// Every communicator made here has MPI_ERRORS_RETURN set, so that a failing call on it returns its
// code to FLEXPAR_CHECK_MPI instead of aborting the job.
//
// Deadlines. MPI_Comm_dup has a non-blocking form (MPI_Comm_idup): duplicate_for_flexpar polls it
// until its deadline. MPI_Comm_split and MPI_Comm_split_type have none: their callers first make
// sure every rank has arrived (detail::bootstrap_barrier over a transport, with a deadline that names
// the ranks that did not), so that the blocking call that follows only waits for ranks that are
// already in it. A rank that dies between the two is the one case left without a deadline.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <flexpar/core/deadline.hpp>

namespace flexpar::detail {

/// Sole owner of an MPI communicator: frees it on destruction (unless MPI is already finalized).
class owned_mpi_comm {
 public:
  owned_mpi_comm() = default;
  explicit owned_mpi_comm(MPI_Comm comm) noexcept : comm_(comm) {}
  owned_mpi_comm(owned_mpi_comm&& other) noexcept : comm_(std::exchange(other.comm_, MPI_COMM_NULL)) {}
  owned_mpi_comm& operator=(owned_mpi_comm&& other) noexcept {
    if (this != &other) {
      reset();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    }
    return *this;
  }
  ~owned_mpi_comm() { reset(); }
  [[nodiscard]] MPI_Comm get() const noexcept { return comm_; }
  void reset() noexcept;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

/// Polls `request` with MPI_Test until it completes (true) or `until` passes (false: the request is
/// still pending). Polls back to back for a while, then sleeps between polls (2 us doubling to
/// 256 us) so that a rank waiting for late peers leaves its core to them.
bool wait_for_mpi(MPI_Request& request, deadline until);

/// Collective over `comm`: MPI_Comm_idup of `comm`, waited for until `until`, with MPI_ERRORS_RETURN
/// set on the duplicate so that failures reach FLEXPAR_CHECK_MPI.
/// @throws timeout_error at `until` ("[rank R] `what`: not every one of the N ranks ..."): MPI does
///         not say which ranks are missing, so the text cannot name them.
owned_mpi_comm duplicate_for_flexpar(MPI_Comm comm, deadline until, std::string_view what);

/// Collective over `comm`: MPI_Comm_split of `comm` (a negative color is MPI_UNDEFINED and gives an
/// empty handle), with MPI_ERRORS_RETURN set on the result. Blocking (MPI has no MPI_Comm_isplit):
/// call it once every rank is known to have arrived (bootstrap_barrier).
owned_mpi_comm split_for_flexpar(MPI_Comm comm, int color, int key);

/// Collective over `comm`, a communicator flexpar owns and sends nothing else on with tag 0: every
/// rank's `mine` (lengths may differ), by rank. Point-to-point (MPI_Isend, MPI_Improbe, MPI_Mrecv),
/// so that at `until` it knows which ranks did not take part.
/// @throws timeout_error at `until`, naming `what` and the ranks whose bytes did not arrive.
std::vector<std::vector<std::byte>> exchange_for_flexpar(MPI_Comm comm, std::span<const std::byte> mine, deadline until,
                                                         std::string_view what);

}  // namespace flexpar::detail
