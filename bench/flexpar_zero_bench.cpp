// bench/flexpar_zero_bench.cpp — a training step of a synthetic model with sharded data parallelism
// (ZeRO-1/2/3, ZeRO-3 without prefetch, without the communication thread, with ZeRO++'s 8-bit weight
// gathers (qwZ), gradient reductions (qgZ) and both) next to data
// parallelism (the gradient_allreduce relaxation: one fused allreduce) measured in the same run.
//
// The model: `--size` bytes of f32 parameters in `--layers` tensors of uneven sizes, bucketed by
// `--bucket`. A step: forward reads every layer's weights `--work` times (a dot product per pass: the
// compute that prefetch hides communication behind), backward reads them again and writes each
// layer's gradient, marked ready as it is made; then Adam. Every timed step starts after a barrier and
// its time is the slowest rank's; the table shows medians over `--iters` steps, the bytes each rank
// held by the library's accounting (parameters + gradients + Adam state: after a step, and the most
// during one, peaks of parameters and gradients added), the peak RSS
// of each configuration (VmHWM after resetting it, the largest over ranks) and the wire bytes per step.
// The result check: after the same steps every ZeRO mode's parameters (full_parameters()) must equal
// data parallelism's within 1e-5 relative (they differ only in where the mean's rounding falls; the
// gradients, the same on every rank, also quantize exactly), else the mode is named and the exit
// status is 1. Under --only other than "data parallel" there is no reference and no check.
//
//   mpiexec.mpich -n 4 build/bench/flexpar_zero_bench --size 32M --iters 10
//   scripts/fakehosts -n 2 -r 1gbit --done 'flexpar_zero_bench: done' -- build/bench/flexpar_zero_bench
#include <mpi.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/relax/registry.hpp>
#include <flexpar/zero/sharded_data_parallel.hpp>

#include "bench_cli.hpp"
#include "bench_timing.hpp"

namespace {

/// Resets this process's peak RSS (Linux: "5" to clear_refs) so that the next read is this part's.
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

/// VmHWM in bytes, the largest over ranks.
double peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  double kib = 0, most = 0;
  while (status >> key)
    if (key == "VmHWM:") {
      status >> kib;
      break;
    }
  MPI_Allreduce(&kib, &most, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return most * 1024;
}

/// What the layers compute on their weights: `work` dot products with a fixed vector.
float compute(std::span<const float> w, int work) {
  float acc = 0;
  for (int k = 0; k < work; ++k)
    for (std::size_t i = 0; i < w.size(); ++i) acc += w[i] * static_cast<float>(i % 7) * 1e-3f;
  return acc;
}

/// `iters` calls of `step`, each after a barrier: this rank's milliseconds.
template <class Step>
std::vector<double> timed(int iters, Step&& step) {
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return ms;
}

struct row {
  std::string name;
  double step_ms = 0, held = 0, peak = 0, rss = 0, sent = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string size_text = "32M", bucket_text = "4M", only;
  int layers = 16, work = 2, iters = 10, warmup = 2;
  CLI::App app{"flexpar_zero_bench: a training step with ZeRO-1/2/3 next to data parallelism"};
  app.add_option("--size", size_text, "bytes of f32 parameters")->capture_default_str();
  app.add_option("--layers", layers, "parameter tensors (uneven sizes)")->capture_default_str();
  app.add_option("--bucket", bucket_text, "bucket bytes")->capture_default_str();
  app.add_option("--work", work, "passes over each layer's weights in forward (and in backward)")
      ->capture_default_str();
  app.add_option("--iters", iters, "timed steps")->capture_default_str();
  app.add_option("--only", only,
                 "run this mode alone (\"data parallel\", \"ZeRO-3 qwZ+qgZ\", ...): its peak RSS is then its own, "
                 "not raised by the heap earlier modes left");
  if (const auto done = flexpar::bench::parse_or_finalize(app, argc, argv, rank)) return *done;
  int status = 0;
  try {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, flexpar::config::from_environment(),
                                                                 flexpar::thread_need::multiple);
    const std::size_t total = flexpar::bench::parse_size(size_text) / sizeof(float);
    // uneven layers: sizes proportional to 1, 2, ..., layers
    std::vector<std::size_t> sizes;
    const std::size_t unit = 2 * total / static_cast<std::size_t>(layers * (layers + 1));
    for (int l = 0; l < layers; ++l)
      sizes.push_back(unit * static_cast<std::size_t>(l + 1) + static_cast<std::size_t>(l));
    std::vector<std::string> names;
    for (int l = 0; l < layers; ++l) names.push_back("layer" + std::to_string(l));
    std::vector<row> rows;
    volatile float sink = 0;
    std::vector<std::vector<float>> reference;  // data parallelism's parameters after its steps
    int wrong = 0;

