// flexpar/sbp/buffer_pool.hpp — a bounded cache of shard buffers, so that boxing reuses warm memory.
//
// Why: a boxing returns a new tensor and works through temporaries (packed blocks, gathered rows).
// Allocated fresh each call, buffers of a few MiB sit around glibc's mmap threshold: every call
// maps, page-faults and unmaps them again, which costs more than the collective itself at 4 MiB.
// A buffer_pool keeps the buffers that tensors and boxing temporaries give
// back and hands them out again:
//
//   - size classes by capacity (powers of two): acquire(n) takes a buffer of capacity >= n from the
//     class of n or the next one up (at most 4x the bytes asked for), else allocates;
//   - best fit by size, not only by capacity: a std::vector value-initializes (zeroes) every element
//     it grows into, even within its capacity, so a buffer once cut down (a P -> S(i) result keeps
//     the front of its buffer; a small request served from a large buffer) costs a fill pass when it
//     is grown again. Among the buffers that fit, acquire(n) takes the one that needs the least
//     filling (n - size), then the one whose size is closest above n (cutting it down wastes the
//     fewest initialized elements, which a later large request would have to fill again), then the
//     most recently returned (the warmest). Without this rule a loop boxing S(0) -> B swapped two
//     64 MiB buffers between the shard and the result and zeroed 32 MiB per call, 25% of the call;
//   - bounded: the pool holds at most max_bytes() of capacity; a buffer that does not fit is freed;
//   - typed lists per block type behind one object (a placement holds one pool for every T);
//   - thread-safe (one mutex): copies of a placement may be used from several threads.
//
// The blocks are host vectors (aligned_vector<T>) or any owning buffer that pool_block<> describes:
// cuda/sbp.hpp describes device_buffer<std::byte>, so a device placement's pool is this class too,
// with the same size classes, bound and counters (whose "filled" stays 0: a device block has no
// initialized size apart from its capacity).
//
// Ownership stays with the block: a buffer is either in the pool or owned by exactly one block, so
// a global_tensor remains move-only and owns its shard; the pool frees what it holds when it is
// destroyed (the placement's shared state owns it, and every tensor holds a copy of its placement,
// so the pool outlives the buffers it may receive).
//
// No process-global state: each placement owns its pool (placement_options::pool_bytes), or the
// user passes one shared pool to several placements.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

#include <flexpar/core/aligned_vector.hpp>

namespace flexpar::sbp {

/// How buffer_pool handles a block type: its element type, capacity and initialized size (both in
/// elements), and a new empty block with room for n elements. Specialized for aligned_vector<T>
/// here and for device_buffer<std::byte> in cuda/sbp.hpp.
template <class Block>
struct pool_block;

/// Host vectors: capacity and size are the vector's own (growing within the capacity zeroes elements).
template <class T>
struct pool_block<aligned_vector<T>> {
  using value_type = T;                                                                      ///< element type
  static std::size_t capacity(const aligned_vector<T>& b) noexcept { return b.capacity(); }  ///< elements of room
  static std::size_t size(const aligned_vector<T>& b) noexcept { return b.size(); }          ///< elements initialized
  /// An empty vector with room for `n` elements.
  static aligned_vector<T> make(std::size_t n) {
    aligned_vector<T> v;
    v.reserve(n);
    return v;
  }
};

/// A bounded, thread-safe cache of buffers of any block and element types (header above).
class buffer_pool {
 public:
  /// What the pool has done (for tests and logs).
  struct statistics {
    std::size_t hits = 0;      ///< acquire() served from the cache
    std::size_t misses = 0;    ///< acquire() that allocated
    std::size_t returned = 0;  ///< buffers give_back() kept
    std::size_t dropped = 0;   ///< buffers give_back() freed (over the bound)
    std::size_t filled = 0;    ///< elements acquire() value-initialized past a reused buffer's size
  };

  /// The default bound: 256 MiB of cached capacity.
  static constexpr std::size_t default_max_bytes = std::size_t{256} << 20;

  /// A pool that caches at most `max_bytes` bytes of buffer capacity (0: caches nothing).
  explicit buffer_pool(std::size_t max_bytes = default_max_bytes) noexcept : max_bytes_(max_bytes) {}
  buffer_pool(const buffer_pool&) = delete;             ///< not copyable: buffers have one owner
  buffer_pool& operator=(const buffer_pool&) = delete;  ///< not copyable
  ~buffer_pool() = default;                             ///< frees every cached buffer

  /// A buffer of exactly `n` elements whose contents are unspecified (a reused buffer keeps old
  /// values; the caller writes every element it reads). Elements past the previous size of a reused
  /// buffer are value-initialized.
  template <class T>
  [[nodiscard]] aligned_vector<T> acquire(std::size_t n) {
    aligned_vector<T> v = take<aligned_vector<T>>(n);
    v.resize(n);  // shrinking is free for trivially destructible T; growing fills only the tail
    return v;
  }

  /// A buffer of `n` copies of `value`.
  template <class T>
  [[nodiscard]] aligned_vector<T> acquire(std::size_t n, const T& value) {
    aligned_vector<T> v = take<aligned_vector<T>>(n);
    v.assign(n, value);
    return v;
  }

