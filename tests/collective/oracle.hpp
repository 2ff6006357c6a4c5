// Inputs whose reductions are exact in any order, and the serial oracle the collectives are checked
// against (the nccl-tests "verifiable" idea): small integers, so that sums, products, minima and
// maxima come out bit-identical whatever the algorithm's order, in every dtype.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <flexpar/collective/context.hpp>
#include <flexpar/core/dtype.hpp>
#include <flexpar/core/reduce_op.hpp>

namespace flexpar::testing_support {

inline constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max,
                                        reduce_op::avg};
inline constexpr dtype all_dtypes[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16,
                                       dtype::i8,  dtype::u8,  dtype::i32, dtype::i64};

template <element T>
constexpr T from_int(int v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    return T(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

/// Rank `rank`'s element `i` for `op`: in [-4, 4] for sums, {1, 2} for products (at most 2^8 over
/// 8 ranks), [-8, 8] for min/max; unsigned types get the non-negative variants.
template <element T>
T input_value(reduce_op op, int rank, std::size_t i) {
  constexpr bool is_unsigned = std::is_same_v<T, std::uint8_t>;
  const auto k = static_cast<long>(static_cast<std::uint32_t>(i * 2654435761u) >> 8);  // scrambled: blocks differ
  switch (op) {
    case reduce_op::prod: return from_int<T>((k + rank) % 3 == 0 ? 2 : 1);
    case reduce_op::min:
    case reduce_op::max: return from_int<T>(static_cast<int>((k * 5 + rank * 11) % 17) - (is_unsigned ? 0 : 8));
    case reduce_op::sum:
    case reduce_op::avg: break;
  }
  return from_int<T>(static_cast<int>((k * 3 + rank * 7) % 9) - (is_unsigned ? 0 : 4));
}

template <element T>
std::vector<T> make_input(reduce_op op, int rank, std::size_t count, std::size_t offset = 0) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = input_value<T>(op, rank, offset + i);
  return v;
}

/// The reduction over ranks 0 .. p-1 of elements [offset, offset + count), computed serially with
/// core's combine() in accumulate_t<T> (independent of the collective layer's kernels).
template <element T>
std::vector<T> expected_reduction(reduce_op op, int p, std::size_t count, std::size_t offset = 0) {
  using A = accumulate_t<T>;
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    A acc = static_cast<A>(input_value<T>(op, 0, offset + i));
    for (int r = 1; r < p; ++r) {
      // combine in A, then round to T as every hop of a distributed reduction does
      acc = static_cast<A>(T(combine(op, acc, static_cast<A>(input_value<T>(op, r, offset + i)))));
    }
    if (op == reduce_op::avg) acc = static_cast<A>(acc / static_cast<A>(p));
    out[i] = T(acc);
  }
  return out;
}

// ---- order-sensitive inputs ------------------------------------------------------------------------
// The small integers above are exact in any order, so they cannot show whether every rank reduces in
// the same order. Random floats of mixed magnitude round differently in different orders: with them an
// allreduce must still give bitwise identical results on every rank (doc/collectives.md) and stay
// within the rounding bound of a sum in some order with T's rounding at each step.

/// The floating-point dtypes (the order of their reduction shows in the result).
inline constexpr dtype float_dtypes[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16};

/// Unit roundoff of T (half of the distance from 1 to the next value): 2^-24 (f32), 2^-53 (f64),
/// 2^-11 (f16: 11 significant bits), 2^-8 (bf16: 8).
template <element T>
constexpr long double unit_roundoff() {
  if constexpr (std::is_same_v<T, half>) return 0x1p-11L;
  if constexpr (std::is_same_v<T, bfloat16>) return 0x1p-8L;
  if constexpr (std::is_same_v<T, float>) return 0x1p-24L;
  return 0x1p-53L;
}

/// Rank `rank`'s random input: x = u * 2^e, u uniform in [-1, 1), e uniform in [-6, 6], rounded to T
/// (the input is exact in T; |x| <= 64 keeps 8 ranks' sums far below f16's 65504). A hash of (seed,
/// rank, i) (splitmix64): the same numbers in every run and in the serial reference.
template <element T>
std::vector<T> random_input(int rank, std::size_t count, std::uint64_t seed) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(rank) * 0xbf58476d1ce4e5b9ull + i;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1p-52 - 1.0;  // 53 random bits: [-1, 1)
    const double value = std::ldexp(u, static_cast<int>(z % 13) - 6);
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
      v[i] = T(static_cast<float>(value));
    else
      v[i] = static_cast<T>(value);
  }
  return v;
}

