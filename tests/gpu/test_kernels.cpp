// flexpar/cuda/kernels.hpp on a device, against the host implementations on fresh random data:
// reduce_into / scale_for_average (every dtype and op, bit for bit), min-max uint8 (codes bit for bit,
// decode and decode-add bit for bit, non-finite input named), 1-bit (signs exact, scale within
// rounding, error feedback), and the batched copy of the fusion packer. Sizes 0, 1, odd, misaligned
// sub-spans and 64 MiB. Exits 77 (skipped) without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <flexpar/collective/reduce_kernel.hpp>
#include <flexpar/compress/minmax_uint8.hpp>
#include <flexpar/compress/onebit.hpp>
#include <flexpar/cuda/kernels.hpp>

#include "support/random_values.hpp"

namespace fc = flexpar::cuda;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t mib64 = std::size_t{64} << 20;

template <class T>
T from_float(float v) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<T>(std::lround(v));
  else
    return T(v);
}

/// Random values of T: normal floats, or small integers (so that sums and products of two stay in range).
template <class T>
std::vector<T> random_of(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(n);
  if constexpr (std::is_integral_v<T>) {
    std::uniform_int_distribution<int> d(std::is_signed_v<T> ? -11 : 0, 11);
    for (auto& x : v) x = static_cast<T>(d(rng));
  } else {
    std::normal_distribution<float> d(0.0f, 3.0f);
    for (auto& x : v) x = from_float<T>(d(rng));
  }
  return v;
}

template <class T>
fc::device_buffer<T> upload(const std::vector<T>& host, fc::stream& s) {
  return fc::to_device(std::span<const T>(host), s);
}

template <class T>
std::vector<T> download(fc::device_span<const T> d, fc::stream& s) {
  return fc::to_host(d, s, 60s, "download");
}

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class T>
std::size_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return i;
  return a.size();
}

// ---- reduce ---------------------------------------------------------------------------------------------

template <class T>
void check_reduce(std::size_t n, std::size_t dst_offset, std::size_t src_offset, flexpar::reduce_op op,
                  std::uint64_t seed) {
  fc::stream s;
  const auto a = random_of<T>(n + dst_offset, seed), b = random_of<T>(n + src_offset, seed + 1);
  auto da = upload(a, s);
  const auto db = upload(b, s);
  const std::string what = std::string(flexpar::name_of(flexpar::dtype_of<T>)) + " " +
                           std::string(flexpar::name_of(op)) + " n=" + std::to_string(n) + " offsets " +
                           std::to_string(dst_offset) + "/" + std::to_string(src_offset);

  // three operands: out = a op b
  fc::device_buffer<T> out(n + 1);
  fc::reduce_into(out.span().subspan(1, n), fc::device_span<const T>(da.span().subspan(dst_offset, n)),
                  fc::device_span<const T>(db.span().subspan(src_offset, n)), op, s);
  // two operands: a = a op b, in place
  fc::reduce_into(da.span().subspan(dst_offset, n), fc::device_span<const T>(db.span().subspan(src_offset, n)), op, s);

  std::vector<T> expected(a.begin() + static_cast<std::ptrdiff_t>(dst_offset), a.end());
  flexpar::reduce_into(std::span<T>(expected), std::span<const T>(b.data() + src_offset, n), op);
  const auto got3 = download(fc::device_span<const T>(out.span().subspan(1, n)), s);
  const auto got2 = download(fc::device_span<const T>(da.span().subspan(dst_offset, n)), s);
  EXPECT_TRUE(same_bytes(got2, expected))
      << what << ", in place: first difference at " << first_difference(got2, expected);
  EXPECT_TRUE(same_bytes(got3, expected))
      << what << ", three operands: first difference at " << first_difference(got3, expected);

  if (op == flexpar::reduce_op::avg) {
    for (int ranks : {1, 3, 4}) {
      auto d = upload(expected, s);
      fc::scale_for_average(d.span(), ranks, s);
      std::vector<T> scaled = expected;
      flexpar::scale_for_average(std::span<T>(scaled), ranks);
      const auto got = download(fc::device_span<const T>(d.span()), s);
      EXPECT_TRUE(same_bytes(got, scaled))
          << what << ", scaled by 1/" << ranks << ": first difference at " << first_difference(got, scaled);
    }
  }
}

