// flexpar/search/executor.hpp — the executor of flexpar/search/execute.hpp, generic over where the
// shards live: its plan of a graph (plan_steps, lib/search/execute.cpp) and the training steps
// (run_steps) over a backend that holds the placement and computes the local steps that differ between
// memories — the host's in lib/search/execute.cpp, the device's in lib/cuda/search_execute.cpp
// (flexpar/cuda/search.hpp). The search layer's interface for a memory backend: what a new memory kind
// implements to run found strategies; a caller who only runs strategies uses execute.hpp instead.
//
// A backend has: `tensor` (a dynamic_tensor<float, 1, Memory>), from_full(shape, sbp, data),
// product(a, transpose_a, b, transpose_b, what) (a^T b or a b^T on the shards, the SBPs of
// transposed_product), relu(x), relu_backward(dy, y), max_pool(x, step), max_pool_backward(x, dy, step),
// sgd(w, dw, lr) (w - lr dw on the shard) and settle() (waits for the work enqueued, before a step's
// clock stops). Boxing, matmul and the convolutions are the run-time SBP form's own (found by ADL).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/search/config.hpp>
#include <flexpar/search/execute.hpp>

namespace flexpar::search::detail {

/// "search::execute_steps: op i 'name': ", the start of every error about op i.
std::string op_context(std::size_t i, const op& o);

}  // namespace flexpar::search::detail