/// Every rank's random_input, rank by rank.
template <element T>
std::vector<std::vector<T>> random_inputs(int p, std::size_t count, std::uint64_t seed) {
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < p; ++r) inputs.push_back(random_input<T>(r, count, seed));
  return inputs;
}

/// `got` against the sum (op sum) or average (op avg) of the ranks' `inputs`, computed serially in long
/// double (64-bit significand: its own error is far below T's). A reduction in any order that rounds
/// to T after each of its p - 1 additions errs by at most (p - 1) u sum_r |x_r| (the recursive
/// summation bound, u = unit_roundoff<T>); avg's division and the final rounding add at most
/// 2 u sum_r |x_r| / p more, so (p + 1) u sum_r |x_r| bounds both, plus T's smallest subnormal for
/// results that land there.
template <element T>
::testing::AssertionResult close_to_serial_sum(const std::vector<T>& got, const std::vector<std::vector<T>>& inputs,
                                               reduce_op op, const std::string& what) {
  const auto p = static_cast<long double>(inputs.size());
  const long double u = unit_roundoff<T>();
  auto wide = [](T x) { return static_cast<long double>(static_cast<double>(static_cast<accumulate_t<T>>(x))); };
  for (std::size_t i = 0; i < got.size(); ++i) {
    long double exact = 0, magnitude = 0;
    for (const std::vector<T>& in : inputs) {
      const long double x = wide(in[i]);
      exact += x;
      magnitude += x < 0 ? -x : x;
    }
    if (op == reduce_op::avg) exact /= p;
    const long double bound = (p + 1) * u * magnitude + 0x1p-149L;
    const long double value = wide(got[i]);
    const long double error = value > exact ? value - exact : exact - value;
    if (!(error <= bound))
      return ::testing::AssertionFailure()
             << what << ": element " << i << " of " << got.size() << " is " << static_cast<double>(value)
             << ", the serial " << name_of(op) << " " << static_cast<double>(exact) << " (error "
             << static_cast<double>(error) << " > bound " << static_cast<double>(bound) << ")";
  }
  return ::testing::AssertionSuccess();
}

/// The cases of the random-float checks: counts 1, 7 and 1003 with sum and avg, and one pipeline chunk
/// + 1 (the chunked paths) with sum.
template <element T>
std::vector<std::pair<std::size_t, reduce_op>> random_float_cases() {
  std::vector<std::pair<std::size_t, reduce_op>> cases;
  for (std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{1003}})
    for (reduce_op op : {reduce_op::sum, reduce_op::avg}) cases.emplace_back(count, op);
  cases.emplace_back(pipeline_chunk_bytes / sizeof(T) + 1, reduce_op::sum);
  return cases;
}

/// Whether every rank's result (results[r]) has the same bytes as rank 0's.
template <element T>
::testing::AssertionResult same_bits_on_every_rank(const std::vector<std::vector<T>>& results,
                                                   const std::string& what) {
  for (std::size_t r = 1; r < results.size(); ++r) {
    if (results[r].size() != results[0].size())
      return ::testing::AssertionFailure()
             << what << ": rank " << r << " has " << results[r].size() << " elements, rank 0 " << results[0].size();
    for (std::size_t i = 0; i < results[0].size(); ++i)
      if (std::memcmp(&results[r][i], &results[0][i], sizeof(T)) != 0)
        return ::testing::AssertionFailure()
               << what << ": element " << i << " is "
               << static_cast<double>(static_cast<accumulate_t<T>>(results[r][i])) << " on rank " << r << " but "
               << static_cast<double>(static_cast<accumulate_t<T>>(results[0][i]))
               << " on rank 0 (not bitwise identical)";
  }
  return ::testing::AssertionSuccess();
}

/// First index where `got` and `want` differ, as a gtest assertion with context.
template <element T>
::testing::AssertionResult same_elements(const std::vector<T>& got, const std::vector<T>& want,
                                         const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " elements, expected " << want.size();
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i]))
      return ::testing::AssertionFailure() << what << ": element " << i << " of " << got.size() << " is "
                                           << static_cast<double>(static_cast<accumulate_t<T>>(got[i])) << ", expected "
                                           << static_cast<double>(static_cast<accumulate_t<T>>(want[i]));
  return ::testing::AssertionSuccess();
}

}  // namespace flexpar::testing_support
