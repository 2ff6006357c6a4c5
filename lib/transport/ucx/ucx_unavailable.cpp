// lib/transport/ucx/ucx_unavailable.cpp — built instead of ucx_transport.cpp when FLEXPAR_WITH_UCX=OFF.
#include <flexpar/transport/ucx.hpp>

namespace flexpar {

bool ucx_available() noexcept { return false; }

std::unique_ptr<transport> make_ucx_transport(MPI_Comm, const config&) {
  throw error_on<usage_error>(no_rank, "make_ucx_transport",
                              "the UCX transport was requested, but this flexpar was built with FLEXPAR_WITH_UCX=OFF");
}

}  // namespace flexpar