    if (only.empty() || only == "data parallel") {  // full parameters, gradients and Adam state on every rank
      reset_peak_rss();
      std::vector<std::vector<float>> w(sizes.size()), g(sizes.size());
      std::vector<flexpar::relax::parameter> params;
      for (std::size_t l = 0; l < sizes.size(); ++l) {
        w[l].assign(sizes[l], 0.01f);
        g[l].assign(sizes[l], 0.0f);
        params.push_back({names[l], w[l], g[l]});
      }
      flexpar::relax::adam opt;
      auto dp = flexpar::relax::make("gradient_allreduce", comm);
      dp->start(params);
      auto step = [&] {
        for (std::size_t l = 0; l < sizes.size(); ++l) sink = sink + compute(w[l], work);
        for (std::size_t l = sizes.size(); l-- > 0;) {
          sink = sink + compute(w[l], work);
          std::fill(g[l].begin(), g[l].end(), 1e-3f);
        }
        dp->step(params, opt);
      };
      for (int i = 0; i < warmup; ++i) step();
      const std::uint64_t before = dp->traffic_so_far().bytes_sent;
      const std::vector<double> ms = timed(iters, step);
      std::size_t state = 0;
      for (std::size_t l = 0; l < sizes.size(); ++l)
        for (const auto& s : opt.state(l, sizes[l])) state += s.floats.size_bytes() + s.counters.size_bytes();
      reference = w;
      rows.push_back({"data parallel", flexpar::bench::median_of_slowest(ms),
                      static_cast<double>(2 * total * sizeof(float) + state),
                      static_cast<double>(2 * total * sizeof(float) + state), peak_rss_bytes(),
                      static_cast<double>(dp->traffic_so_far().bytes_sent - before) / iters});
    }

