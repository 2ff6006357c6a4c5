// flexpar/compress/onebit.hpp — 1-bit sign compression with error feedback (1-bit SGD / 1-bit Adam).
//
// Per chunk of `chunk` floats: [float scale][ceil(chunk / 8) bytes of signs], scale = mean |v| of
// the chunk, where v = x + residual (the error left over from the previous steps). Decoding gives
// +-scale (- where v < 0). The mean is specified to the bit, so that a serial reference can repeat
// it: |v| is summed in float in 8 lanes (element i of the chunk's first 8 floor(n / 8) in lane i mod
// 8, the rest in lane 0, each lane in element order), the lanes are added in double in lane order,
// and the sum divided by n in double is rounded to float. The compressor keeps the residual of its
// tensor: residual' = v - decode(encode(v)), so
//
//   sum over steps of what was sent  =  sum over steps of x  -  residual after the last step,
//
// i.e. nothing is lost, only delayed: the transmitted sum tracks the true sum within the current
// residual (tested). About 32x fewer bytes than f32. Non-finite input throws usage_error.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <flexpar/core/cpu_features.hpp>
#include <flexpar/core/error.hpp>

namespace flexpar::compress {

/// 1-bit sign compression of one tensor, with its error-feedback residual (header above).
class onebit {
 public:
  /// A compressor for one tensor of `count` floats (it owns that tensor's residual).
  explicit onebit(std::size_t count, std::size_t chunk = 2048) : chunk_(chunk), residual_(count, 0.0f) {
    if (chunk == 0) throw error_on<usage_error>(no_rank, "onebit", "chunk must be positive");
  }

  /// Elements of the tensor this compressor serves.
  [[nodiscard]] std::size_t count() const noexcept { return residual_.size(); }
  /// Elements per chunk (each chunk has its own scale).
  [[nodiscard]] std::size_t chunk() const noexcept { return chunk_; }

  /// Bytes that encode() writes for `n` floats.
  [[nodiscard]] std::size_t encoded_size(std::size_t n) const noexcept {
    const std::size_t chunks = (n + chunk_ - 1) / chunk_;
    return chunks * sizeof(float) + (n / chunk_) * ((chunk_ + 7) / 8) + ((n % chunk_) + 7) / 8;
  }

  /// Encodes x + residual into `out` and keeps the new residual.
  void encode(std::span<const float> x, std::span<std::byte> out) {
    if (x.size() != residual_.size())
      throw error_on<usage_error>(no_rank, "onebit::encode", x.size(), " values for a compressor of ",
                                  residual_.size());
    encode_at(0, x, out);
  }

  /// Encodes elements [at, at + x.size()) of the tensor (x + their residual) into `out`: the bytes
  /// encode() of the whole tensor writes from offset encoded_size(at) on, so a tensor may be encoded
  /// piece by piece. @throws usage_error unless `at` is a multiple of chunk() and the piece lies in
  /// the tensor.
  void encode_at(std::size_t at, std::span<const float> x, std::span<std::byte> out) {
    if (at % chunk_ != 0 || at > residual_.size() || x.size() > residual_.size() - at)
      throw error_on<usage_error>(no_rank, "onebit::encode", "elements [", at, ", ", at + x.size(),
                                  ") of a compressor of ", residual_.size(), " in chunks of ", chunk_,
                                  " (a piece starts at a chunk and lies in the tensor)");
    if (out.size() < encoded_size(x.size()))
      throw error_on<usage_error>(no_rank, "onebit::encode", "buffer of ", out.size(), " bytes, needs ",
                                  encoded_size(x.size()));
    // One read-only pass first: x * 0 is NaN exactly for NaN and Inf, so a bad input is refused
    // before the residual changes (8 independent lanes, so it vectorizes).
    constexpr std::size_t lanes = 8;
    float probe8[lanes] = {};
    std::size_t k = 0;
    for (; k + lanes <= x.size(); k += lanes)
      for (std::size_t j = 0; j < lanes; ++j) probe8[j] += x[k + j] * 0.0f;
    for (; k < x.size(); ++k) probe8[0] += x[k] * 0.0f;
    float probe = 0.0f;
    for (float v : probe8) probe += v;
    if (std::isnan(probe)) throw_non_finite(x);
    std::byte* o = out.data();
    for (std::size_t begin = 0; begin < x.size(); begin += chunk_) {
      const std::size_t n = std::min(chunk_, x.size() - begin);
      float* r = residual_.data() + at + begin;
      const float* xs = x.data() + begin;
      float total8[lanes] = {};  // sum of |v| in 8 lanes (a chunk is small: float keeps ~7 digits)
      std::size_t i = 0;
      for (; i + lanes <= n; i += lanes)
        for (std::size_t j = 0; j < lanes; ++j) {
          r[i + j] += xs[i + j];  // v = x + residual, kept in place
          total8[j] += std::abs(r[i + j]);
        }
      for (; i < n; ++i) {
        r[i] += xs[i];
        total8[0] += std::abs(r[i]);
      }
      double total = 0;
      for (float t : total8) total += t;
      const float scale = static_cast<float>(total / static_cast<double>(n));
      std::memcpy(o, &scale, sizeof scale);
      auto* bits = reinterpret_cast<std::uint8_t*>(o + sizeof scale);
      send_signs(r, n, scale, bits);
      o += sizeof scale + (n + 7) / 8;
    }
  }