template <class T>
void check_reduce_all_ops(std::uint64_t seed) {
  for (auto op : {flexpar::reduce_op::sum, flexpar::reduce_op::prod, flexpar::reduce_op::min, flexpar::reduce_op::max,
                  flexpar::reduce_op::avg})
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{33}, std::size_t{1000}, std::size_t{100003}})
      for (auto [d, s] : {std::pair<std::size_t, std::size_t>{0, 0}, {1, 1}, {3, 3}, {1, 0}, {0, 5}})
        check_reduce<T>(n, d, s, op, seed++);
}

TEST(CudaKernels, ReduceF32MatchesTheHostBitForBit) { check_reduce_all_ops<float>(1); }
TEST(CudaKernels, ReduceF64MatchesTheHostBitForBit) { check_reduce_all_ops<double>(2); }
TEST(CudaKernels, ReduceF16MatchesTheHostBitForBit) { check_reduce_all_ops<flexpar::half>(3); }
TEST(CudaKernels, ReduceBf16MatchesTheHostBitForBit) { check_reduce_all_ops<flexpar::bfloat16>(4); }
TEST(CudaKernels, ReduceI8MatchesTheHostBitForBit) { check_reduce_all_ops<std::int8_t>(5); }
TEST(CudaKernels, ReduceU8MatchesTheHostBitForBit) { check_reduce_all_ops<std::uint8_t>(6); }
TEST(CudaKernels, ReduceI32MatchesTheHostBitForBit) { check_reduce_all_ops<std::int32_t>(7); }
TEST(CudaKernels, ReduceI64MatchesTheHostBitForBit) { check_reduce_all_ops<std::int64_t>(8); }

// The many-source form: dst = s0 op s1 op ... op sk, against the host's reduce_into applied source by
// source (bit for bit), for 1..12 sources (one launch up to 8, a second launch folding the rest into
// the running result), dst being the first source or a buffer of its own, aligned and not.
template <class T>
void check_reduce_many(std::size_t sources, std::size_t n, std::size_t offset, bool in_place, flexpar::reduce_op op,
                       std::uint64_t seed) {
  fc::stream s;
  std::vector<std::vector<T>> host;
  std::vector<fc::device_buffer<T>> device;
  for (std::size_t k = 0; k < sources; ++k) {
    host.push_back(random_of<T>(n + offset, seed + k));
    device.push_back(upload(host.back(), s));
  }
  std::vector<fc::device_span<const T>> spans;
  for (std::size_t k = 0; k < sources; ++k)
    spans.emplace_back(device[k].data() + (k % 2 ? offset : 0), n);  // every other source misaligned by `offset`
  fc::device_buffer<T> out(n + 1);
  const fc::device_span<T> dst =
      in_place ? fc::device_span<T>(device[0].data(), n) : fc::device_span<T>(out.data() + 1, n);
  fc::reduce_into(dst, std::span<const fc::device_span<const T>>(spans), op, s);
  std::vector<T> expected(host[0].begin(), host[0].begin() + static_cast<std::ptrdiff_t>(n));
  for (std::size_t k = 1; k < sources; ++k)
    flexpar::reduce_into(std::span<T>(expected), std::span<const T>(host[k].data() + (k % 2 ? offset : 0), n), op);
  const auto got = download(fc::device_span<const T>(dst), s);
  EXPECT_TRUE(same_bytes(got, expected)) << flexpar::name_of(flexpar::dtype_of<T>) << " " << flexpar::name_of(op)
                                         << " sources " << sources << " n " << n << " offset " << offset
                                         << (in_place ? " in place" : "") << ": first difference at "
                                         << first_difference(got, expected);
}

