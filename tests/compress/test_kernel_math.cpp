// flexpar/cuda/kernel_math.hpp on the CPU: the arithmetic and the index math that the CUDA kernels
// run (lib/cuda/*.cu), checked here in every build (no CUDA needed) against the host compressors and
// plain oracles. Each "as the kernel does" function below walks a chunk the way the kernel's warp does
// (32 lanes, lane sums, a butterfly reduction, ballots) with the shared functions, so a wrong byte
// offset, rounding or bit order in that walk fails here before any GPU runs it.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <flexpar/compress/minmax_uint8.hpp>
#include <flexpar/compress/onebit.hpp>
#include <flexpar/cuda/kernel_math.hpp>

#include "support/random_values.hpp"

namespace flexpar::cuda::math {
namespace {

/// The same floats bit for bit (memcmp, which must not see the null data() of an empty vector).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

using testing_support::normal_floats;

float read_float(const std::byte* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}

// ---- split_for_vectors --------------------------------------------------------------------------------

TEST(kernel_math, vector_split_covers_every_element_and_aligns_every_body_access) {
  const std::uintptr_t base = 0x10000;
  for (std::size_t size : {1u, 2u, 4u, 8u}) {
    const std::size_t per_vector = 16 / size;
    for (std::uintptr_t ma = 0; ma < 16; ma += size)
      for (std::uintptr_t mb = 0; mb < 16; mb += size)
        for (std::uintptr_t mc : {ma, mb}) {
          for (std::size_t count = 0; count < 70; ++count) {
            const vector_split s = split_for_vectors(base + ma, base + 64 + mb, base + 128 + mc, count, size);
            ASSERT_EQ(s.head + s.vectors * per_vector + s.tail, count);
            if (ma != mb || ma != mc) {  // no common alignment: all scalar
              EXPECT_EQ(s.head, count);
              continue;
            }
            for (std::uintptr_t p : {base + ma, base + 64 + mb, base + 128 + mc})
              if (s.vectors > 0) {
                EXPECT_EQ((p + s.head * size) % 16, 0u) << "size " << size << " count " << count;
              }
            // the scalar parts are as small as the alignment allows
            EXPECT_LT(s.tail, per_vector);
            EXPECT_LT(s.head, per_vector);
            if (count >= 2 * per_vector) {
              EXPECT_GE(s.vectors, 1u);
            }
          }
        }
  }
}

// ---- min-max uint8 --------------------------------------------------------------------------------------

// The encode kernel's walk: per chunk, min and max (exact in any order), the header, then one code per
// element with minmax_code. Returns false at the first non-finite element, as the kernel reports it.
bool encode_as_the_kernel_does(const std::vector<float>& in, std::size_t chunk, std::vector<std::byte>& out,
                               std::size_t& first_bad) {
  const std::size_t chunks = (in.size() + chunk - 1) / chunk;
  first_bad = std::numeric_limits<std::size_t>::max();
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t begin = c * chunk, m = std::min(chunk, in.size() - begin);
    // lane l takes elements l, l + 32, ...; the warp then combines the lanes
    std::array<float, 32> lo, hi;
    lo.fill(std::numeric_limits<float>::infinity());
    hi.fill(-std::numeric_limits<float>::infinity());
    for (std::size_t i = 0; i < m; ++i) {
      const float x = in[begin + i];
      if (!finite(x)) first_bad = std::min(first_bad, begin + i);
      lo[i % 32] = std::fmin(lo[i % 32], x);
      hi[i % 32] = std::fmax(hi[i % 32], x);
    }
    const float l = *std::min_element(lo.begin(), lo.end()), h = *std::max_element(hi.begin(), hi.end());
    std::byte* header = out.data() + minmax_chunk_offset(c, chunk);
    std::memcpy(header, &l, sizeof l);
    std::memcpy(header + sizeof l, &h, sizeof h);
    const float scale = minmax_scale(l, h);
    for (std::size_t i = 0; i < m; ++i)
      header[minmax_header_bytes + i] = static_cast<std::byte>(minmax_code(in[begin + i], l, scale));
  }
  return first_bad == std::numeric_limits<std::size_t>::max();
}

void decode_as_the_kernel_does(const std::vector<std::byte>& in, std::size_t chunk, std::vector<float>& out,
                               bool accumulate) {
  for (std::size_t begin = 0, c = 0; begin < out.size(); begin += chunk, ++c) {
    const std::size_t m = std::min(chunk, out.size() - begin);
    const std::byte* header = in.data() + minmax_chunk_offset(c, chunk);
    const float lo = read_float(header), step = minmax_step(lo, read_float(header + sizeof(float)));
    for (std::size_t i = 0; i < m; ++i) {
      const float v = minmax_value(static_cast<std::uint8_t>(header[minmax_header_bytes + i]), lo, step);
      out[begin + i] = accumulate ? add_rn(out[begin + i], v) : v;
    }
  }
}

std::vector<std::vector<float>> minmax_inputs(std::size_t n, std::uint64_t seed) {
  std::vector<std::vector<float>> inputs;
  inputs.push_back(normal_floats(n, seed));
  inputs.push_back(normal_floats(n, seed + 1, 1e4f));
  std::vector<float> shifted = normal_floats(n, seed + 2, 1e-3f);  // a small range far from zero
  for (float& x : shifted) x += 1000.0f;
  inputs.push_back(shifted);
  std::vector<float> ties(n);  // values on the code grid and halfway between: the rounding's edge
  for (std::size_t i = 0; i < n; ++i) ties[i] = static_cast<float>(i % 511) * 0.5f;
  inputs.push_back(ties);
  inputs.push_back(std::vector<float>(n, -2.5f));  // constant chunks
  std::vector<float> zeros(n);                     // signed zeros only
  for (std::size_t i = 0; i < n; ++i) zeros[i] = i % 2 ? -0.0f : 0.0f;
  inputs.push_back(zeros);
  return inputs;
}

TEST(kernel_math, minmax_codes_are_the_host_encoders_bit_for_bit) {
  for (std::size_t chunk : {std::size_t{512}, std::size_t{1}, std::size_t{3}, std::size_t{100}, std::size_t{4096}})
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{511}, std::size_t{512},
                          std::size_t{513}, std::size_t{5003}}) {
      const compress::minmax_uint8 host{chunk};
      for (const auto& in : minmax_inputs(n, 100 + n + chunk)) {
        std::vector<std::byte> expected(host.encoded_size(n)), got(host.encoded_size(n), std::byte{0xee});
        host.encode(in, expected);
        std::size_t first_bad = 0;
        ASSERT_TRUE(encode_as_the_kernel_does(in, chunk, got, first_bad));
        for (std::size_t c = 0, off = 0; off < got.size(); ++c, off = minmax_chunk_offset(c, chunk)) {
          // min and max: equal as values (the sign of a zero depends on the order of the scan)
          EXPECT_EQ(read_float(got.data() + off), read_float(expected.data() + off)) << "chunk " << c;
          EXPECT_EQ(read_float(got.data() + off + 4), read_float(expected.data() + off + 4)) << "chunk " << c;
          const std::size_t m = std::min(chunk, n - c * chunk);
          EXPECT_EQ(std::memcmp(got.data() + off + 8, expected.data() + off + 8, m), 0)
              << "codes of chunk " << c << ", n " << n << ", chunk " << chunk;
        }
        // decoding: the host decoder's floats, bit for bit, and decode-add equals decode then add
        std::vector<float> host_out(n), kernel_out(n), acc = normal_floats(n, 9), expected_acc = acc;
        host.decode(expected, host_out);
        decode_as_the_kernel_does(expected, chunk, kernel_out, false);
        EXPECT_TRUE(same_bits(host_out, kernel_out));
        for (std::size_t i = 0; i < n; ++i) expected_acc[i] += host_out[i];
        decode_as_the_kernel_does(expected, chunk, acc, true);
        EXPECT_TRUE(same_bits(acc, expected_acc));
      }
    }
}

