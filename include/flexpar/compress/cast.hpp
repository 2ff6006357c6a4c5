// flexpar/compress/cast.hpp — f32 to f16 / bf16 and back (2x fewer bytes).
//
// | cast | relative error (normal range)       | range                   | non-finite            |
// |------|-------------------------------------|-------------------------|-----------------------|
// | f16  | <= 2^-11 (round to nearest even)    | |x| <= 65504, else +-Inf| NaN -> NaN, Inf -> Inf |
// | bf16 | <= 2^-8  (round to nearest even)    | the f32 range           | NaN -> NaN, Inf -> Inf |
//
// Values below the smallest normal lose relative precision gradually (sub-normals), as IEEE does.
// Overflow to Inf is the documented behaviour of an f16 cast (as in every framework's fp16 path);
// use bf16 where gradients can exceed 65504.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include <flexpar/core/dtype.hpp>
#include <flexpar/core/error.hpp>

namespace flexpar::compress {

/// Round-to-nearest-even cast of f32 values to a 16-bit float type and back (table above).
template <class Narrow>
requires std::is_same_v<Narrow, half> || std::is_same_v<Narrow, bfloat16>
struct cast {
  /// Bytes that encode() writes for `n` floats.
  [[nodiscard]] static constexpr std::size_t encoded_size(std::size_t n) noexcept { return n * sizeof(Narrow); }

  /// Casts every value of `in` into `out` (same length). @throws usage_error on a length mismatch.
  static void encode(std::span<const float> in, std::span<Narrow> out) {
    check(in.size(), out.size());
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = Narrow(in[i]);
  }
  /// Widens every value of `in` into `out` (same length, exact). @throws usage_error on a length mismatch.
  static void decode(std::span<const Narrow> in, std::span<float> out) {
    check(in.size(), out.size());
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = static_cast<float>(in[i]);
  }
  /// Largest relative error of a round trip inside the normal range.
  static constexpr float relative_error = std::is_same_v<Narrow, half> ? 1.0f / 2048 : 1.0f / 256;

 private:
  static void check(std::size_t in, std::size_t out) {
    if (in != out) throw error_on<usage_error>(no_rank, "cast", in, " inputs but ", out, " outputs");
  }
};

using fp16 = cast<half>;
using bf16 = cast<bfloat16>;

}  // namespace flexpar::compress
