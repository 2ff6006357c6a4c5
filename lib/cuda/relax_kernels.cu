// lib/cuda/relax_kernels.cu — lib/cuda/relax_kernels.hpp: the device relaxations' element-wise steps
// (cub::DeviceFor::Bulk).
#include <flexpar/cuda/kernel_math.hpp>

#include "launch.cuh"
#include "relax_kernels.hpp"

namespace flexpar::cuda::detail {
namespace {
using math::add_rn;
using math::div_rn;
using math::mul_rn;
using math::sub_rn;

__device__ inline float decayed(float g, float x, float wd) { return wd != 0.0f ? add_rn(g, mul_rn(wd, x)) : g; }
__device__ inline float next_momentum(float m, float g, float b1) {
  return add_rn(mul_rn(b1, m), mul_rn(sub_rn(1.0f, b1), g));
}
}  // namespace

void adam_warmup_update(device_span<const float> g, device_span<float> x, device_span<float> m, device_span<float> v,
                        const relax::adam_options& a, float c1, float c2, cudaStream_t s) {
  for_each_index(
      g.size(),
      [g = g.data(), x = x.data(), m = m.data(), v = v.data(), b1 = a.beta1, b2 = a.beta2, wd = a.weight_decay,
       lr = a.learning_rate, eps = a.epsilon, c1, c2] __device__(std::size_t i) {
        const float gi = decayed(g[i], x[i], wd);
        const float mi = next_momentum(m[i], gi, b1);
        const float vi = add_rn(mul_rn(b2, v[i]), mul_rn(mul_rn(sub_rn(1.0f, b2), gi), gi));
        m[i] = mi;
        v[i] = vi;
        x[i] = sub_rn(x[i], div_rn(mul_rn(lr, div_rn(mi, c1)), add_rn(__fsqrt_rn(div_rn(vi, c2)), eps)));
      },
      s, "cuda::adam_warmup_update");
}

void adam_freeze(device_span<float> v, float c2, cudaStream_t s) {
  for_each_index(
      v.size(), [v = v.data(), c2] __device__(std::size_t i) { v[i] = div_rn(v[i], c2); }, s, "cuda::adam_freeze");
}

void adam_momentum_update(device_span<const float> g, device_span<const float> x, device_span<float> m, float b1,
                          float wd, cudaStream_t s) {
  for_each_index(
      g.size(),
      [g = g.data(), x = x.data(), m = m.data(), b1, wd] __device__(std::size_t i) {
        m[i] = next_momentum(m[i], decayed(g[i], x[i], wd), b1);
      },
      s, "cuda::adam_momentum_update");
}

void adam_frozen_update(device_span<float> x, device_span<const float> m, device_span<const float> v,
                        const relax::adam_options& a, float c1, cudaStream_t s) {
  for_each_index(
      x.size(),
      [x = x.data(), m = m.data(), v = v.data(), lr = a.learning_rate, eps = a.epsilon, c1] __device__(std::size_t i) {
        x[i] = sub_rn(x[i], div_rn(mul_rn(lr, div_rn(m[i], c1)), add_rn(__fsqrt_rn(v[i]), eps)));
      },
      s, "cuda::adam_frozen_update");
}

void subtract(device_span<const float> a, device_span<const float> b, device_span<float> out, cudaStream_t s) {
  for_each_index(
      out.size(),
      [a = a.data(), b = b.data(), out = out.data()] __device__(std::size_t i) { out[i] = sub_rn(a[i], b[i]); }, s,
      "cuda::subtract");
}

}  // namespace flexpar::cuda::detail
