// Microbenchmarks of the local reduction kernels (collective/reduce_kernel.hpp), next to memcpy and
// a plain scalar `a[i] += b[i]` loop (vectorization switched off) on the same sizes, in one run.
// The kernels take the AVX2 build of their loops where the CPU has it; the `*_baseline` rows run
// the baseline build (16-byte vectors) of the same loops in the same run, and the `*_runs` rows
// reduce 128-element runs at a stride of 256 (the rows of a [n, 256] f32 tensor split on its second
// axis in two, as P -> S(1) reduces them) with either build.
// bytes_per_second counts the bytes of the destination buffer, as the allreduce targets do.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include <flexpar/collective/reduce_kernel.hpp>

namespace {

using flexpar::reduce_op;

template <class T>
std::vector<T> filled(std::size_t n, float v) {
  return std::vector<T>(n, T(v));
}

template <class T>
void reduce_kernel(benchmark::State& state, reduce_op op) {
  const auto n = static_cast<std::size_t>(state.range(0)) / sizeof(T);
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
void baseline_kernel(benchmark::State& state, Op op) {
  const auto n = static_cast<std::size_t>(state.range(0)) / sizeof(T);
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
  std::vector<float> a(2 * n, 1.0f), b(n, 0.0f), dst(n);
  for (auto _ : state) {
    for (std::size_t r = 0; r < runs; ++r) {
      float* to = dst.data() + r * run;
      const float *x = a.data() + 2 * r * run, *y = b.data() + r * run;
      if (baseline)
        flexpar::detail::reduce_loop(to, x, y, run, flexpar::detail::op_sum{});
      else
        flexpar::detail::reduce_elements(to, x, y, run, flexpar::detail::op_sum{});
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

void f32_kernel(benchmark::State& state, reduce_op op) { reduce_kernel<float>(state, op); }
void f32_baseline(benchmark::State& state, reduce_op op) {
  flexpar::detail::visit_op(op, [&](auto f) { baseline_kernel<float>(state, f); });
}
void f64_baseline(benchmark::State& state, reduce_op op) {
  flexpar::detail::visit_op(op, [&](auto f) { baseline_kernel<double>(state, f); });
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

BENCHMARK_MAIN();
