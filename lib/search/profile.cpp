// Measured op times (header: flexpar/search/profile.hpp).
#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/sbp/local_math.hpp>
#include <flexpar/search/profile.hpp>

#include <algorithm>
#include <chrono>

namespace flexpar::search {

namespace {
std::size_t ceil_div(std::size_t a, int d) {
  return (a + static_cast<std::size_t>(d) - 1) / static_cast<std::size_t>(d);
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
  for (std::size_t i = 0; i < g.ops.size() && i < space.size(); ++i) {
    if (g.ops[i].kind != op_kind::linear) continue;
    for (const soap_config& c : space[i])
      for (const auto& s : linear_gemm_shapes(g.ops[i], c)) shapes.push_back(s);
  }
  std::sort(shapes.begin(), shapes.end());
  shapes.erase(std::unique(shapes.begin(), shapes.end()), shapes.end());
  std::vector<double> times;
  for (const auto& [m, n, k] : shapes) {
    std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), out(m * n);
    std::vector<double> runs;
    for (int r = 0; r <= std::max(1, repeats); ++r) {
      const auto start = std::chrono::steady_clock::now();
      sbp::local::gemm(m, n, k, a.data(), b.data(), out.data());
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (r > 0) runs.push_back(t);  // the first run warms the caches
    }
    std::sort(runs.begin(), runs.end());
    times.push_back(runs[runs.size() / 2]);
  }
  if (!times.empty()) allreduce(comm, std::span<double>(times), reduce_op::max);
  for (std::size_t s = 0; s < shapes.size(); ++s) p.gemm_[shapes[s]] = times[s];
  return p;
}

double kernel_profile::seconds(const op& o, const soap_config& c, bool backward) const {
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
