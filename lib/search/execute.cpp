// Running a strategy through sbp::dynamic_tensor (header: flexpar/search/execute.hpp).
#include <cblas.h>

#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/search/execute.hpp>

#include <algorithm>
#include <chrono>
#include <optional>

namespace flexpar::search {

using sbp::nd_parallel;
using sbp::parallel;
using tensor = sbp::dynamic_tensor<float, 1>;

namespace {

std::string op_context(std::size_t i, const op& o) {
  std::string s("search::execute_steps: op ");
  s.append(std::to_string(i)).append(" '").append(o.name).append("': ");
  return s;
}

void check(const graph& g, const strategy& s, int ranks) {
  if (s.size() != g.ops.size())
    throw usage_error(std::string("search::execute_steps: the strategy has ")
                          .append(std::to_string(s.size()))
                          .append(" configs for ")
                          .append(std::to_string(g.ops.size()))
                          .append(" ops"));
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const op& o = g.ops[i];
    if (o.kind != op_kind::linear && o.kind != op_kind::elementwise)
      throw usage_error(
          op_context(i, o).append(name_of(o.kind)).append(" ops are not executable here (linear and relu)"));
    if (o.spatial != 1) throw usage_error(op_context(i, o).append("spatial extent must be 1"));
    if (i == 0 ? !o.inputs.empty() : (o.inputs.size() != 1 || o.inputs[0] != i - 1))
      throw usage_error(op_context(i, o).append("the graph must be a chain (op i reads op i-1)"));
    const soap_config& c = s[i];
    const int axes = (c.sample > 1) + (c.attribute > 1) + (c.parameter > 1);
    if (c.devices() != ranks || c.first_device != 0 || axes > 1)
      throw usage_error(op_context(i, o)
                            .append("config ")
                            .append(to_string(c))
                            .append(" is not a 1-D mesh of all ")
                            .append(std::to_string(ranks))
                            .append(" ranks (the run-time SBP form has no placement changes)"));
  }
}

/// The gradient layout of a tensor laid out as `s`: P(sum) -> B, the rest unchanged.
nd_parallel gradient_of(nd_parallel s) {
  for (std::size_t d = 0; d < s.rank; ++d)
    if (s[d].is_partial()) s[d] = parallel::B();
  return s;
}

/// The SBP of the transpose (split axes swapped).
nd_parallel transposed(nd_parallel s) {
  for (std::size_t d = 0; d < s.rank; ++d)
    if (s[d].is_split()) s[d] = parallel::S(1 - s[d].axis);
  return s;
}

/// a^T b or a b^T on the shards, BLAS transposing in place (no copies); the output's SBP from the matmul
/// table on the transposed operand's SBP, which must have a signature (no boxing happens here).
tensor gemm_transposed(const tensor& a, bool transpose_a, const tensor& b, bool transpose_b, const char* what) {
  const nd_parallel la = transpose_a ? transposed(a.layout()) : a.layout();
  const nd_parallel lb = transpose_b ? transposed(b.layout()) : b.layout();
  const sbp::nd_signature_result sig =
      sbp::nd_signature([](const parallel& x, const parallel& y) { return sbp::signature::matmul(x, y); }, la, lb);
  if (!sig.ok)
    throw usage_error(std::string("search::execute_steps: ")
                          .append(what)
                          .append(": matmul has no signature for ")
                          .append(sbp::to_string(la))
                          .append(" x ")
                          .append(sbp::to_string(lb)));
  const std::size_t m = transpose_a ? a.shape()[1] : a.shape()[0], n = transpose_b ? b.shape()[0] : b.shape()[1];
  if (!a.where().contains_me()) return tensor::from_local(a.where(), {m, n}, sig.out, {});
  const sbp::box ba = a.my_box(), bb = b.my_box();
  const std::size_t rows = transpose_a ? ba.extent[1] : ba.extent[0], inner = transpose_a ? ba.extent[0] : ba.extent[1];
  const std::size_t cols = transpose_b ? bb.extent[0] : bb.extent[1];
  std::vector<float> c(rows * cols, 0.0f);
  if (rows > 0 && cols > 0 && inner > 0)
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(inner), 1.0f, a.to_local().data(),
                static_cast<int>(ba.extent[1]), b.to_local().data(), static_cast<int>(bb.extent[1]), 0.0f, c.data(),
                static_cast<int>(cols));
  return tensor::from_local(a.where(), {m, n}, sig.out, std::move(c));
}

tensor map_local(const tensor& t, const std::vector<float>& values) {
  return tensor::from_local(t.where(), t.shape(), t.layout(), values);
}

}  // namespace

bool executable(const graph& g, const strategy& s, int ranks) {
  try {
    check(g, s, ranks);
  } catch (const usage_error&) {
    return false;
  }
  return true;
}

