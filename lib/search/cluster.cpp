// lib/search/cluster.cpp — the cluster model: presets, JSON, and the measured-on-this-machine constructor.
#include <flexpar/collective.hpp>
#include <flexpar/collective/automatic.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/compress/minmax_uint8.hpp>
#include <flexpar/compress/onebit.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/sbp/boxing.hpp>
#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/sbp/local_math.hpp>
#include <flexpar/search/cluster.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>
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
      throw error_on<usage_error>(no_rank, "search::cluster", field, " must be > 0, got ", std::to_string(v));
  };
  positive(nodes, "nodes");
  positive(devices_per_node, "devices_per_node");
  positive(flops, "flops");
  positive(memory_bandwidth, "memory_bandwidth");
  positive(static_cast<double>(memory_bytes), "memory_bytes");
  if (kernel_latency < 0) throw error_on<usage_error>(no_rank, "search::cluster", "kernel_latency must be >= 0");
  positive(intra.bandwidth, "intra.bandwidth");
  positive(inter.bandwidth, "inter.bandwidth");
  if (intra.latency < 0 || inter.latency < 0)
    throw error_on<usage_error>(no_rank, "search::cluster", "link latencies must be >= 0");
  positive(compression.minmax_encode, "compression.minmax_encode");
  positive(compression.minmax_decode, "compression.minmax_decode");
  positive(compression.onebit_encode, "compression.onebit_encode");
  positive(compression.onebit_decode, "compression.onebit_decode");
  positive(compression.adam_update, "compression.adam_update");
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
  // Not measured (no GPU here): a compression kernel that streams its f32 input once at a third of the
  // memory bandwidth (encode reads 4 bytes and writes ~1 per value, decode the reverse).
  c.compression = {c.memory_bandwidth / 3, c.memory_bandwidth / 3, c.memory_bandwidth / 3, c.memory_bandwidth / 3,
                   c.memory_bandwidth / 3};
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
  std::string msg = error_text(no_rank, "search::preset", "no cluster preset '", name, "'; presets:");
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
                   {"inter", {{"latency", c.inter.latency}, {"bandwidth", c.inter.bandwidth}}},
                   {"compression",
                    {{"minmax_encode", c.compression.minmax_encode},
                     {"minmax_decode", c.compression.minmax_decode},
                     {"onebit_encode", c.compression.onebit_encode},
                     {"onebit_decode", c.compression.onebit_decode},
                     {"adam_update", c.compression.adam_update}}},
                   {"overlap", c.overlap}};
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
    c.overlap = j.value("overlap", c.overlap);
    if (j.contains("compression")) {
      compression_rates& r = c.compression;
      const nlohmann::json& k = j["compression"];
      r.minmax_encode = k.value("minmax_encode", r.minmax_encode);
      r.minmax_decode = k.value("minmax_decode", r.minmax_decode);
      r.onebit_encode = k.value("onebit_encode", r.onebit_encode);
      r.onebit_decode = k.value("onebit_decode", r.onebit_decode);
      r.adam_update = k.value("adam_update", r.adam_update);
    }
  } catch (const nlohmann::json::exception& e) {
    throw usage_error(error_text(no_rank, "search::cluster_from_json").append(e.what()));
  }
  c.validate();
  return c;
}

namespace {
/// The median of 5 timed runs of f after one untimed.
template <class F>
double median_seconds(F&& f) {
  using clock = std::chrono::steady_clock;
  std::vector<double> runs;
  for (int rep = 0; rep < 6; ++rep) {
    const auto start = clock::now();
    f();
    const double t = std::chrono::duration<double>(clock::now() - start).count();
    if (rep > 0) runs.push_back(t);
  }
  std::sort(runs.begin(), runs.end());
  return std::max(runs[runs.size() / 2], 1e-9);
}
}  // namespace

compression_rates measure_compression(std::size_t floats) {
  const std::size_t n = std::max<std::size_t>(floats, 4096);
  // Gradient-like values: a smooth spread with both signs, every one finite.
  std::vector<float> x(n), y(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<int>(i % 1021) - 510) * 1e-3f;
  const double bytes = 4.0 * static_cast<double>(n);
  compression_rates r;
  const compress::minmax_uint8 q;
  std::vector<std::byte> coded(q.encoded_size(n));
  r.minmax_encode = bytes / median_seconds([&] { q.encode(x, coded); });
  r.minmax_decode = bytes / median_seconds([&] { q.decode(coded, y); });
  compress::onebit one(n);
  std::vector<std::byte> bits(one.encoded_size(n));
  r.onebit_encode = bytes / median_seconds([&] { one.encode(x, bits); });
  r.onebit_decode = bytes / median_seconds([&] { one.decode(bits, y); });
  // 1-bit Adam's compression-stage passes (relax/momentum_adam.hpp): m = b1 m + (1 - b1) g, then
  // x -= lr (m / c1) / (sqrt(v) + eps) with the frozen variance v
  std::vector<float> m(n, 0.0f), v(n, 1e-4f);
  r.adam_update = bytes / median_seconds([&] {
                    for (std::size_t i = 0; i < n; ++i) m[i] = 0.9f * m[i] + 0.1f * x[i];
                    for (std::size_t i = 0; i < n; ++i) y[i] -= 1e-3f * (m[i] / 0.1f) / (std::sqrt(v[i]) + 1e-8f);
                  });
  return r;
}

