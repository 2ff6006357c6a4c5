// Microbenchmarks of the local reduction kernels (collective/reduce_kernel.hpp), next to memcpy and
// a plain scalar `a[i] += b[i]` loop (vectorization switched off) on the same sizes, in one run.
// The kernels take the AVX2 build of their loops where the CPU has it; the `*_baseline` rows run
// the baseline build (16-byte vectors) of the same loops in the same run, and the `*_runs` rows
// reduce 128-element runs at a stride of 256 (the rows of a [n, 256] f32 tensor split on its second
// axis in two, as P -> S(1) reduces them) with either build.
// bytes_per_second counts the bytes of the destination buffer, as the allreduce targets do. Before its
// timed loop every kernel row computes one result on varied inputs and compares it with a serial
// loop (a wrong one is an error of that row, and the exit status is 1).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include <flexpar/collective/reduce_kernel.hpp>

namespace {

using flexpar::reduce_op;

template <class T>
std::vector<T> filled(std::size_t n, float v) {
  return std::vector<T>(n, T(v));
}

/// Benchmarks whose verified call gave a wrong result (main's exit status is 1 unless 0).
int failures = 0;

/// Small integers that differ by element (exact in every type here, sums and maxima included).
template <class T>
std::vector<T> varied(std::size_t n, int salt) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(static_cast<float>(static_cast<int>((i * 7 + salt) % 11) - 5));
  return v;
}

/// The result of a + b (sum) or max(a, b) element by element, serially.
template <class T>
std::vector<T> combined(const std::vector<T>& a, const std::vector<T>& b, reduce_op op) {
  std::vector<T> c(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    c[i] = T(op == reduce_op::max ? std::max(x, y) : x + y);
  }
  return c;
}

/// Before the timed loop (google benchmark times only the loop): one call of `reduce` on varied inputs,
/// a <- a (op) b, against the serial result; a wrong one ends the benchmark with an error.
template <class T, class Reduce>
bool verified(benchmark::State& state, std::size_t n, reduce_op op, Reduce&& reduce) {
  std::vector<T> a = varied<T>(n, 1);
  const std::vector<T> b = varied<T>(n, 4), want = combined(a, b, op);
  reduce(a, b);
  for (std::size_t i = 0; i < n; ++i)
    if (std::memcmp(&a[i], &want[i], sizeof(T)) != 0) {
      ++failures;
      state.SkipWithError("the verified call's result is wrong");
      return false;
    }
  return true;
}

template <class T>
void reduce_kernel(benchmark::State& state, reduce_op op) {
  const auto n = static_cast<std::size_t>(state.range(0)) / sizeof(T);
  if (!verified<T>(state, n, op, [op](std::vector<T>& x, const std::vector<T>& y) {
        flexpar::reduce_into(std::span(x), std::span<const T>(y), op);
      }))
    return;
  auto a = filled<T>(n, 1.0f), b = filled<T>(n, 0.0f);
  for (auto _ : state) {
    flexpar::reduce_into(std::span(a), std::span<const T>(b), op);
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

void memcpy_reference(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<char> a(bytes, 1), b(bytes, 2);
  for (auto _ : state) {
    std::memcpy(a.data(), b.data(), bytes);
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

__attribute__((noinline, optimize("no-tree-vectorize"))) void plain_add(float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) a[i] += b[i];
}

void plain_loop_reference(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  for (auto _ : state) {
    plain_add(a.data(), b.data(), n);
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

/// The baseline build of the two-operand loop (what reduce_into runs where the CPU has no AVX2).
template <class T, class Op>
void baseline_kernel(benchmark::State& state, reduce_op which, Op op) {
  const auto n = static_cast<std::size_t>(state.range(0)) / sizeof(T);
  if (!verified<T>(state, n, which, [op](std::vector<T>& x, const std::vector<T>& y) {
        flexpar::detail::reduce_loop(x.data(), y.data(), x.size(), op);
      }))
    return;
  auto a = filled<T>(n, 1.0f), b = filled<T>(n, 0.0f);
  for (auto _ : state) {
    flexpar::detail::reduce_loop(a.data(), b.data(), n, op);
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

/// dst = a + b over runs of 128 f32: a's runs lie at a stride of 256 elements, b and dst are packed
/// (range(0) bytes of dst); with the kernel's entry (AVX2 where the CPU has it) or the baseline loop.
void f32_sum_runs(benchmark::State& state, bool baseline) {
  constexpr std::size_t run = 128;
  const auto n = static_cast<std::size_t>(state.range(0)) / sizeof(float), runs = n / run;
  std::vector<float> a = varied<float>(2 * n, 1), b = varied<float>(n, 4), dst(n);
  const auto reduce_runs = [&] {
    for (std::size_t r = 0; r < runs; ++r) {
      float* to = dst.data() + r * run;
      const float *x = a.data() + 2 * r * run, *y = b.data() + r * run;
      if (baseline)
        flexpar::detail::reduce_loop(to, x, y, run, flexpar::detail::op_sum{});
      else
        flexpar::detail::reduce_elements(to, x, y, run, flexpar::detail::op_sum{});
    }
  };
  reduce_runs();  // verified before the timed loop: run r of dst = run r of a's (stride 256) + b's
  for (std::size_t i = 0; i < runs * run; ++i)
    if (dst[i] != a[(i / run) * 2 * run + i % run] + b[i]) {
      ++failures;
      state.SkipWithError("the verified call's result is wrong");
      return;
    }
  for (auto _ : state) {
    reduce_runs();
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

void f32_kernel(benchmark::State& state, reduce_op op) { reduce_kernel<float>(state, op); }
void f32_baseline(benchmark::State& state, reduce_op op) {
  flexpar::detail::visit_op(op, [&](auto f) { baseline_kernel<float>(state, op, f); });
}
void f64_baseline(benchmark::State& state, reduce_op op) {
  flexpar::detail::visit_op(op, [&](auto f) { baseline_kernel<double>(state, op, f); });
}
void f64_kernel(benchmark::State& state, reduce_op op) { reduce_kernel<double>(state, op); }
void bf16_kernel(benchmark::State& state, reduce_op op) { reduce_kernel<flexpar::bfloat16>(state, op); }
void f16_kernel(benchmark::State& state, reduce_op op) { reduce_kernel<flexpar::half>(state, op); }
void i32_kernel(benchmark::State& state, reduce_op op) { reduce_kernel<std::int32_t>(state, op); }
void i8_kernel(benchmark::State& state, reduce_op op) { reduce_kernel<std::int8_t>(state, op); }

constexpr std::int64_t smallest = 4 << 10, largest = 64 << 20;

}  // namespace

BENCHMARK(memcpy_reference)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK(plain_loop_reference)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(f32_kernel, f32_sum, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(f32_kernel, f32_max, reduce_op::max)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(f32_baseline, f32_sum_baseline, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(f32_baseline, f32_max_baseline, reduce_op::max)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(f32_sum_runs, f32_sum_runs, false)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(f32_sum_runs, f32_sum_runs_baseline, true)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(f64_kernel, f64_sum, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(f64_baseline, f64_sum_baseline, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(bf16_kernel, bf16_sum, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(f16_kernel, f16_sum, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(i32_kernel, i32_sum, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(i8_kernel, i8_sum, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (failures != 0) std::fprintf(stderr, "bench_reduce_kernels: %d benchmarks computed a wrong result\n", failures);
  return failures == 0 ? 0 : 1;
}
