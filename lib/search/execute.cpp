// lib/search/execute.cpp — running a strategy through sbp::dynamic_tensor (header: flexpar/search/execute.hpp).
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
using sbp::shape_t;
using tensor = sbp::dynamic_tensor<float, 1>;

namespace {

std::string op_context(std::size_t i, const op& o) {
  std::string s("search::execute_steps: op ");
  s.append(std::to_string(i)).append(" '").append(o.name).append("': ");
  return s;
}

/// What the executor runs for one op.
enum class step_kind : unsigned char { linear, conv2d, relu, max_pool };

/// One op as the executor runs it: tensor shapes (activations [N, C] or [N, C, H, W]) and geometry.
struct op_step {
  step_kind kind = step_kind::linear;
  shape_t produced;        ///< the producer's output (or the data) as held
  shape_t in;              ///< what the op reads: `produced`, or it flattened to [N, C*H*W] (a linear after maps)
  shape_t out;             ///< what it writes
  shape_t weight;          ///< linear [in, out], conv2d [K, C, k, k]; empty: no weight
  std::size_t pad = 0;     ///< conv2d: (k - 1) / 2, 'same' padding
  std::size_t window = 1;  ///< max_pool: k x k
  std::size_t stride = 1;  ///< max_pool
};

std::size_t square_side(std::size_t n) {
  std::size_t s = 0;
  while ((s + 1) * (s + 1) <= n) ++s;
  return s * s == n ? s : 0;
}

/// The executor's plan of `g` under `s` on `ranks` ranks. @throws usage_error naming the op for anything
/// it cannot run.
std::vector<op_step> plan_steps(const graph& g, const strategy& s, int ranks) {
  if (s.size() != g.ops.size())
    throw usage_error(std::string("search::execute_steps: the strategy has ")
                          .append(std::to_string(s.size()))
                          .append(" configs for ")
                          .append(std::to_string(g.ops.size()))
                          .append(" ops"));
  if (g.ops.empty()) throw usage_error("search::execute_steps: the graph has no ops");
  std::vector<op_step> steps;
  const std::size_t batch = g.ops.front().batch;
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const op& o = g.ops[i];
    auto refuse = [&](std::string_view why) { throw usage_error(op_context(i, o).append(why)); };
    if (i == 0 ? !o.inputs.empty() : (o.inputs.size() != 1 || o.inputs[0] != i - 1))
      refuse("the graph must be a chain (op i reads op i-1)");
    if (o.batch != batch) refuse("its batch differs from op 0's");
    const soap_config& c = s[i];
    const int axes = (c.sample > 1) + (c.attribute > 1) + (c.parameter > 1);
    if (c.devices() != ranks || c.first_device != 0 || axes > 1)
      refuse(std::string("config ")
                 .append(to_string(c))
                 .append(" is not a 1-D mesh of all ")
                 .append(std::to_string(ranks))
                 .append(" ranks (the run-time SBP form has no placement changes)"));
    op_step st;
    const std::size_t side = square_side(o.spatial);
    if (i > 0) {
      st.produced = steps.back().out;
    } else if (o.kind == op_kind::linear) {
      st.produced = {batch, o.in_channels};
    } else if (o.kind == op_kind::conv2d || (o.kind == op_kind::elementwise && o.function == elementwise_fn::relu)) {
      if (o.spatial == 1 && o.kind == op_kind::elementwise) {
        st.produced = {batch, o.in_channels};
      } else {
        if (side == 0) refuse("the input's spatial extent is not a square side x side");
        st.produced = {batch, o.in_channels, side, side};
      }
    } else {
      refuse("the first op must be linear, conv2d or relu (its input shape follows from its own)");
    }
    st.in = st.produced;
    const std::size_t per_sample = sbp::elements_of(st.produced) / std::max<std::size_t>(batch, 1);
    switch (o.kind) {
      case op_kind::linear:
        st.kind = step_kind::linear;
        if (o.spatial != 1) refuse("a linear op over spatial positions is not executable (spatial must be 1)");
        if (per_sample != o.in_channels)
          refuse(std::string("it reads ")
                     .append(std::to_string(o.in_channels))
                     .append(" features per sample, its producer gives ")
                     .append(sbp::to_string(st.produced)));
        st.in = {batch, o.in_channels};  // a flatten when the producer gives maps
        st.out = {batch, o.out_channels};
        st.weight = {o.in_channels, o.out_channels};
        break;
      case op_kind::conv2d:
        st.kind = step_kind::conv2d;
        if (st.produced.size() != 4 || st.produced[1] != o.in_channels || st.produced[2] * st.produced[3] != o.spatial)
          refuse(std::string("conv2d reads [N, ")
                     .append(std::to_string(o.in_channels))
                     .append(", H, W] with H * W = ")
                     .append(std::to_string(o.spatial))
                     .append(" ('same' padding, stride 1); its producer gives ")
                     .append(sbp::to_string(st.produced)));
        if (o.kernel % 2 == 0) refuse("'same' padding needs an odd kernel");
        st.pad = (o.kernel - 1) / 2;
        st.out = {batch, o.out_channels, st.produced[2], st.produced[3]};
        st.weight = {o.out_channels, o.in_channels, o.kernel, o.kernel};
        break;
      case op_kind::elementwise:
        if (st.produced[1] != o.out_channels || per_sample != o.out_channels * o.spatial) {
          if (o.function != elementwise_fn::max_pool || st.produced.size() != 4 || st.produced[1] != o.out_channels)
            refuse(std::string("it works on ")
                       .append(std::to_string(o.out_channels))
                       .append(" channels x ")
                       .append(std::to_string(o.spatial))
                       .append(" positions; its producer gives ")
                       .append(sbp::to_string(st.produced)));
        }
        if (o.function == elementwise_fn::relu) {
          st.kind = step_kind::relu;
          st.out = st.produced;
          if (c.attribute > 1 && st.produced.size() < 4) refuse("a spatial split (S(2)) needs [N, C, H, W] maps");
        } else if (o.function == elementwise_fn::max_pool) {
          st.kind = step_kind::max_pool;
          if (c.attribute > 1)
            refuse("max_pool with a spatial split (S(2)) needs halo exchanges, which the SBP layer does not have");
          if (side == 0 || o.kernel == 0 || st.produced.size() != 4 || st.produced[2] < o.kernel ||
              st.produced[3] < o.kernel)
            refuse("max_pool needs [N, C, H, W] maps at least kernel x kernel and a square output");
          st.window = o.kernel;
          st.stride = 0;
          for (std::size_t str = 1; str <= st.produced[2] && st.stride == 0; ++str)
            if ((st.produced[2] - o.kernel) / str + 1 == side && (st.produced[3] - o.kernel) / str + 1 == side)
              st.stride = str;
          if (st.stride == 0)
            refuse(std::string("no stride maps ")
                       .append(sbp::to_string(st.produced))
                       .append(" to ")
                       .append(std::to_string(side))
                       .append(" x ")
                       .append(std::to_string(side))
                       .append(" with a ")
                       .append(std::to_string(o.kernel))
                       .append(" x ")
                       .append(std::to_string(o.kernel))
                       .append(" window"));
          st.out = {batch, o.out_channels, side, side};
        } else {
          refuse("elementwise function 'other' is not executable (relu and max_pool are)");
        }
        break;
      default:
        refuse(std::string(name_of(o.kind)).append(" ops are not executable here (linear, conv2d, relu, max_pool)"));
    }
    steps.push_back(std::move(st));
  }
  return steps;
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
  if (!a.where().contains_me()) return tensor::adopt(a.where(), {m, n}, sig.out, {});
  const sbp::box ba = a.my_box(), bb = b.my_box();
  const std::size_t rows = transpose_a ? ba.extent[1] : ba.extent[0], inner = transpose_a ? ba.extent[0] : ba.extent[1];
  const std::size_t cols = transpose_b ? bb.extent[0] : bb.extent[1];
  aligned_vector<float> c = a.where().pool().acquire<float>(rows * cols);  // from the pool: reused, not zeroed
  if (inner == 0) std::fill(c.begin(), c.end(), 0.0f);                     // an empty sum (beta = 0 writes the rest)
  if (rows > 0 && cols > 0 && inner > 0)
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(inner), 1.0f, a.to_local().data(),
                static_cast<int>(ba.extent[1]), b.to_local().data(), static_cast<int>(bb.extent[1]), 0.0f, c.data(),
                static_cast<int>(cols));
  return tensor::adopt(a.where(), {m, n}, sig.out, std::move(c));
}

