// flexpar/cuda/kernels.hpp — flexpar's CUDA kernels: element-wise reduction, min-max uint8 and 1-bit compression, and
// the batched copy that packs many tensors into a fusion buffer in one launch.
//
// Part of flexpar::cuda (built with FLEXPAR_WITH_CUDA). Every function here only enqueues work on
// the given stream and returns (the checked encoders also wait, with a deadline); the spans are
// device memory of the current device.
//
// | kernel                           | host twin (same results)                  |
// |----------------------------------|-------------------------------------------|
// | cuda::reduce_into, scale_for_average | flexpar::reduce_into, scale_for_average (bit for bit) |
// | cuda::minmax_uint8               | compress::minmax_uint8 (same bytes)       |
// | cuda::onebit                     | compress::onebit (same format; the scale is summed in another order) |
// | cuda::fusion_packer              | a memcpy per tensor                       |
//
// The compressed formats are the host's, byte for byte, so a GPU rank and a CPU rank exchange
// compressed gradients directly. The arithmetic they share is flexpar/cuda/kernel_math.hpp.
//
//   flexpar::cuda::stream s;
//   flexpar::cuda::reduce_into(acc.span(), incoming, flexpar::reduce_op::sum, s);
//   flexpar::cuda::minmax_uint8 q;                     // chunks of 512, a device status word
//   q.encode_checked(acc.span(), wire.span(), s, 60s); // usage_error naming a non-finite element
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <flexpar/core/dtype.hpp>
#include <flexpar/core/reduce_op.hpp>
#include <flexpar/cuda/kernel_math.hpp>
#include <flexpar/cuda/runtime.hpp>

namespace flexpar::cuda {

// ---- element-wise reduction -----------------------------------------------------------------------

/// dst[i] = dst[i] (op) src[i] on `s`, for every dtype and op of the host reduce_into (avg combines
/// as sum: call scale_for_average once at the end). half and bfloat16 are computed in float and
/// rounded once, as on the host, so results are bit-identical to flexpar::reduce_into (NaN payloads
/// aside). 16-byte vector loads where the spans share their alignment, scalar code otherwise.
/// @pre dst.size() == src.size() (usage_error otherwise); dst and src do not overlap.
template <element T>
void reduce_into(device_span<T> dst, device_span<const T> src, reduce_op op, cudaStream_t s);

/// dst[i] = a[i] (op) b[i] on `s` (the three-operand form of reduce_into).
/// @pre the three spans have one length (usage_error otherwise); dst overlaps neither a nor b.
template <element T>
void reduce_into(device_span<T> dst, device_span<const T> a, device_span<const T> b, reduce_op op, cudaStream_t s);

/// dst[i] = ((sources[0][i] (op) sources[1][i]) (op) sources[2][i]) ... on `s`: the sources folded in
/// their order, each step computed in accumulate_t<T> and rounded to T, so the result is bit-identical
/// to the host's reduce_into applied source by source (what a rank of the device intra-node path
/// computes for its part, reading every peer's copy once). One launch per 8 sources; `dst` may be the
/// first source (same address), but must not overlap any other. One source is a copy.
/// @pre at least one source; every source has dst.size() elements (usage_error otherwise).
template <element T>
void reduce_into(device_span<T> dst, std::span<const device_span<const T>> sources, reduce_op op, cudaStream_t s);

/// Type-erased many-source reduce_into: `sources` are device addresses of `count` elements of `t`.
void reduce_into(dtype t, void* dst, std::span<const void* const> sources, std::size_t count, reduce_op op,
                 cudaStream_t s);

/// data[i] = data[i] / ranks on `s`, computed in accumulate_t<T> (integer division for integer
/// types): what turns the sum of reduce_op::avg into the average. Nothing happens for ranks <= 1.
template <element T>
void scale_for_average(device_span<T> data, int ranks, cudaStream_t s);

/// data[i] = value on `s`, for every dtype (what a rank that has joined contributes to a fused
/// allreduce: the identity of the reduction).
template <element T>
void fill(device_span<T> data, T value, cudaStream_t s);

/// out[i] = to(factor * from(in[i])) on `s`: the value widened to its accumulation type, multiplied
/// by `factor` in double, narrowed to the output's accumulation type and rounded once to the output
/// type, as the host's gradient_sync scales and decompresses. Pairs: any type to itself (in == out
/// allowed), f32 to and from f16 and bf16. @throws usage_error for another pair.
void convert(dtype from, const void* in, dtype to, void* out, std::size_t count, double factor, cudaStream_t s);

/// Type-erased reduce_into for code that holds a dtype and raw device bytes (fusion buffers).
/// @pre dst and src hold `count` elements of `t`.
void reduce_into(dtype t, void* dst, const void* src, std::size_t count, reduce_op op, cudaStream_t s);

// ---- min-max uint8 --------------------------------------------------------------------------------

/// Per-chunk min-max quantization of f32 to 8 bits on the GPU, in compress::minmax_uint8's format:
/// per chunk [float min][float max][one code per element], q = (int)((x - min) * (255 / (max - min))
/// + 0.5). The codes are bit-identical to the host encoder's for the same input; the min and max are
/// equal as values (a zero may differ in its sign, which decodes the same).
///
/// Non-finite input: the encoder records the first non-finite element's index in a device status
/// word that this object owns; check() (or encode_checked()) reads it and throws usage_error naming
/// the element, like the host encoder. The bytes of a chunk holding a non-finite value are unspecified.
/// One object serves one stream at a time (its status word is per object).
class minmax_uint8 {
 public:
  /// An encoder with `chunk` elements per chunk. @throws usage_error when chunk is 0.
  explicit minmax_uint8(std::size_t chunk = 512);