namespace flexpar::search::executor {

using sbp::nd_parallel;
using sbp::parallel;
using sbp::shape_t;

/// What the executor runs for one op.
enum class step_kind : unsigned char {
  linear,   ///< y = x w (matmul on the SBP signature)
  conv2d,   ///< 'same' convolution, im2col + GEMM
  relu,     ///< max(x, 0), on the backend
  max_pool  ///< k x k windows, on the backend
};

/// One op as the executor runs it: tensor shapes (activations [N, C] or [N, C, H, W]) and geometry.
struct op_step {
  step_kind kind = step_kind::linear;  ///< what runs
  shape_t produced;                    ///< the producer's output (or the data) as held
  shape_t in;              ///< what the op reads: `produced`, or it flattened to [N, C*H*W] (a linear after maps)
  shape_t out;             ///< what it writes
  shape_t weight;          ///< linear [in, out], conv2d [K, C, k, k]; empty: no weight
  std::size_t pad = 0;     ///< conv2d: (k - 1) / 2, 'same' padding
  std::size_t window = 1;  ///< max_pool: k x k
  std::size_t stride = 1;  ///< max_pool
};

/// The executor's plan of `g` under `s` on `ranks` ranks (lib/search/execute.cpp). @throws usage_error
/// naming the op for anything it cannot run.
std::vector<op_step> plan_steps(const graph& g, const strategy& s, int ranks);

/// The gradient layout of a tensor laid out as `s`: P(sum) -> B, the rest unchanged.
[[nodiscard]] inline nd_parallel gradient_of(nd_parallel s) {
  for (std::size_t d = 0; d < s.rank; ++d)
    if (s[d].is_partial()) s[d] = parallel::B();
  return s;
}

/// The product a^T b or a b^T of the executor's backward pass, planned: its logical shape [m, n], its
/// SBP, and the local GEMM's extents on this rank (op(a) is rows x inner, op(b) inner x cols).
struct transposed_product {
  std::size_t m = 0;      ///< the logical product's rows
  std::size_t n = 0;      ///< its columns
  nd_parallel out;        ///< its SBP (the matmul table's)
  std::size_t rows = 0;   ///< my shards' GEMM: rows of op(a) and of the result
  std::size_t inner = 0;  ///< columns of op(a), rows of op(b)
  std::size_t cols = 0;   ///< columns of op(b) and of the result
};

/// Plans a^T b (transpose_a) or a b^T (transpose_b) on shards `a_box` and `b_box` of tensors laid out
/// as `a` and `b`: the output SBP from the matmul table on the transposed operand's SBP (S(0) <-> S(1)),
/// which must have a signature (no boxing happens here). @throws usage_error naming `what` otherwise.
transposed_product plan_product(const nd_parallel& a, const shape_t& a_shape, const sbp::box& a_box, bool transpose_a,
                                const nd_parallel& b, const shape_t& b_shape, const sbp::box& b_box, bool transpose_b,
                                const char* what);

/// The same logical tensor with another shape that keeps axis 0 (the flatten [N, C, H, W] <-> [N, C*H*W]):
/// free for S(0), B and P; a split of another axis is boxed to S(0) first (an all-to-all). Collective
/// over the tensor's placement when it boxes.
template <class Tensor>
Tensor reshaped(Tensor t, const shape_t& shape) {
  nd_parallel l = t.layout();
  for (std::size_t d = 0; d < l.rank; ++d)
    if (l[d].is_split() && l[d].axis != 0) l[d] = parallel::S(0);
  if (!(l == t.layout())) t = to(std::move(t), l);
  const auto where = t.where();                                   // release() takes the shard only
  return Tensor::adopt(where, shape, l, std::move(t).release());  // the same shard, no copy
}

/// Collective over `comm`: `steps` training steps of `g` under `s` (planned as `plan`), every tensor of
/// the backend's memory (the header comment of flexpar/search/execute.hpp says what each op does).
/// @throws usage_error naming the op when a step produces another SBP than its signature says; what
///         the boxings and the backend throw.
template <class Backend>
execution_result run_steps(const Backend& be, communicator& comm, const graph& g, const strategy& s,
                           const std::vector<op_step>& plan, std::span<const float> input,
                           const std::vector<std::vector<float>>& weights, float lr, std::size_t steps) {
  using tensor = typename Backend::tensor;
  const std::size_t n = g.ops.size();
  std::vector<sbp_signature> sig;
  for (std::size_t i = 0; i < n; ++i) sig.push_back(signature_of(g.ops[i], s[i]));
  std::vector<std::optional<tensor>> w(n);
  for (std::size_t i = 0; i < n; ++i)
    if (!plan[i].weight.empty()) w[i] = be.from_full(plan[i].weight, sig[i].weight, weights.at(i));
  auto expect_layout = [&](std::size_t i, const tensor& t, const char* what) {
    if (!(t.layout() == sig[i].output))
      throw usage_error(detail::op_context(i, g.ops[i])
                            .append(what)
                            .append(" produced ")
                            .append(sbp::to_string(t.layout()))
                            .append(", the signature says ")
                            .append(sbp::to_string(sig[i].output)));
  };
  execution_result result;
  std::vector<double> times;
  for (std::size_t step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    // forward: keep each op's (boxed) input and its output
    std::vector<std::optional<tensor>> in(n), out(n);
    tensor x = be.from_full(plan[0].produced, sig[0].input, input);
    for (std::size_t i = 0; i < n; ++i) {
      const op_step& st = plan[i];
      if (st.in != st.produced) x = reshaped(std::move(x), st.in);
      in[i] = to(std::move(x), sig[i].input);
      switch (st.kind) {
        case step_kind::linear:
          out[i] = matmul(*in[i], *w[i]);
          expect_layout(i, *out[i], "matmul");
          break;
        case step_kind::conv2d:
          out[i] = conv2d(*in[i], *w[i], st.pad);
          expect_layout(i, *out[i], "conv2d");
          break;
        case step_kind::relu: out[i] = be.relu(*in[i]); break;
        case step_kind::max_pool: out[i] = be.max_pool(*in[i], st); break;  // S(0), S(1) or B: whole planes
      }
      x = out[i]->clone();
    }
    // backward: dy = y (loss 1/2 |y|^2)
    tensor dy = to(out[n - 1]->clone(), gradient_of(out[n - 1]->layout()));
    for (std::size_t i = n; i-- > 0;) {
      const op_step& st = plan[i];
      dy = to(std::move(dy), gradient_of(sig[i].output));
      switch (st.kind) {
        case step_kind::linear:
        case step_kind::conv2d: {
          const bool conv = st.kind == step_kind::conv2d;
          tensor dw =
              to(conv ? conv2d_grad_weight(*in[i], dy, st.pad) : be.product(*in[i], true, dy, false, "weight gradient"),
                 sig[i].weight);
          tensor dx =
              conv ? conv2d_grad_input(dy, *w[i], st.pad) : be.product(dy, false, *w[i], true, "input gradient");
          w[i] = be.sgd(*w[i], dw, lr);
          dy = std::move(dx);
          break;
        }
        case step_kind::relu:  // pass the gradient where the output is positive, in the output's layout
          dy = be.relu_backward(to(std::move(dy), out[i]->layout()), *out[i]);
          break;
        case step_kind::max_pool: dy = be.max_pool_backward(*in[i], to(std::move(dy), out[i]->layout()), st); break;
      }
      if (st.in != st.produced) dy = reshaped(std::move(dy), st.produced);
    }
    be.settle();
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    allreduce(comm, std::span<double>(&t, 1), reduce_op::max);
    times.push_back(t);
    if (step + 1 == steps) result.output = to(out[n - 1]->clone(), gradient_of(out[n - 1]->layout())).to_full();
  }
  for (std::size_t i = 0; i < n; ++i) result.weights.push_back(w[i] ? w[i]->to_full() : std::vector<float>{});
  std::sort(times.begin(), times.end());
  result.median_step_seconds = times.empty() ? 0 : times[times.size() / 2];
  return result;
}

}  // namespace flexpar::search::executor