    struct config {
      const char* name;
      int stage;
      int prefetch;
      bool overlap;
      bool qw = false, qg = false;  // ZeRO++ qwZ, qgZ
    };
    for (const config c : {config{"ZeRO-1", 1, 1, true}, config{"ZeRO-2", 2, 1, true}, config{"ZeRO-3", 3, 1, true},
                           config{"ZeRO-3 no prefetch", 3, 0, true}, config{"ZeRO-3 no thread", 3, 0, false},
                           config{"ZeRO-3 qwZ", 3, 1, true, true, false}, config{"ZeRO-3 qgZ", 3, 1, true, false, true},
                           config{"ZeRO-3 qwZ+qgZ", 3, 1, true, true, true}}) {
      if (!only.empty() && only != c.name) continue;
      reset_peak_rss();
      flexpar::sbp::placement<1> mesh(comm, {comm.size()});
      flexpar::zero::sharded_data_parallel<1> model(mesh, {.stage = c.stage,
                                                           .bucket_bytes = flexpar::bench::parse_size(bucket_text),
                                                           .overlap = c.overlap,
                                                           .prefetch = c.prefetch,
                                                           .quantize_weights = c.qw,
                                                           .quantize_gradients = c.qg});
      for (std::size_t l = 0; l < sizes.size(); ++l)
        model.add(names[l], sizes[l], [](std::size_t, std::span<float> v) { std::fill(v.begin(), v.end(), 0.01f); });
      model.start();
      flexpar::relax::adam opt;
      auto step = [&] {
        for (std::size_t l = 0; l < sizes.size(); ++l) {
          auto w = model.gather(names[l]);
          sink = sink + compute(w.values(), work);
        }
        for (std::size_t l = sizes.size(); l-- > 0;) {
          {
            auto w = model.gather(names[l]);
            sink = sink + compute(w.values(), work);
          }
          std::span<float> g = model.gradient(names[l]);
          std::fill(g.begin(), g.end(), 1e-3f);
          model.gradient_ready(names[l]);
        }
        model.step(opt);
      };
      for (int i = 0; i < warmup; ++i) step();
      const std::uint64_t before = model.traffic().wire_bytes;
      const std::vector<double> ms = timed(iters, step);
      if (c.stage < 3)  // the gathers step() started: held is read once they have landed
        for (const std::string& name : names) (void)model.gather(name);
      const flexpar::zero::memory_report m = model.memory();
      if (!reference.empty()) {  // the same steps as data parallelism: the same parameters
        const auto full = model.full_parameters();
        for (std::size_t l = 0; l < full.size(); ++l)
          for (std::size_t i = 0; i < full[l].second.size(); ++i) {
            const float want = reference[l][i], got = full[l].second[i];
            if (!(std::abs(got - want) <= 1e-5f * std::abs(want))) {
              std::fprintf(stderr, "flexpar_zero_bench: rank %d: %s: %s[%zu] is %.9g, data parallelism's %.9g\n", rank,
                           c.name, full[l].first.c_str(), i, double(got), double(want));
              ++wrong;
              break;
            }
          }
      }
      rows.push_back({c.name, flexpar::bench::median_of_slowest(ms),
                      static_cast<double>(m.parameter_bytes + m.gradient_bytes + m.optimizer_bytes),
                      static_cast<double>(m.peak_parameter_bytes + m.peak_gradient_bytes + m.optimizer_bytes),
                      peak_rss_bytes(), static_cast<double>(model.traffic().wire_bytes - before) / iters});
    }
    if (rank == 0) {
      std::printf(
          "# flexpar_zero_bench: %d ranks, %zu f32 parameters (%.1f MiB) in %d layers, buckets of %s, "
          "work %d, Adam; medians of %d steps (slowest rank)\n",
          comm.size(), total, static_cast<double>(total * 4) / (1 << 20), layers, bucket_text.c_str(), work, iters);
      std::printf("%-20s %10s %8s %10s %8s %10s %8s %14s %14s\n", "mode", "step(ms)", "vs DP", "held(MiB)", "vs DP",
                  "peak(MiB)", "vs DP", "peak RSS(MiB)", "sent(MiB/step)");
      const row& dp = rows[0];  // the ratios are to data parallelism's (to itself under --only)
      for (const row& r : rows)
        std::printf("%-20s %10.2f %8.2f %10.1f %8.3f %10.1f %8.3f %14.1f %14.1f\n", r.name.c_str(), r.step_ms,
                    r.step_ms / dp.step_ms, r.held / (1 << 20), r.held / dp.held, r.peak / (1 << 20), r.peak / dp.peak,
                    r.rss / (1 << 20), r.sent / (1 << 20));
      const auto at = [&](const char* name) {
        for (const row& r : rows)
          if (r.name == name) return r.step_ms;
        return 0.0;
      };
      if (at("ZeRO-3") > 0 && at("ZeRO-3 qwZ+qgZ") > 0)
        std::printf("ZeRO-3 step / ZeRO-3 qwZ+qgZ step: %.2f\n", at("ZeRO-3") / at("ZeRO-3 qwZ+qgZ"));
      std::printf("flexpar_zero_bench: done\n");
    }
    if (wrong != 0) status = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flexpar_zero_bench: rank %d: %s\n", rank, e.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