TEST(kernel_math, minmax_reports_the_first_non_finite_element_as_the_host_does) {
  const compress::minmax_uint8 host{100};
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()})
    for (std::size_t where : {std::size_t{0}, std::size_t{99}, std::size_t{100}, std::size_t{777}}) {
      auto in = normal_floats(1000, 3);
      in[where] = bad;
      in[where + 150] = bad;  // a later one, in another chunk: not the one reported
      std::vector<std::byte> out(host.encoded_size(in.size()));
      std::size_t first_bad = 0;
      EXPECT_FALSE(encode_as_the_kernel_does(in, 100, out, first_bad));
      EXPECT_EQ(first_bad, where);
      try {
        host.encode(in, out);
        ADD_FAILURE() << "the host encoder accepted " << bad;
      } catch (const usage_error& e) {
        EXPECT_NE(std::string(e.what()).find("element " + std::to_string(where) + " is"), std::string::npos)
            << e.what();
      }
    }
  EXPECT_TRUE(finite(0.0f) && finite(-0.0f) && finite(std::numeric_limits<float>::max()) &&
              finite(std::numeric_limits<float>::denorm_min()));
}

// ---- 1-bit ----------------------------------------------------------------------------------------------

// The encode kernel's walk: lane sums of |v| in float, the warp's butterfly in double, then rounds of
// 32 elements whose signs one ballot packs into 4 bytes (fewer at the end of a chunk).
void onebit_encode_as_the_kernel_does(const std::vector<float>& x, std::vector<float>& residual, std::size_t chunk,
                                      std::vector<std::byte>& out) {
  const std::size_t n = x.size();
  for (std::size_t begin = 0, c = 0; begin < n; begin += chunk, ++c) {
    const std::size_t m = std::min(chunk, n - begin);
    std::array<double, 32> lane{};
    std::array<float, 32> part{};
    for (std::size_t i = 0; i < m; ++i)
      part[i % 32] = add_rn(part[i % 32], std::fabs(add_rn(residual[begin + i], x[begin + i])));
    for (std::size_t l = 0; l < 32; ++l) lane[l] = part[l];
    for (std::size_t offset = 16; offset > 0; offset /= 2) {  // __shfl_xor_sync butterfly
      std::array<double, 32> next{};
      for (std::size_t l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ offset];
      lane = next;
    }
    const float scale = static_cast<float>(lane[0] / static_cast<double>(m));
    std::byte* header = out.data() + c * onebit_chunk_bytes(chunk);
    std::memcpy(header, &scale, sizeof scale);
    std::byte* bits = header + sizeof(float);
    for (std::size_t i0 = 0; i0 < m; i0 += 32) {
      std::uint32_t word = 0;
      for (std::size_t l = 0; l < 32; ++l) {
        const std::size_t i = i0 + l;
        if (i >= m) continue;
        const float v = add_rn(residual[begin + i], x[begin + i]);
        if (onebit_negative(v)) word |= 1u << l;
        residual[begin + i] = onebit_feedback(v, scale);
      }
      const std::size_t bytes_here = (m - i0 < 32 ? m - i0 + 7 : 32) / 8;
      for (std::size_t l = 0; l < bytes_here; ++l) bits[i0 / 8 + l] = static_cast<std::byte>((word >> (8 * l)) & 0xffu);
    }
  }
}

