// lib/cuda/reduce.cu — the element-wise reduction kernels of flexpar/cuda/kernels.hpp: dst = a (op) b for every dtype
// and op, and the division that ends reduce_op::avg; fill and the dtype conversions (cub::DeviceFor::Bulk).
//
// One grid-stride kernel per (type, op): the spans split into a scalar head, a body of 16-byte
// vectors (every pointer aligned) and a scalar tail (kernel_math.hpp: split_for_vectors). Each
// thread of the body loads `unroll` vectors of each operand before it computes, so that enough loads
// are in flight to reach the device's memory bandwidth. half and bfloat16 go through float and are
// rounded once, with the hardware's round-to-nearest-even conversions (the host's rounding).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <flexpar/cuda/kernels.hpp>

#include "launch.cuh"

namespace flexpar::cuda {
namespace detail {
namespace {

template <class T>
__device__ inline accumulate_t<T> widen(T v) {
  if constexpr (std::is_same_v<T, half>)
    return __half2float(__ushort_as_half(v.bits));
  else if constexpr (std::is_same_v<T, bfloat16>)
    return __bfloat162float(__ushort_as_bfloat16(v.bits));
  else
    return v;
}

template <class T>
__device__ inline T narrow(accumulate_t<T> v) {
  if constexpr (std::is_same_v<T, half>)
    return half::from_bits(__half_as_ushort(__float2half_rn(v)));
  else if constexpr (std::is_same_v<T, bfloat16>)
    return bfloat16::from_bits(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
  else
    return v;
}

// The host's combine functions (collective/reduce_kernel.hpp), on the accumulation type.
struct op_sum {
  template <class A>
  __device__ A operator()(A a, A b) const {
    return static_cast<A>(a + b);
  }
};
struct op_prod {
  template <class A>
  __device__ A operator()(A a, A b) const {
    return static_cast<A>(a * b);
  }
};
struct op_min {
  template <class A>
  __device__ A operator()(A a, A b) const {
    return b < a ? b : a;
  }
};
struct op_max {
  template <class A>
  __device__ A operator()(A a, A b) const {
    return a < b ? b : a;
  }
};
// x / ranks (the second operand is ignored): the end of reduce_op::avg.
template <class A>
struct op_divide {
  A divisor;
  __device__ A operator()(A a, A) const {
    if constexpr (std::is_same_v<A, float>)
      return math::div_rn(a, divisor);
    else
      return static_cast<A>(a / divisor);
  }
};

template <class T>
struct alignas(16) vector16 {
  T e[16 / sizeof(T)];
};

// One 16-byte load or store (ld/st.global.v4): a plain struct copy may be split into scalar accesses.
template <class T>
__device__ inline vector16<T> load16(const T* p) {
  vector16<T> v;
  *reinterpret_cast<uint4*>(v.e) = *reinterpret_cast<const uint4*>(p);
  return v;
}

template <class T>
__device__ inline void store16(T* p, const vector16<T>& v) {
  uint4 raw;
  std::memcpy(&raw, v.e, sizeof raw);
  __stwb(reinterpret_cast<uint4*>(p), raw);  // st.global.wb.v4: the default caching, always one access
}

template <class T, class Op>
__device__ inline T combine(T a, T b, Op op) {
  return narrow<T>(op(widen(a), widen(b)));
}

// Bytes four to a 32-bit word: sum (wrapping, as the host's narrowing of the sum), min and max of
// int8/uint8 with the video SIMD intrinsics, one instruction per word instead of four extractions,
// four operations and four insertions (i8 max ran at 0.61-0.65 of a device copy element by element).
template <class T, class Op>
inline constexpr bool bytes_in_words = sizeof(T) == 1 && (std::is_same_v<Op, op_sum> || std::is_same_v<Op, op_min> ||
                                                          std::is_same_v<Op, op_max>);

template <class T, class Op>
__device__ inline unsigned combine_words(unsigned a, unsigned b, Op) {
  constexpr bool is_signed = std::is_signed_v<T>;
  if constexpr (std::is_same_v<Op, op_sum>)
    return __vadd4(a, b);
  else if constexpr (std::is_same_v<Op, op_min>)
    return is_signed ? __vmins4(a, b) : __vminu4(a, b);
  else
    return is_signed ? __vmaxs4(a, b) : __vmaxu4(a, b);
}

template <class T, class Op>
__device__ inline vector16<T> combine_vectors(const vector16<T>& x, const vector16<T>& y, Op op) {
  vector16<T> r;
  if constexpr (bytes_in_words<T, Op>) {
    uint4 a, b, c;
    std::memcpy(&a, x.e, sizeof a);
    std::memcpy(&b, y.e, sizeof b);
    c.x = combine_words<T>(a.x, b.x, op);
    c.y = combine_words<T>(a.y, b.y, op);
    c.z = combine_words<T>(a.z, b.z, op);
    c.w = combine_words<T>(a.w, b.w, op);
    std::memcpy(r.e, &c, sizeof c);
  } else {
#pragma unroll
    for (std::size_t k = 0; k < 16 / sizeof(T); ++k) r.e[k] = combine(x.e[k], y.e[k], op);
  }
  return r;
}

constexpr int unroll = 4;

// dst[i] = a[i] (op) b[i]; dst may equal a (each element is read before it is written, by the same
// thread). [0, head) and [tail_begin, count) are scalar, the vectors between are 16-byte aligned.
template <class T, class Op>
__global__ void __launch_bounds__(block_threads)
    reduce_kernel(T* dst, const T* a, const T* b, std::size_t head, std::size_t vectors, std::size_t count, Op op) {
  constexpr std::size_t per_vector = 16 / sizeof(T);
  const std::size_t thread = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t threads = static_cast<std::size_t>(gridDim.x) * blockDim.x;

  // step 1: the scalar head and tail (at most 15 elements each, unless nothing is aligned)
  const std::size_t tail_begin = head + vectors * per_vector;
  for (std::size_t i = thread; i < head; i += threads) dst[i] = combine(a[i], b[i], op);
  for (std::size_t i = tail_begin + thread; i < count; i += threads) dst[i] = combine(a[i], b[i], op);

  // step 2: the body, `unroll` vectors per thread per round, all loads before any store
  T* dv = dst + head;
  const T* av = a + head;
  const T* bv = b + head;
  for (std::size_t base = thread; base < vectors; base += threads * unroll) {
    vector16<T> x[unroll], y[unroll];
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
      const std::size_t v = base + u * threads;
      if (v < vectors) {
        x[u] = load16(av + v * per_vector);
        y[u] = load16(bv + v * per_vector);
      }
    }
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
      const std::size_t v = base + u * threads;
      if (v < vectors) store16(dv + v * per_vector, combine_vectors(x[u], y[u], op));
    }
  }
}

template <class T, class Op>
void launch_reduce(T* dst, const T* a, const T* b, std::size_t count, Op op, cudaStream_t s) {
  if (count == 0) return;
  const math::vector_split split =
      math::split_for_vectors(reinterpret_cast<std::uintptr_t>(dst), reinterpret_cast<std::uintptr_t>(a),
                              reinterpret_cast<std::uintptr_t>(b), count, sizeof(T));
  auto* kernel = &reduce_kernel<T, Op>;
  const std::size_t work = split.vectors + split.head + split.tail;
  const unsigned grid =
      grid_for(work, static_cast<std::size_t>(block_threads) * unroll, blocks_per_sm(kernel, block_threads));
  kernel<<<grid, block_threads, 0, s>>>(dst, a, b, split.head, split.vectors, count, op);
  check_launch("reduce_kernel<<<...>>>");
}

// Up to this many sources per launch of the many-source kernel; more are folded in by further
// launches, each taking the running result as its first source (the order stays s0, s1, s2, ...).
constexpr int max_sources = 8;

template <class T>
struct source_table {
  const T* p[max_sources];
  int n;
};

// dst[i] = ((s0[i] (op) s1[i]) (op) s2[i]) ...: each step rounded to T, as the host's reduce_into
// applied source by source. dst may be the first source (each element is read before it is
// written, by the same thread). Head, vectors and tail as in reduce_kernel.
template <class T, class Op>
__global__ void __launch_bounds__(block_threads)
    reduce_many_kernel(T* dst, source_table<T> src, std::size_t head, std::size_t vectors, std::size_t count, Op op) {
  constexpr std::size_t per_vector = 16 / sizeof(T);
  const std::size_t thread = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t threads = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  auto scalar = [&](std::size_t i) {
    T acc = src.p[0][i];
    for (int k = 1; k < src.n; ++k) acc = combine(acc, src.p[k][i], op);
    dst[i] = acc;
  };
  const std::size_t tail_begin = head + vectors * per_vector;
  for (std::size_t i = thread; i < head; i += threads) scalar(i);
  for (std::size_t i = tail_begin + thread; i < count; i += threads) scalar(i);

  for (std::size_t base = thread; base < vectors; base += threads * unroll) {
    vector16<T> acc[unroll];
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
      const std::size_t v = base + u * threads;
      if (v < vectors) acc[u] = load16(src.p[0] + head + v * per_vector);
    }
    for (int k = 1; k < src.n; ++k) {
      vector16<T> y[unroll];
#pragma unroll
      for (int u = 0; u < unroll; ++u) {
        const std::size_t v = base + u * threads;
        if (v < vectors) y[u] = load16(src.p[k] + head + v * per_vector);
      }
#pragma unroll
      for (int u = 0; u < unroll; ++u) acc[u] = combine_vectors(acc[u], y[u], op);
    }
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
      const std::size_t v = base + u * threads;
      if (v < vectors) store16(dst + head + v * per_vector, acc[u]);
    }
  }
}