TEST(CudaKernels, ReduceOfManySourcesMatchesTheHostSourceBySource) {
  std::uint64_t seed = 100;
  for (std::size_t sources : {1, 2, 3, 4, 8, 9, 12})
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{37}, std::size_t{100003}})
      for (bool in_place : {false, true}) {
        check_reduce_many<float>(sources, n, 0, in_place, flexpar::reduce_op::sum, seed++);
        check_reduce_many<float>(sources, n, 1, in_place, flexpar::reduce_op::max, seed++);
        check_reduce_many<flexpar::half>(sources, n, 0, in_place, flexpar::reduce_op::sum, seed++);
        check_reduce_many<flexpar::bfloat16>(sources, n, 3, in_place, flexpar::reduce_op::prod, seed++);
        check_reduce_many<std::int8_t>(sources, n, 0, in_place, flexpar::reduce_op::sum, seed++);
        check_reduce_many<double>(sources, n, 0, in_place, flexpar::reduce_op::min, seed++);
      }
  fc::stream s;
  fc::device_buffer<float> a(4), b(5);
  const fc::device_span<const float> wrong[] = {fc::device_span<const float>(a.span()),
                                                fc::device_span<const float>(b.span())};
  EXPECT_THROW(
      fc::reduce_into(a.span(), std::span<const fc::device_span<const float>>(wrong), flexpar::reduce_op::sum, s),
      flexpar::usage_error);
  EXPECT_THROW(fc::reduce_into(a.span(), std::span<const fc::device_span<const float>>(), flexpar::reduce_op::sum, s),
               flexpar::usage_error);
}

TEST(CudaKernels, Reduce64MiBMatchesTheHost) {
  check_reduce<float>(mib64 / sizeof(float), 0, 0, flexpar::reduce_op::sum, 77);
  check_reduce<flexpar::bfloat16>(mib64 / 2 + 3, 1, 1, flexpar::reduce_op::max, 78);
}

TEST(CudaKernels, TypeErasedReduceDispatchesOnTheDtype) {
  fc::stream s;
  const auto a = random_of<std::int32_t>(1001, 9), b = random_of<std::int32_t>(1001, 10);
  auto da = upload(a, s);
  const auto db = upload(b, s);
  fc::reduce_into(flexpar::dtype::i32, da.data(), db.data(), a.size(), flexpar::reduce_op::max, s);
  std::vector<std::int32_t> expected = a;
  flexpar::reduce_into(std::span<std::int32_t>(expected), std::span<const std::int32_t>(b), flexpar::reduce_op::max);
  EXPECT_EQ(download(fc::device_span<const std::int32_t>(da.span()), s), expected);
}

TEST(CudaKernels, ReduceOfMismatchedLengthsIsAUsageError) {
  fc::device_buffer<float> a(4), b(5);
  fc::stream s;
  try {
    fc::reduce_into(a.span(), fc::device_span<const float>(b.span()), flexpar::reduce_op::sum, s);
    FAIL() << "no error";
  } catch (const flexpar::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("spans of 4 and 5 elements"), std::string::npos) << e.what();
  }
}

// ---- min-max uint8 ------------------------------------------------------------------------------------------

float read_float(const std::byte* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}

using flexpar::testing_support::normal_floats;

