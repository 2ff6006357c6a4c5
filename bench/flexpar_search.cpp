// flexpar_search — FlexFlow-style strategy search for a reference model (or a graph JSON) on a cluster
// (a preset or a JSON spec): prints the strategy per op in SBP notation and the predicted speedup over
// data parallelism; exports / imports strategies as JSON. `--bench` prints the tables of doc/search.md.
//
//   flexpar_search --model cnn --cluster 16-4-slow-inter [--iterations 20000] [--seed 1] [--export s.json]
//   flexpar_search --model transformer --layers 16 --cluster 64-8 --seconds 5
//   flexpar_search --bench
//   mpiexec -n 2 flexpar_search --run [--batch 256]   # real CPU-rank steps of MLP strategies vs the simulator
//   mpiexec -n 2 flexpar_search --model cnn_small --run [--side 16 --channels 16]   # the same for the small CNN
//   mpiexec -n 2 flexpar_search --run --gpu   # the same steps with every tensor on the GPU (CUDA builds)
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/search/execute.hpp>
#include <flexpar/search/mcmc.hpp>
#include <flexpar/search/profile.hpp>
#include <flexpar/version.hpp>
#if FLEXPAR_HAVE_CUDA
#include <optional>

#include <flexpar/cuda/sbp.hpp>
#include <flexpar/cuda/search.hpp>
#endif

