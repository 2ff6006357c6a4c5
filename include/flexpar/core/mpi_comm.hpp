/// @file
/// @brief MPI communicators that flexpar owns: duplicated or split from yours, freed by flexpar.
///
/// The layer below the transports: the MPI and UCX transports and the communicator build on these.
/// Every communicator made here has MPI_ERRORS_RETURN set, so that a failing call on it returns its
/// code to FLEXPAR_CHECK_MPI instead of aborting the job.
#pragma once

#include <mpi.h>

#include <utility>

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

/// MPI_Comm_dup of `comm` with MPI_ERRORS_RETURN set, so that failures reach FLEXPAR_CHECK_MPI.
owned_mpi_comm duplicate_for_flexpar(MPI_Comm comm);

/// Collective: MPI_Comm_split of `comm` (a negative color is MPI_UNDEFINED and gives an empty
/// handle), with MPI_ERRORS_RETURN set on the result.
owned_mpi_comm split_for_flexpar(MPI_Comm comm, int color, int key);

}  // namespace flexpar::detail