void check_minmax(std::size_t n, std::size_t chunk, std::size_t in_offset, std::size_t out_offset, std::uint64_t seed) {
  const std::string what = "n=" + std::to_string(n) + " chunk=" + std::to_string(chunk) + " offsets " +
                           std::to_string(in_offset) + "/" + std::to_string(out_offset);
  fc::stream s;
  const flexpar::compress::minmax_uint8 host{chunk};
  fc::minmax_uint8 gpu(chunk);
  ASSERT_EQ(gpu.encoded_size(n), host.encoded_size(n));
  auto x = normal_floats(n + in_offset, seed, seed % 2 ? 1.0f : 1e3f);
  const auto dx = upload(x, s);
  const std::size_t bytes = host.encoded_size(n);
  fc::device_buffer<std::byte> wire(bytes + out_offset);
  const auto in = fc::device_span<const float>(dx.span().subspan(in_offset, n));
  const auto out = wire.span().subspan(out_offset, bytes);
  gpu.encode_checked(in, out, s, 60s);

  std::vector<std::byte> expected(bytes);
  const std::vector<float> xs(x.begin() + static_cast<std::ptrdiff_t>(in_offset), x.end());
  host.encode(xs, expected);
  const auto got = download(fc::device_span<const std::byte>(out), s);
  for (std::size_t c = 0; c * chunk < n; ++c) {
    const std::size_t off = c * (8 + chunk), m = std::min(chunk, n - c * chunk);
    ASSERT_EQ(read_float(got.data() + off), read_float(expected.data() + off)) << what << " min of chunk " << c;
    ASSERT_EQ(read_float(got.data() + off + 4), read_float(expected.data() + off + 4)) << what << " max of chunk " << c;
    ASSERT_EQ(std::memcmp(got.data() + off + 8, expected.data() + off + 8, m), 0) << what << " codes of chunk " << c;
  }

  // decode and decode-add of the host's bytes (so a GPU rank reads what a CPU rank sent)
  const auto dwire = upload(expected, s);
  fc::device_buffer<float> decoded(n + 1);
  gpu.decode(fc::device_span<const std::byte>(dwire.span()), decoded.span().subspan(1, n), s);
  std::vector<float> host_decoded(n);
  host.decode(expected, host_decoded);
  const auto got_decoded = download(fc::device_span<const float>(decoded.span().subspan(1, n)), s);
  EXPECT_TRUE(same_bytes(got_decoded, host_decoded))
      << what << " decode: first difference at " << first_difference(got_decoded, host_decoded);

  const auto acc = normal_floats(n, seed + 5, 1.0f);
  auto dacc = upload(acc, s);
  gpu.decode_add(fc::device_span<const std::byte>(dwire.span()), dacc.span(), s);
  std::vector<float> host_acc = acc;
  flexpar::reduce_into(std::span<float>(host_acc), std::span<const float>(host_decoded), flexpar::reduce_op::sum);
  const auto got_acc = download(fc::device_span<const float>(dacc.span()), s);
  EXPECT_TRUE(same_bytes(got_acc, host_acc))
      << what << " decode_add: first difference at " << first_difference(got_acc, host_acc);
}

TEST(CudaKernels, MinmaxMatchesTheHostEncoderBitForBit) {
  std::uint64_t seed = 100;
  for (std::size_t chunk : {std::size_t{512}, std::size_t{100}, std::size_t{3}, std::size_t{1000}, std::size_t{4096}})
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{511}, std::size_t{512},
                          std::size_t{513}, std::size_t{100003}})
      for (auto [i, o] : {std::pair<std::size_t, std::size_t>{0, 0}, {1, 0}, {0, 1}, {3, 2}})
        check_minmax(n, chunk, i, o, seed++);
}

TEST(CudaKernels, Minmax64MiBMatchesTheHost) { check_minmax(mib64 / sizeof(float), 512, 0, 0, 7); }

TEST(CudaKernels, MinmaxNamesTheFirstNonFiniteElement) {
  fc::stream s;
  fc::minmax_uint8 gpu(100);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()})
    for (std::size_t where : {std::size_t{0}, std::size_t{99}, std::size_t{777}}) {
      auto x = normal_floats(100000, where, 1.0f);
      x[where] = bad;
      x[where + 5000] = bad;
      x[99999] = std::numeric_limits<float>::quiet_NaN();
      const auto dx = upload(x, s);
      fc::device_buffer<std::byte> wire(gpu.encoded_size(x.size()));
      try {
        gpu.encode_checked(fc::device_span<const float>(dx.span()), wire.span(), s, 60s, 2);
        ADD_FAILURE() << "no error for " << bad << " at " << where;
      } catch (const flexpar::usage_error& e) {
        const std::string text = e.what();
        EXPECT_NE(text.find("element " + std::to_string(where) + " is"), std::string::npos) << text;
        EXPECT_NE(text.find("[rank 2]"), std::string::npos) << text;
      }
    }
  // the status word is reset by the next encode: finite input passes
  const auto good = upload(normal_floats(1000, 5, 1.0f), s);
  fc::device_buffer<std::byte> wire(gpu.encoded_size(1000));
  EXPECT_NO_THROW(gpu.encode_checked(fc::device_span<const float>(good.span()), wire.span(), s, 60s));
}