  /// Decodes `in` into `out` (+-scale per element).
  void decode(std::span<const std::byte> in, std::span<float> out) const {
    if (in.size() < encoded_size(out.size()))
      throw error_on<usage_error>(no_rank, "onebit::decode", "buffer of ", in.size(), " bytes, needs ",
                                  encoded_size(out.size()));
    const std::byte* p = in.data();
    for (std::size_t begin = 0; begin < out.size(); begin += chunk_) {
      const std::size_t n = std::min(chunk_, out.size() - begin);
      float scale;
      std::memcpy(&scale, p, sizeof scale);
      const auto* bits = reinterpret_cast<const std::uint8_t*>(p + sizeof scale);
      // -scale is scale with its sign bit set (scale >= 0): a set bit flips the sign, 8 at a time
      const auto magnitude = std::bit_cast<std::uint32_t>(scale);
      float* y = out.data() + begin;
      const std::size_t full = n / 8;
      for (std::size_t b = 0; b < full; ++b)
        for (std::size_t j = 0; j < 8; ++j)
          y[8 * b + j] = std::bit_cast<float>(magnitude ^ (((static_cast<std::uint32_t>(bits[b]) >> j) & 1u) << 31));
      for (std::size_t i = 8 * full; i < n; ++i) y[i] = (bits[i / 8] >> (i % 8)) & 1u ? -scale : scale;
      p += sizeof scale + (n + 7) / 8;
    }
  }

  /// The error not yet sent.
  [[nodiscard]] std::span<const float> residual() const noexcept { return residual_; }
  /// Forgets the residual (e.g. when the model is re-initialized).
  void reset() { std::fill(residual_.begin(), residual_.end(), 0.0f); }

 private:
  /// Bit j of bits[b] = (v[8b + j] < 0), and v -= (v < 0 ? -scale : scale): what was not sent stays
  /// for the next step. x - (-s) is x + s exactly, so both paths give the same bits.
  static void send_signs(float* v, std::size_t n, float scale, std::uint8_t* bits) noexcept {
    std::size_t done = 0;
#if defined(__x86_64__)
    if (flexpar::cpu_has_avx2()) done = send_signs_avx2(v, n / 8, scale, bits);
#endif
    for (std::size_t b = done / 8; b < (n + 7) / 8; ++b) {
      unsigned byte = 0;
      const std::size_t m = std::min<std::size_t>(8, n - 8 * b);
      for (std::size_t j = 0; j < m; ++j) {
        float& x = v[8 * b + j];
        const bool negative = x < 0;
        byte |= static_cast<unsigned>(negative) << j;
        x = negative ? x + scale : x - scale;
      }
      bits[b] = static_cast<std::uint8_t>(byte);
    }
  }
#if defined(__x86_64__)
  /// send_signs of the first 8 * bytes elements, 8 per instruction (compare, movemask, blend); returns
  /// the elements done.
  __attribute__((target("avx2"))) static std::size_t send_signs_avx2(float* v, std::size_t bytes, float scale,
                                                                     std::uint8_t* bits) noexcept {
    const __m256 zero = _mm256_setzero_ps(), s = _mm256_set1_ps(scale);
    for (std::size_t b = 0; b < bytes; ++b) {
      const __m256 x = _mm256_loadu_ps(v + 8 * b);
      const __m256 negative = _mm256_cmp_ps(x, zero, _CMP_LT_OQ);
      bits[b] = static_cast<std::uint8_t>(_mm256_movemask_ps(negative));
      _mm256_storeu_ps(v + 8 * b, _mm256_blendv_ps(_mm256_sub_ps(x, s), _mm256_add_ps(x, s), negative));
    }
    return 8 * bytes;
  }
#endif

  [[noreturn]] static void throw_non_finite(std::span<const float> x) {
    std::size_t i = 0;
    while (std::isfinite(x[i])) ++i;
    throw error_on<usage_error>(no_rank, "onebit::encode", "element ", i, " is ", std::to_string(x[i]),
                                "; 1-bit compression needs finite values");
  }

  std::size_t chunk_;
  std::vector<float> residual_;
};

}  // namespace flexpar::compress
