// The local reduction kernels against core's scalar combine(), for every dtype and op.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <flexpar/collective/reduce_kernel.hpp>

#include "oracle.hpp"
#include "support/machine_skip.hpp"
#include "sweep.hpp"

namespace flexpar {
namespace {

using namespace testing_support;

TEST(reduce_kernel, two_and_three_operand_forms_match_combine_for_every_dtype_and_op) {
  for_each_dtype([](auto zero) {
    using T = decltype(zero);
    using A = accumulate_t<T>;
    for (reduce_op op : all_ops) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
        const std::vector<T> a = make_input<T>(op, 0, n), b = make_input<T>(op, 1, n);
        std::vector<T> want(n);
        for (std::size_t i = 0; i < n; ++i) want[i] = T(combine(op, static_cast<A>(a[i]), static_cast<A>(b[i])));
        std::vector<T> two = a;
        reduce_into(std::span(two), std::span<const T>(b), op);
        const std::string what =
            std::string(name_of(dtype_of<T>)) + " " + std::string(name_of(op)) + " n=" + std::to_string(n);
        EXPECT_TRUE(same_elements(two, want, "reduce_into(dst, src) " + what));
        std::vector<T> three(n, from_int<T>(99));
        reduce_into(std::span(three), std::span<const T>(a), std::span<const T>(b), op);
        EXPECT_TRUE(same_elements(three, want, "reduce_into(dst, a, b) " + what));
        std::vector<T> erased = a;
        reduce_into(dtype_of<T>, erased.data(), b.data(), n, op);
        EXPECT_TRUE(same_elements(erased, want, "type-erased reduce_into " + what));
      }
    }
  });
}

TEST(reduce_kernel, half_types_reduce_in_float_and_round_once) {
  // The sum is computed in float and rounded to the storage type once, to nearest even.
  std::vector<half> a{half(2048.0f)}, b{half(3.0f)};  // 2051 lies between halves 2050 and 2052: ties to 2052
  reduce_into(std::span(a), std::span<const half>(b), reduce_op::sum);
  EXPECT_EQ(static_cast<float>(a[0]), 2052.0f);
  std::vector<bfloat16> c{bfloat16(256.0f)}, d{bfloat16(3.0f)};  // 259 rounds to 260 in bf16 (8 bits)
  reduce_into(std::span(c), std::span<const bfloat16>(d), reduce_op::sum);
  EXPECT_EQ(static_cast<float>(c[0]), 260.0f);
}

TEST(reduce_kernel, vectorized_half_and_bfloat16_round_exactly_like_core_on_any_value) {
  // Random bit patterns over the whole float range (seeded), so that the vector paths see rounding
  // ties, overflow to infinity, subnormal halves and (for bfloat16) NaNs.
  std::mt19937 rng(20261121);
  std::uniform_real_distribution<float> exponent(-30.0f, 20.0f), mantissa(-2.0f, 2.0f);
  auto random_float = [&] { return std::ldexp(mantissa(rng), static_cast<int>(exponent(rng))); };
  const std::size_t n = 4099;  // several blocks and a tail
  std::vector<float> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = random_float();
    b[i] = i % 97 == 0 ? std::numeric_limits<float>::quiet_NaN() : random_float();
  }
  std::vector<bfloat16> ab(n), bb(n);
  std::vector<half> ah(n), bh(n);
  for (std::size_t i = 0; i < n; ++i) {
    ab[i] = bfloat16(a[i]);
    bb[i] = bfloat16(b[i]);
    ah[i] = half(a[i]);
    bh[i] = half(i % 97 == 0 ? 1.0f : b[i]);  // F16C keeps NaN payloads its own way: no NaN for half
  }
  for (reduce_op op : all_ops) {
    std::vector<bfloat16> rb = ab;
    std::vector<half> rh = ah;
    reduce_into(std::span(rb), std::span<const bfloat16>(bb), op);
    reduce_into(std::span(rh), std::span<const half>(bh), op);
    for (std::size_t i = 0; i < n; ++i) {
      const bfloat16 want_b(combine(op, static_cast<float>(ab[i]), static_cast<float>(bb[i])));
      const half want_h(combine(op, static_cast<float>(ah[i]), static_cast<float>(bh[i])));
      ASSERT_EQ(rb[i].bits, want_b.bits) << "bf16 " << name_of(op) << " element " << i;
      ASSERT_EQ(rh[i].bits, want_h.bits) << "f16 " << name_of(op) << " element " << i;
    }
  }
}

