// flexpar/core/streaming_copy.hpp — copies for passes that touch more memory than the cache holds:
// memcpy with non-temporal stores for large destinations written once, an inline copy for the short
// runs of a packing pass, and the threshold test that picks between them.
//
// Why: a normal store to a line that is not in cache first reads the line (read for ownership), so
// copying into memory moves 3 bytes per byte copied; a non-temporal store writes the full line
// without reading it. glibc's memcpy switches to such stores only above its non_temporal_threshold
// (3/4 of the shared cache), so a copy cut into many short runs (the rows of a tensor split on an
// inner axis) never gets them. Public: the collectives' placing passes and the SBP boxings' strided
// packing and placing passes both use them.
//
// The fence is the caller's: copy runs with copy_streaming_unfenced, then store_fence() once before
// another thread or process may read the data (a fence per short run costs more than it saves).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace flexpar {

/// Whether data of `bytes` is taken to live in memory rather than in cache, given one of the
/// communicator's thresholds (0 = never): for destinations config::streaming_min_bytes
/// (FLEXPAR_STREAMING_MIN_BYTES, default 4 MiB: streaming stores), for the sources of the boxings'
/// packing passes config::source_in_memory_min_bytes (the last-level cache's share of each rank by
/// default: the inline run copy). Another machine may want other values (doc/configuration.md).
constexpr bool in_memory(std::size_t bytes, std::size_t streaming_min_bytes) noexcept {
  return streaming_min_bytes != 0 && bytes >= streaming_min_bytes;
}

/// Copies `bytes` from `src` to `dst` (not overlapping), the bulk with non-temporal stores
/// (x86-64: 16-byte stores; elsewhere memcpy). Not ordered with later stores: store_fence() first.
inline void copy_streaming_unfenced(std::byte* dst, const std::byte* src, std::size_t bytes) noexcept {
#if defined(__x86_64__)
  // Whole cache lines only: a partial line written with streaming stores reaches memory as a partial
  // write-combining flush (the rest of that line is often written by another run of a placing pass),
  // far slower than one cached store. So the head up to a 64-byte boundary and the tail go through
  // the cache.
  const std::size_t head = std::min(bytes, (64 - reinterpret_cast<std::uintptr_t>(dst) % 64) % 64);
  if (head != 0) std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  if (i != bytes) std::memcpy(dst + i, src + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

/// Copies `bytes` from `src` to `dst` (not overlapping) through the cache, inline: for the short runs
/// of a packing pass over a source in memory (512 bytes in a [n, 256] f32 tensor split in two), where
/// a call into the C library's memcpy costs as much as the copy. In cache memcpy's wider stores win,
/// so use it only for sources in memory (in_memory with the source threshold); runs of 2 KiB and
/// more go to memcpy.
inline void copy_run(std::byte* dst, const std::byte* src, std::size_t bytes) noexcept {
#if defined(__x86_64__)
  if (bytes < 2048) {
    std::size_t i = 0;
    for (; i + 16 <= bytes; i += 16)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    for (; i < bytes; ++i) dst[i] = src[i];
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

/// Orders the streaming stores before every later store (x86-64: sfence; elsewhere nothing to do).
inline void store_fence() noexcept {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

/// copy_streaming_unfenced, then the fence: the data is visible in order once this returns.
inline void copy_streaming(std::byte* dst, const std::byte* src, std::size_t bytes) noexcept {
  copy_streaming_unfenced(dst, src, bytes);
  store_fence();
}

}  // namespace flexpar