template <class T, class Op>
void launch_reduce_many(T* dst, const source_table<T>& table, std::size_t count, Op op, cudaStream_t s) {
  math::vector_split split =
      math::split_for_vectors(reinterpret_cast<std::uintptr_t>(dst), reinterpret_cast<std::uintptr_t>(table.p[0]),
                              reinterpret_cast<std::uintptr_t>(dst), count, sizeof(T));
  for (int k = 1; k < table.n; ++k)
    if (reinterpret_cast<std::uintptr_t>(table.p[k]) % 16 != reinterpret_cast<std::uintptr_t>(dst) % 16)
      split = math::vector_split{count, 0, 0};  // no common alignment: all scalar
  auto* kernel = &reduce_many_kernel<T, Op>;
  const std::size_t work = split.vectors + split.head + split.tail;
  const unsigned grid =
      grid_for(work, static_cast<std::size_t>(block_threads) * unroll, blocks_per_sm(kernel, block_threads));
  kernel<<<grid, block_threads, 0, s>>>(dst, table, split.head, split.vectors, count, op);
  check_launch("reduce_many_kernel<<<...>>>");
}

// Folds every source into dst in order, max_sources per launch.
template <class T, class Op>
void reduce_many(T* dst, std::span<const T* const> sources, std::size_t count, Op op, cudaStream_t s) {
  std::size_t next = 0;
  while (next < sources.size()) {
    source_table<T> table{};
    table.n = 0;
    if (next > 0) table.p[table.n++] = dst;  // the running result comes first
    while (table.n < max_sources && next < sources.size()) table.p[table.n++] = sources[next++];
    if (table.n == 1) {  // a single source: a copy
      if (table.p[0] != dst)
        FLEXPAR_CHECK_CUDA(-1, cudaMemcpyAsync(dst, table.p[0], count * sizeof(T), cudaMemcpyDeviceToDevice, s));
      continue;
    }
    launch_reduce_many(dst, table, count, op, s);
  }
}