TEST(CudaKernels, MinmaxRefusesTooSmallBuffers) {
  fc::stream s;
  fc::minmax_uint8 gpu(512);
  fc::device_buffer<float> x(1000);
  fc::device_buffer<std::byte> wire(gpu.encoded_size(1000) - 1);
  EXPECT_THROW(gpu.encode(fc::device_span<const float>(x.span()), wire.span(), s), flexpar::usage_error);
  EXPECT_THROW(gpu.decode(fc::device_span<const std::byte>(wire.span()), x.span(), s), flexpar::usage_error);
}

// ---- 1-bit ------------------------------------------------------------------------------------------------

TEST(CudaKernels, OnebitMatchesTheHostCompressor) {
  // Step 0 (zero residual): the GPU's bytes against compress::onebit's. Every step: against the
  // definition applied to the GPU's own residual: v = x + residual (one float add), the signs of v
  // exactly, the scale = mean |v| within rounding, the new residual = v - (+-scale) bit for bit with
  // the scale the GPU sent.
  for (std::size_t chunk :
       {std::size_t{2048}, std::size_t{7}, std::size_t{33}, std::size_t{100}, std::size_t{1000}, std::size_t{4100}})
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{2049}, std::size_t{100003}}) {
      const std::string what = "n=" + std::to_string(n) + " chunk=" + std::to_string(chunk);
      fc::stream s;
      flexpar::compress::onebit host(n, chunk);
      fc::onebit gpu(n, chunk);
      ASSERT_EQ(gpu.encoded_size(n), host.encoded_size(n));
      const std::size_t bytes = host.encoded_size(n);
      std::vector<double> sent(n, 0.0), truth(n, 0.0);
      for (int step = 0; step < 3; ++step) {
        const auto x = normal_floats(n, 31 * step + n + chunk, 1.0f);
        const std::vector<float> r_before = download(gpu.residual(), s);
        const auto dx = upload(x, s);
        fc::device_buffer<std::byte> wire(bytes + 1);
        gpu.encode(fc::device_span<const float>(dx.span()), wire.span().subspan(1, bytes), s);
        gpu.check(s, 60s);
        const auto got = download(fc::device_span<const std::byte>(wire.span().subspan(1, bytes)), s);
        const auto residual = download(gpu.residual(), s);
        if (step == 0) {
          std::vector<std::byte> expected(bytes);
          host.encode(x, expected);
          for (std::size_t begin = 0, c = 0; begin < n; begin += chunk, ++c) {
            const std::size_t off = c * (4 + (chunk + 7) / 8), m = std::min(chunk, n - begin);
            const float b = read_float(expected.data() + off);
            EXPECT_NEAR(read_float(got.data() + off), b, 1e-5f * b) << what << " host scale of chunk " << c;
            ASSERT_EQ(std::memcmp(got.data() + off + 4, expected.data() + off + 4, (m + 7) / 8), 0)
                << what << " host signs of chunk " << c;
          }
        }
        for (std::size_t begin = 0, c = 0; begin < n; begin += chunk, ++c) {
          const std::size_t off = c * (4 + (chunk + 7) / 8), m = std::min(chunk, n - begin);
          const float scale = read_float(got.data() + off);
          double total = 0;
          for (std::size_t i = 0; i < m; ++i) total += std::abs(x[begin + i] + r_before[begin + i]);
          EXPECT_NEAR(scale, total / static_cast<double>(m), 1e-5 * total / static_cast<double>(m))
              << what << " step " << step << " scale of chunk " << c;
          for (std::size_t i = 0; i < m; ++i) {
            const float v = x[begin + i] + r_before[begin + i];
            const bool bit = (static_cast<unsigned>(got[off + 4 + i / 8]) >> (i % 8)) & 1u;
            ASSERT_EQ(bit, v < 0) << what << " step " << step << " sign of element " << begin + i;
            const float kept = v - (v < 0 ? -scale : scale);
            ASSERT_EQ(std::memcmp(&residual[begin + i], &kept, sizeof kept), 0)
                << what << " step " << step << " residual of element " << begin + i;
          }
        }
        // decode: the GPU's bytes as the host decodes them
        fc::device_buffer<float> decoded(n);
        gpu.decode(fc::device_span<const std::byte>(wire.span().subspan(1, bytes)), decoded.span(), s);
        std::vector<float> host_decoded(n);
        host.decode(got, host_decoded);
        const auto got_decoded = download(fc::device_span<const float>(decoded.span()), s);
        EXPECT_TRUE(same_bytes(got_decoded, host_decoded)) << what << " decode";
        for (std::size_t i = 0; i < n; ++i) sent[i] += got_decoded[i], truth[i] += x[i];
      }
      // error feedback: what was sent is the truth minus what is still held back
      const auto residual = download(gpu.residual(), s);
      for (std::size_t i = 0; i < n; ++i) ASSERT_NEAR(sent[i], truth[i] - residual[i], 1e-4) << what << " " << i;
    }
}

