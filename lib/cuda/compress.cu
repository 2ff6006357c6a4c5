// lib/cuda/compress.cu — the compression kernels of flexpar/cuda/kernels.hpp: min-max uint8 (encode, decode,
// decode-add) and 1-bit signs with error feedback (encode, decode), in the host compressors' byte formats.
//
// One warp per chunk (a grid-stride loop over chunks): the warp reduces its chunk's min/max (or sum
// of |v|) with shuffles, lane 0 writes the chunk's header, and the lanes write the codes (min-max:
// four per lane per round, with 16-byte loads where the layout is aligned; 1-bit: one warp ballot
// gives 32 signs = 4 bytes of the format). For chunks of at most 1024 floats (min-max; default 512)
// or 2048 (1-bit; the default) the encoders hold each lane's part of the chunk in registers, its
// loads issued together: the chunk is read once instead of twice, with many loads in flight. The
// 1-bit decoder gives each warp a 512-element piece of a chunk instead. The arithmetic per
// element is kernel_math.hpp's, shared with the CPU test. A non-finite input is reported through a
// device status word: the smallest offending index, by atomicMin.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include <flexpar/cuda/kernels.hpp>

#include "launch.cuh"

namespace flexpar::cuda {
namespace detail {
namespace {

constexpr unsigned long long no_error = ~0ull;
constexpr unsigned full_mask = 0xffffffffu;
constexpr int warps_per_block = block_threads / 32;

struct warp_position {
  std::size_t warp;   // this warp's index in the grid
  std::size_t warps;  // warps in the grid
  unsigned lane;
};

__device__ inline warp_position where_am_i() {
  return {(static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32,
          static_cast<std::size_t>(gridDim.x) * blockDim.x / 32, threadIdx.x % 32};
}

/// Chunk c of a tensor of n elements: its first element and its length (only the last may be short).
struct chunk_range {
  std::size_t begin;
  std::size_t size;
};
__device__ inline chunk_range chunk_at(std::size_t c, std::size_t chunk, std::size_t n) {
  const std::size_t begin = c * chunk;
  return {begin, n - begin < chunk ? n - begin : chunk};
}

/// Records `index` as a non-finite element when it is smaller than what the word holds.
__device__ inline void report_non_finite(unsigned long long* status, unsigned long long index) {
  if (index != no_error) atomicMin(status, index);
}

// ---- min-max uint8 ----------------------------------------------------------------------------------

/// One float4 of a chunk (its first element at index `at` of the tensor) into the lane's min, max
/// and first non-finite index.
__device__ inline void take_vector(const float4 v, std::size_t at, float& lo, float& hi,
                                   unsigned long long& first_bad) {
  lo = fminf(fminf(lo, v.x), fminf(v.y, fminf(v.z, v.w)));
  hi = fmaxf(fmaxf(hi, v.x), fmaxf(v.y, fmaxf(v.z, v.w)));
  if (first_bad == no_error && !(math::finite(v.x) && math::finite(v.y) && math::finite(v.z) && math::finite(v.w)))
    first_bad = at + (math::finite(v.x) ? (math::finite(v.y) ? (math::finite(v.z) ? 3 : 2) : 1) : 0);
}

__device__ inline uchar4 codes_of(const float4 v, float lo, float scale) {
  uchar4 codes;
  codes.x = math::minmax_code(v.x, lo, scale);
  codes.y = math::minmax_code(v.y, lo, scale);
  codes.z = math::minmax_code(v.z, lo, scale);
  codes.w = math::minmax_code(v.w, lo, scale);
  return codes;
}

// Vectorized: `in` is 16-byte aligned, chunk % 4 == 0 and `out` 4-byte aligned, so every chunk's
// floats start 16-byte aligned and its codes 4-byte aligned. Held > 0 (Vectorized, chunk <= 128 Held):
// each lane loads all of its Held vectors of the chunk before it uses any, and step 3 codes them from
// those registers. Held = 0 reads the chunk twice, one vector per lane in flight at a time: at the
// default 512-float chunk that ran at 0.65 of a device copy on an H100 at 256 MiB, held at 0.95.
template <bool Vectorized, int Held>
__global__ void __launch_bounds__(block_threads) minmax_encode_kernel(const float* in, std::size_t n, std::size_t chunk,
                                                                      std::byte* out, unsigned long long* status) {
  static_assert(Held == 0 || Vectorized, "registers hold float4 vectors");
  const warp_position me = where_am_i();
  const std::size_t chunks = (n + chunk - 1) / chunk;
  for (std::size_t c = me.warp; c < chunks; c += me.warps) {
    const auto [begin, m] = chunk_at(c, chunk, n);
    const float* x = in + begin;
    const std::size_t body = Vectorized ? m / 4 * 4 : 0;  // elements read as float4
    auto held_at = [&](int k) { return 4 * (me.lane + 32 * static_cast<std::size_t>(k)); };

    // step 1: the chunk's min and max, and its first non-finite element
    float lo = INFINITY, hi = -INFINITY;
    unsigned long long first_bad = no_error;
    float4 held[Held > 0 ? Held : 1];
    if constexpr (Held > 0) {
#pragma unroll
      for (int k = 0; k < Held; ++k)  // every load first
        if (held_at(k) < body) held[k] = *reinterpret_cast<const float4*>(x + held_at(k));
#pragma unroll
      for (int k = 0; k < Held; ++k)
        if (held_at(k) < body) take_vector(held[k], begin + held_at(k), lo, hi, first_bad);
    } else if constexpr (Vectorized) {
      for (std::size_t i = 4 * me.lane; i < body; i += 4 * 32)
        take_vector(*reinterpret_cast<const float4*>(x + i), begin + i, lo, hi, first_bad);
    }
    for (std::size_t i = body + me.lane; i < m; i += 32) {
      lo = fminf(lo, x[i]);
      hi = fmaxf(hi, x[i]);
      if (first_bad == no_error && !math::finite(x[i])) first_bad = begin + i;
    }
    lo = warp_min(lo);
    hi = warp_max(hi);
    if (warp_any(first_bad != no_error)) {  // the host encoder throws: leave the chunk, report the index
      report_non_finite(status, first_bad);
      continue;
    }

    // step 2: the header [min][max]
    std::byte* header = out + math::minmax_chunk_offset(c, chunk);
    if (me.lane == 0) {
      store_float(header, lo);
      store_float(header + sizeof(float), hi);
    }

    // step 3: the codes
    const float scale = math::minmax_scale(lo, hi);
    std::uint8_t* q = reinterpret_cast<std::uint8_t*>(header + math::minmax_header_bytes);
    if constexpr (Held > 0) {
#pragma unroll
      for (int k = 0; k < Held; ++k)
        if (held_at(k) < body) *reinterpret_cast<uchar4*>(q + held_at(k)) = codes_of(held[k], lo, scale);
    } else if constexpr (Vectorized) {
      for (std::size_t i = 4 * me.lane; i < body; i += 4 * 32)
        *reinterpret_cast<uchar4*>(q + i) = codes_of(*reinterpret_cast<const float4*>(x + i), lo, scale);
    }
    for (std::size_t i = body + me.lane; i < m; i += 32) q[i] = math::minmax_code(x[i], lo, scale);
  }
}

// out[i] = decode(in)[i] (Accumulate: out[i] += decode(in)[i]). Vectorized: `out` 16-byte aligned,
// chunk % 4 == 0, `in` 4-byte aligned.
template <bool Vectorized, bool Accumulate>
__global__ void __launch_bounds__(block_threads)
    minmax_decode_kernel(const std::byte* in, std::size_t n, std::size_t chunk, float* out) {
  const warp_position me = where_am_i();
  const std::size_t chunks = (n + chunk - 1) / chunk;
  for (std::size_t c = me.warp; c < chunks; c += me.warps) {
    const auto [begin, m] = chunk_at(c, chunk, n);
    const std::size_t body = Vectorized ? m / 4 * 4 : 0;
    const std::byte* header = in + math::minmax_chunk_offset(c, chunk);
    const float lo = load_float(header);
    const float step = math::minmax_step(lo, load_float(header + sizeof(float)));
    const std::uint8_t* q = reinterpret_cast<const std::uint8_t*>(header + math::minmax_header_bytes);
    float* y = out + begin;
    if constexpr (Vectorized)
      for (std::size_t i = 4 * me.lane; i < body; i += 4 * 32) {
        const uchar4 codes = *reinterpret_cast<const uchar4*>(q + i);
        float4 v = make_float4(math::minmax_value(codes.x, lo, step), math::minmax_value(codes.y, lo, step),
                               math::minmax_value(codes.z, lo, step), math::minmax_value(codes.w, lo, step));
        if constexpr (Accumulate) {
          const float4 a = *reinterpret_cast<const float4*>(y + i);
          v = make_float4(math::add_rn(a.x, v.x), math::add_rn(a.y, v.y), math::add_rn(a.z, v.z),
                          math::add_rn(a.w, v.w));
        }
        *reinterpret_cast<float4*>(y + i) = v;
      }
    for (std::size_t i = body + me.lane; i < m; i += 32) {
      const float v = math::minmax_value(q[i], lo, step);
      y[i] = Accumulate ? math::add_rn(y[i], v) : v;
    }
  }
}

// ---- 1-bit ------------------------------------------------------------------------------------------

// Elements per lane whose loads the 1-bit encoder issues together (a batch: its inputs and residuals,
// 2 x 16 loads in flight per lane), and the group of a chunk it holds when it does not hold all of it.
constexpr int onebit_batch = 16;

// Held > 0 (chunks of at most 32 Held elements): each lane loads all of its inputs and residuals of
// the chunk before it uses any and keeps v = residual + x in registers for step 2, so the chunk is
// read once. Held = 0: groups of onebit_batch elements per lane, read again in step 2 (from L2 at
// best). Either way the loads go out a batch at a time (all 64 of a held chunk at once took 226
// registers and ran slower). At the default 2048-element chunk on an H100, one load in flight per lane
// and two reads ran at 0.53-0.56 of a device copy; held in batches, 0.90-0.91 (128 registers). The
// arithmetic and its order per lane are the same in every form.
template <int Held>
__global__ void __launch_bounds__(block_threads)
    onebit_encode_kernel(const float* in, float* residual, std::size_t n, std::size_t chunk, std::byte* out,
                         unsigned long long* status) {
  constexpr int group = Held > 0 ? Held : onebit_batch;  // elements per lane per group of the chunk
  static_assert(group % onebit_batch == 0, "a group is whole batches");
  const warp_position me = where_am_i();
  const std::size_t chunks = (n + chunk - 1) / chunk;
  const std::size_t full_chunk_bytes = math::onebit_chunk_bytes(chunk);
  for (std::size_t c = me.warp; c < chunks; c += me.warps) {
    const auto [begin, m] = chunk_at(c, chunk, n);
    const float* x = in + begin;
    float* r = residual + begin;
    float v[group];  // v = residual + x of the lane's elements g0 + 32 k of the current group

    // step 1: scale = mean |x + residual| (lane sums in float, the warp's sum in double, as the host
    // sums its lanes); the first non-finite input
    float part = 0.0f;
    unsigned long long first_bad = no_error;
    auto sum_group = [&](std::size_t g0) {
#pragma unroll
      for (int b0 = 0; b0 < group; b0 += onebit_batch) {
        float xs[onebit_batch];
#pragma unroll
        for (int k = 0; k < onebit_batch; ++k) {  // the batch's loads first
          const std::size_t i = g0 + 32 * static_cast<std::size_t>(b0 + k) + me.lane;
          if (i < m) {
            xs[k] = x[i];
            v[b0 + k] = r[i];
          }
        }
#pragma unroll
        for (int k = 0; k < onebit_batch; ++k) {
          const std::size_t i = g0 + 32 * static_cast<std::size_t>(b0 + k) + me.lane;
          if (i < m) {
            v[b0 + k] = math::add_rn(v[b0 + k], xs[k]);
            part = math::add_rn(part, fabsf(v[b0 + k]));
            if (first_bad == no_error && !math::finite(xs[k])) first_bad = begin + i;
          }
        }
      }
    };
    if constexpr (Held > 0)
      sum_group(0);  // the whole chunk: no loop, so that v stays in registers for step 2
    else
      for (std::size_t g0 = 0; g0 < m; g0 += 32 * group) sum_group(g0);
    if (warp_any(first_bad != no_error)) {  // the host refuses the input: keep this chunk's residual
      report_non_finite(status, first_bad);
      continue;
    }
    const double total = warp_sum(static_cast<double>(part));
    const float scale = static_cast<float>(total / static_cast<double>(m));
    std::byte* header = out + c * full_chunk_bytes;
    if (me.lane == 0) store_float(header, scale);

    // step 2: 32 signs per ballot = 4 bytes of the format; the residual keeps what was not sent
    std::byte* bits = header + sizeof(float);
    auto send_group = [&](std::size_t g0) {
      if constexpr (Held == 0) {
#pragma unroll
        for (int k = 0; k < group; ++k) {
          const std::size_t i = g0 + 32 * static_cast<std::size_t>(k) + me.lane;
          if (i < m) v[k] = math::add_rn(r[i], x[i]);
        }
      }
#pragma unroll
      for (int k = 0; k < group; ++k) {
        const std::size_t i0 = g0 + 32 * static_cast<std::size_t>(k);
        if (i0 >= m) break;  // the same for every lane: the ballots stay whole-warp
        const std::size_t i = i0 + me.lane;
        const bool valid = i < m;
        const bool negative = valid && math::onebit_negative(v[k]);
        const unsigned word = __ballot_sync(full_mask, negative);
        if (valid) r[i] = math::onebit_feedback(v[k], scale);
        const std::size_t bytes_here = (m - i0 < 32 ? m - i0 + 7 : 32) / 8;  // never past the chunk
        if (me.lane < bytes_here) bits[i0 / 8 + me.lane] = static_cast<std::byte>((word >> (8 * me.lane)) & 0xffu);
      }
    };
    if constexpr (Held > 0)
      send_group(0);
    else
      for (std::size_t g0 = 0; g0 < m; g0 += 32 * group) send_group(g0);
  }
}

// Elements a warp of the vectorized 1-bit decoder writes: a piece of a chunk, whatever the chunk's
// size, so that every lane has four 16-byte stores and its four sign bytes loaded first. On an H100
// at 256 MiB: 0.84-0.85 of a device copy at the default 2048-element chunk, and 0.86 at 8192 where a
// warp per chunk gave 0.79. At 64 MiB the default stays at 0.79: splitting the chunks into pieces
// (16384 warps instead of 8192) did not move it; the decoder writes 64 MiB in 34 us and reads 2 MiB.
constexpr std::size_t onebit_decode_piece = 512;

// Vectorized: `out` 16-byte aligned and chunk % 4 == 0; one warp per piece of a chunk
// (onebit_decode_piece elements), each lane loading the four bytes that hold its four nibbles before
// it writes the four 16-byte stores of their values. Otherwise one warp per chunk, element by element.
template <bool Vectorized>
__global__ void __launch_bounds__(block_threads)
    onebit_decode_kernel(const std::byte* in, std::size_t n, std::size_t chunk, float* out) {
  constexpr int held = static_cast<int>(onebit_decode_piece / (4 * 32));  // nibbles per lane per piece
  const warp_position me = where_am_i();
  const std::size_t chunks = (n + chunk - 1) / chunk;
  const std::size_t full_chunk_bytes = math::onebit_chunk_bytes(chunk);
  const std::size_t pieces = Vectorized ? (chunk + onebit_decode_piece - 1) / onebit_decode_piece : 1;
  for (std::size_t w = me.warp; w < chunks * pieces; w += me.warps) {
    const std::size_t c = w / pieces;
    const auto [begin, m] = chunk_at(c, chunk, n);
    const std::size_t from = Vectorized ? w % pieces * onebit_decode_piece : 0;
    if (from >= m) continue;  // the last chunk is short: fewer pieces
    const std::size_t to = Vectorized ? std::min(m, from + onebit_decode_piece) : m;
    const std::byte* header = in + c * full_chunk_bytes;
    const float scale = load_float(header);
    const auto* bits = reinterpret_cast<const std::uint8_t*>(header + sizeof(float));
    const std::size_t body = Vectorized ? from + (to - from) / 4 * 4 : from;  // from is a multiple of 4
    if constexpr (Vectorized) {
      unsigned bytes[held];
#pragma unroll
      for (int k = 0; k < held; ++k) {
        const std::size_t i = from + 4 * (me.lane + 32 * static_cast<std::size_t>(k));
        if (i < body) bytes[k] = bits[i / 8];
      }
#pragma unroll
      for (int k = 0; k < held; ++k) {
        const std::size_t i = from + 4 * (me.lane + 32 * static_cast<std::size_t>(k));
        if (i >= body) break;
        const unsigned nibble = (bytes[k] >> (i % 8)) & 0xfu;
        *reinterpret_cast<float4*>(out + begin + i) =
            make_float4(math::onebit_value((nibble & 1u) != 0, scale), math::onebit_value((nibble & 2u) != 0, scale),
                        math::onebit_value((nibble & 4u) != 0, scale), math::onebit_value((nibble & 8u) != 0, scale));
      }
    }
    for (std::size_t i = body + me.lane; i < to; i += 32)
      out[begin + i] = math::onebit_value(((bits[i / 8] >> (i % 8)) & 1u) != 0, scale);
  }
}

template <class Kernel>
unsigned warp_per_chunk_grid(Kernel kernel, std::size_t chunks) {
  return grid_for(chunks, warps_per_block, blocks_per_sm(kernel, block_threads));
}

bool aligned(const void* p, std::size_t to) { return reinterpret_cast<std::uintptr_t>(p) % to == 0; }

/// Copies the status word to the host and waits; when it names an element, reads that element and
/// throws usage_error "<who>: element I is V; <need>".
void check_status(const unsigned long long* status, unsigned long long* host, const float* input, cudaStream_t s,
                  std::chrono::milliseconds deadline, int rank, const char* who, const char* need) {
  if (input == nullptr) return;  // no encode yet, or an empty one: the status word says nothing
  copy_bytes_async(host, status, sizeof *host, cudaMemcpyDeviceToHost, s);
  synchronize(s, deadline, who, rank);
  if (*host == no_error) return;
  const std::size_t index = static_cast<std::size_t>(*host);
  float value = 0;
  copy_bytes_async(&value, input + index, sizeof value, cudaMemcpyDeviceToHost, s);
  synchronize(s, deadline, who, rank);
  // A rank below 0 (a caller without a communicator) leaves the prefix out rather than "[rank ?] ".
  std::string text = rank >= 0 ? on_rank(rank, who) : std::string(who).append(": ");
  text.append("element ")
      .append(std::to_string(index))
      .append(" is ")
      .append(std::to_string(value))
      .append("; ")
      .append(need);
  throw usage_error(text);
}

}  // namespace
}  // namespace detail

// ---- minmax_uint8 -------------------------------------------------------------------------------------

minmax_uint8::minmax_uint8(std::size_t chunk) : chunk_(chunk) {
  if (chunk == 0) throw error_on<usage_error>(no_rank, "cuda::minmax_uint8", "chunk must be positive");
  status_ = device_buffer<unsigned long long>(1);
  status_host_ = pinned_buffer<unsigned long long>(1);
}

void minmax_uint8::encode(device_span<const float> in, device_span<std::byte> out, cudaStream_t s) {
  detail::check_bytes("cuda::minmax_uint8::encode", out.size(), encoded_size(in.size()));
  last_input_ = in.data();
  FLEXPAR_CHECK_CUDA(-1, cudaMemsetAsync(status_.data(), 0xff, sizeof(unsigned long long), s));
  if (in.empty()) return;
  const bool vectorized = detail::aligned(in.data(), 16) && detail::aligned(out.data(), 4) && chunk_ % 4 == 0;
  auto* kernel = !vectorized      ? &detail::minmax_encode_kernel<false, 0>
                 : chunk_ <= 512  ? &detail::minmax_encode_kernel<true, 4>
                 : chunk_ <= 1024 ? &detail::minmax_encode_kernel<true, 8>
                                  : &detail::minmax_encode_kernel<true, 0>;
  const unsigned grid = detail::warp_per_chunk_grid(kernel, (in.size() + chunk_ - 1) / chunk_);
  kernel<<<grid, detail::block_threads, 0, s>>>(in.data(), in.size(), chunk_, out.data(), status_.data());
  detail::check_launch("minmax_encode_kernel<<<...>>>");
}

void minmax_uint8::check(cudaStream_t s, std::chrono::milliseconds deadline, int rank) {
  detail::check_status(status_.data(), status_host_.data(), last_input_, s, deadline, rank,
                       "cuda::minmax_uint8::encode", "min-max quantization needs finite values");
}

namespace {
template <bool Accumulate>
void launch_minmax_decode(const std::byte* in, float* out, std::size_t n, std::size_t chunk, cudaStream_t s) {
  if (n == 0) return;
  const bool vectorized = detail::aligned(out, 16) && detail::aligned(in, 4) && chunk % 4 == 0;
  auto* kernel =
      vectorized ? &detail::minmax_decode_kernel<true, Accumulate> : &detail::minmax_decode_kernel<false, Accumulate>;
  const unsigned grid = detail::warp_per_chunk_grid(kernel, (n + chunk - 1) / chunk);
  kernel<<<grid, detail::block_threads, 0, s>>>(in, n, chunk, out);
  detail::check_launch("minmax_decode_kernel<<<...>>>");
}
}  // namespace

void minmax_uint8::decode(device_span<const std::byte> in, device_span<float> out, cudaStream_t s) const {
  detail::check_bytes("cuda::minmax_uint8::decode", in.size(), encoded_size(out.size()));
  launch_minmax_decode<false>(in.data(), out.data(), out.size(), chunk_, s);
}

void minmax_uint8::decode_add(device_span<const std::byte> in, device_span<float> acc, cudaStream_t s) const {
  detail::check_bytes("cuda::minmax_uint8::decode_add", in.size(), encoded_size(acc.size()));
  launch_minmax_decode<true>(in.data(), acc.data(), acc.size(), chunk_, s);
}

// ---- onebit -----------------------------------------------------------------------------------------

onebit::onebit(std::size_t count, std::size_t chunk) : chunk_(chunk) {
  if (chunk == 0) throw error_on<usage_error>(no_rank, "cuda::onebit", "chunk must be positive");
  residual_ = device_buffer<float>(count);
  status_ = device_buffer<unsigned long long>(1);
  status_host_ = pinned_buffer<unsigned long long>(1);
  stream zeroing;
  reset(zeroing);
  synchronize(zeroing, std::chrono::seconds(60), "cuda::onebit: zeroing the residual");
}

void onebit::reset(cudaStream_t s) {
  if (residual_.size() != 0)
    FLEXPAR_CHECK_CUDA(-1, cudaMemsetAsync(residual_.data(), 0, residual_.size() * sizeof(float), s));
}

void onebit::encode(device_span<const float> x, device_span<std::byte> out, cudaStream_t s) {
  if (x.size() != residual_.size()) {
    throw error_on<usage_error>(no_rank, "cuda::onebit::encode", x.size(), " values for a compressor of ",
                                residual_.size());
  }
  detail::check_bytes("cuda::onebit::encode", out.size(), encoded_size(x.size()));
  last_input_ = x.data();
  FLEXPAR_CHECK_CUDA(-1, cudaMemsetAsync(status_.data(), 0xff, sizeof(unsigned long long), s));
  if (x.empty()) return;
  auto* kernel = chunk_ <= 512    ? &detail::onebit_encode_kernel<16>
                 : chunk_ <= 2048 ? &detail::onebit_encode_kernel<64>
                                  : &detail::onebit_encode_kernel<0>;
  const unsigned grid = detail::warp_per_chunk_grid(kernel, (x.size() + chunk_ - 1) / chunk_);
  kernel<<<grid, detail::block_threads, 0, s>>>(x.data(), residual_.data(), x.size(), chunk_, out.data(),
                                                status_.data());
  detail::check_launch("onebit_encode_kernel<<<...>>>");
}

void onebit::check(cudaStream_t s, std::chrono::milliseconds deadline, int rank) {
  detail::check_status(status_.data(), status_host_.data(), last_input_, s, deadline, rank, "cuda::onebit::encode",
                       "1-bit compression needs finite values");
}

void onebit::decode(device_span<const std::byte> in, device_span<float> out, cudaStream_t s) const {
  detail::check_bytes("cuda::onebit::decode", in.size(), encoded_size(out.size()));
  if (out.empty()) return;
  const bool vectorized = detail::aligned(out.data(), 16) && chunk_ % 4 == 0;
  auto* kernel = vectorized ? &detail::onebit_decode_kernel<true> : &detail::onebit_decode_kernel<false>;
  const std::size_t pieces = vectorized ? (chunk_ + detail::onebit_decode_piece - 1) / detail::onebit_decode_piece : 1;
  const unsigned grid = detail::warp_per_chunk_grid(kernel, (out.size() + chunk_ - 1) / chunk_ * pieces);
  kernel<<<grid, detail::block_threads, 0, s>>>(in.data(), out.size(), chunk_, out.data());
  detail::check_launch("onebit_decode_kernel<<<...>>>");
}

}  // namespace flexpar::cuda