#if defined(__x86_64__)
TEST(reduce_kernel, the_avx2_loops_give_the_bits_of_the_baseline_loops) {
  // reduce_elements takes the AVX2 build of the loops where the CPU runs it (so every other test here
  // runs that build on such a machine); this one holds it to the baseline build, bit for bit (NaN
  // payloads of NaN op NaN aside), on
  // random bit patterns with, for the float types, signed zeros, infinities, NaNs of both signs and
  // subnormals mixed in (where min and max must keep the scalar loop's operand order), in both forms,
  // at every length up to 70 (two vectors of int8 and a tail) and some longer, on arrays one element
  // off their alignment.
  if (!cpu_has_avx2()) FLEXPAR_MACHINE_SKIP("this CPU does not run AVX2");
  std::mt19937_64 rng(20261123);
  for_each_dtype([&](auto zero) {
    using T = decltype(zero);
    if constexpr (!detail::sixteen_bit_float<T>) {
      for (reduce_op op : all_ops)
        for (std::size_t n = 0; n <= 100; n += n < 70 ? 1 : 10) {
          std::vector<T> a(n + 1), b(n + 1);
          for (std::size_t i = 0; i < n + 1; ++i) {
            std::uint64_t x = rng(), y = i % 5 == 0 ? x : rng();  // some equal pairs
            if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
              // half the type's bits, signed: sums and products stay in range (overflow is undefined)
              constexpr int keep = static_cast<int>(sizeof(T)) * 4;
              x = static_cast<std::uint64_t>(static_cast<std::int64_t>(x) >> (64 - keep));
              y = static_cast<std::uint64_t>(static_cast<std::int64_t>(y) >> (64 - keep));
            }
            std::memcpy(&a[i], &x, sizeof(T));  // the low bytes (x86-64 is little-endian)
            std::memcpy(&b[i], &y, sizeof(T));
          }
          if constexpr (std::is_floating_point_v<T>) {
            using limits = std::numeric_limits<T>;
            const T special[] = {T(0),
                                 -T(0),
                                 limits::infinity(),
                                 -limits::infinity(),
                                 limits::quiet_NaN(),
                                 -limits::quiet_NaN(),
                                 limits::denorm_min(),
                                 T(1)};
            const std::size_t kinds = std::size(special);
            for (std::size_t i = 0; i < n + 1; ++i) {
              if (i % 3 == 0) a[i] = special[(i / 3) % kinds];
              if (i % 4 == 0) b[i] = special[(i / 4 + 1) % kinds];
            }
          }
          const std::string what =
              std::string(name_of(dtype_of<T>)) + " " + std::string(name_of(op)) + " n=" + std::to_string(n);
          // the same bits, but for which NaN a sum or product of two NaNs returns: the compiler may
          // swap the operands of a commutative operation, and x86 returns the first operand's NaN
          auto same = [&](const std::vector<T>& x, const std::vector<T>& y, const std::string& form) {
            for (std::size_t i = 0; i < x.size(); ++i) {
              if constexpr (std::is_floating_point_v<T>)
                if (std::isnan(x[i]) && std::isnan(y[i])) continue;
              ASSERT_EQ(std::memcmp(&x[i], &y[i], sizeof(T)), 0) << form << ", " << what << ", element " << i;
            }
          };
          detail::visit_op(op, [&](auto f) {
            std::vector<T> base(n + 1), wide(n + 1);
            detail::reduce_loop(base.data() + 1, a.data() + 1, b.data() + 1, n, f);
            detail::reduce_loop_avx2(wide.data() + 1, a.data() + 1, b.data() + 1, n, f);
            same(base, wide, "dst = a op b");
            std::vector<T> base2 = a, wide2 = a;
            detail::reduce_loop(base2.data() + 1, b.data() + 1, n, f);
            detail::reduce_loop_avx2(wide2.data() + 1, b.data() + 1, n, f);
            same(base2, wide2, "dst op= b");
          });
        }
    }
  });
}
#endif

TEST(reduce_kernel, scale_for_average_divides_in_the_accumulation_type) {
  std::vector<float> f{3.0f, -6.0f};
  scale_for_average(std::span(f), 3);
  EXPECT_EQ(f, (std::vector<float>{1.0f, -2.0f}));
  std::vector<std::int32_t> i{7, -7};
  scale_for_average(std::span(i), 2);
  EXPECT_EQ(i, (std::vector<std::int32_t>{3, -3}));
  std::vector<half> h{half(5.0f)};
  scale_for_average(std::span(h), 2);
  EXPECT_EQ(static_cast<float>(h[0]), 2.5f);
}

TEST(reduce_kernel, mismatched_lengths_are_a_usage_error) {
  std::vector<float> a(3), b(4);
  EXPECT_THROW(reduce_into(std::span(a), std::span<const float>(b), reduce_op::sum), usage_error);
}

}  // namespace
}  // namespace flexpar
