// flexpar/transport/ucx.hpp — the UCX transport (ucp tag API).
//
// One ucp context and worker per transport; worker addresses are exchanged over MPI once, then every
// message goes through UCX (shared memory, TCP, verbs: whatever UCX_TLS allows). ucp tags carry the
// sender's rank in their upper 32 bits and flexpar's tag in the lower 32, so a receive matches
// exactly one (peer, tag). A wait polls the worker for config::spin, then sleeps on the
// worker's event file descriptor (UCP_FEATURE_WAKEUP) so that an idle rank does not burn a core.
//
// UCX settings: `UCX_*` as usual; `FLEXPAR_P2P_UCX_*` (e.g. `FLEXPAR_P2P_UCX_TLS=tcp`) apply to
// flexpar's UCX context only, on top of them, leaving MPICH's own UCX as it is.
#pragma once

#include <mpi.h>

#include <memory>

#include <flexpar/transport/transport.hpp>

namespace flexpar {

/// True when this flexpar was built with UCX (FLEXPAR_WITH_UCX).
bool ucx_available() noexcept;

/// Collective over `comm`: a UCX transport over the ranks of `comm` (which it duplicates for its
/// own bootstrap and split). @throws usage_error when built without UCX; transport_error when UCX
/// fails (with ucs_status_string's text).
std::unique_ptr<transport> make_ucx_transport(MPI_Comm comm, const config& cfg);

}  // namespace flexpar
