// lib/search/profile.cpp — measured op times (header: flexpar/search/profile.hpp).
#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/sbp/local_math.hpp>
#include <flexpar/search/profile.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace flexpar::search {

namespace {
std::size_t ceil_div(std::size_t a, int d) {
  return (a + static_cast<std::size_t>(d) - 1) / static_cast<std::size_t>(d);
}
}  // namespace

std::array<std::size_t, 5> conv2d_shard(const op& o, const soap_config& c) {
  const auto side = static_cast<std::size_t>(std::lround(std::sqrt(static_cast<double>(o.spatial))));
  // conv2d's attribute is its reduced input-channel axis, its parameter the output channels (config.hpp)
  return {ceil_div(o.batch, c.sample), ceil_div(o.in_channels, c.attribute), side,
          ceil_div(o.out_channels, c.parameter), o.kernel};
}

std::size_t output_shard_elements(const op& o, const soap_config& c) {
  return ceil_div(o.batch, c.sample) * ceil_div(o.out_channels, c.parameter) * ceil_div(o.spatial, c.attribute);
}

std::size_t weight_shard_elements(const op& o, const soap_config& c) {
  const sbp_signature s = signature_of(o, c);
  int split = 1;
  for (std::size_t d = 0; d < s.weight.rank; ++d)
    if (s.weight[d].is_split()) split *= s.mesh[d];
  const auto elements = static_cast<std::size_t>(o.param_bytes / 4.0 + 0.5);
  return ceil_div(elements, split);
}

namespace {
/// The median of `repeats` timed runs of f after one untimed.
template <class F>
double median_of(int repeats, F&& f) {
  std::vector<double> runs;
  for (int r = 0; r <= std::max(1, repeats); ++r) {
    const auto start = std::chrono::steady_clock::now();
    f();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r > 0) runs.push_back(t);  // the first run warms the caches
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}
}  // namespace

std::array<std::array<std::size_t, 3>, 3> linear_gemm_shapes(const op& o, const soap_config& c) {
  const std::size_t m = ceil_div(o.batch, c.sample) * o.spatial;
  const std::size_t k = ceil_div(o.in_channels, c.attribute);
  const std::size_t n = ceil_div(o.out_channels, c.parameter);
  return {{{m, n, k}, {k, n, m}, {m, k, n}}};
}

