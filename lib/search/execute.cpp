// lib/search/execute.cpp — running a strategy through sbp::dynamic_tensor (header: flexpar/search/execute.hpp;
// the steps themselves: flexpar/search/executor.hpp, shared with the device executor).
#include <cblas.h>

#include <flexpar/core/error.hpp>
#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/search/execute.hpp>

#include <algorithm>

#include <flexpar/search/executor.hpp>

namespace flexpar::search {

namespace detail {

std::string op_context(std::size_t i, const op& o) {
  return error_text(no_rank, "search::execute_steps", "op ", i, " '", o.name, "': ");
}

}  // namespace detail

namespace executor {

using detail::op_context;

namespace {

std::size_t square_side(std::size_t n) {
  std::size_t s = 0;
  while ((s + 1) * (s + 1) <= n) ++s;
  return s * s == n ? s : 0;
}

/// The SBP of the transpose (split axes swapped).
nd_parallel transposed(nd_parallel s) {
  for (std::size_t d = 0; d < s.rank; ++d)
    if (s[d].is_split()) s[d] = parallel::S(1 - s[d].axis);
  return s;
}

}  // namespace

std::vector<op_step> plan_steps(const graph& g, const strategy& s, int ranks) {
  if (s.size() != g.ops.size())
    throw usage_error(error_text(no_rank, "search::execute_steps", "the strategy has ")
                          .append(std::to_string(s.size()))
                          .append(" configs for ")
                          .append(std::to_string(g.ops.size()))
                          .append(" ops"));
  if (g.ops.empty()) throw error_on<usage_error>(no_rank, "search::execute_steps", "the graph has no ops");
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

transposed_product plan_product(const nd_parallel& a, const shape_t& a_shape, const sbp::box& a_box, bool transpose_a,
                                const nd_parallel& b, const shape_t& b_shape, const sbp::box& b_box, bool transpose_b,
                                const char* what) {
  const nd_parallel la = transpose_a ? transposed(a) : a;
  const nd_parallel lb = transpose_b ? transposed(b) : b;
  const sbp::nd_signature_result sig =
      sbp::nd_signature([](const parallel& x, const parallel& y) { return sbp::signature::matmul(x, y); }, la, lb);
  if (!sig.ok)
    throw usage_error(error_text(no_rank, "search::execute_steps")
                          .append(what)
                          .append(": matmul has no signature for ")
                          .append(sbp::to_string(la))
                          .append(" x ")
                          .append(sbp::to_string(lb)));
  transposed_product p;
  p.m = transpose_a ? a_shape[1] : a_shape[0];
  p.n = transpose_b ? b_shape[0] : b_shape[1];
  p.out = sig.out;
  if (a_box.extent.size() == 2 && b_box.extent.size() == 2) {
    p.rows = transpose_a ? a_box.extent[1] : a_box.extent[0];
    p.inner = transpose_a ? a_box.extent[0] : a_box.extent[1];
    p.cols = transpose_b ? b_box.extent[0] : b_box.extent[1];
  }
  return p;
}

}  // namespace executor

namespace {

using executor::op_step;
using executor::step_kind;
using sbp::shape_t;

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

/// The executor's local steps on host shards (flexpar/search/executor.hpp): OpenBLAS for the transposed
/// products, loops for the rest, every buffer from the mesh's pool.
struct host_backend {
  using tensor = sbp::dynamic_tensor<float, 1>;
  const sbp::placement<1>& mesh;

