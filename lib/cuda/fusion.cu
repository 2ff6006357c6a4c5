// lib/cuda/fusion.cu — the batched copy of flexpar/cuda/kernels.hpp (fusion_packer): many device regions in one launch.
//
// The host splits every region into units of 16 KiB and numbers them (prefix sums in the descriptor
// table, computed while the host writes the table: it holds the host's pointers, so no device scan is
// needed); block b takes units b, b + grid, ... and finds each unit's region by binary search on those
// prefix sums (libcu++'s cuda::std::upper_bound). Inside a unit the block copies a scalar head, a
// body of 16-byte vectors and a scalar tail when source and destination share their alignment, and
// bytes otherwise.
#include <cuda_runtime.h>

#include <cuda/std/__algorithm/upper_bound.h>

#include <algorithm>
#include <string>

#include <flexpar/cuda/kernels.hpp>

#include "launch.cuh"

namespace flexpar::cuda {
namespace detail {
namespace {

constexpr std::size_t unit_bytes = 16384;
constexpr int copy_unroll = unit_bytes / 16 / block_threads;  // vectors per thread in a full unit

__device__ inline void block_copy(std::byte* dst, const std::byte* src, std::size_t len) {
  const math::vector_split split =
      math::split_for_vectors(reinterpret_cast<std::uintptr_t>(dst), reinterpret_cast<std::uintptr_t>(src),
                              reinterpret_cast<std::uintptr_t>(src), len, 1);
  const std::size_t tail_begin = split.head + split.vectors * 16;
  for (std::size_t i = threadIdx.x; i < split.head; i += blockDim.x) dst[i] = src[i];
  for (std::size_t i = tail_begin + threadIdx.x; i < len; i += blockDim.x) dst[i] = src[i];
  const uint4* s = reinterpret_cast<const uint4*>(src + split.head);
  uint4* d = reinterpret_cast<uint4*>(dst + split.head);
  for (std::size_t base = threadIdx.x; base < split.vectors;
       base += static_cast<std::size_t>(blockDim.x) * copy_unroll) {
    uint4 v[copy_unroll];
#pragma unroll
    for (int u = 0; u < copy_unroll; ++u) {
      const std::size_t k = base + static_cast<std::size_t>(u) * blockDim.x;
      if (k < split.vectors) v[u] = __ldcg(s + k);  // explicit global loads: the table's pointers are generic
    }
#pragma unroll
    for (int u = 0; u < copy_unroll; ++u) {
      const std::size_t k = base + static_cast<std::size_t>(u) * blockDim.x;
      if (k < split.vectors) __stwb(d + k, v[u]);
    }
  }
}

__global__ void __launch_bounds__(block_threads)
    batched_copy_kernel(const math::copy_piece* pieces, std::size_t count, std::size_t units) {
  for (std::size_t unit = blockIdx.x; unit < units; unit += gridDim.x) {
    // the last piece whose first unit is at most `unit` (a piece of no units shares the next one's)
    const math::copy_piece piece = ::cuda::std::upper_bound(
        pieces, pieces + count, unit, [](std::size_t u, const math::copy_piece& p) { return u < p.first_unit; })[-1];
    const std::size_t offset = (unit - piece.first_unit) * unit_bytes;
    const std::size_t len = piece.bytes - offset < unit_bytes ? piece.bytes - offset : unit_bytes;
    block_copy(piece.dst + offset, piece.src + offset, len);
  }
}

}  // namespace
}  // namespace detail

fusion_packer::fusion_packer(std::chrono::milliseconds deadline) : deadline_(deadline) {}

fusion_packer::~fusion_packer() {
  // The staging memory may still be read by a batch in flight: wait for it before it is freed.
  for (slot& sl : slots_) {
    if (!sl.used) continue;
    try {
      wait(sl.done, deadline_, "fusion_packer: the last batch before destruction");
    } catch (...) {  // a destructor cannot throw; cudaFree below synchronizes anyway
    }
  }
}

void fusion_packer::copy(std::span<const copy_region> regions, cudaStream_t s) {
  std::size_t count = 0, units = 0;
  for (const copy_region& r : regions)
    if (r.bytes != 0) ++count, units += (r.bytes + detail::unit_bytes - 1) / detail::unit_bytes;
  if (count == 0) return;

  // step 1: a staging slot that no batch in flight reads any more, large enough
  slot& sl = slots_[next_];
  next_ ^= 1;
  if (sl.used) wait(sl.done, deadline_, "fusion_packer: waiting for a staging slot");
  if (sl.staging.size() < count) {
    const std::size_t capacity = std::max(count, 2 * sl.staging.size());
    sl.staging = pinned_buffer<math::copy_piece>(capacity);
    sl.table = device_buffer<math::copy_piece>(capacity);
  }

  // step 2: the descriptor table with the units' prefix sums, uploaded in one copy
  math::copy_piece* table = sl.staging.data();
  std::size_t k = 0, first_unit = 0;
  for (const copy_region& r : regions) {
    if (r.bytes == 0) continue;
    table[k++] = {static_cast<const std::byte*>(r.src), static_cast<std::byte*>(r.dst), r.bytes, first_unit};
    first_unit += (r.bytes + detail::unit_bytes - 1) / detail::unit_bytes;
  }
  detail::copy_bytes_async(sl.table.data(), table, count * sizeof(math::copy_piece), cudaMemcpyHostToDevice, s);

  // step 3: one kernel for every region
  auto* kernel = &detail::batched_copy_kernel;
  const unsigned grid = detail::grid_for(units, 1, detail::blocks_per_sm(kernel, detail::block_threads));
  kernel<<<grid, detail::block_threads, 0, s>>>(sl.table.data(), count, units);
  detail::check_launch("batched_copy_kernel<<<...>>>");
  sl.done.record(s);
  sl.used = true;
}

namespace {
/// One region per tensor, `make(tensor, offset)` pairing each with the buffer's part at `offset`
/// (consecutive parts). @throws usage_error when the buffer is smaller than the tensors' total.
template <class Tensor, class Make>
void regions_of(std::span<const Tensor> tensors, std::size_t buffer_bytes, const char* op,
                std::vector<copy_region>& regions, Make make) {
  std::size_t total = 0;
  for (const auto& t : tensors) total += t.size();
  detail::check_bytes(op, buffer_bytes, total);
  regions.clear();
  std::size_t offset = 0;
  for (const auto& t : tensors) {
    regions.push_back(make(t, offset));
    offset += t.size();
  }
}
}  // namespace

void fusion_packer::pack(std::span<const device_span<const std::byte>> tensors, device_span<std::byte> buffer,
                         cudaStream_t s) {
  regions_of(tensors, buffer.size(), "cuda::fusion_packer::pack", scratch_, [&](const auto& t, std::size_t offset) {
    return copy_region{t.data(), buffer.data() + offset, t.size()};
  });
  copy(scratch_, s);
}

void fusion_packer::unpack(device_span<const std::byte> buffer, std::span<const device_span<std::byte>> tensors,
                           cudaStream_t s) {
  regions_of(tensors, buffer.size(), "cuda::fusion_packer::unpack", scratch_, [&](const auto& t, std::size_t offset) {
    return copy_region{buffer.data() + offset, t.data(), t.size()};
  });
  copy(scratch_, s);
}

}  // namespace flexpar::cuda
