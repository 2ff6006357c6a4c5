// flexpar/compress/minmax_uint8.hpp — min-max quantization to 8 bits, per chunk (BAGUA's bytegrad).
//
// Each chunk of `chunk` floats is stored as [float min][float max][chunk bytes]: 4x fewer bytes
// than f32 (plus 8 bytes per chunk). Encoding: q = floor((x - min) * s + 1/2) with s = 255 / (max -
// min) (0 when max == min); decoding: min + q * ((max - min) / 255); every step in float, in this
// order (a serial reference repeats it to the bit).
//
// Error bound (tested): |decode(encode(x)) - x| <= (max - min) / 510 of x's chunk, plus float
// rounding (one ulp of max(|min|, |max|)). A constant chunk (max == min) decodes exactly.
// Non-finite input (NaN, +-Inf) has no meaningful range: encode throws usage_error naming the
// index, instead of producing garbage.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <flexpar/core/error.hpp>

namespace flexpar::compress {

/// Per-chunk min-max quantization of f32 to 8 bits (header above: layout, error bound).
struct minmax_uint8 {
  /// Elements per chunk (each chunk has its own min and max).
  std::size_t chunk = 512;

  /// Bytes before each chunk's codes: its min and max as floats.
  static constexpr std::size_t header_bytes = 2 * sizeof(float);

  /// Bytes that encode() writes for `n` floats.
  [[nodiscard]] constexpr std::size_t encoded_size(std::size_t n) const noexcept {
    return n + header_bytes * ((n + chunk - 1) / chunk);
  }

  /// Encodes `in` into `out` (encoded_size(in.size()) bytes).
  /// @throws usage_error for a too-small output or a non-finite input value.
  void encode(std::span<const float> in, std::span<std::byte> out) const {
    check_size("encode", out.size(), encoded_size(in.size()));
    std::byte* o = out.data();
    for (std::size_t begin = 0; begin < in.size(); begin += chunk) {
      const std::size_t n = std::min(chunk, in.size() - begin);
      const float* x = in.data() + begin;
      // One pass in 8 independent lanes (so the compiler vectorizes it: minps/maxps): min and max
      // skip NaN (every comparison with it is false); x * 0 is NaN exactly for NaN and Inf.
      constexpr std::size_t lanes = 8;
      float lo8[lanes], hi8[lanes], probe8[lanes];
      for (std::size_t j = 0; j < lanes; ++j) lo8[j] = hi8[j] = x[0], probe8[j] = 0.0f;
      std::size_t i = 0;
      for (; i + lanes <= n; i += lanes)
        for (std::size_t j = 0; j < lanes; ++j) {
          const float v = x[i + j];
          lo8[j] = v < lo8[j] ? v : lo8[j];
          hi8[j] = v > hi8[j] ? v : hi8[j];
          probe8[j] += v * 0.0f;
        }
      for (; i < n; ++i) {
        lo8[0] = x[i] < lo8[0] ? x[i] : lo8[0];
        hi8[0] = x[i] > hi8[0] ? x[i] : hi8[0];
        probe8[0] += x[i] * 0.0f;
      }
      float lo = lo8[0], hi = hi8[0], probe = 0.0f;
      for (std::size_t j = 0; j < lanes; ++j) {
        lo = std::min(lo, lo8[j]);
        hi = std::max(hi, hi8[j]);
        probe += probe8[j];
      }
      if (std::isnan(probe) || !std::isfinite(lo) || !std::isfinite(hi)) throw_non_finite(in, begin, n);
      std::memcpy(o, &lo, sizeof lo);
      std::memcpy(o + sizeof lo, &hi, sizeof hi);
      auto* q = reinterpret_cast<std::uint8_t*>(o + header_bytes);
      const float range = hi - lo;
      const float scale = range > 0 ? 255.0f / range : 0.0f;
      // round half up: (x - lo) * scale is in [0, 255] (+ rounding), so the truncation is exact and
      // vectorizes (cvttps2dq), unlike std::lround
      for (std::size_t k = 0; k < n; ++k)
        q[k] = static_cast<std::uint8_t>(static_cast<int>((x[k] - lo) * scale + 0.5f));
      o += header_bytes + n;
    }
  }

  /// Decodes `in` (as written by encode for `out.size()` floats) into `out`.
  void decode(std::span<const std::byte> in, std::span<float> out) const {
    check_size("decode", in.size(), encoded_size(out.size()));
    const std::byte* p = in.data();
    for (std::size_t begin = 0; begin < out.size(); begin += chunk) {
      const std::size_t n = std::min(chunk, out.size() - begin);
      float lo, hi;
      std::memcpy(&lo, p, sizeof lo);
      std::memcpy(&hi, p + sizeof lo, sizeof hi);
      const auto* q = reinterpret_cast<const std::uint8_t*>(p + header_bytes);
      const float step = (hi - lo) / 255.0f;
      float* y = out.data() + begin;
      for (std::size_t i = 0; i < n; ++i) y[i] = lo + static_cast<float>(q[i]) * step;
      p += header_bytes + n;
    }
  }

  /// The bound of the header for a chunk with range [lo, hi].
  [[nodiscard]] static float error_bound(float lo, float hi) noexcept {
    return (hi - lo) / 510.0f + std::max(std::abs(lo), std::abs(hi)) * 2.0f * 1.1920929e-7f;
  }

 private:
  static void check_size(const char* op, std::size_t have, std::size_t need) {
    if (have < need)
      throw error_on<usage_error>(no_rank, std::string("minmax_uint8::") + op, "buffer of ", have, " bytes, needs ",
                                  need);
  }
  [[noreturn]] static void throw_non_finite(std::span<const float> in, std::size_t begin, std::size_t n) {
    std::size_t i = begin;
    while (i < begin + n && std::isfinite(in[i])) ++i;
    throw error_on<usage_error>(no_rank, "minmax_uint8::encode", "element ", i, " is ", std::to_string(in[i]),
                                "; min-max quantization needs finite values");
  }
};

}  // namespace flexpar::compress
