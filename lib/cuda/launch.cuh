// lib/cuda/launch.cuh — internal to lib/cuda: how flexpar's kernels size their grids and check their launches.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <source_location>
#include <string>

#include <cub/device/device_for.cuh>
#include <cub/util_ptx.cuh>
#include <cub/warp/warp_reduce.cuh>
#include <cuda/std/functional>

#include <flexpar/core/check_cuda.hpp>
#include <flexpar/core/error.hpp>

namespace flexpar::cuda::detail {

/// Threads per block of the element-wise kernels (8 warps).
inline constexpr int block_threads = 256;

/// The grid of a grid-stride kernel that has `work` independent items of `per_block` each: enough
/// blocks to fill the device (`blocks_per_sm` resident per multiprocessor, as the kernel's
/// occupancy allows), never more than there is work. The multiprocessor count is asked of the
/// current device at each call (cudaDeviceGetAttribute reads a cached value: no driver round trip).
inline unsigned grid_for(std::size_t work, std::size_t per_block, int blocks_per_sm) {
  if (work == 0) return 0;
  int device = 0, sms = 0;
  FLEXPAR_CHECK_CUDA(-1, cudaGetDevice(&device));
  FLEXPAR_CHECK_CUDA(-1, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const std::size_t needed = (work + per_block - 1) / per_block;
  const std::size_t full = static_cast<std::size_t>(sms) * static_cast<std::size_t>(std::max(blocks_per_sm, 1));
  return static_cast<unsigned>(std::min(needed, full));
}

/// Resident blocks per multiprocessor of `kernel` at `threads` per block (cudaOccupancy…), at least 1.
template <class Kernel>
int blocks_per_sm(Kernel kernel, int threads) {
  int blocks = 0;
  FLEXPAR_CHECK_CUDA(-1, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0));
  return std::max(blocks, 1);
}

/// Throws transport_error when the launch just made failed (bad configuration, no device).
inline void check_launch(const char* what) {
  const cudaError_t code = cudaGetLastError();
  if (code != cudaSuccess) flexpar::detail::throw_cuda_failure(-1, code, what, std::source_location::current());
}

/// usage_error "<op>: spans of A and B elements; they must have the same length".
inline void check_same_length(const char* op, std::size_t a, std::size_t b) {
  if (a == b) return;
  throw error_on<usage_error>(no_rank, op, "spans of ", a, " and ", b, " elements; they must have the same length");
}

/// usage_error "<op>: buffer of H bytes, needs N".
inline void check_bytes(const char* op, std::size_t have, std::size_t need) {
  if (have >= need) return;
  throw error_on<usage_error>(no_rank, op, "buffer of ", have, " bytes, needs ", need);
}

/// `op(i)` for every i of [0, count) on stream `s`: cub::DeviceFor::Bulk (one thread per index, CUB's
/// grid), for the element-wise kernels. `what` names the kernel in the error a failed launch throws.
template <class Op>
void for_each_index(std::size_t count, Op op, cudaStream_t s, const char* what) {
  if (count == 0) return;
  const cudaError_t code = cub::DeviceFor::Bulk(count, op, s);
  if (code != cudaSuccess) flexpar::detail::throw_cuda_failure(-1, code, what, std::source_location::current());
  check_launch(what);
}

/// `v` of every lane of a full warp reduced by `op` (cub::WarpReduce), returned to every lane. A block
/// has at most 32 warps: one TempStorage each (empty for the shuffle form CUB picks for 32 lanes).
template <class T, class Op>
__device__ inline T warp_reduce(T v, Op op) {
  using reduce = cub::WarpReduce<T>;
  __shared__ typename reduce::TempStorage storage[32];
  const T in_lane0 = reduce(storage[threadIdx.x / 32]).Reduce(v, op);
  return cub::ShuffleIndex<32>(in_lane0, 0, 0xffffffffu);
}
struct fmin_op {
  __device__ float operator()(float a, float b) const { return fminf(a, b); }
};
struct fmax_op {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
/// Min and max across a warp (fminf/fmaxf: a NaN lane is ignored) and sum, every lane gets the result.
__device__ inline float warp_min(float v) { return warp_reduce(v, fmin_op{}); }
__device__ inline float warp_max(float v) { return warp_reduce(v, fmax_op{}); }
__device__ inline double warp_sum(double v) { return warp_reduce(v, ::cuda::std::plus<double>{}); }
__device__ inline bool warp_any(bool v) { return __any_sync(0xffffffffu, v) != 0; }

/// A float at any byte address (the compressed formats put floats at offsets that need not be
/// multiples of 4).
__device__ inline float load_float(const std::byte* p) {
  unsigned bits = 0;
  for (int i = 0; i < 4; ++i) bits |= static_cast<unsigned>(static_cast<unsigned char>(p[i])) << (8 * i);
  return __uint_as_float(bits);
}
__device__ inline void store_float(std::byte* p, float v) {
  const unsigned bits = __float_as_uint(v);
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>((bits >> (8 * i)) & 0xffu);
}

}  // namespace flexpar::cuda::detail
