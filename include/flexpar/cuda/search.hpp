// flexpar/cuda/search.hpp — a strategy of the search run on GPUs: search::execute_steps with every
// activation, weight and gradient a dynamic_tensor<float, 1, memory::cuda> (flexpar/cuda/sbp_dynamic.hpp):
// the same plan, signatures and boxing routes as on the host, each boxing step on the device
// communicator of the mesh, the GEMMs through cuBLAS, the convolutions im2col + cuBLAS, relu, max pooling
// and the SGD update as kernels (flexpar/cuda/nn.hpp).
//
// Part of flexpar::cuda.
//
//   sbp::placement<1> ranks(comm, {comm.size()});
//   cuda::device_placement gpu(ranks, comm.topology().local_rank() % cuda::device_count());
//   search::execution_result r = cuda::execute_steps(gpu, g, found.best, input, weights, lr, 5);
//
// The placement is the caller's and is kept between calls: its device communicators (CUDA IPC among
// ranks sharing a GPU, NCCL across GPUs) and pool are made once, not per run.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include <flexpar/search/execute.hpp>

namespace flexpar::cuda {

template <std::size_t MeshRank>
class device_placement;

/// search::execute_steps on the device: `steps` training steps of `g` under `s` on `gpu`, the device
/// side of the 1-D mesh of every rank of its parent communicator (collective over it). The result
/// (output, weights, the slowest rank's median step time, the device's work waited for in each step)
/// is on the host of every rank. @throws usage_error as search::execute_steps, and when gpu's mesh is
/// not every rank of its parent.
search::execution_result execute_steps(const device_placement<1>& gpu, const search::graph& g,
                                       const search::strategy& s, std::span<const float> input,
                                       std::vector<std::vector<float>> weights, float lr, std::size_t steps = 1);

}  // namespace flexpar::cuda