  /// A buffer holding a copy of `values` (a clone's shard; a std::vector adopted as a shard).
  template <class T>
  [[nodiscard]] aligned_vector<T> acquire_copy(std::span<const T> values) {
    aligned_vector<T> v = take<aligned_vector<T>>(values.size());
    v.assign(values.begin(), values.end());
    return v;
  }

  /// A block of room for at least `n` elements, its contents and size unspecified (pool_block<Block>
  /// says what size means): a cached one when one fits, else a new one. Block is the device's
  /// block, say (cuda/sbp.hpp); host vectors come through acquire().
  template <class Block>
  [[nodiscard]] Block acquire_block(std::size_t n) {
    return take<Block>(n);
  }

  /// Returns `v`'s buffer to the pool (or frees it when the pool is full). Leaves `v` empty.
  /// Never throws: when the free list cannot grow, the buffer is freed instead.
  template <class Block>
  void give_back(Block&& v) noexcept requires(!std::is_lvalue_reference_v<Block>) {
    using traits = pool_block<Block>;
    Block owned = std::move(v);
    v = Block{};
    const std::size_t bytes = traits::capacity(owned) * sizeof(typename traits::value_type);
    if (bytes == 0) return;
    std::lock_guard lock(mutex_);
    if (bytes > max_bytes_ - std::min(max_bytes_, cached_bytes_)) {
      ++stats_.dropped;
      return;  // `owned` frees it
    }
    try {
      lists_for<Block>().by_class[class_of(traits::capacity(owned))].push_back(std::move(owned));
    } catch (const std::bad_alloc&) {  // the free list could not grow: free the buffer instead
      ++stats_.dropped;
      return;
    }
    cached_bytes_ += bytes;
    ++stats_.returned;
  }

  /// Bytes of capacity cached now (<= max_bytes()).
  [[nodiscard]] std::size_t cached_bytes() const {
    std::lock_guard lock(mutex_);
    return cached_bytes_;
  }
  /// The bound on cached_bytes().
  [[nodiscard]] std::size_t max_bytes() const noexcept { return max_bytes_; }
  /// Counters since construction.
  [[nodiscard]] statistics stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  /// Frees every cached buffer.
  void clear() {
    std::lock_guard lock(mutex_);
    lists_.clear();
    cached_bytes_ = 0;
  }

 private:
  static constexpr std::size_t classes = 64;

  struct lists_base {
    virtual ~lists_base() = default;
  };
  template <class Block>
  struct typed_lists final : lists_base {
    std::array<std::vector<Block>, classes> by_class;  // class k: capacity in [2^k, 2^(k+1))
  };

  static std::size_t class_of(std::size_t n) noexcept { return n == 0 ? 0 : std::bit_width(n) - 1; }

  template <class Block>
  typed_lists<Block>& lists_for() {
    for (auto& [type, lists] : lists_)
      if (type == std::type_index(typeid(Block))) return static_cast<typed_lists<Block>&>(*lists);
    lists_.emplace_back(std::type_index(typeid(Block)), std::make_unique<typed_lists<Block>>());
    return static_cast<typed_lists<Block>&>(*lists_.back().second);
  }

  /// A cached buffer of capacity >= n (class of n, or the next one), else a new empty one. Of those
  /// that fit: the least filling, then the least size cut off, then the most recently returned.
  template <class Block>
  Block take(std::size_t n) {
    using traits = pool_block<Block>;
    if (n == 0) return {};
    {
      std::lock_guard lock(mutex_);
      auto& lists = lists_for<Block>();
      const std::size_t k = class_of(n);
      bool found = false;
      std::size_t best_class = 0, best_index = 0, best_fill = 0, best_cut = 0;
      for (std::size_t c = k; c < std::min(k + 2, classes); ++c) {
        auto& list = lists.by_class[c];
        for (std::size_t i = list.size(); i-- > 0;) {  // most recently returned first: wins ties
          if (traits::capacity(list[i]) < n) continue;
          const std::size_t size = traits::size(list[i]);
          const std::size_t fill = size < n ? n - size : 0, cut = size > n ? size - n : 0;
          if (found && (fill > best_fill || (fill == best_fill && cut >= best_cut))) continue;
          found = true;
          best_class = c, best_index = i, best_fill = fill, best_cut = cut;
        }
      }
      if (found) {
        auto& list = lists.by_class[best_class];
        Block v = std::move(list[best_index]);
        list.erase(list.begin() + static_cast<std::ptrdiff_t>(best_index));
        cached_bytes_ -= traits::capacity(v) * sizeof(typename traits::value_type);
        ++stats_.hits;
        stats_.filled += best_fill;  // acquire() grows the buffer into these: std::vector zeroes them
        return v;
      }
      ++stats_.misses;
    }
    return traits::make(n);
  }

  mutable std::mutex mutex_;
  std::size_t max_bytes_;
  std::size_t cached_bytes_ = 0;
  statistics stats_;
  std::vector<std::pair<std::type_index, std::unique_ptr<lists_base>>> lists_;
};

}  // namespace flexpar::sbp
