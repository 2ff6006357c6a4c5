// The settings in-process tests run with: the defaults, but a deadline short enough that a hang
// fails the test well inside its ctest TIMEOUT.
#pragma once

#include <chrono>

#include <flexpar/core/config.hpp>

namespace flexpar::testing_support {

/// config{} with `timeout` as the deadline of every blocking wait.
inline config with_timeout(std::chrono::seconds timeout = std::chrono::seconds(60)) {
  config c;
  c.timeout = timeout;
  return c;
}

}  // namespace flexpar::testing_support
