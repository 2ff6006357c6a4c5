#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include <flexpar/core/dtype.hpp>
#include <flexpar/core/reduce_op.hpp>

namespace flexpar {
namespace {

static_assert(dtype_of<float> == dtype::f32 && dtype_of<const double> == dtype::f64);
static_assert(dtype_of<half> == dtype::f16 && dtype_of<bfloat16> == dtype::bf16);
static_assert(std::is_same_v<accumulate_t<half>, float> && std::is_same_v<accumulate_t<std::int32_t>, std::int32_t>);
static_assert(!element<char> && !element<long double> && element<std::uint8_t>);
static_assert(size_of(dtype::bf16) == 2 && size_of(dtype::i64) == 8 && size_of(dtype::u8) == 1);
static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

// An independent oracle for half: the hardware/compiler conversion of _Float16 (GCC 12, x86-64).
TEST(half, matches_the_compiler_conversion_for_every_half_and_rounding_cases) {
  for (std::uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const half h = half::from_bits(static_cast<std::uint16_t>(bits));
    _Float16 ref;
    std::memcpy(&ref, &bits, 2);
    const float f = static_cast<float>(h);
    if (std::isnan(static_cast<float>(ref))) {
      EXPECT_TRUE(std::isnan(f)) << bits;
      continue;
    }
    ASSERT_EQ(f, static_cast<float>(ref)) << "half bits " << bits;
    // Round trip through float is exact for every non-NaN half.
    ASSERT_EQ(half(f).bits, bits) << "half bits " << bits;
  }
  // Floats between halves (ties, sub-normals, overflow) round like the compiler does.
  for (std::uint32_t i = 0; i < 2000000; ++i) {
    const std::uint32_t fbits = i * 2147u + (i & 1 ? 0x80000000u : 0u);
    float f;
    std::memcpy(&f, &fbits, 4);
    if (std::isnan(f)) continue;
    const _Float16 ref = static_cast<_Float16>(f);
    std::uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(half(f).bits, ref_bits) << "float " << f << " (bits " << fbits << ")";
  }
}

TEST(bfloat16, rounds_to_nearest_even_and_keeps_nan) {
  EXPECT_EQ(bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(static_cast<float>(bfloat16(3.0f)), 3.0f);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(static_cast<float>(bfloat16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  EXPECT_EQ(static_cast<float>(bfloat16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
  EXPECT_TRUE(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(static_cast<float>(bfloat16(std::numeric_limits<float>::infinity()))));
  // Every small integer used by the exact-reduction tests is representable.
  for (int i = -256; i <= 256; ++i) EXPECT_EQ(static_cast<float>(bfloat16(static_cast<float>(i))), i);
}

TEST(visit_dtype, reaches_the_cpp_type_of_each_dtype) {
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i8, dtype::u8, dtype::i32, dtype::i64}) {
    const std::size_t size = visit_dtype(t, [](auto x) { return sizeof(x); });
    EXPECT_EQ(size, size_of(t)) << name_of(t);
    const dtype back = visit_dtype(t, [](auto x) { return dtype_of<decltype(x)>; });
    EXPECT_EQ(back, t);
  }
}

TEST(reduce_op, combine_and_identity) {
  EXPECT_EQ(combine(reduce_op::sum, 2, 3), 5);
  EXPECT_EQ(combine(reduce_op::avg, 2, 3), 5);  // scaled once at the end, not per combine
  EXPECT_EQ(combine(reduce_op::prod, 2, 3), 6);
  EXPECT_EQ(combine(reduce_op::min, 2, 3), 2);
  EXPECT_EQ(combine(reduce_op::max, 2, 3), 3);
  for (reduce_op op : {reduce_op::sum, reduce_op::prod, reduce_op::min, reduce_op::max, reduce_op::avg}) {
    EXPECT_EQ(combine(op, identity_of<float>(op), 7.5f), 7.5f) << name_of(op);
    EXPECT_EQ(combine(op, identity_of<std::int8_t>(op), std::int8_t{-3}), -3) << name_of(op);
  }
  EXPECT_EQ(name_of(reduce_op::prod), "prod");
}

}  // namespace
}  // namespace flexpar
