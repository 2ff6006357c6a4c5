// Shared by the CNN execution tests (threads as ranks and mpiexec): seeded small-integer data, the
// weights of a graph's linear and conv2d ops, the ranks' cluster, and the executable 1-D configs of an op.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include <flexpar/search/cluster.hpp>
#include <flexpar/search/config.hpp>

namespace flexpar::search::testing_support {

/// Values in {-1, 0, 1} from a generator seeded with `salt` (no short period: a periodic pattern can
/// make every convolution window sum vanish).
inline std::vector<float> values(std::size_t n, std::size_t salt) {
  std::mt19937 rng(static_cast<std::uint32_t>(salt));
  std::vector<float> v(n);
  for (float& e : v) e = static_cast<float>(static_cast<int>(rng() % 3) - 1);
  return v;
}

/// Op i's weight: [in, out] for linear, [out, in, k, k] for conv2d, empty otherwise.
inline std::vector<std::vector<float>> weights_of(const graph& g) {
  std::vector<std::vector<float>> w;
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const op& o = g.ops[i];
    const std::size_t n = o.kind == op_kind::linear   ? o.in_channels * o.out_channels
                          : o.kind == op_kind::conv2d ? o.out_channels * o.in_channels * o.kernel * o.kernel
                                                      : 0;
    w.push_back(values(n, i + 1));
  }
  return w;
}

/// This machine's CPU preset with p devices on its one node (the executor's ranks).
inline cluster ranks_cluster(int p) {
  cluster c = preset("2-1-cpu");
  c.devices_per_node = p;
  return c;
}

/// A 1-D mesh of all p ranks.
inline bool one_d_of_all(const soap_config& c, int p) {
  return c.devices() == p && c.first_device == 0 && (c.sample > 1) + (c.attribute > 1) + (c.parameter > 1) <= 1;
}

/// The configs of `o` on `cl` that execute_steps runs on p ranks (a max_pool keeps its planes whole).
inline std::vector<soap_config> executable_configs(const op& o, const cluster& cl, int p) {
  std::vector<soap_config> out;
  for (const soap_config& c : candidates(o, cl))
    if (one_d_of_all(c, p) && !(o.function == elementwise_fn::max_pool && c.attribute > 1)) out.push_back(c);
  return out;
}

}  // namespace flexpar::search::testing_support