TEST(CudaKernels, OnebitNamesANonFiniteInputAndKeepsThatChunksResidual) {
  fc::stream s;
  const std::size_t n = 10000, chunk = 1000;
  fc::onebit gpu(n, chunk);
  auto x = normal_floats(n, 3, 1.0f);
  x[4321] = std::numeric_limits<float>::infinity();
  const auto dx = upload(x, s);
  fc::device_buffer<std::byte> wire(gpu.encoded_size(n));
  gpu.encode(fc::device_span<const float>(dx.span()), wire.span(), s);
  try {
    gpu.check(s, 60s);
    FAIL() << "no error";
  } catch (const flexpar::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("element 4321 is inf"), std::string::npos) << e.what();
  }
  const auto residual = download(gpu.residual(), s);
  for (std::size_t i = 4000; i < 5000; ++i) ASSERT_EQ(residual[i], 0.0f) << i;
  gpu.reset(s);
  const auto zero = download(gpu.residual(), s);
  EXPECT_TRUE(std::all_of(zero.begin(), zero.end(), [](float v) { return v == 0.0f; }));
}

// ---- fusion packer ------------------------------------------------------------------------------------------

TEST(CudaKernels, FusionPackAndUnpackManyTensorsOfUnevenSizes) {
  fc::stream s;
  fc::fusion_packer packer;
  std::mt19937_64 rng(21);
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1024}, std::size_t{3000}}) {
    // the tensors live at odd offsets of one allocation; some are empty, a few are large
    std::vector<std::size_t> sizes(count), offsets(count);
    std::size_t arena = 0;
    for (std::size_t k = 0; k < count; ++k) {
      sizes[k] = k % 97 == 5 ? 0 : (k % 501 == 7 ? 300000 + rng() % 7 : rng() % 5000);
      offsets[k] = arena + rng() % 16;
      arena = offsets[k] + sizes[k];
    }
    std::vector<std::byte> host(arena);
    for (auto& b : host) b = static_cast<std::byte>(rng());
    const auto source = upload(host, s);
    std::vector<fc::device_span<const std::byte>> tensors;
    std::vector<std::byte> expected;
    for (std::size_t k = 0; k < count; ++k) {
      tensors.emplace_back(source.data() + offsets[k], sizes[k]);
      expected.insert(expected.end(), host.begin() + static_cast<std::ptrdiff_t>(offsets[k]),
                      host.begin() + static_cast<std::ptrdiff_t>(offsets[k] + sizes[k]));
    }
    fc::device_buffer<std::byte> buffer(expected.size() + 3);
    const auto packed = buffer.span().subspan(3, expected.size());  // a misaligned fusion buffer too
    packer.pack(tensors, packed, s);
    EXPECT_TRUE(same_bytes(download(fc::device_span<const std::byte>(packed), s), expected)) << count << " tensors";

    // unpack into a fresh arena; the bytes between tensors stay untouched
    std::vector<std::byte> fill(arena, std::byte{0x5a});
    auto target = upload(fill, s);
    std::vector<fc::device_span<std::byte>> outs;
    for (std::size_t k = 0; k < count; ++k) outs.emplace_back(target.data() + offsets[k], sizes[k]);
    packer.unpack(fc::device_span<const std::byte>(packed), outs, s);
    std::vector<std::byte> back = fill;
    for (std::size_t k = 0; k < count; ++k) std::memcpy(back.data() + offsets[k], host.data() + offsets[k], sizes[k]);
    EXPECT_TRUE(same_bytes(download(fc::device_span<const std::byte>(target.span()), s), back)) << count << " tensors";
  }
}

