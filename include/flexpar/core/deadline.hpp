// flexpar/core/deadline.hpp — the clock and the deadline of every blocking wait.
//
// Every blocking wait in flexpar takes a `deadline` (STYLE §7): a moment on a monotonic clock past
// which it gives up with timeout_error. Below the transport (MPI communicator creation) and above
// it (collectives, the engine) the same type is used.
#pragma once

#include <chrono>

namespace flexpar {

/// The clock of every deadline: monotonic, so that a wall-clock change never fires or delays a timeout.
using clock = std::chrono::steady_clock;
/// The moment a blocking wait gives up with timeout_error.
using deadline = clock::time_point;

/// A deadline `d` from now.
inline deadline deadline_after(clock::duration d) { return clock::now() + d; }

}  // namespace flexpar
