// Inputs whose reductions are exact in any order, and the serial oracle the collectives are checked
// against (the nccl-tests "verifiable" idea): small integers, so that sums, products, minima and
// maxima come out bit-identical whatever the algorithm's order, in every dtype.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

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
