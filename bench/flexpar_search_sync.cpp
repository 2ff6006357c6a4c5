// flexpar_search_sync — the simulator chooses the gradient synchronization per network (doc/search.md,
// "Choosing the communication relaxation"): exact allreduce (ring, hierarchical) or BAGUA's relaxations
// (bytegrad, 1-bit Adam, decentralized shift_one, low precision decentralized), priced by bytes on the
// wire plus the compressors' throughput measured here (the fake-host rows are predictions to set next
// to doc/relaxations.md's measurements). Each search's result is verified: its strategy simulated
// again from scratch gives the time the search reported, no worse than data parallelism and better
// exactly when the search says it beat data parallelism, and the data parallel step never gets slower
// as the policy allows more algorithms; exit status 1 otherwise.
//
//   flexpar_search_sync [--iterations 2000]
//
// Prints: (1) the compressors' throughput on this machine; (2) per network, a 25 MiB gradient over every
// device: each algorithm's seconds and the choice under each policy; (3) the reference models' data
// parallel and searched step times under each policy; (4) the fake-host setups of doc/relaxations.md
// (25 MiB, 2 and 4 hosts at 1 Gbit/s): the predicted step of each algorithm and its ratio to the ring.
#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/search/mcmc.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace flexpar::search;
using flexpar::algorithm;

constexpr algorithm algorithms[] = {algorithm::ring,          algorithm::hierarchical,
                                    algorithm::bytegrad,      algorithm::onebit_adam,
                                    algorithm::decentralized, algorithm::low_precision_decentralized};
constexpr sync_policy policies[] = {sync_policy::exact, sync_policy::compressed, sync_policy::relaxed};
constexpr double gradient_bytes = 25.0 * 1024 * 1024;  // doc/relaxations.md's synthetic model
constexpr double gbit = 125e6;                         // 1 Gbit/s in bytes per second

struct network {
  std::string name;
  cluster c;
};

/// CPU hosts of one device each on a shaped link (doc/relaxations.md's fake hosts); the compressors and the
/// memory bandwidth are this machine's.
cluster cpu_hosts(int hosts, double bandwidth, const cluster& here) {
  cluster c = here;
  c.nodes = hosts;
  c.devices_per_node = 1;
  c.inter = {100e-6, bandwidth};  // TCP over veth; latency not shaped (negligible next to 25 MiB)
  c.intra = c.inter;
  return c;
}

sync_group whole(const cluster& c) { return {c.devices(), c.nodes, c.devices_per_node}; }

/// Results found wrong (each printed with what was expected); the exit status is 1 unless 0.
int failures = 0;

void fail(const std::string& what) {
  std::fprintf(stderr, "flexpar_search_sync: %s\n", what.c_str());
  ++failures;
}

void choice_table(const std::vector<network>& nets) {
  std::printf("\n#### 25 MiB gradient over every device: seconds per algorithm, choice per policy\n\n| network |");
  for (algorithm a : algorithms) std::printf(" %s ms |", std::string(name_of(a)).c_str());
  std::printf(" exact | compressed | relaxed |\n|---|");
  for (std::size_t k = 0; k < std::size(algorithms) + 3; ++k) std::printf("---|");
  std::printf("\n");
  for (const network& n : nets) {
    std::printf("| %s |", n.name.c_str());
    for (algorithm a : algorithms) {
      const double t = sync_seconds(a, whole(n.c), gradient_bytes, n.c);
      if (std::isinf(t))
        std::printf(" — |");
      else
        std::printf(" %.2f |", t * 1e3);
    }
    for (sync_policy p : policies) {
      algorithm best = algorithm::ring;
      double best_t = 1e300;
      for (algorithm a : algorithms) {
        const double t = sync_seconds(a, whole(n.c), gradient_bytes, n.c);
        if (policy_of(a) <= p && t < best_t) {
          best_t = t;
          best = a;
        }
      }
      std::printf(" **%s** |", std::string(name_of(best)).c_str());
    }
    std::printf("\n");
  }
}