  /// Elements per chunk.
  [[nodiscard]] std::size_t chunk() const noexcept { return chunk_; }
  /// Bytes that encode() writes for `n` floats (the host encoder's encoded_size).
  [[nodiscard]] std::size_t encoded_size(std::size_t n) const noexcept {
    return n + math::minmax_header_bytes * ((n + chunk_ - 1) / chunk_);
  }

  /// Encodes `in` into `out` on `s`, and records the first non-finite element of `in` in the status
  /// word (read it with check()). Returns at once.
  /// @throws usage_error when out is smaller than encoded_size(in.size()).
  void encode(device_span<const float> in, device_span<std::byte> out, cudaStream_t s);

  /// Waits (at most `deadline`) for the encode() last enqueued on `s` and throws usage_error
  /// "minmax_uint8::encode: element I is V; min-max quantization needs finite values" when it met a
  /// non-finite value. @throws timeout_error past the deadline.
  void check(cudaStream_t s, std::chrono::milliseconds deadline, int rank = -1);

  /// encode() then check(): the host encoder's contract, at the price of a wait.
  void encode_checked(device_span<const float> in, device_span<std::byte> out, cudaStream_t s,
                      std::chrono::milliseconds deadline, int rank = -1) {
    encode(in, out, s);
    check(s, deadline, rank);
  }

  /// Decodes `in` (as written by encode for out.size() floats) into `out` on `s`.
  /// @throws usage_error when in is smaller than encoded_size(out.size()).
  void decode(device_span<const std::byte> in, device_span<float> out, cudaStream_t s) const;

  /// acc[i] += decode(in)[i] on `s`: the reduce step of bytegrad without a temporary (bit-identical to
  /// decoding into a temporary and adding it).
  void decode_add(device_span<const std::byte> in, device_span<float> acc, cudaStream_t s) const;

 private:
  std::size_t chunk_;
  device_buffer<unsigned long long> status_;  // first non-finite index, ~0 for none
  pinned_buffer<unsigned long long> status_host_;
  const float* last_input_ = nullptr;  // what check() reads the offending value from
};

// ---- 1-bit signs with error feedback --------------------------------------------------------------

/// 1-bit sign compression of one device tensor with its error-feedback residual (a device buffer this
/// object owns), in compress::onebit's format: per chunk [float scale = mean |v|][sign bits, bit j of
/// byte b = element 8b + j], v = x + residual, residual' = v - (+-scale). Bits are packed with warp
/// ballots. The signs equal the host compressor's for the same v; the scale is the same mean summed
/// in another order (equal within float rounding).
///
/// Non-finite input: encode() records the first non-finite index (read by check()); the chunks that
/// hold one keep their residual, the others advance, so call reset() after such an error.
class onebit {
 public:
  /// A compressor for `count` floats with chunks of `chunk`; the residual starts at zero.
  /// @throws usage_error when chunk is 0.
  explicit onebit(std::size_t count, std::size_t chunk = 2048);

