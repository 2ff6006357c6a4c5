// flexpar/core/dtype.hpp — element types flexpar moves and reduces.
//
// | dtype | C++ type            | bytes | accumulates in |
// |-------|---------------------|-------|----------------|
// | f32   | float               | 4     | float          |
// | f64   | double              | 8     | double         |
// | f16   | flexpar::half       | 2     | float          |
// | bf16  | flexpar::bfloat16   | 2     | float          |
// | i8    | std::int8_t         | 1     | itself         |
// | u8    | std::uint8_t        | 1     | itself         |
// | i32   | std::int32_t        | 4     | itself         |
// | i64   | std::int64_t        | 8     | itself         |
//
// half and bfloat16 are storage types: 16 bits with conversions to and from float that round to
// nearest even, so reductions in them go through float (as NCCL and Horovod do).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace flexpar {

/// IEEE 754 binary16, stored as its 16 bits.
struct half {
  std::uint16_t bits = 0;  ///< The binary16 bit pattern (sign, exponent, mantissa).

  constexpr half() = default;  ///< Positive zero.
  /// `value` rounded to the nearest binary16 (ties to even); out-of-range values become infinities.
  constexpr explicit half(float value) noexcept : bits(from_float(value)) {}
  /// The exact float value (every binary16 is a float).
  constexpr explicit operator float() const noexcept { return to_float(bits); }
  /// Bitwise equality: +0 != -0, and a NaN equals the same NaN pattern.
  friend constexpr bool operator==(half a, half b) noexcept { return a.bits == b.bits; }

  /// The half whose bit pattern is `b`.
  static constexpr half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits = b;
    return h;
  }

 private:
  static constexpr std::uint16_t from_float(float value) noexcept {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
    const std::uint32_t sign = (f >> 16) & 0x8000u;
    const std::uint32_t abs = f & 0x7fffffffu;
    if (abs >= 0x7f800000u)  // Inf or NaN (NaN keeps a quiet payload bit)
      return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
    if (abs < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
      if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25 rounds to zero
      const std::uint32_t exponent = abs >> 23;
      const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
      const std::uint32_t shift = 126u - exponent;  // 14..24
      std::uint32_t result = mantissa >> shift;
      const std::uint32_t remainder = mantissa & ((1u << shift) - 1u);
      const std::uint32_t halfway = 1u << (shift - 1u);
      if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
      return static_cast<std::uint16_t>(sign | result);
    }
    // normal: rebias the exponent (127 -> 15), round the 13 dropped mantissa bits to nearest even
    std::uint32_t result = ((abs - 0x38000000u) >> 13);
    const std::uint32_t remainder = abs & 0x1fffu;
    if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u))) ++result;
    return static_cast<std::uint16_t>(sign | result);
  }

  static constexpr float to_float(std::uint16_t h) noexcept {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exponent = (h >> 10) & 0x1fu;
    std::uint32_t mantissa = h & 0x3ffu;
    if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
    if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // subnormal half: normalise
    std::uint32_t e = 113u;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    return std::bit_cast<float>(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
  }
};

/// bfloat16: the top 16 bits of an IEEE binary32, rounded to nearest even.
struct bfloat16 {
  std::uint16_t bits = 0;  ///< The bfloat16 bit pattern (sign, exponent, mantissa).

  constexpr bfloat16() = default;  ///< Positive zero.
  /// `value` rounded to the nearest bfloat16 (ties to even); out-of-range values become infinities.
  constexpr explicit bfloat16(float value) noexcept : bits(from_float(value)) {}
  /// The exact float value (the bits become the top half of a binary32).
  constexpr explicit operator float() const noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  /// Bitwise equality: +0 != -0, and a NaN equals the same NaN pattern.
  friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept { return a.bits == b.bits; }

  /// The bfloat16 whose bit pattern is `b`.
  static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }

 private:
  static constexpr std::uint16_t from_float(float value) noexcept {
    const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
    if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((f >> 16) | 0x40u);  // quiet NaN
    const std::uint32_t rounding = 0x7fffu + ((f >> 16) & 1u);
    return static_cast<std::uint16_t>((f + rounding) >> 16);
  }
};

/// The element types of the table above.
enum class dtype : std::uint8_t { f32, f64, f16, bf16, i8, u8, i32, i64 };

/// Size in bytes of one element.
constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::f64:
    case dtype::i64: return 8;
    case dtype::f32:
    case dtype::i32: return 4;
    case dtype::f16:
    case dtype::bf16: return 2;
    case dtype::i8:
    case dtype::u8: return 1;
  }
  return 0;
}

/// Short name as printed in errors, benchmarks and the timeline ("f32", "bf16", ...).
constexpr std::string_view name_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::i8: return "i8";
    case dtype::u8: return "u8";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
  }
  return "?";
}

namespace detail {
template <class T>
struct dtype_of_impl;  // undefined: only the types of the table have a dtype
template <>
struct dtype_of_impl<float> {
  static constexpr dtype value = dtype::f32;
  using accumulate = float;
};
template <>
struct dtype_of_impl<double> {
  static constexpr dtype value = dtype::f64;
  using accumulate = double;
};
template <>
struct dtype_of_impl<half> {
  static constexpr dtype value = dtype::f16;
  using accumulate = float;
};
template <>
struct dtype_of_impl<bfloat16> {
  static constexpr dtype value = dtype::bf16;
  using accumulate = float;
};
template <>
struct dtype_of_impl<std::int8_t> {
  static constexpr dtype value = dtype::i8;
  using accumulate = std::int8_t;
};
template <>
struct dtype_of_impl<std::uint8_t> {
  static constexpr dtype value = dtype::u8;
  using accumulate = std::uint8_t;
};
template <>
struct dtype_of_impl<std::int32_t> {
  static constexpr dtype value = dtype::i32;
  using accumulate = std::int32_t;
};
template <>
struct dtype_of_impl<std::int64_t> {
  static constexpr dtype value = dtype::i64;
  using accumulate = std::int64_t;
};

template <class T, class = void>
struct has_dtype : std::false_type {};
template <class T>
struct has_dtype<T, std::void_t<decltype(dtype_of_impl<T>::value)>> : std::true_type {};
}  // namespace detail

/// True for the element types flexpar knows (the table above).
template <class T>
concept element = detail::has_dtype<std::remove_cv_t<T>>::value;

/// dtype of a C++ element type: `dtype_of<float> == dtype::f32`.
template <element T>
inline constexpr dtype dtype_of = detail::dtype_of_impl<std::remove_cv_t<T>>::value;

/// Type in which reductions of T are computed (float for half and bfloat16, T otherwise).
template <element T>
using accumulate_t = typename detail::dtype_of_impl<std::remove_cv_t<T>>::accumulate;

/// Calls `f(T{})` with the C++ type of a run-time dtype — the bridge from type-erased to templated code.
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: return f(float{});
    case dtype::f64: return f(double{});
    case dtype::f16: return f(half{});
    case dtype::bf16: return f(bfloat16{});
    case dtype::i8: return f(std::int8_t{});
    case dtype::u8: return f(std::uint8_t{});
    case dtype::i32: return f(std::int32_t{});
    case dtype::i64: return f(std::int64_t{});
  }
  return f(float{});  // unreachable for valid enumerators
}

}  // namespace flexpar
