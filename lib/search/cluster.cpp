// The cluster model: presets, JSON, and the measured-on-this-machine constructor.
#include <flexpar/collective.hpp>
#include <flexpar/collective/automatic.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/sbp/local_math.hpp>
#include <flexpar/search/cluster.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace flexpar::search {

cost_params cluster::params(bool crosses_nodes) const noexcept {
  cost_params m;
  const link& l = crosses_nodes ? inter : intra;
  m.alpha = l.latency;
  m.beta = 1.0 / l.bandwidth;
  m.gamma = 1.0 / memory_bandwidth;  // a reduction streams its operands through memory
  m.shm_alpha = intra.latency;
  m.copy_beta = 1.0 / intra.bandwidth;
  return m;
}

void cluster::validate() const {
  auto positive = [](double v, const char* field) {
    if (!(v > 0))
      throw usage_error(
          std::string("search::cluster: ").append(field).append(" must be > 0, got ").append(std::to_string(v)));
  };
  positive(nodes, "nodes");
  positive(devices_per_node, "devices_per_node");
  positive(flops, "flops");
  positive(memory_bandwidth, "memory_bandwidth");
  positive(static_cast<double>(memory_bytes), "memory_bytes");
  if (kernel_latency < 0) throw usage_error("search::cluster: kernel_latency must be >= 0");
  positive(intra.bandwidth, "intra.bandwidth");
  positive(inter.bandwidth, "inter.bandwidth");
  if (intra.latency < 0 || inter.latency < 0) throw usage_error("search::cluster: link latencies must be >= 0");
}

namespace {
// A V100-class device (15 TFLOP/s, 16 GiB at 900 GB/s) and a link inside a node of `intra_bandwidth`
// bytes/s; the link between nodes is `inter_slowdown` times slower.
cluster gpu_cluster(int nodes, int per_node, double intra_bandwidth, double inter_slowdown) {
  cluster c;
  c.nodes = nodes;
  c.devices_per_node = per_node;
  c.flops = 15e12;
  c.memory_bandwidth = 900e9;
  c.memory_bytes = 16ull << 30;
  c.kernel_latency = 5e-6;
  c.intra = {5e-6, intra_bandwidth};
  c.inter = {10e-6, intra_bandwidth / inter_slowdown};
  return c;
}
constexpr double pcie = 12e9;     // PCIe 3.0 x16 between the GPUs of a node
constexpr double nvlink = 100e9;  // NVLink-class
}  // namespace

std::vector<std::string> preset_names() { return {"16-4-slow-inter", "16-4-nvlink", "64-8", "8-1", "2-1-cpu"}; }

cluster preset(std::string_view name) {
  if (name == "16-4-slow-inter") return gpu_cluster(4, 4, pcie, 10);
  if (name == "16-4-nvlink") return gpu_cluster(4, 4, nvlink, 10);
  if (name == "64-8") return gpu_cluster(8, 8, pcie, 10);
  if (name == "8-1") return gpu_cluster(1, 8, pcie, 10);
  if (name == "2-1-cpu") {
    cluster c;
    c.nodes = 1;
    c.devices_per_node = 2;
    c.flops = 50e9;
    c.memory_bandwidth = 10e9;
    c.memory_bytes = 4ull << 30;
    c.kernel_latency = 2e-6;
    c.intra = {2e-6, 5e9};
    c.inter = c.intra;
    return c;
  }
  std::string msg("search::preset: no cluster preset '");
  msg.append(name).append("'; presets:");
  for (const std::string& n : preset_names()) msg.append(" ").append(n);
  throw usage_error(msg);
}

std::string to_json(const cluster& c) {
  nlohmann::json j{{"nodes", c.nodes},
                   {"devices_per_node", c.devices_per_node},
                   {"flops", c.flops},
                   {"memory_bandwidth", c.memory_bandwidth},
                   {"memory_bytes", c.memory_bytes},
                   {"kernel_latency", c.kernel_latency},
                   {"intra", {{"latency", c.intra.latency}, {"bandwidth", c.intra.bandwidth}}},
                   {"inter", {{"latency", c.inter.latency}, {"bandwidth", c.inter.bandwidth}}}};
  return j.dump(1);
}

cluster cluster_from_json(std::string_view text) {
  cluster c;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    c.nodes = j.value("nodes", c.nodes);
    c.devices_per_node = j.value("devices_per_node", c.devices_per_node);
    c.flops = j.value("flops", c.flops);
    c.memory_bandwidth = j.value("memory_bandwidth", c.memory_bandwidth);
    c.memory_bytes = j.value("memory_bytes", c.memory_bytes);
    c.kernel_latency = j.value("kernel_latency", c.kernel_latency);
    if (j.contains("intra")) {
      c.intra.latency = j["intra"].value("latency", c.intra.latency);
      c.intra.bandwidth = j["intra"].value("bandwidth", c.intra.bandwidth);
    }
    if (j.contains("inter")) {
      c.inter.latency = j["inter"].value("latency", c.inter.latency);
      c.inter.bandwidth = j["inter"].value("bandwidth", c.inter.bandwidth);
    }
  } catch (const nlohmann::json::exception& e) {
    throw usage_error(std::string("search::cluster_from_json: ").append(e.what()));
  }
  c.validate();
  return c;
}

cluster measure_cluster(communicator& comm, std::size_t gemm_n) {
  using clock = std::chrono::steady_clock;
  cluster c;
  c.nodes = 1;
  c.devices_per_node = comm.size();
  // FLOP rate: a local GEMM through the BLAS the SBP ops use, the median of 5 after a warm-up (the median,
  // not the best: on a shared machine the best run is the least-loaded moment, not what a step sees).
  const std::size_t n = std::max<std::size_t>(gemm_n, 16);
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), out(n * n);
  std::vector<double> runs;
  for (int rep = 0; rep < 6; ++rep) {
    const auto start = clock::now();
    sbp::local::gemm(n, n, n, a.data(), b.data(), out.data());
    const double t = std::chrono::duration<double>(clock::now() - start).count();
    if (rep > 0) runs.push_back(t);
  }
  std::sort(runs.begin(), runs.end());
  double best = runs[runs.size() / 2];
  // Every rank must hold the same cluster (a search on it must give every rank the same strategy):
  // the slowest rank's times count.
  allreduce(comm, std::span<double>(&best, 1), reduce_op::max);
  c.flops = 2.0 * double(n) * double(n) * double(n) / std::max(best, 1e-9);
  // Memory bandwidth: a copy of 16 MiB reads and writes each byte once (median of 5).
  std::vector<char> src(16u << 20, 1), dst(16u << 20);
  std::vector<double> copies;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = clock::now();
    std::memcpy(dst.data(), src.data(), src.size());
    copies.push_back(std::chrono::duration<double>(clock::now() - start).count());
  }
  std::sort(copies.begin(), copies.end());
  double best_copy = copies[copies.size() / 2];
  allreduce(comm, std::span<double>(&best_copy, 1), reduce_op::max);
  c.memory_bandwidth = 2.0 * double(src.size()) / std::max(best_copy, 1e-9);
  // Links: the collectives' own alpha / beta measurement (a ping-pong between ranks 0 and 1).
  const cost_params& m = machine_of(comm);
  c.intra = {m.alpha, 1.0 / m.beta};
  c.inter = c.intra;
  c.kernel_latency = 1e-6;
  return c;
}

}  // namespace flexpar::search
