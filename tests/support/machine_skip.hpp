// FLEXPAR_MACHINE_SKIP(reason): skip a test for what this machine lacks (a CPU feature, a library,
// sysfs, an MPI launch). Where FLEXPAR_TEST_SKIPS_FAIL=1 is set (.ci/run sets it: CI's machine has all
// of these, so a skip there hides a regression) the skip is a failure that says why. A skip by design
// (a case that needs more ranks than this run has) stays GTEST_SKIP; the gpu tests' skip without a
// device is ctest's exit code 77, which scripts/test lets through for the gpu label alone.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

namespace flexpar::testing_support {

/// True where FLEXPAR_TEST_SKIPS_FAIL=1: a machine skip fails.
inline bool machine_skips_fail() {
  const char* v = std::getenv("FLEXPAR_TEST_SKIPS_FAIL");
  return v != nullptr && std::string_view(v) == "1";
}

}  // namespace flexpar::testing_support

#define FLEXPAR_MACHINE_SKIP(reason)                                                                                \
  do {                                                                                                              \
    if (::flexpar::testing_support::machine_skips_fail())                                                           \
      GTEST_FAIL() << "would skip (" << reason << "), but FLEXPAR_TEST_SKIPS_FAIL=1 says this machine must run it"; \
    GTEST_SKIP() << reason;                                                                                         \
  } while (0)
