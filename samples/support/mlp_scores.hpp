// samples/support/mlp_scores.hpp — what the Fashion-MNIST MLP samples measure: a model's loss and
// accuracy on a set, summed over the ranks, and one number for all its weights.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <flexpar/comm/communicator.hpp>

#include "fashion_mnist.hpp"
#include "mlp.hpp"

namespace flexpar::samples {

/// Sum over the ranks of `comm` of (loss, correct, examples).
inline batch_result sum_over_ranks(const communicator& comm, const batch_result& r) {
  double in[3] = {r.loss_sum, static_cast<double>(r.correct), static_cast<double>(r.examples)}, out[3] = {};
  MPI_Allreduce(in, out, 3, MPI_DOUBLE, MPI_SUM, comm.mpi_comm());
  return {out[0], static_cast<std::size_t>(out[1]), static_cast<std::size_t>(out[2])};
}

/// Loss/accuracy of this rank's model on `set` (already normalized into `x`), in chunks of 1000
/// examples; parameters from `src` (default: the model's own).
inline batch_result evaluate(mlp& model, const std::vector<float>& x, const fashion_mnist_set& set,
                             parameter_source* src = nullptr) {
  batch_result r;
  constexpr std::size_t chunk = 1000;
  const std::size_t px = set.pixels();
  for (std::size_t s = 0; s < set.count; s += chunk) {
    const std::size_t n = std::min(chunk, set.count - s);
    model.evaluate(std::span(x).subspan(s * px, n * px), std::span(set.labels).subspan(s, n), n, r, src);
  }
  return r;
}

/// FNV-1a of the weights' bytes: one number that differs when any bit of any weight does.
inline std::uint64_t digest(const std::vector<float>& weights) {
  std::uint64_t h = 1469598103934665603ULL;
  const auto* b = reinterpret_cast<const unsigned char*>(weights.data());
  for (std::size_t i = 0; i < weights.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

}  // namespace flexpar::samples
