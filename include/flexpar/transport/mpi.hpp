// flexpar/transport/mpi.hpp — the MPI transport: MPI_Isend/MPI_Irecv on a duplicated communicator.
#pragma once

#include <mpi.h>

#include <memory>

#include <flexpar/transport/transport.hpp>

namespace flexpar {

/// Collective over `comm`: a transport over a duplicate of `comm` (with MPI_ERRORS_RETURN, so that a
/// failing call becomes a transport_error carrying MPI's own error string). Messages above 2^31
/// bytes use MPI 4's large-count calls. Peers are checked by MPI itself.
std::unique_ptr<transport> make_mpi_transport(MPI_Comm comm, const config& cfg);

}  // namespace flexpar
