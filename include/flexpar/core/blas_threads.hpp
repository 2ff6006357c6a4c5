// flexpar/core/blas_threads.hpp — how many threads the BLAS libflexpar was built with may run: p ranks
// on a node, each with a BLAS thread per core, would run p threads per core. The communicator sizes
// them once, in communicator::from_mpi; the SBP ops and anything else that calls the BLAS use them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace flexpar {

/// Sets the BLAS's threads for `blas_threads` (config::blas_threads, core/config.hpp) on a rank that
/// shares its node with `ranks_on_node` ranks, given the environment `lookup` reads: 0 divides the
/// cores of this process's affinity mask among the node's ranks (at least one each), a positive
/// number sets that many. Returns the number set, or 0 when the BLAS is left alone (-1, a BLAS threads
/// variable set in the environment, or a BLAS that is not OpenBLAS). Called by communicator::from_mpi.
int size_blas_threads(int blas_threads, int ranks_on_node, std::optional<std::string> (*lookup)(std::string_view));

/// The BLAS's threads now (OpenBLAS), or 0 where the BLAS does not say.
[[nodiscard]] int blas_threads_now();

}  // namespace flexpar
