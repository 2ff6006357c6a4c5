#include <flexpar/core/check_mpi.hpp>
#include <flexpar/core/mpi_comm.hpp>

namespace flexpar::detail {

void owned_mpi_comm::reset() noexcept {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

owned_mpi_comm duplicate_for_flexpar(MPI_Comm comm) {
  MPI_Comm dup = MPI_COMM_NULL;
  FLEXPAR_CHECK_MPI(MPI_Comm_dup(comm, &dup));
  owned_mpi_comm owned(dup);
  FLEXPAR_CHECK_MPI(MPI_Comm_set_errhandler(owned.get(), MPI_ERRORS_RETURN));
  return owned;
}

owned_mpi_comm split_for_flexpar(MPI_Comm comm, int color, int key) {
  MPI_Comm sub = MPI_COMM_NULL;
  FLEXPAR_CHECK_MPI(MPI_Comm_split(comm, color < 0 ? MPI_UNDEFINED : color, key, &sub));
  owned_mpi_comm owned(sub);
  if (sub != MPI_COMM_NULL) FLEXPAR_CHECK_MPI(MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN));
  return owned;
}

}  // namespace flexpar::detail