kernel_profile kernel_profile::measure(communicator& comm, const graph& g,
                                       const std::vector<std::vector<soap_config>>& space, int repeats) {
  kernel_profile p;
  std::vector<std::array<std::size_t, 3>> shapes;
  std::vector<std::size_t> pointwise, updates;
  std::vector<std::array<std::size_t, 5>> convs;
  for (std::size_t i = 0; i < g.ops.size() && i < space.size(); ++i) {
    const op& o = g.ops[i];
    for (const soap_config& c : space[i]) {
      if (o.kind == op_kind::linear)
        for (const auto& s : linear_gemm_shapes(o, c)) shapes.push_back(s);
      if (o.kind == op_kind::elementwise && o.function == elementwise_fn::relu)
        pointwise.push_back(output_shard_elements(o, c));
      if (o.kind == op_kind::conv2d) convs.push_back(conv2d_shard(o, c));
      if (o.param_bytes > 0) updates.push_back(weight_shard_elements(o, c));
    }
  }
  auto unique = [](auto& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
  };
  unique(shapes);
  unique(pointwise);
  unique(updates);
  unique(convs);
  std::vector<double> times;
  for (const auto& [m, n, k] : shapes) {
    std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), out(m * n);
    times.push_back(median_of(repeats, [&] { sbp::local::gemm(m, n, k, a.data(), b.data(), out.data()); }));
  }
  // relu as the executor runs it: forward copies the shard and clamps it; backward copies the gradient and
  // zeroes it where the output is not positive
  for (std::size_t n : pointwise) {
    std::vector<float> x(n), y(n);
    for (std::size_t e = 0; e < n; ++e) x[e] = static_cast<float>(static_cast<int>(e % 7) - 3);
    times.push_back(median_of(repeats, [&] {
      std::vector<float> v(x.begin(), x.end());
      for (float& e : v) e = e > 0 ? e : 0.0f;
      y.swap(v);
    }));
    times.push_back(median_of(repeats, [&] {
      std::vector<float> v(x.begin(), x.end());
      for (std::size_t e = 0; e < n; ++e)
        if (!(y[e] > 0)) v[e] = 0.0f;
      y.swap(v);
    }));
  }
  // the update: a copy of the weight shard and w -= lr g
  for (std::size_t n : updates) {
    std::vector<float> w(n, 1.0f), grad(n, 0.5f);
    times.push_back(median_of(repeats, [&] {
      std::vector<float> updated(w.begin(), w.end());
      for (std::size_t e = 0; e < n; ++e) updated[e] -= 1e-3f * grad[e];
      w.swap(updated);
    }));
  }
  // conv2d as sbp::conv2d runs it on a shard: im2col + GEMM forward; backward the input gradient (GEMM +
  // col2im) and the weight gradient
  for (const auto& [n, ch, side, k, r] : convs) {
    const sbp::local::conv2d_geometry geo{n, ch, side, side, k, r, r, (r - 1) / 2, (r - 1) / 2};
    std::vector<float> x(n * ch * side * side, 0.5f), w(k * ch * r * r, 0.25f), y(n * k * side * side, 0.0f);
    std::vector<float> dx(x.size()), dw(w.size());
    times.push_back(median_of(repeats, [&] { sbp::local::conv2d_forward(geo, x.data(), w.data(), y.data()); }));
    times.push_back(median_of(repeats, [&] {
      sbp::local::conv2d_backward_data(geo, y.data(), w.data(), dx.data());
      sbp::local::conv2d_backward_weight(geo, x.data(), y.data(), dw.data());
    }));
  }
  if (!times.empty()) allreduce(comm, std::span<double>(times), reduce_op::max);
  std::size_t t = 0;
  for (const auto& s : shapes) p.gemm_[s] = times[t++];
  for (std::size_t n : pointwise) {
    p.elementwise_[n] = {times[t], times[t + 1]};
    t += 2;
  }
  for (std::size_t n : updates) p.update_[n] = times[t++];
  for (const auto& key : convs) {
    p.conv_[key] = {times[t], times[t + 1]};
    t += 2;
  }
  return p;
}

double kernel_profile::update_seconds(const op& o, const soap_config& c) const {
  if (o.param_bytes <= 0) return -1;
  const auto it = update_.find(weight_shard_elements(o, c));
  return it == update_.end() ? -1.0 : it->second;
}

double kernel_profile::seconds(const op& o, const soap_config& c, bool backward) const {
  if (o.kind == op_kind::elementwise) {
    if (o.function != elementwise_fn::relu) return -1;
    const auto it = elementwise_.find(output_shard_elements(o, c));
    return it == elementwise_.end() ? -1.0 : it->second[backward ? 1 : 0];
  }
  if (o.kind == op_kind::conv2d) {
    const auto it = conv_.find(conv2d_shard(o, c));
    return it == conv_.end() ? -1.0 : it->second[backward ? 1 : 0];
  }
  if (o.kind != op_kind::linear) return -1;
  const auto shapes = linear_gemm_shapes(o, c);
  auto time_of = [&](const std::array<std::size_t, 3>& s) {
    const auto it = gemm_.find(s);
    return it == gemm_.end() ? -1.0 : it->second;
  };
  if (!backward) return time_of(shapes[0]);
  const double dw = time_of(shapes[1]), dx = time_of(shapes[2]);
  return dw < 0 || dx < 0 ? -1.0 : dw + dx;
}

}  // namespace flexpar::search
