// flexpar/cuda/runtime.hpp — the CUDA runtime as flexpar uses it: device spans that say "this is device memory" in
// their type, owning device and pinned buffers, streams and events, copies between the kinds, and a deadline on every
// wait.
//
// Part of flexpar::cuda (built with FLEXPAR_WITH_CUDA); includes the CUDA runtime header.
//
//   flexpar::cuda::device_buffer<float> grad(n);                 // cudaMalloc, freed by the destructor
//   flexpar::cuda::stream s;                                      // a non-blocking stream
//   flexpar::cuda::copy_async(grad.span(), std::span(host), s);   // host -> device, sizes checked
//   flexpar::cuda::synchronize(s, std::chrono::seconds(60), "upload");  // timeout_error past 60 s
//
// A device pointer never travels in a std::span: device_span<T> has no operator[] and no iterator,
// so host code cannot read it by accident, and the host collectives (std::span) do not accept it.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <flexpar/core/check_cuda.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/core/memory.hpp>

namespace flexpar::cuda {

/// Number of CUDA devices this process sees; 0 when there is no device or no driver (never throws:
/// this is the question a test asks before it skips).
int device_count() noexcept;

/// True when at least one CUDA device is usable.
inline bool device_present() noexcept { return device_count() > 0; }

/// Where `p` points: memory_kind::cuda for device (and managed) memory, memory_kind::host otherwise
/// (pageable, pinned, or a null pointer).
memory_kind memory_kind_of(const void* p) noexcept;

/// A view of `size()` elements of device memory (the device analogue of std::span; read it only from
/// kernels, copies and device-aware transports).
template <class T>
class device_span {
 public:
  using element_type = T;                      ///< the element type (const-qualified for a read-only view)
  using memory_type = memory::cuda;            ///< where the elements live
  constexpr device_span() noexcept = default;  ///< An empty view.
  /// A view of `count` elements at device address `data`.
  constexpr device_span(T* data, std::size_t count) noexcept : data_(data), size_(count) {}
  /// A view of const elements from a view of mutable ones.
  template <class U>
  requires(std::is_convertible_v<U (*)[], T (*)[]> &&
           !std::is_same_v<U, T>) constexpr device_span(device_span<U> other) noexcept
      : data_(other.data()), size_(other.size()) {}

  [[nodiscard]] constexpr T* data() const noexcept { return data_; }                             ///< the device address
  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }                    ///< elements
  [[nodiscard]] constexpr std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }  ///< bytes
  [[nodiscard]] constexpr bool empty() const noexcept { return size_ == 0; }                     ///< no elements
  /// Elements [offset, offset + count).
  [[nodiscard]] constexpr device_span subspan(std::size_t offset, std::size_t count) const noexcept {
    return {data_ + offset, count};
  }
  /// The first `count` elements.
  [[nodiscard]] constexpr device_span first(std::size_t count) const noexcept { return {data_, count}; }
  /// The same bytes as raw bytes.
  [[nodiscard]] device_span<std::conditional_t<std::is_const_v<T>, const std::byte, std::byte>> as_bytes()
      const noexcept {
    using B = std::conditional_t<std::is_const_v<T>, const std::byte, std::byte>;
    return {reinterpret_cast<B*>(data_), size_bytes()};
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The calling thread's current device (cudaGetDevice).
int current_device();

/// Makes `device` current for the calling thread while it lives, and restores the previous one.
class device_guard {
 public:
  /// cudaSetDevice(device); @throws transport_error for a device that does not exist.
  explicit device_guard(int device);
  ~device_guard();
  device_guard(const device_guard&) = delete;             ///< not copyable
  device_guard& operator=(const device_guard&) = delete;  ///< not copyable

 private:
  int previous_;
};

/// An owning, non-blocking CUDA stream (cudaStreamNonBlocking: it does not synchronize with the
/// legacy default stream).
class stream {
 public:
  /// A new stream on the current device.
  stream();
  ~stream();
  stream(stream&& other) noexcept : s_(std::exchange(other.s_, nullptr)) {}  ///< takes ownership
  stream& operator=(stream&& other) noexcept;                                ///< takes ownership
  stream(const stream&) = delete;                                            ///< not copyable
  stream& operator=(const stream&) = delete;                                 ///< not copyable
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }             ///< the raw stream
  operator cudaStream_t() const noexcept { return s_; }                      ///< the raw stream

 private:
  cudaStream_t s_ = nullptr;
};

