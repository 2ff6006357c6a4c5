// Microbenchmarks of the host codecs of the relaxations (compress/minmax_uint8.hpp, compress/onebit.hpp)
// next to memcpy of the same floats, in one run: an encoder or decoder at memory bandwidth runs near
// the memcpy row. bytes_per_second counts the floats (4 bytes each) encoded or decoded; memcpy's row
// copies that many bytes. Before its timed loop every codec row checks one round trip on varied
// inputs against bounds computed here, not taken from the codec: min-max within (max - min) / 510 of
// its chunk plus two float roundings; 1-bit: every decoded element is +-(mean |x| of its chunk,
// summed here in double) with the sign of x, and the residual kept is x minus it. A wrong one is an
// error of that row (exit status 1).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include <flexpar/compress/minmax_uint8.hpp>
#include <flexpar/compress/onebit.hpp>

namespace {

int failures = 0;

std::vector<float> varied(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(static_cast<int>((i * 2654435761u) >> 20) % 201 - 100) * 0.01f;
  return x;
}

void fail(benchmark::State& state, const char* what) {
  ++failures;
  state.SkipWithError(what);
}

/// The timed loop of every row: `body` once per iteration, then the floats it handled per second.
template <class Body>
void timed(benchmark::State& state, std::size_t n, void* written, Body&& body) {
  for (auto _ : state) {
    body();
    benchmark::DoNotOptimize(written);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
}

void memcpy_reference(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> src = varied(n);
  std::vector<float> dst(n);
  timed(state, n, dst.data(), [&] { std::memcpy(dst.data(), src.data(), n * sizeof(float)); });
}

bool minmax_round_trip_holds(const flexpar::compress::minmax_uint8& q, const std::vector<float>& x) {
  std::vector<std::byte> bytes(q.encoded_size(x.size()));
  std::vector<float> back(x.size());
  q.encode(x, bytes);
  q.decode(bytes, back);
  for (std::size_t begin = 0; begin < x.size(); begin += q.chunk) {
    const std::size_t n = std::min(q.chunk, x.size() - begin);
    float lo = x[begin], hi = x[begin];
    for (std::size_t i = begin; i < begin + n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
    // half a step of 255 steps over [lo, hi], plus the roundings of the scale and of the decode
    const float bound =
        (hi - lo) / 510.0f + 2.0f * std::numeric_limits<float>::epsilon() * std::max(std::abs(lo), std::abs(hi));
    for (std::size_t i = begin; i < begin + n; ++i)
      if (!(std::abs(back[i] - x[i]) <= bound)) return false;
  }
  return true;
}

void minmax_encode(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const flexpar::compress::minmax_uint8 q{512};
  const std::vector<float> x = varied(n);
  if (!minmax_round_trip_holds(q, x)) return fail(state, "min-max round trip outside its error bound");
  std::vector<std::byte> bytes(q.encoded_size(n));
  timed(state, n, bytes.data(), [&] { q.encode(x, bytes); });
}

void minmax_decode(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const flexpar::compress::minmax_uint8 q{512};
  const std::vector<float> x = varied(n);
  if (!minmax_round_trip_holds(q, x)) return fail(state, "min-max round trip outside its error bound");
  std::vector<std::byte> bytes(q.encoded_size(n));
  q.encode(x, bytes);
  std::vector<float> out(n);
  timed(state, n, out.data(), [&] { q.decode(bytes, out); });
}

/// One 1-bit round trip from a zero residual: every decoded element of a chunk is +-(the chunk's mean
/// |x|, computed here in double; the codec sums in float lanes, so to 1e-6 relative), - exactly where
/// x < 0, and the residual the codec keeps is x minus the decoded value.
bool onebit_round_trip_holds(std::size_t chunk, const std::vector<float>& x) {
  flexpar::compress::onebit c(x.size(), chunk);
  std::vector<std::byte> bytes(c.encoded_size(x.size()));
  std::vector<float> back(x.size());
  c.encode(x, bytes);
  c.decode(bytes, back);
  for (std::size_t begin = 0; begin < x.size(); begin += chunk) {
    const std::size_t end = std::min(x.size(), begin + chunk);
    double mean = 0;
    for (std::size_t i = begin; i < end; ++i) mean += std::abs(double(x[i]));
    mean /= double(end - begin);
    for (std::size_t i = begin; i < end; ++i) {
      if ((back[i] < 0) != (x[i] < 0) || std::signbit(back[i]) != (x[i] < 0)) return false;
      if (!(std::abs(std::abs(double(back[i])) - mean) <= 1e-6 * mean)) return false;
      if (c.residual()[i] != x[i] - back[i]) return false;
    }
  }
  return true;
}

void onebit_encode(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = varied(n);
  if (!onebit_round_trip_holds(2048, x)) return fail(state, "1-bit round trip wrong");
  flexpar::compress::onebit c(n, 2048);
  std::vector<std::byte> bytes(c.encoded_size(n));
  timed(state, n, bytes.data(), [&] { c.encode(x, bytes); });
}

void onebit_decode(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> x = varied(n);
  if (!onebit_round_trip_holds(2048, x)) return fail(state, "1-bit round trip wrong");
  flexpar::compress::onebit c(n, 2048);
  std::vector<std::byte> bytes(c.encoded_size(n));
  c.encode(x, bytes);
  std::vector<float> out(n);
  timed(state, n, out.data(), [&] { c.decode(bytes, out); });
}

constexpr std::int64_t smallest = 1 << 14, largest = 1 << 22;  // floats: 64 KiB .. 16 MiB

}  // namespace

BENCHMARK(memcpy_reference)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK(minmax_encode)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK(minmax_decode)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK(onebit_encode)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK(onebit_decode)->RangeMultiplier(16)->Range(smallest, largest);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (failures != 0) std::fprintf(stderr, "bench_codecs: %d benchmarks computed a wrong result\n", failures);
  return failures == 0 ? 0 : 1;
}
