// Microbenchmarks of the local reduction kernels (collective/reduce_kernel.hpp), next to memcpy and
// a plain scalar `a[i] += b[i]` loop (vectorization switched off) on the same sizes, in one run.
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

void f32_kernel(benchmark::State& state, reduce_op op) { reduce_kernel<float>(state, op); }
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
BENCHMARK_CAPTURE(f64_kernel, f64_sum, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(bf16_kernel, bf16_sum, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(f16_kernel, f16_sum, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(i32_kernel, i32_sum, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);
BENCHMARK_CAPTURE(i8_kernel, i8_sum, reduce_op::sum)->RangeMultiplier(16)->Range(smallest, largest);

BENCHMARK_MAIN();