void model_table(const std::vector<network>& nets, std::size_t iterations) {
  std::printf(
      "\n#### Reference models: simulated step per policy (DP = data parallel; found = MCMC, %zu proposals, "
      "seed 1)\n\n",
      iterations);
  std::printf(
      "| model | network | DP exact ms | DP compressed ms | DP relaxed ms | found exact ms | found compressed "
      "ms | found relaxed ms | syncs chosen (found, relaxed) |\n|---|---|---|---|---|---|---|---|---|\n");
  const std::vector<graph> models{reference::mlp(64, {256, 1024, 1024, 256}), reference::cnn(256),
                                  reference::transformer(2, 16, 64, 256)};
  for (const network& n : nets) {
    if (n.c.devices() < 4) continue;
    for (const graph& g : models) {
      double dp[3], found[3];
      std::string chosen;
      for (std::size_t k = 0; k < 3; ++k) {
        simulator sim(g, n.c);
        sim.set_policy(policies[k]);
        dp[k] = sim.simulate(data_parallel(g, n.c));
        search_options o;
        o.iterations = iterations;
        const search_result r = mcmc_search(sim, 1, o).run();
        found[k] = r.best_time;
        const std::string what = g.name + " on " + n.name + ", policy " + std::string(name_of(policies[k])) + ": ";
        simulator fresh(g, n.c);  // the returned strategy from scratch, not through the search's deltas
        fresh.set_policy(policies[k]);
        const double again = fresh.simulate(r.best);
        if (again != r.best_time)
          fail(what + "the search reported " + std::to_string(r.best_time) + " s, its strategy simulates to " +
               std::to_string(again) + " s");
        if (r.data_parallel_time != dp[k] || r.best_time > dp[k] || r.beat_data_parallel != (r.best_time < dp[k]))
          fail(what + "found " + std::to_string(r.best_time) + " s against data parallel " + std::to_string(dp[k]) +
               " s (the search's own figure " + std::to_string(r.data_parallel_time) + " s), reported " +
               (r.beat_data_parallel ? "beaten" : "not beaten"));
        if (k > 0 && dp[k] > dp[k - 1])
          fail(what + "data parallel takes " + std::to_string(dp[k]) + " s, more than the stricter policy's " +
               std::to_string(dp[k - 1]) + " s");
        if (k == 2) {
          sim.simulate(r.best);
          std::vector<std::pair<std::string, int>> counts;
          for (std::size_t i = 0; i < g.ops.size(); ++i) {
            const std::string a(name_of(sim.times_of(i).algorithm));
            if (a == "none") continue;
            bool seen = false;
            for (auto& [name, c] : counts)
              if (name == a) ++c, seen = true;
            if (!seen) counts.emplace_back(a, 1);
          }
          for (const auto& [name, c] : counts) chosen.append(name).append(" x").append(std::to_string(c)).append(" ");
        }
      }
      std::printf("| %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %s|\n", g.name.c_str(), n.name.c_str(),
                  dp[0] * 1e3, dp[1] * 1e3, dp[2] * 1e3, found[0] * 1e3, found[1] * 1e3, found[2] * 1e3,
                  chosen.c_str());
    }
  }
}

void fake_host_table(const cluster& here) {
  std::printf("\n#### doc/relaxations.md's fake hosts, 25 MiB f32 model: predicted step (sync + SGD update pass)\n\n");
  std::printf("| hosts | algorithm | predicted ms | predicted speedup vs ring |\n|---|---|---|---|\n");
  for (int hosts : {2, 4}) {
    const cluster c = cpu_hosts(hosts, gbit, here);
    const double update = c.kernel_latency + 4.0 * gradient_bytes / c.memory_bandwidth;  // as the simulator's
    const double ring = sync_seconds(algorithm::ring, whole(c), gradient_bytes, c) + update;
    for (algorithm a : algorithms) {
      const double t = sync_seconds(a, whole(c), gradient_bytes, c);
      if (std::isinf(t)) continue;
      std::printf("| %d @1 Gbit/s | %s | %.1f | %.2fx |\n", hosts, std::string(name_of(a)).c_str(), (t + update) * 1e3,
                  ring / (t + update));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t iterations = 2000;
  for (int k = 1; k + 1 < argc; ++k)
    if (std::strcmp(argv[k], "--iterations") == 0) iterations = std::strtoull(argv[k + 1], nullptr, 10);
  cluster here;
  flexpar::run_in_process(1, [&](flexpar::communicator& comm) { here = measure_cluster(comm); });
  std::printf(
      "this machine, one core: min-max uint8 encode %.2f GB/s, decode %.2f GB/s; 1-bit encode %.2f GB/s, "
      "decode %.2f GB/s; 1-bit Adam passes %.2f GB/s (f32 bytes); memory %.2f GB/s\n",
      here.compression.minmax_encode / 1e9, here.compression.minmax_decode / 1e9, here.compression.onebit_encode / 1e9,
      here.compression.onebit_decode / 1e9, here.compression.adam_update / 1e9, here.memory_bandwidth / 1e9);
  cluster gbit_inter = preset("16-4-slow-inter");
  gbit_inter.inter.bandwidth = gbit;
  const std::vector<network> nets{
      {"16 GPUs / 4 nodes, NVLink 100 GB/s, inter 10 GB/s", preset("16-4-nvlink")},
      {"16 GPUs / 4 nodes, PCIe 12 GB/s, inter 1.2 GB/s", preset("16-4-slow-inter")},
      {"16 GPUs / 4 nodes, PCIe 12 GB/s, inter 1 Gbit/s", gbit_inter},
      {"2 CPU hosts, unshaped (1.08 GB/s)", cpu_hosts(2, 1.08e9, here)},
      {"2 CPU hosts @1 Gbit/s", cpu_hosts(2, gbit, here)},
      {"4 CPU hosts @1 Gbit/s", cpu_hosts(4, gbit, here)},
  };
  choice_table(nets);
  model_table(nets, iterations);
  fake_host_table(here);
  std::printf("\n# verified: every search's result simulated again, %d wrong\n", failures);
  return failures == 0 ? 0 : 1;
}
