// flexpar/core/memory.hpp — where a buffer lives: the memory kinds (host, cuda) as values and as tag types.
//
// Every buffer flexpar touches lives in one memory kind. The host API (flexpar/collective.hpp, the
// SBP layer's `global_tensor<T, Sbp, memory::host>`) takes host memory; the GPU path
// (flexpar/cuda/*.hpp, built with FLEXPAR_WITH_CUDA) takes `cuda::device_span<T>`, whose type says
// the pointer is device memory, and never hands such a pointer to a transport that cannot read it
// (doc/gpu.md). This header needs no CUDA: the kinds exist in every build, so code can name them
// and a CPU-only build can say clearly that it has no device memory.
#pragma once

#include <concepts>
#include <cstdint>
#include <string_view>

#include <flexpar/version.hpp>

namespace flexpar {

/// The memory kind of a buffer, as a run-time value.
enum class memory_kind : std::uint8_t {
  host,  ///< pageable or pinned host memory: any CPU thread and every transport may read it
  cuda,  ///< CUDA device memory (cudaMalloc): only kernels, cudaMemcpy and CUDA-aware transports read it
};

/// "host" or "cuda", as printed in errors and the timeline.
constexpr std::string_view name_of(memory_kind k) noexcept { return k == memory_kind::host ? "host" : "cuda"; }

/// The memory kinds as types (template arguments of global_tensor and the device spans).
namespace memory {
/// Host memory.
struct host {
  static constexpr memory_kind kind = memory_kind::host;  ///< its run-time value
};
/// CUDA device memory of the current device.
struct cuda {
  static constexpr memory_kind kind = memory_kind::cuda;  ///< its run-time value
};
}  // namespace memory

/// True for the tag types of namespace memory.
template <class M>
concept memory_tag = requires {
  { M::kind } -> std::convertible_to<memory_kind>;
};

/// Whether this build of flexpar has the CUDA path (flexpar::cuda: FLEXPAR_WITH_CUDA found a CUDA
/// compiler). Without it the flexpar/cuda/ headers are installed but their library is not.
inline constexpr bool built_with_cuda = FLEXPAR_HAVE_CUDA == 1;

/// Whether this build has the NCCL transport (flexpar/cuda/nccl.hpp).
inline constexpr bool built_with_nccl = FLEXPAR_HAVE_NCCL == 1;

}  // namespace flexpar
