// bench/flexpar_relax_bench.cpp — one step of every relaxation (BAGUA) on a model-sized gradient,
// next to MPICH's fp32 MPI_Allreduce of the same bytes measured in the same run.
//
// The model is synthetic: `--size` bytes of f32 parameters in a few tensors of uneven sizes (like a
// network's layers), gradients drawn once per rank from a seeded normal distribution. A step is
// algorithm::step() with SGD (lr 1e-4; onebit_adam and qadam apply their own Adam). Every timed step
// starts after a barrier; its time is the slowest rank's; the table shows the median (and mean) over
// `--iters` steps and the payload bytes each rank handed to the transport per step (traffic_so_far).
// For MPI_Allreduce it also shows the bus bandwidth, busbw = size / time * 2 (p - 1) / p, as a
// fraction of `--line-gbit` (the rate scripts/fakehosts shaped each link to).
//
//   scripts/fakehosts -n 2 -r 1gbit -- build/bench/flexpar_relax_bench --line-gbit 1
//   mpiexec -n 2 build/bench/flexpar_relax_bench --size 4M          # unthrottled, one machine
#include <mpi.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/relax/registry.hpp>

#include "bench_cli.hpp"

namespace {

struct row {
  std::string name;
  double median_ms = 0, mean_ms = 0, bytes_per_step = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

/// Times `step` `iters` times (after `warmup` untimed calls): barrier, step, slowest rank's time.
template <class Step>
std::vector<double> time_steps(int warmup, int iters, Step&& step) {
  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    step();
    double mine = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(), slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    ms.push_back(slowest);
  }
  return ms;
}

/// A synthetic model of `bytes` f32 values in tensors of uneven sizes (shares 40/25/15/10/6/3/1 %).
struct synthetic_model {
  std::vector<std::vector<float>> weights, grads;
  std::vector<flexpar::relax::parameter> params;

  synthetic_model(std::size_t bytes, int rank, std::uint64_t seed) {
    const std::size_t n = bytes / sizeof(float);
    const double share[] = {0.40, 0.25, 0.15, 0.10, 0.06, 0.03};
    std::vector<std::size_t> sizes;
    std::size_t used = 0;
    for (double s : share) {
      sizes.push_back(static_cast<std::size_t>(static_cast<double>(n) * s));
      used += sizes.back();
    }
    sizes.push_back(n - used);  // the rest (~1 %)
    std::mt19937_64 rng(seed * 7919 + static_cast<std::uint64_t>(rank));
    std::normal_distribution<float> dist(0.0f, 1e-2f);
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      weights.emplace_back(sizes[t]);
      grads.emplace_back(sizes[t]);
      for (float& w : weights.back()) w = dist(rng);
      for (float& g : grads.back()) g = dist(rng);
    }
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      std::string name = "layer";
      name.append(std::to_string(t));
      params.push_back({name, weights[t], grads[t]});
    }
  }
};

int run(int argc, char** argv) {
  CLI::App app{"flexpar_relax_bench: step time and bytes of every relaxation next to MPI_Allreduce"};
  std::string size_text = "25M";
  int iters = 10, warmup = 2;
  double line_gbit = 0;
  std::vector<std::string> algorithms;
  std::string peers = "shift_one";
  int interval = 4;
  app.add_option("-s,--size", size_text, "gradient bytes (K, M, G = powers of 1024)")->capture_default_str();
  app.add_option("-n,--iters", iters, "timed steps per algorithm")->capture_default_str();
  app.add_option("-w,--warmup", warmup, "untimed steps first")->capture_default_str();
  app.add_option("--line-gbit", line_gbit, "each link's rate in Gbit/s (0: unknown, no % column)")
      ->capture_default_str();
  app.add_option("--peers", peers, "decentralized peers")->capture_default_str();
  app.add_option("--interval", interval, "local_sgd's interval")->capture_default_str();
  app.add_option("-a,--algorithms", algorithms, "relaxations to run (default: all)");
  app.allow_windows_style_options(false);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::size_t bytes = flexpar::bench::parse_size(size_text);
  if (algorithms.empty())
    for (std::string_view n : flexpar::relax::algorithm_names()) algorithms.emplace_back(n);

  auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, flexpar::config::from_environment(),
                                              flexpar::thread_need::multiple);
  const int rank = comm.rank(), p = comm.size();
  std::vector<row> rows;

  {  // the peer: MPICH's fp32 allreduce of the same bytes
    std::vector<float> buf(bytes / sizeof(float), 1.0f);
    const auto ms = time_steps(warmup, iters, [&] {
      FLEXPAR_CHECK_MPI(
          MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    });
    rows.push_back({"MPI_Allreduce (fp32)", median(ms), mean(ms), 2.0 * (p - 1) / p * static_cast<double>(bytes)});
  }

  for (const std::string& name : algorithms) {
    synthetic_model model(bytes, rank, 1);
    flexpar::relax::options o;
    o.peers = peers;
    if (name == "local_sgd") o.interval = interval;
    o.warmup_steps = 0;  // onebit_adam, qadam: time the compressed stage
    o.adam.epsilon = 1e-4f;
    flexpar::relax::sgd opt({.learning_rate = 1e-4f});
    auto algo = flexpar::relax::make(name, comm, o);
    algo->start(model.params);
    for (int i = 0; i < warmup; ++i) algo->step(model.params, opt);
    const std::uint64_t before = algo->traffic_so_far().bytes_sent;
    const auto ms = time_steps(0, iters, [&] { algo->step(model.params, opt); });
    const std::uint64_t after = algo->traffic_so_far().bytes_sent;
    algo->finish(model.params);
    double sent = static_cast<double>(after - before) / iters, sent_sum = 0;
    MPI_Allreduce(&sent, &sent_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    std::string label = name;
    if (name == "decentralized") label.append(" (").append(peers).append(")");
    if (name == "local_sgd") label.append(" (k=").append(std::to_string(interval)).append(")");
    rows.push_back({label, median(ms), mean(ms), sent_sum / p});
  }

  if (rank == 0) {
    const double mib = static_cast<double>(bytes) / (1 << 20);
    std::printf("# flexpar_relax_bench: %.1f MiB f32 gradient, %d ranks, %d timed steps (median of the slowest rank)\n",
                mib, p, iters);
    const row& peer = rows.front();
    const double busbw = static_cast<double>(bytes) / (peer.median_ms / 1e3) * 2.0 * (p - 1) / p;  // bytes/s
    if (line_gbit > 0)
      std::printf("# MPI_Allreduce busbw %.1f MB/s = %.1f %% of the %.3g Gbit/s line rate\n", busbw / 1e6,
                  100.0 * busbw * 8 / (line_gbit * 1e9), line_gbit);
    else
      std::printf("# MPI_Allreduce busbw %.1f MB/s\n", busbw / 1e6);
    std::printf("%-34s %12s %12s %14s %10s\n", "algorithm", "median ms", "mean ms", "MB sent/rank", "speedup");
    for (const row& r : rows)
      std::printf("%-34s %12.2f %12.2f %14.2f %9.2fx\n", r.name.c_str(), r.median_ms, r.mean_ms, r.bytes_per_step / 1e6,
                  peer.median_ms / r.median_ms);
    std::printf("relax bench done: %zu rows\n", rows.size());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int status = 0;
  try {
    status = run(argc, argv);
  } catch (const std::exception& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "flexpar_relax_bench: rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
