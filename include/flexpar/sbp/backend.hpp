// flexpar/sbp/backend.hpp — what the SBP layer needs of the memory its shards live in. global_tensor,
// dynamic_tensor, boxing, placement changes and the ops are written once over backend<Memory>:
//
//   backend<memory::host>   shards are aligned_vector<T> from the placement's buffer_pool, the kernels
//                           loops and the BLAS (host_kernels.hpp); here
//   backend<memory::cuda>   shards are cuda::device_shard<T> from the device placement's pool, every
//                           call on the placement's stream, the kernels CUDA and cuBLAS; in
//                           <flexpar/cuda/sbp.hpp>, part of flexpar::cuda
//
// A backend has:
//   available, host_memory                     true; whether the shards are host memory
//   placement_type<N>, shard<T>, span<T>       its placement of a mesh of N axes, a shard, its elements
//   view<T>                                    what box_axis takes for one mesh axis (axis_view here)
//   acquire<T>(where, n), give_back(where, s)  shards from the placement's pool and back
//   elements(s)                                a shard's elements
//   copy(where, dst, src), fill(where, s, v)   on the placement's stream where it has one
//   host_placement(where)                      the placement<N> of the same mesh (checks, gathers)
//   readable(where, s)                         s readable by the host (itself here; a download there)
//   from_host(where, host_span), read(where, s, i)  a shard from host values; one element to the host
//   axis(where, d, group_shape, shard)         the view of mesh axis d around my shard
//   the kernels of host_kernels.hpp            what the ops compute with
// The host-only fast paths of boxing (uneven collectives, the placed exchanges, the shared-memory
// rounds) are box_axis overloads on the host's view (boxing/axis.hpp); another memory's view gets the
// scripts of equal blocks (boxing/equal_blocks.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include <flexpar/core/memory.hpp>
#include <flexpar/sbp/boxing/strided_copy.hpp>
#include <flexpar/sbp/buffer_pool.hpp>
#include <flexpar/sbp/host_kernels.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/sbp/placement.hpp>

namespace flexpar::sbp {

/// Host memory: the default memory kind of global tensors (core/memory.hpp).
using host = flexpar::memory::host;

/// The SBP layer's view of one memory kind (header above). Not available unless specialized.
template <class Memory>
struct backend {
  static constexpr bool available = false;  ///< no backend for this memory in this translation unit
};

/// Host memory (header above).
template <>
struct backend<memory::host> : host_kernels {
  static constexpr bool available = true;    ///< see backend
  static constexpr bool host_memory = true;  ///< shards are host memory
  template <std::size_t N>
  using placement_type = placement<N>;  ///< the placement of a mesh of N axes
  template <class T>
  using shard = aligned_vector<T>;  ///< a shard
  template <class T>
  using span = std::span<T>;  ///< a shard's elements
  template <class T>
  using view = axis_view<T>;  ///< one mesh axis's boxing

  /// `n` elements from the placement's pool (contents unspecified).
  template <class T, std::size_t N>
  static shard<T> acquire(const placement<N>& where, std::size_t n) {
    return where.pool().template acquire<T>(n);
  }
  /// `s` back to the placement's pool.
  template <class T, std::size_t N>
  static void give_back(const placement<N>& where, shard<T>&& s) noexcept {
    where.pool().give_back(std::move(s));
  }
  /// The elements of `s`.
  template <class T>
  static std::span<T> elements(shard<T>& s) noexcept {
    return s;
  }
  /// The elements of `s`.
  template <class T>
  static std::span<const T> elements(const shard<T>& s) noexcept {
    return s;
  }
  /// dst = src.
  template <class T, std::size_t N>
  static void copy(const placement<N>&, std::span<T> dst, std::span<const T> src) {
    std::copy(src.begin(), src.end(), dst.begin());
  }
  /// Every element of `s` set to `value`.
  template <class T, std::size_t N>
  static void fill(const placement<N>&, std::span<T> s, const T& value) {
    std::fill(s.begin(), s.end(), value);
  }
  /// The placement itself.
  template <std::size_t N>
  static const placement<N>& host_placement(const placement<N>& where) noexcept {
    return where;
  }
  /// `s` itself: host memory is readable as it is.
  template <class T, std::size_t N>
  static std::span<const T> readable(const placement<N>&, std::span<const T> s) noexcept {
    return s;
  }
  /// A shard holding a copy of `values`.
  template <class T, std::size_t N>
  static shard<T> from_host(const placement<N>& where, std::span<const T> values) {
    return where.pool().acquire_copy(values);
  }
  /// Element `i` of `s`.
  template <class T, std::size_t N>
  static T read(const placement<N>&, std::span<const T> s, std::size_t i) {
    return s[i];
  }
  /// The view of mesh axis `d` around my shard `local` (group_shape: what the axis's group holds).
  template <class T, std::size_t N>
  static axis_view<T> axis(const placement<N>& where, std::size_t d, shape_t group_shape, shard<T>&& local) {
    return axis_view<T>{where.axis(d), std::move(group_shape), std::move(local), where.pool()};
  }
};

/// The memory tag of a placement type (placement<N>: memory::host; cuda::device_placement<N>: memory::cuda).
template <class Where>
using memory_of = typename Where::memory_type;

}  // namespace flexpar::sbp
