// flexpar/core/config.hpp — run-time settings, from FLEXPAR_* environment variables or from code.
//
// A `config` is a plain value: build it with `config::from_environment()` (or default-construct it),
// change any field in code, and pass it to the objects that use it. Nothing reads the environment
// behind your back. The table of variables is in doc/configuration.md; each field below names its
// variable.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace flexpar {

/// Which point-to-point transport a communicator moves bytes with.
enum class transport_kind : unsigned char {
  mpi,     ///< MPI_Isend/MPI_Irecv on a duplicated communicator
  ucx,     ///< UCX ucp tag API; worker addresses exchanged over MPI
  inproc,  ///< threads as ranks in one process (tests)
};

std::string_view name_of(transport_kind kind) noexcept;

struct config {
  /// FLEXPAR_TIMEOUT (seconds, fractional allowed; default 300): the deadline of every blocking wait
  /// that is not given one explicitly. A wait past it throws flexpar::timeout_error.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};

  /// FLEXPAR_TRANSPORT (mpi | ucx; default mpi): the transport communicator::from_mpi() builds.
  transport_kind transport = transport_kind::mpi;

  /// FLEXPAR_RANKS_PER_NODE (default 0 = detect with MPI_Comm_split_type): treat every run of this
  /// many consecutive ranks as one node. Lets hierarchical algorithms be tested on one machine.
  int ranks_per_node = 0;

  /// FLEXPAR_UCX_SPIN_US (microseconds; default 50): how long a UCX wait polls before it sleeps on
  /// the worker's event file descriptor (so that an idle rank does not burn a core).
  std::chrono::microseconds ucx_spin{50};

  /// Reads every FLEXPAR_* variable above; unset ones keep their defaults. A malformed value throws
  /// flexpar::usage_error naming the variable, the value and what was expected.
  /// `lookup` returns a variable's value (default: std::getenv); tests pass their own.
  static config from_environment(
      const std::function<std::optional<std::string>(std::string_view)>& lookup = environment_lookup);

  /// std::getenv as a lookup function.
  static std::optional<std::string> environment_lookup(std::string_view name);
};

}  // namespace flexpar
