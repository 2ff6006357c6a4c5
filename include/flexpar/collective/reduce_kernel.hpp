// flexpar/collective/reduce_kernel.hpp — the local reductions every collective ends in.
//
//   reduce_into(dst, src, op)      dst[i] = dst[i] (op) src[i]
//   reduce_into(dst, a, b, op)     dst[i] = a[i] (op) b[i]       (dst must not overlap a or b)
//   reduce_into_forward(dst, a, b, op)  the same, dst at or before a (in place, or reading ahead)
//   with_reduce_kernel<T>(op, body)     body(kernel): the op dispatched once for many short runs
//   scale_for_average(data, p)     data[i] = data[i] / p          (the end of reduce_op::avg)
//
// The op is dispatched once per call, outside the loop, so that each loop is a plain element-wise
// expression over restrict pointers that the compiler vectorizes, built twice on x86-64: for the
// baseline (16-byte vectors) and for AVX2 (32-byte), the second chosen where the CPU runs it
// (checked once; the same bits either way, but for which NaN a NaN op NaN returns). half and
// bfloat16 are widened to float and rounded back once per call (accumulate_t), as NCCL does, a
// block of 256 elements at a time: with AVX2 (bfloat16) and F16C (half) instructions where the CPU
// has them (checked once at run time), with scalar conversions otherwise.
// Both give the same bits as core's conversions (NaN payloads aside).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include <flexpar/core/cpu_features.hpp>
#include <flexpar/core/dtype.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/core/reduce_op.hpp>

namespace flexpar {

namespace detail {

template <element T>
constexpr accumulate_t<T> widen(T v) noexcept {
  if constexpr (std::is_same_v<T, accumulate_t<T>>)
    return v;
  else
    return static_cast<accumulate_t<T>>(v);
}

template <element T>
constexpr T narrow(accumulate_t<T> v) noexcept {
  if constexpr (std::is_same_v<T, accumulate_t<T>>)
    return v;
  else
    return T(v);
}

struct op_sum {
  template <class A>
  constexpr A operator()(A a, A b) const noexcept {
    return static_cast<A>(a + b);
  }
};
struct op_prod {
  template <class A>
  constexpr A operator()(A a, A b) const noexcept {
    return static_cast<A>(a * b);
  }
};
struct op_min {
  template <class A>
  constexpr A operator()(A a, A b) const noexcept {
    return b < a ? b : a;
  }
};
struct op_max {
  template <class A>
  constexpr A operator()(A a, A b) const noexcept {
    return a < b ? b : a;
  }
};

/// The last reduction of an average, in one pass: (a + b) times the reciprocal of the rank count (a
/// power of two: exact) or divided by it.
template <class A>
struct op_sum_times {
  A factor;
  constexpr A operator()(A a, A b) const noexcept { return static_cast<A>(static_cast<A>(a + b) * factor); }
};
template <class A>
struct op_sum_over {
  A divisor;
  constexpr A operator()(A a, A b) const noexcept { return static_cast<A>(static_cast<A>(a + b) / divisor); }
};

/// Calls `f(op_functor)` for a run-time reduce_op (avg combines as sum).
template <class F>
decltype(auto) visit_op(reduce_op op, F&& f) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg: return f(op_sum{});
    case reduce_op::prod: return f(op_prod{});
    case reduce_op::min: return f(op_min{});
    case reduce_op::max: return f(op_max{});
  }
  return f(op_sum{});  // unreachable for valid enumerators
}

// Always inlined, so that the AVX2 build below is these loops compiled for AVX2 (one body each).
template <element T, class Op>
[[gnu::always_inline]] inline void reduce_loop(T* __restrict dst, const T* __restrict src, std::size_t n,
                                               Op op) noexcept {
  for (std::size_t i = 0; i < n; ++i) dst[i] = narrow<T>(op(widen(dst[i]), widen(src[i])));
}