tensor map_local(const tensor& t, aligned_vector<float> values) {
  return tensor::adopt(t.where(), t.shape(), t.layout(), std::move(values));
}

/// A copy of `t`'s shard in a buffer of its placement's pool (the start of an element-wise step).
aligned_vector<float> pooled_copy(const tensor& t) { return t.where().pool().acquire_copy(t.to_local()); }

/// The same logical tensor with another shape that keeps axis 0 (the flatten [N, C, H, W] <-> [N, C*H*W]):
/// free for S(0), B and P; a split of another axis is boxed to S(0) first (an all-to-all).
tensor reshaped(tensor t, const shape_t& shape) {
  nd_parallel l = t.layout();
  for (std::size_t d = 0; d < l.rank; ++d)
    if (l[d].is_split() && l[d].axis != 0) l[d] = parallel::S(0);
  if (!(l == t.layout())) t = to(std::move(t), l);
  const auto& where = t.where();                                  // release() takes the shard only: the placement stays
  return tensor::adopt(where, shape, l, std::move(t).release());  // the same shard, no copy
}

/// k x k max pooling of `planes` planes [h, w] -> [ph, pw] with stride `stride`: for each output the index
/// (within its plane) of the first maximum of its window in row-major scan order.
std::vector<std::size_t> pool_argmax(const float* x, std::size_t planes, std::size_t h, std::size_t w,
                                     const op_step& st) {
  const std::size_t ph = st.out[2], pw = st.out[3];
  std::vector<std::size_t> arg(planes * ph * pw);
  for (std::size_t p = 0; p < planes; ++p)
    for (std::size_t i = 0; i < ph; ++i)
      for (std::size_t j = 0; j < pw; ++j) {
        std::size_t best = (i * st.stride) * w + j * st.stride;
        for (std::size_t r = 0; r < st.window; ++r)
          for (std::size_t c = 0; c < st.window; ++c) {
            const std::size_t at = (i * st.stride + r) * w + j * st.stride + c;
            if (x[p * h * w + at] > x[p * h * w + best]) best = at;
          }
        arg[(p * ph + i) * pw + j] = best;
      }
  return arg;
}