template <class From, class To>
void launch_convert(const void* in, void* out, std::size_t count, double factor, cudaStream_t s) {
  using A = accumulate_t<To>;
  for_each_index(
      count,
      [in = static_cast<const From*>(in), out = static_cast<To*>(out), factor] __device__(std::size_t i) {
        out[i] = narrow<To>(static_cast<A>(static_cast<double>(widen(in[i])) * factor));
      },
      s, "cuda::convert");
}

template <class T>
void reduce_dispatch(T* dst, const T* a, const T* b, std::size_t count, reduce_op op, cudaStream_t s) {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg: return launch_reduce(dst, a, b, count, op_sum{}, s);
    case reduce_op::prod: return launch_reduce(dst, a, b, count, op_prod{}, s);
    case reduce_op::min: return launch_reduce(dst, a, b, count, op_min{}, s);
    case reduce_op::max: return launch_reduce(dst, a, b, count, op_max{}, s);
  }
  throw error_on<usage_error>(no_rank, "cuda::reduce_into", "unknown reduce_op ", static_cast<int>(op));
}

}  // namespace
}  // namespace detail

template <element T>
void reduce_into(device_span<T> dst, device_span<const T> src, reduce_op op, cudaStream_t s) {
  detail::check_same_length("cuda::reduce_into", dst.size(), src.size());
  detail::reduce_dispatch<T>(dst.data(), dst.data(), src.data(), dst.size(), op, s);
}

template <element T>
void reduce_into(device_span<T> dst, device_span<const T> a, device_span<const T> b, reduce_op op, cudaStream_t s) {
  detail::check_same_length("cuda::reduce_into", dst.size(), a.size());
  detail::check_same_length("cuda::reduce_into", dst.size(), b.size());
  detail::reduce_dispatch<T>(dst.data(), a.data(), b.data(), dst.size(), op, s);
}