template <element T, class Op>
[[gnu::always_inline]] inline void reduce_loop(T* __restrict dst, const T* __restrict a, const T* __restrict b,
                                               std::size_t n, Op op) noexcept {
  for (std::size_t i = 0; i < n; ++i) dst[i] = narrow<T>(op(widen(a[i]), widen(b[i])));
}

#if defined(__x86_64__)
// The same two loops built for AVX2 (the library targets baseline x86-64, 16-byte vectors): the
// compiler vectorizes them 32 bytes wide. The same operation on each element, so the same bits; only
// a sum or product of two NaNs may return the other NaN (the compiler may swap the operands of a
// commutative operation, and x86 returns the first operand's NaN).
// In cache an f32 sum runs at about twice the speed, short runs (128 f32 at a stride of 256, as
// P -> S(1) reduces them) at 1.3-1.5x; whole buffers out of cache are bound by memory either way
// (bench_reduce_kernels; doc/collectives.md, the kernel table).
template <element T, class Op>
__attribute__((target("avx2"))) void reduce_loop_avx2(T* __restrict dst, const T* __restrict src, std::size_t n,
                                                      Op op) noexcept {
  reduce_loop(dst, src, n, op);
}

template <element T, class Op>
__attribute__((target("avx2"))) void reduce_loop_avx2(T* __restrict dst, const T* __restrict a, const T* __restrict b,
                                                      std::size_t n, Op op) noexcept {
  reduce_loop(dst, a, b, n, op);
}
#endif

/// reduce_loop in the widest vectors this CPU runs (checked once).
template <element T, class Op>
void reduce_loop_widest(T* dst, const T* a, const T* b, std::size_t n, Op op) noexcept {
#if defined(__x86_64__)
  if (cpu_has_avx2()) {
    if (dst == a)
      reduce_loop_avx2(dst, b, n, op);
    else
      reduce_loop_avx2(dst, a, b, n, op);
    return;
  }
#endif
  if (dst == a)
    reduce_loop(dst, b, n, op);
  else
    reduce_loop(dst, a, b, n, op);
}

// ---- half and bfloat16: widen a block to float, reduce in float, round back ----------------------

constexpr std::size_t widen_block = 256;

inline void widen_scalar(const bfloat16* in, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i].bits) << 16);
}
inline void narrow_scalar(const float* in, bfloat16* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const auto f = std::bit_cast<std::uint32_t>(in[i]);
    const std::uint32_t rounded = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
    const std::uint32_t quiet_nan = (f >> 16) | 0x40u;
    out[i].bits = static_cast<std::uint16_t>((f & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) inline void widen_avx2(const bfloat16* in, float* out, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
  widen_scalar(in + i, out + i, n - i);
}
__attribute__((target("avx2"))) inline void narrow_avx2(const float* in, bfloat16* out, std::size_t n) noexcept {
  std::size_t i = 0;
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), abs_mask = _mm256_set1_epi32(0x7fffffff),
                infinity = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x40);
  for (; i + 8 <= n; i += 8) {
    const __m256i f = _mm256_castps_si256(_mm256_loadu_ps(in + i));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(f, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(f, bias), lsb), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(f, abs_mask), infinity);
    const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(f, 16), quiet);
    const __m256i bits = _mm256_blendv_epi8(rounded, quiet_nan, nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
  }
  narrow_scalar(in + i, out + i, n - i);
}
#endif

inline void widen_block_of(const bfloat16* in, float* out, std::size_t n) noexcept {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return widen_avx2(in, out, n);
#endif
  widen_scalar(in, out, n);
}
inline void narrow_block_of(const float* in, bfloat16* out, std::size_t n) noexcept {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return narrow_avx2(in, out, n);
#endif
  narrow_scalar(in, out, n);
}

#if defined(__x86_64__)
inline bool cpu_has_f16c() noexcept {
  static const bool has = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return has;
}
__attribute__((target("avx,f16c"))) inline void widen_f16c(const half* in, float* out, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = static_cast<float>(in[i]);
}
__attribute__((target("avx,f16c"))) inline void narrow_f16c(const float* in, half* out, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) out[i] = half(in[i]);
}
#endif