execution_result execute_steps(communicator& comm, const graph& g, const strategy& s, std::span<const float> input,
                               std::vector<std::vector<float>> weights, float lr, std::size_t steps) {
  check(g, s, comm.size());
  sbp::placement<1> mesh(comm, {comm.size()});
  const std::size_t n = g.ops.size();
  std::vector<sbp_signature> sig;
  for (std::size_t i = 0; i < n; ++i) sig.push_back(signature_of(g.ops[i], s[i]));
  std::vector<std::optional<tensor>> w(n);
  for (std::size_t i = 0; i < n; ++i)
    if (g.ops[i].kind == op_kind::linear)
      w[i] = tensor::from_full(mesh, {g.ops[i].in_channels, g.ops[i].out_channels}, sig[i].weight, weights.at(i));
  const op& first = g.ops.front();
  execution_result result;
  std::vector<double> times;
  for (std::size_t step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    // forward: keep each op's (boxed) input and its output
    std::vector<std::optional<tensor>> in(n), out(n);
    tensor x = tensor::from_full(mesh, {first.batch, first.in_channels}, sig[0].input, input);
    for (std::size_t i = 0; i < n; ++i) {
      in[i] = to(std::move(x), sig[i].input);
      if (g.ops[i].kind == op_kind::linear) {
        out[i] = sbp::matmul(*in[i], *w[i]);
        if (!(out[i]->layout() == sig[i].output))
          throw usage_error(op_context(i, g.ops[i])
                                .append("matmul produced ")
                                .append(sbp::to_string(out[i]->layout()))
                                .append(", the signature says ")
                                .append(sbp::to_string(sig[i].output)));
      } else {
        std::vector<float> v(in[i]->to_local().begin(), in[i]->to_local().end());
        for (float& e : v) e = e > 0 ? e : 0.0f;
        out[i] = map_local(*in[i], v);
      }
      x = out[i]->clone();
    }
    // backward: dy = y (loss 1/2 |y|^2)
    tensor dy = to(out[n - 1]->clone(), gradient_of(out[n - 1]->layout()));
    for (std::size_t i = n; i-- > 0;) {
      dy = to(std::move(dy), gradient_of(sig[i].output));
      if (g.ops[i].kind == op_kind::linear) {
        tensor dw = to(gemm_transposed(*in[i], true, dy, false, "weight gradient"), sig[i].weight);
        tensor dx = gemm_transposed(dy, false, *w[i], true, "input gradient");
        std::vector<float> updated(w[i]->to_local().begin(), w[i]->to_local().end());
        const auto g_local = dw.to_local();
        for (std::size_t k = 0; k < updated.size(); ++k) updated[k] -= lr * g_local[k];
        w[i] = map_local(*w[i], updated);
        dy = std::move(dx);
      } else {  // relu: pass the gradient where the output is positive, in the output's layout
        dy = to(std::move(dy), out[i]->layout());
        std::vector<float> v(dy.to_local().begin(), dy.to_local().end());
        const auto o = out[i]->to_local();
        for (std::size_t k = 0; k < v.size(); ++k)
          if (!(o[k] > 0)) v[k] = 0.0f;
        dy = map_local(dy, v);
      }
    }
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    allreduce(comm, std::span<double>(&t, 1), reduce_op::max);
    times.push_back(t);
    if (step + 1 == steps) result.output = to(out[n - 1]->clone(), gradient_of(out[n - 1]->layout())).to_full();
  }
  for (std::size_t i = 0; i < n; ++i) result.weights.push_back(w[i] ? w[i]->to_full() : std::vector<float>{});
  std::sort(times.begin(), times.end());
  result.median_step_seconds = times[times.size() / 2];
  return result;
}

execution_result execute_serial(const graph& g, std::span<const float> input, std::vector<std::vector<float>> weights,
                                float lr) {
  const std::size_t n = g.ops.size(), batch = g.ops.front().batch;
  std::vector<std::vector<float>> acts{std::vector<float>(input.begin(), input.end())};  // acts[i]: input of op i
  for (std::size_t i = 0; i < n; ++i) {
    const op& o = g.ops[i];
    std::vector<float> y;
    if (o.kind == op_kind::linear) {
      y.assign(batch * o.out_channels, 0.0f);
      sbp::local::gemm(batch, o.out_channels, o.in_channels, acts[i].data(), weights[i].data(), y.data());
    } else {
      y = acts[i];
      for (float& e : y) e = e > 0 ? e : 0.0f;
    }
    acts.push_back(std::move(y));
  }
  execution_result r;
  r.output = acts[n];
  std::vector<float> dy = acts[n];
  for (std::size_t i = n; i-- > 0;) {
    const op& o = g.ops[i];
    if (o.kind == op_kind::linear) {
      const std::size_t in = o.in_channels, out = o.out_channels;
      std::vector<float> dw(in * out, 0.0f), dx(batch * in, 0.0f);
      for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t k = 0; k < in; ++k)
          for (std::size_t j = 0; j < out; ++j) {
            dw[k * out + j] += acts[i][b * in + k] * dy[b * out + j];
            dx[b * in + k] += dy[b * out + j] * weights[i][k * out + j];
          }
      for (std::size_t k = 0; k < dw.size(); ++k) weights[i][k] -= lr * dw[k];
      dy = std::move(dx);
    } else {
      for (std::size_t k = 0; k < dy.size(); ++k)
        if (!(acts[i + 1][k] > 0)) dy[k] = 0.0f;
    }
  }
  for (std::size_t i = 0; i < n; ++i)
    r.weights.push_back(g.ops[i].kind == op_kind::linear ? weights[i] : std::vector<float>{});
  return r;
}

}  // namespace flexpar::search