/// The pooled planes, written to `y` (`planes` x out[2] x out[3] elements, every one written: a
/// reused pool buffer or the serial reference's vector).
void pool_forward(const float* x, std::size_t planes, std::size_t h, std::size_t w, const op_step& st, float* y) {
  const std::vector<std::size_t> arg = pool_argmax(x, planes, h, w, st);
  const std::size_t per = st.out[2] * st.out[3];
  for (std::size_t k = 0; k < arg.size(); ++k) y[k] = x[(k / per) * h * w + arg[k]];
}

/// The input gradient of pool_forward, written to `dx` (`planes` x h x w elements, zeroed here first):
/// each output's gradient added at its window's maximum.
void pool_backward(const float* x, const float* dy, std::size_t planes, std::size_t h, std::size_t w, const op_step& st,
                   float* dx) {
  const std::vector<std::size_t> arg = pool_argmax(x, planes, h, w, st);
  const std::size_t per = st.out[2] * st.out[3];
  std::fill_n(dx, planes * h * w, 0.0f);
  for (std::size_t k = 0; k < arg.size(); ++k) dx[(k / per) * h * w + arg[k]] += dy[k];
}

}  // namespace

bool executable(const graph& g, const strategy& s, int ranks) {
  try {
    (void)plan_steps(g, s, ranks);
  } catch (const usage_error&) {
    return false;
  }
  return true;
}

