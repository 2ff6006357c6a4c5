// lib/cuda/relax_kernels.hpp — internal to lib/cuda: the element-wise steps of the device relaxations that no
// public kernel does: the Adam family's (relax::detail::momentum_adam_rule over device memory) and
// low_precision_decentralized's difference. Each element is computed with the host loops'
// operations in their order, rounded one by one (no fused multiply-add), so the results are
// bit-identical to the host forms' for the same inputs.
#pragma once

#include <cuda_runtime.h>

#include <flexpar/cuda/runtime.hpp>
#include <flexpar/relax/optimizer.hpp>

namespace flexpar::cuda::detail {

/// The warm-up step: g (+ wd x); m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g g;
/// x -= lr (m / c1) / (sqrt(v / c2) + eps).
void adam_warmup_update(device_span<const float> g, device_span<float> x, device_span<float> m, device_span<float> v,
                        const relax::adam_options& a, float c1, float c2, cudaStream_t s);
/// v = v / c2 (the variance frozen, bias-corrected).
void adam_freeze(device_span<float> v, float c2, cudaStream_t s);
/// The compression stage's step 1: g (+ wd x); m = b1 m + (1 - b1) g.
void adam_momentum_update(device_span<const float> g, device_span<const float> x, device_span<float> m, float b1,
                          float wd, cudaStream_t s);
/// The compression stage's step 3: x -= lr (m / c1) / (sqrt(v) + eps).
void adam_frozen_update(device_span<float> x, device_span<const float> m, device_span<const float> v,
                        const relax::adam_options& a, float c1, cudaStream_t s);

/// out = a - b.
void subtract(device_span<const float> a, device_span<const float> b, device_span<float> out, cudaStream_t s);

}  // namespace flexpar::cuda::detail