inline void widen_block_of(const half* in, float* out, std::size_t n) noexcept {
#if defined(__x86_64__)
  if (cpu_has_f16c()) return widen_f16c(in, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}
inline void narrow_block_of(const float* in, half* out, std::size_t n) noexcept {
#if defined(__x86_64__)
  if (cpu_has_f16c()) return narrow_f16c(in, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = half(in[i]);
}

template <class T>
concept sixteen_bit_float = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

/// dst = a (op) b through float blocks; dst may be a (the two-operand form).
template <sixteen_bit_float T, class Op>
void reduce_loop_widened(T* dst, const T* a, const T* b, std::size_t n, Op op) noexcept {
  alignas(64) float fa[widen_block];
  alignas(64) float fb[widen_block];
  for (std::size_t i = 0; i < n; i += widen_block) {
    const std::size_t m = std::min(widen_block, n - i);
    widen_block_of(a + i, fa, m);
    widen_block_of(b + i, fb, m);
    reduce_loop(fa, fb, m, op);
    narrow_block_of(fa, dst + i, m);
  }
}

/// The kernels' single entry: dst = a (op) b, dst == a allowed.
template <element T, class Op>
void reduce_elements(T* dst, const T* a, const T* b, std::size_t n, Op op) noexcept {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    reduce_loop_widened(dst, a, b, n, op);
  else
    reduce_loop_widest(dst, a, b, n, op);
}

/// dst = a (f) b for n elements, where `dst` lies at or before `a` (a - dst = gap >= 0) or apart
/// from it: in pieces no longer than the gap, so that no piece overwrites an element of `a` that it
/// has yet to read (a gap of 0 is in place).
template <element T, class Op>
void reduce_elements_forward(T* dst, const T* a, const T* b, std::size_t n, Op f) noexcept {
  if (dst + n <= a || a + n <= dst || dst == a) {
    reduce_elements(dst, a, b, n, f);
    return;
  }
  const auto gap = static_cast<std::size_t>(a - dst);
  for (std::size_t at = 0; at < n; at += gap) reduce_elements(dst + at, a + at, b + at, std::min(gap, n - at), f);
}

inline void check_same_length(std::string_view what, std::size_t a, std::size_t b) {
  if (a != b)
    throw error_on<usage_error>(no_rank, what, "spans of ", a, " and ", b, " elements; they must have the same length");
}

}  // namespace detail

/// dst[i] = dst[i] (op) src[i]; avg combines as sum (scale once at the end with scale_for_average).
/// @pre dst.size() == src.size() (usage_error otherwise); dst and src do not overlap.
template <element T>
void reduce_into(std::span<T> dst, std::span<const T> src, reduce_op op) {
  detail::check_same_length("reduce_into", dst.size(), src.size());
  detail::visit_op(op, [&](auto f) { detail::reduce_elements(dst.data(), dst.data(), src.data(), dst.size(), f); });
}

/// dst[i] = a[i] (op) b[i].
/// @pre the three spans have one length; dst overlaps neither a nor b.
template <element T>
void reduce_into(std::span<T> dst, std::span<const T> a, std::span<const T> b, reduce_op op) {
  detail::check_same_length("reduce_into", dst.size(), a.size());
  detail::check_same_length("reduce_into", dst.size(), b.size());
  detail::visit_op(op, [&](auto f) { detail::reduce_elements(dst.data(), a.data(), b.data(), dst.size(), f); });
}

/// out[i] = a[i] (op) b[i], where `out` lies at or before `a` (in place, or a result written ahead
/// of the input it is read from, as a reduce-scatter that leaves its block at the front of the
/// buffer does) or apart from it.
/// @pre the three spans have one length (usage_error otherwise); `out` does not overlap `b`.
template <element T>
void reduce_into_forward(std::span<T> out, std::span<const T> a, std::span<const T> b, reduce_op op) {
  detail::check_same_length("reduce_into_forward", out.size(), a.size());
  detail::check_same_length("reduce_into_forward", out.size(), b.size());
  detail::visit_op(op, [&](auto f) { detail::reduce_elements_forward(out.data(), a.data(), b.data(), out.size(), f); });
}

/// The kernel with_reduce_kernel hands its body: kernel(dst, a, b, n) computes dst[i] = a[i] (op)
/// b[i] for n elements, `dst` at or before `a` or apart from it (reduce_into_forward's contract).
template <element T, class Op>
struct forward_reduce_kernel {
  Op op;  ///< the op's element functor
  /// Reduces one run; no checks (the caller's spans are its contract).
  void operator()(T* dst, const T* a, const T* b, std::size_t n) const noexcept {
    detail::reduce_elements_forward(dst, a, b, n, op);
  }
};

/// Dispatches `op` once and calls body(kernel) with a forward_reduce_kernel<T, ...>: for callers that
/// reduce many short runs with one op (a run-time dispatch per run of a few hundred bytes costs as
/// much as the run). Returns what `body` returns.
template <element T, class Body>
decltype(auto) with_reduce_kernel(reduce_op op, Body&& body) {
  return detail::visit_op(op, [&](auto f) { return body(forward_reduce_kernel<T, decltype(f)>{f}); });
}

/// Whether the last reduction of an average folds the division in (average_into): for f32 and f64,
/// reduced in their own precision, one pass gives the bits of the sum and the division done apart.
template <element T>
inline constexpr bool average_folds = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// The last reduction of reduce_op::avg over `ranks` ranks: dst[i] = (a[i] + b[i]) / ranks, the bits
/// of reduce_into_forward(sum) followed by scale_for_average, in one pass over the elements.
/// `dst` at or before `a`, or apart from it (reduce_into_forward's contract).
/// @pre average_folds<T>; the three spans have one length.
template <element T>
requires average_folds<T>
void average_into_forward(std::span<T> dst, std::span<const T> a, std::span<const T> b, int ranks) {
  detail::check_same_length("average_into_forward", dst.size(), a.size());
  detail::check_same_length("average_into_forward", dst.size(), b.size());
  if ((ranks & (ranks - 1)) == 0)
    detail::reduce_elements_forward(dst.data(), a.data(), b.data(), dst.size(),
                                    detail::op_sum_times<T>{T(1) / static_cast<T>(ranks)});
  else
    detail::reduce_elements_forward(dst.data(), a.data(), b.data(), dst.size(),
                                    detail::op_sum_over<T>{static_cast<T>(ranks)});
}

/// data[i] = data[i] / ranks, computed in accumulate_t<T> (integer division for integer types):
/// what turns the sum of reduce_op::avg into the average. For a floating-point type and a power of
/// two, as a multiplication by 1 / ranks (exact: the same bits as the division, at a fraction of
/// its cost).
template <element T>
void scale_for_average(std::span<T> data, int ranks) {
  if (ranks <= 1) return;
  using A = accumulate_t<T>;
  if constexpr (std::is_floating_point_v<A>) {
    if ((ranks & (ranks - 1)) == 0) {
      const A reciprocal = A(1) / static_cast<A>(ranks);
      for (T& v : data) v = detail::narrow<T>(static_cast<A>(detail::widen(v) * reciprocal));
      return;
    }
  }
  const A divisor = static_cast<A>(ranks);
  for (T& v : data) v = detail::narrow<T>(static_cast<A>(detail::widen(v) / divisor));
}

/// Type-erased reduce_into for code that holds a dtype and raw bytes (engine, fusion buffers).
inline void reduce_into(dtype t, void* dst, const void* src, std::size_t count, reduce_op op) {
  visit_dtype(t, [&](auto zero) {
    using T = decltype(zero);
    reduce_into(std::span<T>(static_cast<T*>(dst), count), std::span<const T>(static_cast<const T*>(src), count), op);
  });
}

}  // namespace flexpar