TEST(CudaKernels, FusionBatchesInFlightKeepTheirOwnDescriptors) {
  // Several batches enqueued back to back (both staging slots in use, one of them regrown) before
  // anything is waited for: each must copy its own regions.
  fc::stream s;
  fc::fusion_packer packer;
  std::vector<std::byte> host(1 << 20);
  std::iota(reinterpret_cast<unsigned char*>(host.data()), reinterpret_cast<unsigned char*>(host.data()) + host.size(),
            static_cast<unsigned char>(0));
  const auto source = upload(host, s);
  std::vector<fc::device_buffer<std::byte>> targets;
  std::vector<std::vector<fc::copy_region>> batches;
  for (std::size_t b = 0; b < 6; ++b) {
    targets.emplace_back(host.size());
    std::vector<fc::copy_region> regions;
    const std::size_t pieces = 1 + b * 300;  // growing tables
    const std::size_t piece = host.size() / pieces;
    for (std::size_t k = 0; k < pieces; ++k)
      regions.push_back({source.data() + k * piece, targets.back().data() + k * piece, piece});
    packer.copy(regions, s);
    batches.push_back(std::move(regions));
  }
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const std::size_t covered = batches[b].size() * batches[b].front().bytes;
    const auto got = download(fc::device_span<const std::byte>(targets[b].span().first(covered)), s);
    EXPECT_EQ(std::memcmp(got.data(), host.data(), covered), 0) << "batch " << b;
  }
}

TEST(CudaKernels, FusionPack64MiB) {
  fc::stream s;
  fc::fusion_packer packer;
  const auto host = random_of<std::uint8_t>(mib64 + 5, 3);
  const auto source = upload(host, s);
  std::vector<fc::device_span<const std::byte>> tensors = {
      {reinterpret_cast<const std::byte*>(source.data()) + 1, mib64 / 2},
      {reinterpret_cast<const std::byte*>(source.data()) + 1 + mib64 / 2, mib64 / 2 + 4}};
  fc::device_buffer<std::byte> buffer(mib64 + 4);
  packer.pack(tensors, buffer.span(), s);
  const auto got = download(fc::device_span<const std::byte>(buffer.span()), s);
  EXPECT_EQ(std::memcmp(got.data(), host.data() + 1, got.size()), 0);
}

TEST(CudaKernels, FusionPackIntoATooSmallBufferIsAUsageError) {
  fc::stream s;
  fc::fusion_packer packer;
  fc::device_buffer<std::byte> a(100), b(50), buffer(149);
  std::vector<fc::device_span<const std::byte>> tensors = {fc::device_span<const std::byte>(a.span()),
                                                           fc::device_span<const std::byte>(b.span())};
  try {
    packer.pack(tensors, buffer.span(), s);
    FAIL() << "no error";
  } catch (const flexpar::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("buffer of 149 bytes, needs 150"), std::string::npos) << e.what();
  }
}

}  // namespace