link fit_link(const std::vector<link_sample>& samples, double gamma) {
  if (samples.size() < 2) throw error_on<usage_error>(no_rank, "search::fit_link", "needs at least 2 samples");
  // t - gamma r = alpha x + beta y with x = messages (transport + shared memory), y = bytes (wire + copies)
  const auto [alpha, beta] = fit_channel(
      samples, [](const cost& c) { return c.steps + c.shm_steps; },
      [](const cost& c) { return c.wire_bytes + c.copy_bytes; },
      [gamma](const cost& c) { return gamma * c.reduce_bytes; }, 0.0, 0.0);
  if (!(beta > 0)) throw error_on<usage_error>(no_rank, "search::fit_link", "the samples give no positive bandwidth");
  return {alpha, 1.0 / beta};
}

namespace {
/// measure_cluster's boxing samples on a 1-D mesh of every rank (header: measure_cluster).
std::vector<link_sample> boxing_samples(communicator& comm) {
  using tensor = sbp::dynamic_tensor<float, 1>;
  using sbp::parallel;
  const int p = comm.size();
  sbp::placement<1> mesh(comm, {p});
  auto one = [](parallel x) {
    sbp::nd_parallel s;
    s[0] = x;
    return s;
  };
  const std::pair<parallel, parallel> moves[] = {{parallel::S(0), parallel::B()},
                                                 {parallel::S(1), parallel::B()},
                                                 {parallel::P(), parallel::B()},
                                                 {parallel::P(), parallel::S(0)},
                                                 {parallel::S(0), parallel::S(1)}};
  std::vector<link_sample> samples;
  const std::size_t rows = 64;
  for (std::size_t cols : {64u, 512u, 4096u}) {  // 16 KiB, 128 KiB, 1 MiB
    const std::vector<float> full(rows * cols, 0.5f);
    for (const auto& [from, to_] : moves) {
      const tensor source = tensor::from_full(mesh, {rows, cols}, one(from), full);
      std::vector<double> runs;
      for (int rep = 0; rep < 6; ++rep) {
        tensor t = source.clone();
        barrier(comm);
        const auto start = std::chrono::steady_clock::now();
        tensor moved = to(std::move(t), one(to_));
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (rep > 0) runs.push_back(seconds);
      }
      std::sort(runs.begin(), runs.end());
      const double bytes = static_cast<double>(rows * cols * sizeof(float));
      samples.push_back({sbp::axis_step_cost(from, to_, p, bytes), runs[runs.size() / 2]});
    }
  }
  std::vector<double> seconds;
  for (const link_sample& k : samples) seconds.push_back(k.seconds);
  allreduce(comm, std::span<double>(seconds), reduce_op::max);
  for (std::size_t k = 0; k < samples.size(); ++k) samples[k].seconds = seconds[k];
  return samples;
}
}  // namespace

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
  // Links: fitted to the SBP layer's boxings (header); one rank has no link to time.
  const cost_params& m = machine_of(comm);
  c.intra = {m.alpha, 1.0 / m.beta};
  if (comm.size() > 1) {
    const std::vector<link_sample> samples = boxing_samples(comm);  // collective: every rank takes part
    try {
      c.intra = fit_link(samples, 1.0 / c.memory_bandwidth);
    } catch (const usage_error&) {
      // no positive fit (in-process ranks: a boxing is a memcpy, faster than the reduction term): keep the
      // ping-pong; every rank holds the same samples, so every rank takes this branch alike
    }
  }
  c.inter = c.intra;
  c.kernel_latency = 1e-6;
  c.overlap = false;
  // The compressors: every rank keeps the slowest rank's seconds per byte.
  const compression_rates local = measure_compression();
  std::vector<double> per_byte{1 / local.minmax_encode, 1 / local.minmax_decode, 1 / local.onebit_encode,
                               1 / local.onebit_decode, 1 / local.adam_update};
  allreduce(comm, std::span<double>(per_byte), reduce_op::max);
  c.compression = {1 / per_byte[0], 1 / per_byte[1], 1 / per_byte[2], 1 / per_byte[3], 1 / per_byte[4]};
  return c;
}

}  // namespace flexpar::search
