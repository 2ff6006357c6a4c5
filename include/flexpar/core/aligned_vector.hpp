// flexpar/core/aligned_vector.hpp — std::vector whose buffer starts on a cache line.
//
//   flexpar::aligned_vector<float> shard(n);   // shard.data() % 64 == 0
//
// Why: glibc's malloc hands out 16-byte aligned blocks; a large std::vector<float> starts 16 bytes
// past a page. A copy then writes every run of a strided placing (the 512-byte rows of a tensor
// split on an inner axis) across one more cache line than it holds, and the streaming stores the
// shared-memory rounds use for destinations in memory go through the cache at each run's ends
// (streaming_copy.hpp): on a 16-core Intel Xeon host S(1) -> B took about 1.4x as long with
// 16-byte aligned buffers as with 64-byte aligned ones. Global tensors keep their shards in these;
// callers of the bare collectives get the same from them.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace flexpar {

/// The alignment of aligned_vector's buffers: one cache line on x86-64 and most ARM cores.
inline constexpr std::size_t cache_line_bytes = 64;

/// A std::allocator that starts every block on a cache line (aligned operator new).
template <class T>
struct cache_line_allocator {
  using value_type = T;  ///< element type

  cache_line_allocator() noexcept = default;
  /// Rebinding: allocators of every element type are interchangeable.
  template <class U>
  cache_line_allocator(const cache_line_allocator<U>&) noexcept {}  // NOLINT: implicit, as std::allocator

  /// `n` uninitialized elements, the first on a cache_line_bytes boundary.
  [[nodiscard]] T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{alignment()}));
  }
  /// Frees a block from allocate().
  void deallocate(T* p, std::size_t n) noexcept { ::operator delete (p, n * sizeof(T), std::align_val_t{alignment()}); }

  /// Any two compare equal: a block from one may be freed by another.
  template <class U>
  friend bool operator==(const cache_line_allocator&, const cache_line_allocator<U>&) noexcept {
    return true;
  }

 private:
  static constexpr std::size_t alignment() noexcept {
    return alignof(T) > cache_line_bytes ? alignof(T) : cache_line_bytes;
  }
};

/// A std::vector whose data() lies on a cache line: the storage of global tensors' shards and of the
/// buffer pool.
template <class T>
using aligned_vector = std::vector<T, cache_line_allocator<T>>;

}  // namespace flexpar
