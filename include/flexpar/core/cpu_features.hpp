// flexpar/core/cpu_features.hpp — what the CPU this process runs on can do, asked once: libflexpar is
// built for baseline x86-64, and the hot loops (the collectives' reductions, the 1-bit compressor's
// sign packing) carry a second AVX2 build that they pick at run time.
#pragma once

namespace flexpar {

/// True when this CPU runs AVX2 instructions (always false off x86-64). Asked of the CPU once per
/// process; thread-safe.
[[nodiscard]] inline bool cpu_has_avx2() noexcept {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

}  // namespace flexpar
