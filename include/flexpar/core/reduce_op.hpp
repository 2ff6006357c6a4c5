// flexpar/core/reduce_op.hpp — reduction operators.
//
// | op   | combine(a, b) | identity          | note                                      |
// |------|---------------|-------------------|-------------------------------------------|
// | sum  | a + b         | 0                 |                                           |
// | prod | a * b         | 1                 |                                           |
// | min  | min(a, b)     | +max of the type  |                                           |
// | max  | max(a, b)     | lowest of the type|                                           |
// | avg  | a + b         | 0                 | summed, then scaled by 1/p once at the end|
//
// Reductions of half/bfloat16 are computed in float (accumulate_t), as NCCL does.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string_view>

#include <flexpar/core/dtype.hpp>

namespace flexpar {

/// How a reduction combines the values of the ranks (the table above).
enum class reduce_op : std::uint8_t { sum, prod, min, max, avg };

/// Short name as printed in errors, benchmarks and the timeline ("sum", "avg", ...).
constexpr std::string_view name_of(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::prod: return "prod";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
    case reduce_op::avg: return "avg";
  }
  return "?";
}

/// combine(a, b) of the table above, on the accumulation type A (avg combines as sum).
template <class A>
constexpr A combine(reduce_op op, A a, A b) noexcept {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg: return static_cast<A>(a + b);
    case reduce_op::prod: return static_cast<A>(a * b);
    case reduce_op::min: return std::min(a, b);
    case reduce_op::max: return std::max(a, b);
  }
  return a;
}

/// The identity of `op` on the accumulation type A: combine(op, identity, x) == x.
/// What a rank that has no data (e.g. after join()) contributes.
template <class A>
constexpr A identity_of(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg: return A(0);
    case reduce_op::prod: return A(1);
    case reduce_op::min:
      return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max();
    case reduce_op::max:
      return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                  : std::numeric_limits<A>::lowest();
  }
  return A(0);
}

}  // namespace flexpar