/// An owning CUDA event (timing enabled unless asked otherwise).
class event {
 public:
  /// A new event; `timing` false gives cudaEventDisableTiming (cheaper, for ordering only);
  /// `interprocess` adds cudaEventInterprocess (an event other processes may wait for through
  /// cudaIpcGetEventHandle; CUDA requires it without timing, so it implies timing false).
  explicit event(bool timing = true, bool interprocess = false);
  ~event();
  event(event&& other) noexcept : e_(std::exchange(other.e_, nullptr)) {}  ///< takes ownership
  event& operator=(event&& other) noexcept;                                ///< takes ownership
  event(const event&) = delete;                                            ///< not copyable
  event& operator=(const event&) = delete;                                 ///< not copyable
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }            ///< the raw event
  /// Records the event on `s` (cudaEventRecord).
  void record(cudaStream_t s);
  /// True when the work recorded before it has finished (cudaEventQuery); throws on a CUDA error.
  [[nodiscard]] bool done() const;
  /// Milliseconds between two recorded, finished events (cudaEventElapsedTime).
  [[nodiscard]] static float elapsed_ms(const event& start, const event& stop);

 private:
  cudaEvent_t e_ = nullptr;
};

/// Makes `waiter` wait (on the device, without blocking the host) for the work recorded in `e`.
void stream_wait(cudaStream_t waiter, const event& e);

/// Which allocation device addresses lie in (the driver's cuMemGetAddressRange, reached through the
/// runtime's entry point: no link to libcuda). One copy, kernel range or collective may not span two
/// allocations, even where the allocator put them back to back (cudaMemcpy refuses it, a CUDA IPC
/// handle covers one): tensors that lie back to back are one buffer only within one allocation.
class allocation_ranges {
 public:
  /// Resolves the entry point (on a driver without it, one_allocation() is always false).
  allocation_ranges();
  /// Whether [begin, begin + bytes) lies in one allocation; false when the driver cannot tell.
  [[nodiscard]] bool one_allocation(const void* begin, std::size_t bytes) const;

 private:
  void* address_range_ = nullptr;  // CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr)
};

/// Blocks until the work recorded in `e` is done, polling, with a deadline: past it throws
/// timeout_error "[rank R] <what>: the GPU work did not finish within N ms". A CUDA error from the
/// work (a failed kernel) throws transport_error.
void wait(const event& e, std::chrono::milliseconds deadline, std::string_view what, int rank = -1);

/// Records an event on `s` and waits for it like wait(): a cudaStreamSynchronize with a deadline.
void synchronize(cudaStream_t s, std::chrono::milliseconds deadline, std::string_view what, int rank = -1);

namespace detail {
void* device_allocate(std::size_t bytes);
void device_free(void* p) noexcept;
void* pinned_allocate(std::size_t bytes);
void pinned_free(void* p) noexcept;
void copy_bytes_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
[[noreturn]] void throw_size_mismatch(std::string_view op, std::size_t dst, std::size_t src, std::size_t bytes);
}  // namespace detail

namespace detail {
/// Memory of `count` T from `Allocate`, returned to `Free` by the destructor; move-only. The base of
/// device_buffer and pinned_buffer, which differ only in where the memory comes from and what view
/// they give.
template <class T, void* (*Allocate)(std::size_t), void (*Free)(void*) noexcept>
class owned_memory {
  static_assert(std::is_trivially_copyable_v<T>, "flexpar::cuda buffers hold trivially copyable types only");

