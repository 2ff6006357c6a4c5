// flexpar/cuda/kernel_math.hpp — the per-element and per-chunk arithmetic of flexpar's CUDA kernels, written once for
// the host and the device.
//
// Every function here is `FLEXPAR_HD` (`__host__ __device__` under nvcc, nothing under a host
// compiler), takes and returns plain values, and needs no CUDA header, so the CPU test
// (tests/compress/test_kernel_math.cpp) checks, in every build, the very code the kernels run:
//
// | function                        | used by                  | checked against (CPU)              |
// |---------------------------------|--------------------------|------------------------------------|
// | `split_for_vectors`             | reduce, fusion copy      | exhaustive alignments              |
// | `minmax_scale`, `minmax_code`, `minmax_value` | min-max encode/decode | compress::minmax_uint8, bit for bit |
// | `onebit_feedback`, `onebit_value` | 1-bit encode/decode    | compress::onebit                   |
//
// Float arithmetic goes through `mul_rn`/`add_rn`/`sub_rn`/`div_rn`: on the device these are the
// round-to-nearest intrinsics, which nvcc never contracts into a fused multiply-add, so a code
// computed on the GPU is bit-identical to the host encoder's (flexpar builds host code without
// -mfma, so the host compiler does not contract either).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
/// Marks a function as callable from host and device code (empty under a host-only compiler).
#define FLEXPAR_HD __host__ __device__
#else
/// Marks a function as callable from host and device code (empty under a host-only compiler).
#define FLEXPAR_HD
#endif

namespace flexpar::cuda::math {

// ---- float arithmetic that is never contracted ----------------------------------------------------

/// a * b, rounded to nearest even (never fused with a following add).
FLEXPAR_HD inline float mul_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
/// a + b, rounded to nearest even (never fused with a preceding multiply).
FLEXPAR_HD inline float add_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
/// a - b, rounded to nearest even.
FLEXPAR_HD inline float sub_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
/// a / b, IEEE division rounded to nearest even (whatever -prec-div says).
FLEXPAR_HD inline float div_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
/// True for a finite float (not NaN, not an infinity), by its exponent bits.
FLEXPAR_HD inline bool finite(float x) noexcept {
  // x - x is 0 for every finite x and NaN for NaN and the infinities; the comparison is false for NaN.
  return sub_rn(x, x) == 0.0f;
}

// ---- vector bodies: a scalar head, 16-byte vectors, a scalar tail ----------------------------------

/// How a run of `count` elements of `element_bytes` bytes splits into a scalar head, a body of
/// 16-byte vectors, and a scalar tail, so that every body access is 16-byte aligned for all the
/// pointers at once.
struct vector_split {
  std::size_t head = 0;     ///< elements before the first aligned vector
  std::size_t vectors = 0;  ///< 16-byte vectors in the body
  std::size_t tail = 0;     ///< elements after the body
};

/// The split of `count` elements at the byte addresses `a`, `b`, `c` (pass one address twice when
/// there are only two). When the addresses disagree modulo 16 no common alignment exists and
/// everything is head (the kernels then take their scalar path).
/// @post head + vectors * (16 / element_bytes) + tail == count.
FLEXPAR_HD inline vector_split split_for_vectors(std::uintptr_t a, std::uintptr_t b, std::uintptr_t c,
                                                 std::size_t count, std::size_t element_bytes) noexcept {
  vector_split s;
  const std::uintptr_t misalignment = a % 16;
  if (b % 16 != misalignment || c % 16 != misalignment || misalignment % element_bytes != 0) {
    s.head = count;
    return s;
  }
  const std::size_t per_vector = 16 / element_bytes;
  const std::size_t to_boundary = misalignment == 0 ? 0 : (16 - misalignment) / element_bytes;
  s.head = to_boundary < count ? to_boundary : count;
  s.vectors = (count - s.head) / per_vector;
  s.tail = count - s.head - s.vectors * per_vector;
  return s;
}

// ---- min-max uint8 (format of compress::minmax_uint8) ----------------------------------------------

/// Bytes before each chunk's codes: its min and max as floats.
inline constexpr std::size_t minmax_header_bytes = 2 * sizeof(float);

/// Byte offset of chunk `c`'s header when chunks hold `chunk` elements (every chunk but the last is full).
FLEXPAR_HD inline std::size_t minmax_chunk_offset(std::size_t c, std::size_t chunk) noexcept {
  return c * (minmax_header_bytes + chunk);
}

/// The factor from (x - min) to code units: 255 / (max - min), or 0 for a constant chunk.
FLEXPAR_HD inline float minmax_scale(float lo, float hi) noexcept {
  const float range = sub_rn(hi, lo);
  return range > 0 ? div_rn(255.0f, range) : 0.0f;
}

/// The code of `x` in a chunk with minimum `lo` and scale minmax_scale(lo, hi): round half up of
/// (x - lo) * scale, which lies in [0, 255] for lo <= x <= hi.
FLEXPAR_HD inline std::uint8_t minmax_code(float x, float lo, float scale) noexcept {
  return static_cast<std::uint8_t>(static_cast<int>(add_rn(mul_rn(sub_rn(x, lo), scale), 0.5f)));
}

/// The step between two codes: (max - min) / 255.
FLEXPAR_HD inline float minmax_step(float lo, float hi) noexcept { return div_rn(sub_rn(hi, lo), 255.0f); }

/// The value that code `q` decodes to: lo + q * step.
FLEXPAR_HD inline float minmax_value(std::uint8_t q, float lo, float step) noexcept {
  return add_rn(lo, mul_rn(static_cast<float>(q), step));
}

// ---- 1-bit signs with error feedback (format of compress::onebit) ----------------------------------

/// Bytes of one chunk of `n` elements: the float scale and ceil(n / 8) bytes of signs.
FLEXPAR_HD inline std::size_t onebit_chunk_bytes(std::size_t n) noexcept { return sizeof(float) + (n + 7) / 8; }

/// True when `v` is sent as -scale (its sign bit in the format is 1).
FLEXPAR_HD inline bool onebit_negative(float v) noexcept { return v < 0; }

/// The residual left after sending `v` as +-scale: v - (+-scale).
FLEXPAR_HD inline float onebit_feedback(float v, float scale) noexcept {
  return sub_rn(v, onebit_negative(v) ? -scale : scale);
}

/// The value a sign bit decodes to.
FLEXPAR_HD inline float onebit_value(bool negative, float scale) noexcept { return negative ? -scale : scale; }

// ---- fused copies: one piece of a batched copy --------------------------------------------

/// One piece of a batched copy as the device reads it: `bytes` from `src` to `dst`, split into units
/// of work numbered from `first_unit`.
struct copy_piece {
  const std::byte* src = nullptr;  ///< where the bytes come from (device memory)
  std::byte* dst = nullptr;        ///< where they go (device memory)
  std::size_t bytes = 0;           ///< how many
  std::size_t first_unit = 0;      ///< the first unit of work of this piece (prefix sum of units)
};

}  // namespace flexpar::cuda::math