template <element T>
void reduce_into(device_span<T> dst, std::span<const device_span<const T>> sources, reduce_op op, cudaStream_t s) {
  if (sources.empty()) throw error_on<usage_error>(no_rank, "cuda::reduce_into", "no sources to reduce");
  std::vector<const T*> pointers;
  pointers.reserve(sources.size());
  for (const device_span<const T>& src : sources) {
    detail::check_same_length("cuda::reduce_into", dst.size(), src.size());
    pointers.push_back(src.data());
  }
  if (dst.empty()) return;
  const std::span<const T* const> all(pointers);
  switch (op) {
    case reduce_op::sum:
    case reduce_op::avg: return detail::reduce_many(dst.data(), all, dst.size(), detail::op_sum{}, s);
    case reduce_op::prod: return detail::reduce_many(dst.data(), all, dst.size(), detail::op_prod{}, s);
    case reduce_op::min: return detail::reduce_many(dst.data(), all, dst.size(), detail::op_min{}, s);
    case reduce_op::max: return detail::reduce_many(dst.data(), all, dst.size(), detail::op_max{}, s);
  }
  throw error_on<usage_error>(no_rank, "cuda::reduce_into", "unknown reduce_op ", static_cast<int>(op));
}

template <element T>
void fill(device_span<T> data, T value, cudaStream_t s) {
  detail::for_each_index(
      data.size(), [p = data.data(), value] __device__(std::size_t i) { p[i] = value; }, s, "cuda::fill");
}

template <element T>
void scale_for_average(device_span<T> data, int ranks, cudaStream_t s) {
  if (ranks <= 1) return;
  using A = accumulate_t<T>;
  detail::launch_reduce<T>(data.data(), data.data(), data.data(), data.size(),
                           detail::op_divide<A>{static_cast<A>(ranks)}, s);
}

void reduce_into(dtype t, void* dst, const void* src, std::size_t count, reduce_op op, cudaStream_t s) {
  visit_dtype(t, [&](auto zero) {
    using T = decltype(zero);
    reduce_into(device_span<T>(static_cast<T*>(dst), count), device_span<const T>(static_cast<const T*>(src), count),
                op, s);
  });
}

void convert(dtype from, const void* in, dtype to, void* out, std::size_t count, double factor, cudaStream_t s) {
  if (from == to) {
    visit_dtype(from, [&](auto zero) {
      using T = decltype(zero);
      detail::launch_convert<T, T>(in, out, count, factor, s);
    });
    return;
  }
  if (from == dtype::f32 && to == dtype::f16) return detail::launch_convert<float, half>(in, out, count, factor, s);
  if (from == dtype::f16 && to == dtype::f32) return detail::launch_convert<half, float>(in, out, count, factor, s);
  if (from == dtype::f32 && to == dtype::bf16)
    return detail::launch_convert<float, bfloat16>(in, out, count, factor, s);
  if (from == dtype::bf16 && to == dtype::f32)
    return detail::launch_convert<bfloat16, float>(in, out, count, factor, s);
  throw error_on<usage_error>(no_rank, "cuda::convert", name_of(from), " to ", name_of(to),
                              " is not supported (a type to itself, or f32 to and from f16 and bf16)");
}

void reduce_into(dtype t, void* dst, std::span<const void* const> sources, std::size_t count, reduce_op op,
                 cudaStream_t s) {
  visit_dtype(t, [&](auto zero) {
    using T = decltype(zero);
    std::vector<device_span<const T>> typed;
    typed.reserve(sources.size());
    for (const void* src : sources) typed.emplace_back(static_cast<const T*>(src), count);
    reduce_into(device_span<T>(static_cast<T*>(dst), count), std::span<const device_span<const T>>(typed), op, s);
  });
}

#define FLEXPAR_INSTANTIATE_REDUCE(T)                                                                                \
  template void reduce_into<T>(device_span<T>, device_span<const T>, reduce_op, cudaStream_t);                       \
  template void reduce_into<T>(device_span<T>, device_span<const T>, device_span<const T>, reduce_op, cudaStream_t); \
  template void scale_for_average<T>(device_span<T>, int, cudaStream_t);                                             \
  template void reduce_into<T>(device_span<T>, std::span<const device_span<const T>>, reduce_op, cudaStream_t);      \
  template void fill<T>(device_span<T>, T, cudaStream_t);
FLEXPAR_INSTANTIATE_REDUCE(float)
FLEXPAR_INSTANTIATE_REDUCE(double)
FLEXPAR_INSTANTIATE_REDUCE(half)
FLEXPAR_INSTANTIATE_REDUCE(bfloat16)
FLEXPAR_INSTANTIATE_REDUCE(std::int8_t)
FLEXPAR_INSTANTIATE_REDUCE(std::uint8_t)
FLEXPAR_INSTANTIATE_REDUCE(std::int32_t)
FLEXPAR_INSTANTIATE_REDUCE(std::int64_t)
#undef FLEXPAR_INSTANTIATE_REDUCE

}  // namespace flexpar::cuda