namespace {

using namespace flexpar::search;
using clock_type = std::chrono::steady_clock;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw flexpar::usage_error(std::string("cannot read ").append(path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct model_options {
  std::string model = "cnn";
  std::size_t batch = 0;  // 0: the model's default
  std::size_t layers = 16;
};

constexpr const char* model_names = "mlp, cnn, cnn_small, transformer, dlrm";

graph build_model(const model_options& m) {
  auto batch_or = [&](std::size_t b) { return m.batch ? m.batch : b; };
  if (m.model == "mlp") return reference::mlp(batch_or(256), {1024, 4096, 4096, 1024});
  if (m.model == "cnn") return reference::cnn(batch_or(1024));
  if (m.model == "cnn_small") return reference::cnn_small(batch_or(32), 16, 16);
  if (m.model == "transformer") return reference::transformer(m.layers, batch_or(32), 512, 1024);
  if (m.model == "dlrm") return reference::dlrm(batch_or(4096), 8, 1000000);
  if (!std::ifstream(m.model))
    throw flexpar::usage_error("--model " + m.model + ": not a model (" + model_names +
                               ") and not a graph JSON file that can be read");
  return graph_from_json(read_file(m.model));
}

cluster build_cluster(const std::string& spec) {
  std::string presets;
  for (const std::string& name : preset_names()) {
    if (name == spec) return preset(spec);
    presets.append(presets.empty() ? "" : ", ").append(name);
  }
  if (!std::ifstream(spec))
    throw flexpar::usage_error("--cluster " + spec + ": not a preset (" + presets +
                               ") and not a cluster JSON file that can be read");
  return cluster_from_json(read_file(spec));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void print_strategy(simulator& sim, const strategy& s) {
  sim.simulate(s);
  const graph& g = sim.model();
  std::printf("%-18s %-11s %-22s %-40s %10s %10s %s\n", "op", "kind", "config", "SBP (input, weight) -> output",
              "fwd us", "grad AR us", "allreduce");
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const op_times t = sim.times_of(i);
    std::printf("%-18s %-11s %-22s %-40s %10.1f %10.1f %s\n", g.ops[i].name.c_str(),
                std::string(name_of(g.ops[i].kind)).c_str(), to_string(s[i]).c_str(), describe(g.ops[i], s[i]).c_str(),
                t.forward * 1e6, t.gradient_allreduce * 1e6, std::string(name_of(t.algorithm)).c_str());
  }
}

search_result search(simulator& sim, std::uint64_t seed, const search_options& o, bool verbose) {
  mcmc_search s(sim, seed, o);
  if (verbose)
    s.on_progress([](const search_progress& p) {
      std::printf("  [%7zu proposals, %6.2f s] current %.3f ms, best %.3f ms (data parallel %.3f ms)\n", p.iteration,
                  p.elapsed, p.current * 1e3, p.best * 1e3, p.data_parallel * 1e3);
    });
  return s.run();
}

// ---- --bench: the tables of doc/search.md --------------------------------------------------------

void bench_delta_vs_full(const graph& g, const cluster& cl, std::size_t proposals) {
  std::mt19937_64 rng(11);
  std::vector<std::vector<soap_config>> space;
  for (const op& o : g.ops) space.push_back(candidates(o, cl));
  strategy s = data_parallel(g, cl);
  simulator delta(g, cl), full(g, cl);
  delta.simulate(s);
  std::vector<double> t_delta, t_full;
  std::size_t mismatches = 0;
  for (std::size_t k = 0; k < proposals; ++k) {
    const std::size_t i = rng() % g.ops.size();
    const soap_config c = space[i][rng() % space[i].size()];
    s[i] = c;
    auto t0 = clock_type::now();
    const double a = delta.change(i, c);
    auto t1 = clock_type::now();
    const double b = full.simulate(s);
    auto t2 = clock_type::now();
    if (a != b) ++mismatches;
    t_delta.push_back(std::chrono::duration<double>(t1 - t0).count());
    t_full.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  const double md = median(t_delta), mf = median(t_full);
  std::printf("| %s, %zu ops, %zu tasks | %d | %zu | %.1f | %.1f | %.1fx | %zu |\n", g.name.c_str(), g.ops.size(),
              delta.task_count(), cl.devices(), proposals, md * 1e6, mf * 1e6, mf / md, mismatches);
}

void bench_models(const cluster& cl, const char* cluster_name, std::size_t iterations) {
  model_options m;
  for (const char* name : {"mlp", "cnn", "transformer", "dlrm"}) {
    m.model = name;
    m.layers = 4;
    const graph g = build_model(m);
    simulator sim(g, cl);
    search_options o;
    o.iterations = iterations;
    const search_result r = search(sim, 1, o, false);
    std::printf("| %s | %s | %.3f | %.3f (%.2fx) | %.3f | **%.2fx** | %s | %.2f |\n", name, cluster_name,
                r.data_parallel_time * 1e3, r.expert_time * 1e3, r.data_parallel_time / r.expert_time,
                r.best_time * 1e3, r.data_parallel_time / r.best_time, r.beat_data_parallel ? "search" : "DP",
                r.seconds);
  }
}

int run_bench(std::size_t iterations) {
  std::printf("## Delta vs full simulation, per proposal (median over 400 random proposals; same answers)\n\n");
  std::printf(
      "| graph | devices | proposals | delta us | full us | full / delta | delta != full "
      "|\n|---|---|---|---|---|---|---|\n");
  model_options tm;
  tm.model = "transformer";
  tm.layers = 16;
  const graph big = build_model(tm);
  bench_delta_vs_full(big, preset("64-8"), 400);
  bench_delta_vs_full(build_model({"cnn", 0, 16}), preset("16-4-slow-inter"), 400);
  bench_delta_vs_full(build_model({"dlrm", 0, 16}), preset("64-8"), 400);

  std::printf("\n## Search time: %zu-op Transformer on 64 simulated devices (8 nodes x 8)\n\n", big.ops.size());
  std::printf("| proposals | seconds | proposals / s | DP ms | found ms | speedup |\n|---|---|---|---|---|---|\n");
  for (std::size_t its : {std::size_t{5000}, iterations}) {
    simulator sim(big, preset("64-8"));
    search_options o;
    o.iterations = its;
    const search_result r = search(sim, 1, o, false);
    std::printf("| %zu | %.2f | %.0f | %.3f | %.3f | %.2fx |\n", r.proposals, r.seconds,
                static_cast<double>(r.proposals) / r.seconds, r.data_parallel_time * 1e3, r.best_time * 1e3,
                r.data_parallel_time / r.best_time);
  }

  std::printf("\n## Found strategy vs data parallelism and the expert (simulated step time, %zu proposals, seed 1)\n\n",
              iterations);
  std::printf(
      "| model | cluster | DP ms | expert ms (vs DP) | found ms | found vs DP | returned | search s |\n"
      "|---|---|---|---|---|---|---|---|\n");
  bench_models(preset("16-4-slow-inter"), "16 dev / 4 nodes, inter 10x slower", iterations);
  bench_models(preset("16-4-nvlink"), "16 dev / 4 nodes, NVLink-class, inter 10x slower", iterations);
  bench_models(preset("64-8"), "64 dev / 8 nodes, inter 10x slower", iterations);
  bench_models(preset("8-1"), "8 dev / 1 node", iterations);
  return 0;
}

// ---- --run: the MLP's or the small CNN's strategies executed on CPU ranks next to their simulated times ----

/// Values in {-1/64, 0, 1/64} (no short period): every product and sum of the runs is exact in float.
std::vector<float> small_values(std::size_t n, std::size_t salt) {
  std::mt19937 rng(static_cast<std::uint32_t>(salt));
  std::vector<float> v(n);
  for (float& e : v) e = static_cast<float>(static_cast<int>(rng() % 3) - 1) / 64.0f;
  return v;
}

std::size_t weight_elements(const op& o) {
  if (o.kind == op_kind::linear) return o.in_channels * o.out_channels;
  if (o.kind == op_kind::conv2d) return o.out_channels * o.in_channels * o.kernel * o.kernel;
  return 0;
}

struct run_options {
  std::string model = "mlp";  // mlp or cnn_small
  std::size_t batch = 0, width = 256, side = 16, channels = 16, steps = 20, iterations = 2000;
  std::uint64_t seed = 1;
  bool gpu = false;  // every tensor on the GPU (node-local rank modulo the devices)
};

int run_on_ranks(int argc, char** argv, const run_options& ro) {
  if (ro.model != "mlp" && ro.model != "cnn_small")
    throw flexpar::usage_error(std::string("--run: runs --model mlp or cnn_small, not ").append(ro.model));
  const bool cnn = ro.model == "cnn_small";
  const std::size_t batch = ro.batch ? ro.batch : (cnn ? 32 : 64);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int code = 0;
  try {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    const int p = comm.size();
    const bool root = comm.rank() == 0;
#if FLEXPAR_HAVE_CUDA
    std::optional<flexpar::cuda::device_placement<1>> gpu;
    if (ro.gpu) {
      if (flexpar::cuda::device_count() == 0) {
        if (root) std::fprintf(stderr, "flexpar_search --gpu: no CUDA device is present\n");
        MPI_Finalize();
        return 77;  // ctest's skip code
      }
      gpu.emplace(flexpar::sbp::placement<1>(comm, {p}), comm.topology().local_rank() % flexpar::cuda::device_count());
    }
#else
    if (ro.gpu) throw flexpar::usage_error("--gpu: this flexpar was built without CUDA (FLEXPAR_WITH_CUDA)");
#endif
    const cluster cl = measure_cluster(comm, 512);
    const std::size_t width = ro.width;
    const graph g = cnn ? reference::cnn_small(batch, ro.side, ro.channels)
                        : reference::mlp(batch, {width, 4 * width, 4 * width, width});
    std::vector<std::vector<float>> w;
    for (std::size_t i = 0; i < g.ops.size(); ++i) w.push_back(small_values(weight_elements(g.ops[i]), i));
    const op& first = g.ops.front();
    const std::vector<float> x = small_values(batch * first.in_channels * (cnn ? first.spatial : 1), 7);
    auto runnable = [&g, p](std::size_t i, const soap_config& c) {  // 1-D meshes of all ranks; pools keep planes
      return c.devices() == p && c.first_device == 0 && (c.sample > 1) + (c.attribute > 1) + (c.parameter > 1) <= 1 &&
             !(g.ops[i].function == elementwise_fn::max_pool && c.attribute > 1);
    };
    std::vector<std::vector<soap_config>> space;  // what the search may propose
    for (std::size_t i = 0; i < g.ops.size(); ++i) {
      space.emplace_back();
      for (const soap_config& c : candidates(g.ops[i], cl))
        if (runnable(i, c)) space.back().push_back(c);
    }
    const kernel_profile profile = kernel_profile::measure(comm, g, space);
    simulator flop_model(g, cl);
    simulator sim(g, cl, profile);  // linear op times from the measured shard GEMMs (conv2d: the FLOP model)
    search_options o;
    o.iterations = ro.iterations;
    o.allow = runnable;
    const search_result found = mcmc_search(sim, ro.seed, o).run();
    std::vector<std::pair<std::string, strategy>> cases{{"data parallel", data_parallel(g, cl)}};
    if (cnn) {
      // every op split over channels where it can be (conv2d / linear output channels, relu / pool planes)
      strategy channels;
      for (const op& op_i : g.ops)
        channels.push_back(static_cast<std::size_t>(p) <= op_i.out_channels ? soap_config{1, 1, p, 0}
                                                                            : soap_config{p, 1, 1, 0});
      cases.emplace_back("expert", expert(g, cl));
      cases.emplace_back("channel parallel", channels);
    } else {
      // hand-made comparison points: Megatron (column, relu, row, relu, column) and all column parallel
      strategy megatron, column;
      for (std::size_t i = 0; i < g.ops.size(); ++i) {
        const bool linear = g.ops[i].kind == op_kind::linear;
        const std::size_t layer = i / 2;
        megatron.push_back(linear && layer % 2 == 1 ? soap_config{1, p, 1, 0} : soap_config{1, 1, p, 0});
        column.push_back(soap_config{1, 1, p, 0});
      }
      if (p > 1) {  // relus after a row-parallel layer take its output by batch
        for (std::size_t i = 1; i < g.ops.size(); i += 2)
          megatron[i] = megatron[i - 1].attribute > 1 ? soap_config{p, 1, 1, 0} : megatron[i];
      }
      cases.emplace_back("column parallel", column);
      cases.emplace_back("megatron", megatron);
    }
    cases.emplace_back("searched", found.best);
    const float lr = 1.0f / 1024;
    const execution_result serial = execute_serial(g, x, w, lr);
    auto execute = [&](const strategy& s, std::size_t steps) {
#if FLEXPAR_HAVE_CUDA
      if (gpu) return flexpar::cuda::execute_steps(*gpu, g, s, x, w, lr, steps);
#endif
      return execute_steps(comm, g, s, x, w, lr, steps);
    };
    if (root) {
      std::printf(
          "cluster measured on this machine: %d ranks, %.2f GFLOP/s per rank, memory %.1f GB/s, link alpha %.2f us, "
          "%.2f GB/s\n",
          p, cl.flops / 1e9, cl.memory_bandwidth / 1e9, cl.intra.latency * 1e6, cl.intra.bandwidth / 1e9);
      double flops = 0;
      for (const op& op_i : g.ops) flops += op_i.forward_flops;
      std::printf("%s: %zu ops, batch %zu, %.1f MFLOP per forward pass\n", g.name.c_str(), g.ops.size(), batch,
                  flops / 1e6);
      if (ro.gpu)
        std::printf(
            "executed on the GPU: every tensor in device memory; the simulated columns are the model "
            "calibrated on the CPU ranks above\n");
      std::printf(
          "| strategy | SBP per op with weights | simulated ms (FLOP model) | simulated ms (measured kernels) | "
          "measured ms (median of %zu rounds of 5 steps) | error (kernels) | max |y - serial| |\n"
          "|---|---|---|---|---|---|---|\n",
          std::max<std::size_t>(1, ro.steps / 5));
    }
    // Interleaved: each round runs a few steps of every strategy (from the same initial weights; the median
    // of the few skips the first step's one-time costs on a fresh placement), so load from other processes
    // falls on all strategies alike; per strategy the median over the rounds. The output of one step is
    // compared with the serial model's first.
    constexpr std::size_t per_round = 5;
    std::vector<std::vector<double>> seconds(cases.size());
    std::vector<double> diff(cases.size(), 0);
    for (std::size_t k = 0; k < cases.size(); ++k) {
      if (!executable(g, cases[k].second, p)) continue;
      const execution_result once = execute(cases[k].second, 1);
      for (std::size_t e = 0; e < once.output.size(); ++e)
        diff[k] = std::max(diff[k], static_cast<double>(std::abs(once.output[e] - serial.output[e])));
    }
    for (std::size_t round = 0; round < std::max<std::size_t>(1, ro.steps / per_round); ++round)
      for (std::size_t k = 0; k < cases.size(); ++k)
        if (executable(g, cases[k].second, p))
          seconds[k].push_back(execute(cases[k].second, per_round).median_step_seconds);
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const auto& [name, s] = cases[k];
      if (seconds[k].empty()) {
        if (root) std::printf("| %s | (not executable on %d ranks) | | | | | |\n", name.c_str(), p);
        continue;
      }
      const double simulated = sim.simulate(s), by_flops = flop_model.simulate(s), measured = median(seconds[k]);
      std::string sbps;
      for (std::size_t i = 0; i < g.ops.size(); ++i)
        if (g.ops[i].param_bytes > 0) sbps.append(sbps.empty() ? "" : "; ").append(describe(g.ops[i], s[i]));
      if (root)
        std::printf("| %s | %s | %.3f | %.3f | %.3f | %+.0f%% | %g |\n", name.c_str(), sbps.c_str(), by_flops * 1e3,
                    simulated * 1e3, measured * 1e3, 100.0 * (simulated - measured) / measured, diff[k]);
      if (diff[k] != 0) code = 1;
    }
  } catch (const flexpar::usage_error& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::fprintf(stderr, "flexpar_search: %s\n", e.what());  // the same on every rank: once
    code = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flexpar_search: %s\n", e.what());  // names its rank
    code = 2;
  }
  MPI_Finalize();
  return code;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flexpar_search: FlexFlow-style SOAP strategy search on the flexpar simulator"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  model_options m;
  std::string cluster_spec = "16-4-slow-inter", export_path, import_path;
  search_options o;
  std::uint64_t seed = 1;
  bool quiet = false, bench = false, show_expert = false, run = false;
  run_options ro;
  app.add_option("--model", m.model, std::string(model_names) + ", or a graph JSON file")->capture_default_str();
  app.add_option("--batch", m.batch, "global batch (0: the model's default)");
  app.add_option("--layers", m.layers, "Transformer blocks")->capture_default_str();
  app.add_option("--cluster", cluster_spec, "a preset (16-4-slow-inter, 64-8, 8-1, 2-1-cpu) or a cluster JSON file")
      ->capture_default_str();
  app.add_option("--iterations", o.iterations,
                 "MCMC steps in all, divided evenly among the chains (one per starting strategy: data parallel, "
                 "the expert, --random-starts random ones); a step that draws an op's current config is skipped, so "
                 "at most this many proposals are evaluated (0: use --seconds)")
      ->capture_default_str();
  app.add_option("--seconds", o.seconds, "wall-clock budget (0: use --iterations)");
  app.add_option("--seed", seed, "RNG seed")->capture_default_str();
  app.add_option("--random-starts", o.random_starts, "random initial strategies")->capture_default_str();
  app.add_option("--export", export_path, "write the strategy found as JSON");
  app.add_option("--import", import_path, "simulate this strategy JSON instead of searching");
  app.add_flag("--quiet", quiet, "no progress lines");
  std::string sync = "exact";
  app.add_option("--sync", sync, "gradient synchronizations the simulator may choose: exact, compressed, relaxed")
      ->capture_default_str();
  app.add_flag("--expert", show_expert, "simulate and print the expert strategy instead of searching");
  app.add_flag("--bench", bench, "print the benchmark tables of doc/search.md");
  app.add_flag("--run", run,
               "under mpiexec: execute the strategies of --model mlp (default here) or cnn_small on the ranks, next "
               "to the simulated times");
  app.add_flag("--gpu", ro.gpu,
               "--run: every tensor on the GPU (node-local rank modulo the devices; CUDA builds; exit 77 without a "
               "device)");
  app.add_option("--steps", ro.steps, "--run: training steps per strategy")->capture_default_str();
  app.add_option("--width", ro.width, "--run: MLP width (layers width -> 4 width -> 4 width -> width)")
      ->capture_default_str();
  app.add_option("--side", ro.side, "cnn_small: input side (a multiple of 4)")->capture_default_str();
  app.add_option("--channels", ro.channels, "cnn_small: conv1's output channels (conv2 has twice as many)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    if (bench) return run_bench(o.iterations);
    if (run) {
      ro.model = app.get_option("--model")->count() ? m.model : "mlp";
      ro.batch = m.batch;
      ro.seed = seed;
      ro.iterations = o.iterations;
      return run_on_ranks(argc, argv, ro);
    }
    const graph g = build_model(m);
    const cluster cl = build_cluster(cluster_spec);
    simulator sim(g, cl);
    sim.set_policy(sync_policy_from(sync));
    std::printf("%s: %zu ops, %zu tasks; cluster %d nodes x %d devices\n", g.name.c_str(), g.ops.size(),
                sim.task_count(), cl.nodes, cl.devices_per_node);
    const double dp = sim.simulate(data_parallel(g, cl));
    if (!import_path.empty() || show_expert) {
      const strategy s = show_expert ? expert(g, cl) : strategy_from_json(read_file(import_path), g, cl);
      print_strategy(sim, s);
      std::printf("%s strategy: %.3f ms per step; data parallel %.3f ms; predicted speedup over DP %.2fx\n",
                  show_expert ? "expert" : "imported", sim.step_time() * 1e3, dp * 1e3, dp / sim.step_time());
      return 0;
    }
    o.report_every = quiet ? 0 : std::max<std::size_t>(1, o.iterations / 10);
    if (o.iterations == 0) o.report_every = quiet ? 0 : 2000;
    const search_result r = search(sim, seed, o, !quiet);
    print_strategy(sim, r.best);
    std::printf("data parallel %.3f ms, expert %.3f ms (%.2fx), found %.3f ms: predicted speedup over DP %.2fx%s\n",
                r.data_parallel_time * 1e3, r.expert_time * 1e3, r.data_parallel_time / r.expert_time,
                r.best_time * 1e3, r.data_parallel_time / r.best_time,
                r.beat_data_parallel ? "" : " (returned data parallelism)");
    const std::string budget =
        o.iterations > 0 ? "--iterations " + std::to_string(o.iterations) + ": " + std::to_string(r.chains) +
                               " chains of " + std::to_string(o.iterations / std::max<std::size_t>(1, r.chains))
                         : "--seconds " + std::to_string(o.seconds) + " over " + std::to_string(r.chains) + " chains";
    std::printf(
        "search: %zu steps (%s), %zu proposals evaluated (the other steps drew the op's current config), %zu "
        "accepted, in %.2f s, seed %llu\n",
        r.steps, budget.c_str(), r.proposals, r.accepted, r.seconds, static_cast<unsigned long long>(seed));
    if (!export_path.empty()) {
      std::ofstream out(export_path);
      out << to_json(g, r.best) << "\n";
      if (!out) throw flexpar::usage_error(std::string("cannot write ").append(export_path));
      std::printf("strategy written to %s\n", export_path.c_str());
    }
  } catch (const flexpar::error& e) {
    std::fprintf(stderr, "flexpar_search: %s\n", e.what());
    return 2;
  }
  return 0;
}