TEST(kernel_math, onebit_signs_match_the_host_and_scales_agree_within_rounding) {
  for (std::size_t chunk : {std::size_t{2048}, std::size_t{1}, std::size_t{7}, std::size_t{33}, std::size_t{100}})
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{2047}, std::size_t{2049}, std::size_t{5000}}) {
      compress::onebit host(n, chunk);
      std::vector<float> residual(n, 0.0f);
      const std::size_t bytes = host.encoded_size(n);
      for (int step = 0; step < 4; ++step) {
        const auto x = normal_floats(n, 1000 * step + n + chunk);
        std::vector<std::byte> expected(bytes), got(bytes + 16, std::byte{0xee});
        const std::vector<float> before(host.residual().begin(), host.residual().end());
        host.encode(x, expected);
        // start each step from the host's residual, so the signs are comparable exactly
        residual = before;
        onebit_encode_as_the_kernel_does(x, residual, chunk, got);
        for (std::size_t i = bytes; i < got.size(); ++i) ASSERT_EQ(got[i], std::byte{0xee}) << "wrote past the end";
        for (std::size_t begin = 0, c = 0; begin < n; begin += chunk, ++c) {
          const std::size_t m = std::min(chunk, n - begin), off = c * onebit_chunk_bytes(chunk);
          const float a = read_float(got.data() + off), b = read_float(expected.data() + off);
          EXPECT_NEAR(a, b, 1e-5f * b) << "scale of chunk " << c;
          EXPECT_EQ(std::memcmp(got.data() + off + 4, expected.data() + off + 4, (m + 7) / 8), 0)
              << "signs of chunk " << c << ", n " << n << ", chunk " << chunk;
        }
        for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(residual[i], host.residual()[i], 1e-5f) << i;
        // decode: +-scale from the bits, as the host decodes
        std::vector<float> host_out(n), kernel_out(n);
        host.decode(expected, host_out);
        for (std::size_t begin = 0, c = 0; begin < n; begin += chunk, ++c) {
          const std::byte* header = expected.data() + c * onebit_chunk_bytes(chunk);
          const auto* b = reinterpret_cast<const std::uint8_t*>(header + 4);
          for (std::size_t i = 0; i < std::min(chunk, n - begin); ++i)
            kernel_out[begin + i] = onebit_value(((b[i / 8] >> (i % 8)) & 1u) != 0, read_float(header));
        }
        EXPECT_TRUE(same_bits(host_out, kernel_out));
      }
    }
}

TEST(kernel_math, onebit_error_feedback_loses_nothing) {
  const std::size_t n = 3001, chunk = 64;
  compress::onebit host(n, chunk);  // for encoded_size and decode only
  std::vector<float> residual(n, 0.0f);
  std::vector<double> sent(n, 0.0), truth(n, 0.0);
  for (int step = 0; step < 20; ++step) {
    const auto x = normal_floats(n, 50 + step);
    std::vector<std::byte> wire(host.encoded_size(n));
    onebit_encode_as_the_kernel_does(x, residual, chunk, wire);
    std::vector<float> decoded(n);
    host.decode(wire, decoded);
    for (std::size_t i = 0; i < n; ++i) sent[i] += decoded[i], truth[i] += x[i];
  }
  for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(sent[i], truth[i] - residual[i], 1e-3) << i;
}

}  // namespace
}  // namespace flexpar::cuda::math