execution_result execute_steps(communicator& comm, const graph& g, const strategy& s, std::span<const float> input,
                               std::vector<std::vector<float>> weights, float lr, std::size_t steps) {
  const std::vector<op_step> plan = plan_steps(g, s, comm.size());
  sbp::placement<1> mesh(comm, {comm.size()});
  const std::size_t n = g.ops.size();
  std::vector<sbp_signature> sig;
  for (std::size_t i = 0; i < n; ++i) sig.push_back(signature_of(g.ops[i], s[i]));
  std::vector<std::optional<tensor>> w(n);
  for (std::size_t i = 0; i < n; ++i)
    if (!plan[i].weight.empty()) w[i] = tensor::from_full(mesh, plan[i].weight, sig[i].weight, weights.at(i));
  auto expect_layout = [&](std::size_t i, const tensor& t, const char* what) {
    if (!(t.layout() == sig[i].output))
      throw usage_error(op_context(i, g.ops[i])
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
    tensor x = tensor::from_full(mesh, plan[0].produced, sig[0].input, input);
    for (std::size_t i = 0; i < n; ++i) {
      const op_step& st = plan[i];
      if (st.in != st.produced) x = reshaped(std::move(x), st.in);
      in[i] = to(std::move(x), sig[i].input);
      switch (st.kind) {
        case step_kind::linear:
          out[i] = sbp::matmul(*in[i], *w[i]);
          expect_layout(i, *out[i], "matmul");
          break;
        case step_kind::conv2d:
          out[i] = sbp::conv2d(*in[i], *w[i], st.pad);
          expect_layout(i, *out[i], "conv2d");
          break;
        case step_kind::relu: {
          aligned_vector<float> v = pooled_copy(*in[i]);
          for (float& e : v) e = e > 0 ? e : 0.0f;
          out[i] = map_local(*in[i], std::move(v));
          break;
        }
        case step_kind::max_pool: {  // input S(0), S(1) or B: whole planes on each rank
          const sbp::box b = in[i]->my_box();
          aligned_vector<float> y = mesh.pool().acquire<float>(b.extent[0] * b.extent[1] * st.out[2] * st.out[3]);
          pool_forward(in[i]->to_local().data(), b.extent[0] * b.extent[1], b.extent[2], b.extent[3], st, y.data());
          out[i] = tensor::adopt(mesh, st.out, in[i]->layout(), std::move(y));
          break;
        }
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
          tensor dw = to(conv ? sbp::conv2d_grad_weight(*in[i], dy, st.pad)
                              : gemm_transposed(*in[i], true, dy, false, "weight gradient"),
                         sig[i].weight);
          tensor dx = conv ? sbp::conv2d_grad_input(dy, *w[i], st.pad)
                           : gemm_transposed(dy, false, *w[i], true, "input gradient");
          aligned_vector<float> updated = pooled_copy(*w[i]);
          const auto g_local = dw.to_local();
          for (std::size_t k = 0; k < updated.size(); ++k) updated[k] -= lr * g_local[k];
          w[i] = map_local(*w[i], std::move(updated));
          dy = std::move(dx);
          break;
        }
        case step_kind::relu: {  // pass the gradient where the output is positive, in the output's layout
          dy = to(std::move(dy), out[i]->layout());
          aligned_vector<float> v = pooled_copy(dy);
          const auto o = out[i]->to_local();
          for (std::size_t k = 0; k < v.size(); ++k)
            if (!(o[k] > 0)) v[k] = 0.0f;
          dy = map_local(dy, std::move(v));
          break;
        }
        case step_kind::max_pool: {
          dy = to(std::move(dy), out[i]->layout());
          const sbp::box b = in[i]->my_box();
          aligned_vector<float> dx = mesh.pool().acquire<float>(b.elements());
          pool_backward(in[i]->to_local().data(), dy.to_local().data(), b.extent[0] * b.extent[1], b.extent[2],
                        b.extent[3], st, dx.data());
          dy = tensor::adopt(mesh, st.in, in[i]->layout(), std::move(dx));
          break;
        }
      }
      if (st.in != st.produced) dy = reshaped(std::move(dy), st.produced);
    }
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

execution_result execute_serial(const graph& g, std::span<const float> input, std::vector<std::vector<float>> weights,
                                float lr) {
  const strategy one_device(g.ops.size(), soap_config{});
  const std::vector<op_step> plan = plan_steps(g, one_device, 1);
  const std::size_t n = g.ops.size(), batch = g.ops.front().batch;
  std::vector<std::vector<float>> acts{std::vector<float>(input.begin(), input.end())};  // acts[i]: input of op i
  // direct loops (no im2col, no BLAS): the oracle of the distributed run
  auto conv_loops = [&](const op_step& st, std::size_t nn, std::size_t k, std::size_t c, std::size_t p, std::size_t q,
                        std::size_t r, std::size_t t, auto&& visit) {
    const std::size_t hh = p + r, ww = q + t;
    if (hh < st.pad || ww < st.pad || hh - st.pad >= st.in[2] || ww - st.pad >= st.in[3]) return;
    const std::size_t xi = ((nn * st.in[1] + c) * st.in[2] + hh - st.pad) * st.in[3] + ww - st.pad;
    const std::size_t wi = ((k * st.in[1] + c) * st.weight[2] + r) * st.weight[3] + t;
    const std::size_t yi = ((nn * st.out[1] + k) * st.out[2] + p) * st.out[3] + q;
    visit(xi, wi, yi);
  };
  auto for_each_tap = [&](const op_step& st, auto&& visit) {
    for (std::size_t nn = 0; nn < batch; ++nn)
      for (std::size_t k = 0; k < st.out[1]; ++k)
        for (std::size_t p = 0; p < st.out[2]; ++p)
          for (std::size_t q = 0; q < st.out[3]; ++q)
            for (std::size_t c = 0; c < st.in[1]; ++c)
              for (std::size_t r = 0; r < st.weight[2]; ++r)
                for (std::size_t t = 0; t < st.weight[3]; ++t) conv_loops(st, nn, k, c, p, q, r, t, visit);
  };
  for (std::size_t i = 0; i < n; ++i) {
    const op_step& st = plan[i];
    const std::vector<float>& x = acts[i];
    std::vector<float> y(sbp::elements_of(st.out), 0.0f);
    switch (st.kind) {
      case step_kind::linear:
        for (std::size_t b = 0; b < batch; ++b)
          for (std::size_t k = 0; k < st.in[1]; ++k)
            for (std::size_t j = 0; j < st.out[1]; ++j)
              y[b * st.out[1] + j] += x[b * st.in[1] + k] * weights[i][k * st.out[1] + j];
        break;
      case step_kind::conv2d:
        for_each_tap(st, [&](std::size_t xi, std::size_t wi, std::size_t yi) { y[yi] += x[xi] * weights[i][wi]; });
        break;
      case step_kind::relu:
        for (std::size_t k = 0; k < y.size(); ++k) y[k] = x[k] > 0 ? x[k] : 0.0f;
        break;
      case step_kind::max_pool: pool_forward(x.data(), batch * st.in[1], st.in[2], st.in[3], st, y.data()); break;
    }
    acts.push_back(std::move(y));
  }
  execution_result r;
  r.output = acts[n];
  std::vector<float> dy = acts[n];
  for (std::size_t i = n; i-- > 0;) {
    const op_step& st = plan[i];
    const std::vector<float>& x = acts[i];
    std::vector<float> dx(x.size(), 0.0f), dw(sbp::elements_of(st.weight), 0.0f);
    switch (st.kind) {
      case step_kind::linear: {
        const std::size_t in = st.in[1], out = st.out[1];
        for (std::size_t b = 0; b < batch; ++b)
          for (std::size_t k = 0; k < in; ++k)
            for (std::size_t j = 0; j < out; ++j) {
              dw[k * out + j] += x[b * in + k] * dy[b * out + j];
              dx[b * in + k] += dy[b * out + j] * weights[i][k * out + j];
            }
        break;
      }
      case step_kind::conv2d:
        for_each_tap(st, [&](std::size_t xi, std::size_t wi, std::size_t yi) {
          dw[wi] += dy[yi] * x[xi];
          dx[xi] += dy[yi] * weights[i][wi];
        });
        break;
      case step_kind::relu:
        for (std::size_t k = 0; k < dy.size(); ++k) dx[k] = acts[i + 1][k] > 0 ? dy[k] : 0.0f;
        break;
      case step_kind::max_pool:
        pool_backward(x.data(), dy.data(), batch * st.in[1], st.in[2], st.in[3], st, dx.data());
        break;
    }
    if (!st.weight.empty())
      for (std::size_t k = 0; k < dw.size(); ++k) weights[i][k] -= lr * dw[k];
    dy = std::move(dx);
  }
  for (std::size_t i = 0; i < n; ++i) r.weights.push_back(plan[i].weight.empty() ? std::vector<float>{} : weights[i]);
  return r;
}

}  // namespace flexpar::search