 public:
  owned_memory() noexcept = default;
  explicit owned_memory(std::size_t count)
      : data_(static_cast<T*>(count ? Allocate(count * sizeof(T)) : nullptr)), size_(count) {}
  ~owned_memory() { Free(data_); }
  owned_memory(owned_memory&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  owned_memory& operator=(owned_memory&& other) noexcept {
    if (this != &other) {
      Free(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  owned_memory(const owned_memory&) = delete;
  owned_memory& operator=(const owned_memory&) = delete;

  [[nodiscard]] T* data() const noexcept { return data_; }           ///< the address
  [[nodiscard]] std::size_t size() const noexcept { return size_; }  ///< elements

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};
}  // namespace detail

/// `count` elements of device memory (cudaMalloc), freed by the destructor; move-only. The memory is
/// not initialized. Construction throws transport_error (cudaErrorMemoryAllocation, or no device).
template <class T>
class device_buffer : public detail::owned_memory<T, detail::device_allocate, detail::device_free> {
  using base = detail::owned_memory<T, detail::device_allocate, detail::device_free>;

 public:
  using base::base;
  /// The whole buffer.
  [[nodiscard]] device_span<T> span() const noexcept { return {this->data(), this->size()}; }
};

/// `count` elements of page-locked host memory (cudaMallocHost): host memory that the GPU's copy
/// engines read and write directly (full-speed, truly asynchronous copies); move-only. Construction
/// throws transport_error when the host cannot pin them.
template <class T>
class pinned_buffer : public detail::owned_memory<T, detail::pinned_allocate, detail::pinned_free> {
  using base = detail::owned_memory<T, detail::pinned_allocate, detail::pinned_free>;

 public:
  using base::base;
  /// The whole buffer.
  [[nodiscard]] std::span<T> span() const noexcept { return {this->data(), this->size()}; }
};

/// Host -> device copy on `s` (asynchronous when `src` is pinned). @throws usage_error unless the sizes match.
template <class T, class U>
requires std::is_same_v<std::remove_const_t<U>, T>
void copy_async(device_span<T> dst, std::span<U> src, cudaStream_t s) {
  if (dst.size() != src.size())
    detail::throw_size_mismatch("copy_async(host -> device)", dst.size(), src.size(), sizeof(T));
  detail::copy_bytes_async(dst.data(), src.data(), src.size_bytes(), cudaMemcpyHostToDevice, s);
}
/// Device -> host copy on `s`. @throws usage_error unless the sizes match.
template <class T, class U>
requires std::is_same_v<std::remove_const_t<U>, T>
void copy_async(std::span<T> dst, device_span<U> src, cudaStream_t s) {
  if (dst.size() != src.size())
    detail::throw_size_mismatch("copy_async(device -> host)", dst.size(), src.size(), sizeof(T));
  detail::copy_bytes_async(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDeviceToHost, s);
}
/// Device -> device copy on `s`. @throws usage_error unless the sizes match.
template <class T, class U>
requires std::is_same_v<std::remove_const_t<U>, T>
void copy_async(device_span<T> dst, device_span<U> src, cudaStream_t s) {
  if (dst.size() != src.size())
    detail::throw_size_mismatch("copy_async(device -> device)", dst.size(), src.size(), sizeof(T));
  detail::copy_bytes_async(dst.data(), src.data(), src.size_bytes(), cudaMemcpyDeviceToDevice, s);
}

/// A new device buffer holding a copy of `host`, enqueued on `s` (`host` must stay unchanged until
/// `s` has run the copy).
template <class T>
device_buffer<T> to_device(std::span<const T> host, cudaStream_t s) {
  device_buffer<T> d(host.size());
  copy_async(d.span(), host, s);
  return d;
}
/// Device memory's contents on the host: the copy is enqueued on `s`, which is then waited for as
/// synchronize(s, deadline, what) does. @throws timeout_error past the deadline.
template <class T>
std::vector<std::remove_const_t<T>> to_host(device_span<T> d, cudaStream_t s, std::chrono::milliseconds deadline,
                                            std::string_view what) {
  std::vector<std::remove_const_t<T>> host(d.size());
  copy_async(std::span<std::remove_const_t<T>>(host), d, s);
  synchronize(s, deadline, what);
  return host;
}

}  // namespace flexpar::cuda
