// flexpar/search/execute.hpp — runs a strategy: one training step of a chain of linear layers and
// relus (the reference MLP) through the SBP layer's run-time form, each op on the SBP signature its
// config maps to (config.hpp), so that the searched strategy, not a hand-written one, does the work.
//
// Per linear op, on a 1-D mesh of every rank of `comm`:
//   forward   X = to(x, input SBP); Y = matmul(X, W)                 (W held in its weight SBP)
//   backward  dY = to(dy, dual of the output SBP)                    (P(sum) -> B, S -> S)
//             dW = X^T dY -> to(dW, weight SBP)                      (P(sum) -> B: the gradient allreduce)
//             dx = dY W^T                                            (local GEMMs with the BLAS transposing;
//                                                                     the SBPs from the matmul table with
//                                                                     S(0) <-> S(1) for the transposed operand)
//   update    W -= lr * dW on the shard
// relu runs on its shard in its config's SBP; the loss is 1/2 |y|^2 (dy = y).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include <flexpar/search/config.hpp>

namespace flexpar {
class communicator;
}

namespace flexpar::search {

/// What a run returns (on every rank).
struct execution_result {
  std::vector<float> output;                ///< the last step's forward output [batch, out], gathered
  std::vector<std::vector<float>> weights;  ///< every op's weight after the last update (empty for relus)
  double median_step_seconds = 0;           ///< median over the steps of the slowest rank's step time
};

/// Runs `steps` training steps of `g` under `s` on `comm` (collective). `input` is [batch, in] of the first
/// op; `weights[i]` the [in, out] weight of linear op i (ignored for elementwise ops, which are relus).
/// @throws usage_error naming the op when `g` is not a chain of linear and elementwise ops, or a config does
/// not put the op on all of comm's ranks as a 1-D mesh (placement changes are not in the run-time form).
execution_result execute_steps(communicator& comm, const graph& g, const strategy& s, std::span<const float> input,
                               std::vector<std::vector<float>> weights, float lr, std::size_t steps = 1);

/// The same step computed serially on one rank (the oracle).
execution_result execute_serial(const graph& g, std::span<const float> input, std::vector<std::vector<float>> weights,
                                float lr);

/// True when every config of `s` is one execute_steps can run on `ranks` ranks.
bool executable(const graph& g, const strategy& s, int ranks);

}  // namespace flexpar::search
