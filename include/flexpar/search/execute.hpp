// flexpar/search/execute.hpp — runs a strategy: training steps of a chain of linear, conv2d, relu and
// max_pool ops (the reference MLP, reference::cnn_small) through the SBP layer's run-time form, each op on
// the SBP signature its config maps to (config.hpp), so that the searched strategy, not a hand-written
// one, does the work.
//
// Activations are [N, C] after linear ops and [N, C, H, W] (NCHW) after convolutions; a linear op after
// maps reads them flattened to [N, C*H*W] (free for S(0), B and P; a channel split S(1) is boxed to S(0)
// first). Per op, on a 1-D mesh of every rank of `comm`:
//   linear    forward   X = to(x, input SBP); Y = matmul(X, W)                 (W held in its weight SBP)
//             backward  dY = to(dy, dual of the output SBP)                    (P(sum) -> B, S -> S)
//                       dW = X^T dY -> to(dW, weight SBP)                      (P(sum) -> B: the gradient allreduce)
//                       dx = dY W^T                                            (local GEMMs, the BLAS transposing;
//                                                                               SBPs from the matmul table with
//                                                                               S(0) <-> S(1) for the transposed
//                                                                               operand)
//   conv2d    forward   Y = sbp::conv2d(X, W, (k - 1) / 2)                     (stride 1, 'same' padding, odd k;
//                                                                               W [K, C, k, k])
//             backward  dW = conv2d_grad_weight(X, dY) -> to(dW, weight SBP);  dx = conv2d_grad_input(dY, W)
//                       (sample (S(0), B) -> S(0): dW P(sum) -> B; output channels (B, S(0)) -> S(1): dx
//                       P(sum); input channels (S(1), S(1)) -> P(sum): dY B, dW S(1), dx S(1))
//   update    W -= lr * dW on the shard
// relu and max_pool (k x k window, the stride that maps the input's side to the op's output side; the
// gradient goes to the first maximum of each window) run on their shards in their config's SBP, which for
// max_pool must keep planes whole (S(0), S(1) or B). The loss is 1/2 |y|^2 (dy = y).
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

/// Runs `steps` training steps of `g` under `s` on `comm` (collective). `input` is the first op's input,
/// [batch, in] for a linear op, [batch, in, side, side] for a conv2d (its spatial extent is side * side);
/// `weights[i]` is op i's weight, [in, out] for linear, [out, in, k, k] for conv2d, ignored for
/// elementwise ops. @throws usage_error naming the op when `g` is not a chain of linear, conv2d, relu and
/// max_pool ops whose shapes follow on (the header comment), or a config does not put the op on all of
/// comm's ranks as a 1-D mesh (placement changes are not in the run-time form) or splits a max_pool's
/// positions (that needs halos).
execution_result execute_steps(communicator& comm, const graph& g, const strategy& s, std::span<const float> input,
                               std::vector<std::vector<float>> weights, float lr, std::size_t steps = 1);

/// The same step computed serially on one rank with direct loops (no im2col, no BLAS): the oracle.
execution_result execute_serial(const graph& g, std::span<const float> input, std::vector<std::vector<float>> weights,
                                float lr);

/// True when every config of `s` is one execute_steps can run on `ranks` ranks.
bool executable(const graph& g, const strategy& s, int ranks);

}  // namespace flexpar::search
