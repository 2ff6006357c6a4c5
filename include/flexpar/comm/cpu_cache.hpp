// flexpar/comm/cpu_cache.hpp — the last-level cache a communicator divides among the ranks of its node
// (config::source_in_memory_min_bytes, when unset, is this share: collective/automatic.hpp sends a
// message from its source buffer up to it and streams larger ones).
//
// Read from Linux's sysfs description of cpu0's caches (index0/, index1/, ... with level, type and
// size files), not sysconf(_SC_LEVEL3_CACHE_SIZE): on the 2-core AMD EPYC VM glibc reports 320 MiB
// there, where sysfs (and lscpu) says 32 MiB. A machine whose sysfs names no cache (some VMs and
// containers) gets the fallback.
#pragma once

#include <cstddef>
#include <filesystem>

namespace flexpar {

/// Bytes of the last-level cache `cache_dir` describes in sysfs's layout: the highest level of a data
/// or unified cache (its size file: "32768K", "1M", bytes without a unit); 0 when it names none.
std::size_t last_level_cache_bytes(const std::filesystem::path& cache_dir = "/sys/devices/system/cpu/cpu0/cache");

/// `cache` divided among `ranks_on_node` ranks (at least 1 byte), or `fallback` when `cache` is 0.
constexpr std::size_t cache_share(std::size_t cache, int ranks_on_node, std::size_t fallback) noexcept {
  if (cache == 0) return fallback;
  const std::size_t share = cache / static_cast<std::size_t>(ranks_on_node > 1 ? ranks_on_node : 1);
  return share > 0 ? share : 1;
}

}  // namespace flexpar