  /// Elements of the tensor this compressor serves.
  [[nodiscard]] std::size_t count() const noexcept { return residual_.size(); }
  /// Elements per chunk.
  [[nodiscard]] std::size_t chunk() const noexcept { return chunk_; }
  /// Bytes that encode() writes for `n` floats (the host compressor's encoded_size).
  [[nodiscard]] std::size_t encoded_size(std::size_t n) const noexcept {
    const std::size_t chunks = (n + chunk_ - 1) / chunk_;
    return chunks * sizeof(float) + (n / chunk_) * ((chunk_ + 7) / 8) + ((n % chunk_) + 7) / 8;
  }

  /// Encodes x + residual into `out` on `s` and keeps the new residual. Returns at once.
  /// @throws usage_error when x.size() != count() or out is too small.
  void encode(device_span<const float> x, device_span<std::byte> out, cudaStream_t s);

  /// Waits (at most `deadline`) for the encode() last enqueued on `s`; throws usage_error naming the
  /// first non-finite element if it met one. @throws timeout_error past the deadline.
  void check(cudaStream_t s, std::chrono::milliseconds deadline, int rank = -1);

  /// Decodes `in` into `out` (+-scale per element) on `s`.
  /// @throws usage_error when in is smaller than encoded_size(out.size()).
  void decode(device_span<const std::byte> in, device_span<float> out, cudaStream_t s) const;

  /// The error not yet sent (device memory; read it after the stream's work is done).
  [[nodiscard]] device_span<const float> residual() const noexcept { return residual_.span(); }
  /// Sets the residual to zero on `s`.
  void reset(cudaStream_t s);

 private:
  std::size_t chunk_;
  device_buffer<float> residual_;
  device_buffer<unsigned long long> status_;
  pinned_buffer<unsigned long long> status_host_;
  const float* last_input_ = nullptr;
};

// ---- batched copies: fusion buffers -----------------------------------------------------------------

/// One copy of a batch: `bytes` from device address `src` to device address `dst`.
struct copy_region {
  const void* src = nullptr;  ///< source (device memory)
  void* dst = nullptr;        ///< destination (device memory)
  std::size_t bytes = 0;      ///< how many bytes
};

/// Copies many device regions in ONE kernel launch: what packs a fusion buffer from many small
/// tensors (and unpacks it), where a cudaMemcpyAsync per tensor would pay a launch each.
///
/// How a batch runs:
///   1. the host writes the descriptor table (src, dst, bytes, first unit of work) into a pinned
///      staging slot that this object owns and grows;
///   2. one cudaMemcpyAsync moves the table to the slot's device copy, on the caller's stream;
///   3. one kernel: each block takes units of work (16 KiB of one region), finds its region by binary
///      search on the units' prefix sums, and copies with 16-byte vectors where source and
///      destination share their alignment (bytes otherwise).
/// Two staging slots alternate; a slot is rewritten only after the kernel that read it is done
/// (a host wait with the deadline given at construction), so the host runs up to two batches ahead.
class fusion_packer {
 public:
  /// A packer whose host waits for a staging slot give up after `deadline` (timeout_error).
  explicit fusion_packer(std::chrono::milliseconds deadline = std::chrono::seconds(300));
  ~fusion_packer();
  fusion_packer(const fusion_packer&) = delete;             ///< not copyable
  fusion_packer& operator=(const fusion_packer&) = delete;  ///< not copyable

  /// Copies every region on `s` with one launch (plus the descriptor upload). Regions must not
  /// overlap each other's destinations. Empty batches and empty regions cost nothing.
  void copy(std::span<const copy_region> regions, cudaStream_t s);

  /// Packs `tensors` one after another into `buffer` (tensor k at the sum of the sizes before it).
  /// @throws usage_error when buffer is smaller than the tensors' total.
  void pack(std::span<const device_span<const std::byte>> tensors, device_span<std::byte> buffer, cudaStream_t s);

  /// The inverse of pack: copies consecutive parts of `buffer` back into `tensors`.
  /// @throws usage_error when buffer is smaller than the tensors' total.
  void unpack(device_span<const std::byte> buffer, std::span<const device_span<std::byte>> tensors, cudaStream_t s);

 private:
  struct slot {
    pinned_buffer<math::copy_piece> staging;
    device_buffer<math::copy_piece> table;
    event done{false};
    bool used = false;
  };
  std::chrono::milliseconds deadline_;
  slot slots_[2];
  int next_ = 0;
  std::vector<copy_region> scratch_;
};

}  // namespace flexpar::cuda
