// lib/cuda/runtime.cpp — the non-template parts of flexpar/cuda/runtime.hpp.
#include <flexpar/cuda/runtime.hpp>

#include <cuda.h>  // CUdeviceptr, CUresult: the types of cuMemGetAddressRange, reached through the runtime

#include <cstdint>

#include <thread>

namespace flexpar::cuda {

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // "no driver" / "no device" is an answer here, not a sticky error
    return 0;
  }
  return n;
}

memory_kind memory_kind_of(const void* p) noexcept {
  if (p == nullptr) return memory_kind::host;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return memory_kind::host;
  }
  return (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) ? memory_kind::cuda : memory_kind::host;
}

int current_device() {
  int d = 0;
  FLEXPAR_CHECK_CUDA(-1, cudaGetDevice(&d));
  return d;
}

device_guard::device_guard(int device) : previous_(current_device()) { FLEXPAR_CHECK_CUDA(-1, cudaSetDevice(device)); }
device_guard::~device_guard() { (void)cudaSetDevice(previous_); }

stream::stream() { FLEXPAR_CHECK_CUDA(-1, cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
stream::~stream() {
  if (s_ != nullptr) (void)cudaStreamDestroy(s_);
}
stream& stream::operator=(stream&& other) noexcept {
  if (this != &other) {
    if (s_ != nullptr) (void)cudaStreamDestroy(s_);
    s_ = std::exchange(other.s_, nullptr);
  }
  return *this;
}

event::event(bool timing, bool interprocess) {
  const unsigned flags = interprocess ? (cudaEventDisableTiming | cudaEventInterprocess)
                                      : (timing ? cudaEventDefault : cudaEventDisableTiming);
  FLEXPAR_CHECK_CUDA(-1, cudaEventCreateWithFlags(&e_, flags));
}
event::~event() {
  if (e_ != nullptr) (void)cudaEventDestroy(e_);
}
event& event::operator=(event&& other) noexcept {
  if (this != &other) {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
    e_ = std::exchange(other.e_, nullptr);
  }
  return *this;
}
void event::record(cudaStream_t s) { FLEXPAR_CHECK_CUDA(-1, cudaEventRecord(e_, s)); }
bool event::done() const {
  const cudaError_t code = cudaEventQuery(e_);
  if (code == cudaSuccess) return true;
  if (code == cudaErrorNotReady) return false;
  flexpar::detail::throw_cuda_failure(-1, code, "cudaEventQuery(event)", std::source_location::current());
}
float event::elapsed_ms(const event& start, const event& stop) {
  float ms = 0;
  FLEXPAR_CHECK_CUDA(-1, cudaEventElapsedTime(&ms, start.e_, stop.e_));
  return ms;
}

allocation_ranges::allocation_ranges() {
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &address_range_, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    address_range_ = nullptr;
    (void)cudaGetLastError();  // without it, nothing is taken for one allocation
  }
}

bool allocation_ranges::one_allocation(const void* begin, std::size_t bytes) const {
  if (address_range_ == nullptr) return false;
  using address_range_fn = CUresult (*)(CUdeviceptr * base, std::size_t * size, CUdeviceptr pointer);
  CUdeviceptr base = 0;
  std::size_t size = 0;
  if (reinterpret_cast<address_range_fn>(address_range_)(&base, &size, reinterpret_cast<CUdeviceptr>(begin)) !=
      CUDA_SUCCESS)
    return false;
  return reinterpret_cast<std::uintptr_t>(begin) + bytes <= static_cast<std::uintptr_t>(base) + size;
}

void stream_wait(cudaStream_t waiter, const event& e) {
  FLEXPAR_CHECK_CUDA(-1, cudaStreamWaitEvent(waiter, e.get(), 0));
}

void wait(const event& e, std::chrono::milliseconds deadline, std::string_view what, int rank) {
  const auto start = std::chrono::steady_clock::now();
  // Spin briefly (most waits are short), then yield the core: a GPU wait must not starve the
  // engine's or the transport's threads.
  for (int spins = 0;; ++spins) {
    const cudaError_t code = cudaEventQuery(e.get());
    if (code == cudaSuccess) return;
    if (code != cudaErrorNotReady) {
      std::string call = "waiting for ";
      call += what;
      flexpar::detail::throw_cuda_failure(rank, code, call.c_str(), std::source_location::current());
    }
    if (std::chrono::steady_clock::now() - start > deadline) {
      throw error_on<timeout_error>(rank, what, "the GPU work did not finish within ", deadline.count(), " ms");
    }
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void synchronize(cudaStream_t s, std::chrono::milliseconds deadline, std::string_view what, int rank) {
  event e(false);
  e.record(s);
  wait(e, deadline, what, rank);
}

namespace detail {

void* device_allocate(std::size_t bytes) {
  void* p = nullptr;
  FLEXPAR_CHECK_CUDA(-1, cudaMalloc(&p, bytes));
  return p;
}
void device_free(void* p) noexcept {
  if (p != nullptr) (void)cudaFree(p);
}
void* pinned_allocate(std::size_t bytes) {
  void* p = nullptr;
  FLEXPAR_CHECK_CUDA(-1, cudaMallocHost(&p, bytes));
  return p;
}
void pinned_free(void* p) noexcept {
  if (p != nullptr) (void)cudaFreeHost(p);
}
void copy_bytes_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (bytes == 0) return;
  FLEXPAR_CHECK_CUDA(-1, cudaMemcpyAsync(dst, src, bytes, kind, s));
}
void throw_size_mismatch(std::string_view op, std::size_t dst, std::size_t src, std::size_t element_bytes) {
  throw error_on<usage_error>(no_rank, std::string("flexpar::cuda::").append(op), "the destination holds ", dst,
                              " elements, the source ", src, " (elements of ", element_bytes, " bytes)");
}

}  // namespace detail
}  // namespace flexpar::cuda