  [[nodiscard]] tensor from_full(const shape_t& shape, const sbp::nd_parallel& s, std::span<const float> data) const {
    return tensor::from_full(mesh, shape, s, data);
  }
  /// a^T b or a b^T on the shards, the BLAS transposing in place (no copies).
  [[nodiscard]] tensor product(const tensor& a, bool transpose_a, const tensor& b, bool transpose_b,
                               const char* what) const {
    const sbp::box ba = a.my_box(), bb = b.my_box();
    const executor::transposed_product p =
        executor::plan_product(a.layout(), a.shape(), ba, transpose_a, b.layout(), b.shape(), bb, transpose_b, what);
    if (!mesh.contains_me()) return tensor::adopt(mesh, {p.m, p.n}, p.out, {});
    aligned_vector<float> c = mesh.pool().acquire<float>(p.rows * p.cols);  // from the pool: reused, not zeroed
    if (p.inner == 0) std::fill(c.begin(), c.end(), 0.0f);                  // an empty sum (beta = 0 writes the rest)
    if (p.rows > 0 && p.cols > 0 && p.inner > 0)
      cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
                  static_cast<int>(p.rows), static_cast<int>(p.cols), static_cast<int>(p.inner), 1.0f,
                  a.to_local().data(), static_cast<int>(ba.extent[1]), b.to_local().data(),
                  static_cast<int>(bb.extent[1]), 0.0f, c.data(), static_cast<int>(p.cols));
    return tensor::adopt(mesh, {p.m, p.n}, p.out, std::move(c));
  }
  [[nodiscard]] tensor relu(const tensor& x) const {
    aligned_vector<float> v = mesh.pool().acquire_copy(x.to_local());
    for (float& e : v) e = e > 0 ? e : 0.0f;
    return tensor::adopt(mesh, x.shape(), x.layout(), std::move(v));
  }
  /// dy (in y's layout) where the output y is positive, else 0.
  [[nodiscard]] tensor relu_backward(const tensor& dy, const tensor& y) const {
    aligned_vector<float> v = mesh.pool().acquire_copy(dy.to_local());
    const auto o = y.to_local();
    for (std::size_t k = 0; k < v.size(); ++k)
      if (!(o[k] > 0)) v[k] = 0.0f;
    return tensor::adopt(mesh, dy.shape(), dy.layout(), std::move(v));
  }
  [[nodiscard]] tensor max_pool(const tensor& x, const op_step& st) const {
    const sbp::box b = x.my_box();
    aligned_vector<float> y = mesh.pool().acquire<float>(b.extent[0] * b.extent[1] * st.out[2] * st.out[3]);
    pool_forward(x.to_local().data(), b.extent[0] * b.extent[1], b.extent[2], b.extent[3], st, y.data());
    return tensor::adopt(mesh, st.out, x.layout(), std::move(y));
  }
  [[nodiscard]] tensor max_pool_backward(const tensor& x, const tensor& dy, const op_step& st) const {
    const sbp::box b = x.my_box();
    aligned_vector<float> dx = mesh.pool().acquire<float>(b.elements());
    pool_backward(x.to_local().data(), dy.to_local().data(), b.extent[0] * b.extent[1], b.extent[2], b.extent[3], st,
                  dx.data());
    return tensor::adopt(mesh, x.shape(), x.layout(), std::move(dx));
  }
  [[nodiscard]] tensor sgd(const tensor& w, const tensor& dw, float lr) const {
    aligned_vector<float> updated = mesh.pool().acquire_copy(w.to_local());
    const auto g = dw.to_local();
    for (std::size_t k = 0; k < updated.size(); ++k) updated[k] -= lr * g[k];
    return tensor::adopt(mesh, w.shape(), w.layout(), std::move(updated));
  }
  void settle() const {}
};

}  // namespace

bool executable(const graph& g, const strategy& s, int ranks) {
  try {
    (void)executor::plan_steps(g, s, ranks);
  } catch (const usage_error&) {
    return false;
  }
  return true;
}

execution_result execute_steps(communicator& comm, const graph& g, const strategy& s, std::span<const float> input,
                               std::vector<std::vector<float>> weights, float lr, std::size_t steps) {
  const std::vector<op_step> plan = executor::plan_steps(g, s, comm.size());
  const sbp::placement<1> mesh(comm, {comm.size()});
  return executor::run_steps(host_backend{mesh}, comm, g, s, plan, input, weights, lr, steps);
}

execution_result execute_serial(const graph& g, std::span<const float> input, std::vector<std::vector<float>> weights,
                                float lr) {
  const strategy one_device(g.ops.size(), soap_config{});
  const std::vector<op_step> plan = executor::plan_steps(g, one_device, 1);
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
