// flexpar/core/process.hpp — whether a process of this node has exited: what the waits through
// shared memory ask about the rank they wait for, so that a dead peer on the node is named within
// a fraction of a second instead of at the deadline.
#pragma once

#include <cstdint>

namespace flexpar {

/// True when no live process `pid` runs on this node: it does not exist, or it is a zombie (it
/// exited and its parent, the launcher, has not collected it yet). False for pid <= 0 (unknown).
[[nodiscard]] bool process_gone(std::int64_t pid);

/// This process's pid.
[[nodiscard]] std::int64_t my_pid() noexcept;

}  // namespace flexpar
