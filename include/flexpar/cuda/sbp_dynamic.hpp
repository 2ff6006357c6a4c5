// flexpar/cuda/sbp_dynamic.hpp — the run-time SBP form in device memory: dynamic_tensor<T, N,
// memory::cuda> is sbp/dynamic.hpp's dynamic_tensor over backend<memory::cuda> (flexpar/cuda/sbp.hpp):
// the same plan() and box_axis steps, matmul (cuBLAS) and the convolutions (im2col + cuBLAS) on
// run-time SBPs. What the strategy search's executor runs on a GPU (flexpar/cuda/search.hpp).
//
// Part of flexpar::cuda.
//
//   cuda::device_placement gpu(mesh, 0);
//   auto x = dynamic_tensor<float, 1, memory::cuda>::from_full(gpu, {m, k}, nd_parallel{parallel::S(0)}, data);
//   auto y = to(std::move(x), nd_parallel{parallel::B()});    // the device allgather
//   auto z = matmul(y, w);                                     // the cheapest signature, then one cuBLAS GEMM
//   std::vector<float> all = z.to_full();                      // gathered on the host (the tests' oracle)
#pragma once

#include <flexpar/cuda/sbp.hpp>
#include <flexpar/sbp/dynamic.hpp>
