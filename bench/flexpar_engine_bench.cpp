// flexpar_engine_bench — what the engine's fusion and response cache are worth, measured in one run.
//
// (a) fusion: N tensors of S bytes allreduced through the engine per step, fused (threshold
//     FLEXPAR_FUSION_THRESHOLD or 128 MiB) and unfused (threshold 0), next to one allreduce of N*S
//     bytes by flexpar's collective and by MPI_Allreduce on the same machine in the same run.
// (b) negotiation: steady-state step of K tiny (4-byte) tensors with the response cache and without
//     (capacity 0); overhead per tensor = (step - one fused allreduce of K floats) / K.
// Times are medians over the steps, slowest rank. After its timing each engine runs one more step on
// inputs that differ by rank and element, checked against the exact sums (exit status 1 if wrong).
//
//   mpiexec -n 2 flexpar_engine_bench [-n 1024] [-s 4096] [--steps 30] [--fused-only]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/engine/engine.hpp>

#include "bench_cli.hpp"
#include "bench_timing.hpp"

namespace {

using flexpar::bench::median_of_slowest;

double time_steps(int steps, const std::function<void()>& step) {
  std::vector<double> samples;
  for (int i = 0; i < steps + 3; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    step();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (i >= 3) samples.push_back(us);
  }
  return median_of_slowest(std::move(samples));
}

/// One step of `n` allreduces through `eng`: submit all, wait all.
void engine_step(flexpar::engine& eng, std::vector<std::vector<float>>& tensors,
                 const std::vector<std::string>& names) {
  std::vector<flexpar::handle> handles;
  handles.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i)
    handles.push_back(eng.allreduce_async(names[i], std::span(tensors[i]), flexpar::reduce_op::sum));
  for (auto& h : handles) h.wait();
}

/// One more step of `eng`, untimed, on inputs that differ by rank and element: the elements that differ
/// from the exact sum over the ranks (small integers), on every rank together.
long long wrong_after_one_step(flexpar::engine& eng, std::vector<std::vector<float>>& tensors,
                               const std::vector<std::string>& names, int rank, int size) {
  auto value = [](int r, std::size_t t, std::size_t i) { return static_cast<float>((r + 1) * ((t + i) % 5 + 1)); };
  for (std::size_t t = 0; t < tensors.size(); ++t)
    for (std::size_t i = 0; i < tensors[t].size(); ++i) tensors[t][i] = value(rank, t, i);
  engine_step(eng, tensors, names);
  long long wrong = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t)
    for (std::size_t i = 0; i < tensors[t].size(); ++i) {
      float want = 0.0f;
      for (int r = 0; r < size; ++r) want += value(r, t, i);
      wrong += tensors[t][i] != want;
    }
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CLI::App app{"flexpar_engine_bench: fusion and negotiation overhead of the engine"};
  int tensors = 1024, steps = 30, tiny = 256;
  std::size_t tensor_bytes = 4096;
  app.add_option("-n,--tensors", tensors, "tensors per step for (a)");
  app.add_option("-s,--bytes", tensor_bytes, "bytes per tensor for (a)");
  app.add_option("-k,--tiny", tiny, "4-byte tensors per step for (b)");
  app.add_option("--steps", steps, "measured steps per row");
  bool fused_only = false;
  app.add_flag("--fused-only", fused_only, "time (a)'s fused engine only (for a profiler)");
  if (const auto done = flexpar::bench::parse_or_finalize(app, argc, argv, rank)) return *done;
  int status = 0;
  try {
    flexpar::config base = flexpar::config::from_environment();
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, base, flexpar::thread_need::multiple);
    const std::size_t count = tensor_bytes / sizeof(float);
    std::vector<std::vector<float>> data(static_cast<std::size_t>(tensors), std::vector<float>(count, 1.0f));
    std::vector<std::string> names;
    for (int i = 0; i < tensors; ++i) names.push_back("grad" + std::to_string(i));
    std::vector<float> big(count * static_cast<std::size_t>(tensors), 1.0f), big_out(big.size());

    auto fused_cfg = base, unfused_cfg = base;
    unfused_cfg.fusion_threshold = 0;
    double fused = 0, unfused = 0;
    long long wrong = 0;  // of one more step of each engine, after its timing
    {
      flexpar::engine eng(comm, fused_cfg);
      fused = time_steps(steps, [&] { engine_step(eng, data, names); });
      wrong += wrong_after_one_step(eng, data, names, rank, size);
    }
    if (fused_only) {
      if (rank == 0) std::printf("engine fused: %.1f us per step, %lld wrong\n", fused, wrong);
      MPI_Finalize();
      return wrong != 0;
    }
    {
      flexpar::engine eng(comm, unfused_cfg);
      unfused = time_steps(std::max(3, steps / 3), [&] { engine_step(eng, data, names); });
      wrong += wrong_after_one_step(eng, data, names, rank, size);
    }
    const double single = time_steps(steps, [&] { flexpar::allreduce(comm, std::span(big), flexpar::reduce_op::sum); });
    const double mpi = time_steps(steps, [&] {
      MPI_Allreduce(big.data(), big_out.data(), static_cast<int>(big.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
    // (b) negotiation overhead with and without the response cache
    std::vector<std::vector<float>> small(static_cast<std::size_t>(tiny), std::vector<float>(1, 1.0f));
    std::vector<std::string> small_names;
    for (int i = 0; i < tiny; ++i) small_names.push_back("bias" + std::to_string(i));
    std::vector<float> tiny_fused(static_cast<std::size_t>(tiny), 1.0f);
    auto no_cache = base;
    no_cache.cache_capacity = 0;
    double with_cache = 0, without_cache = 0;
    {
      flexpar::engine eng(comm, base);
      with_cache = time_steps(steps, [&] { engine_step(eng, small, small_names); });
      wrong += wrong_after_one_step(eng, small, small_names, rank, size);
    }
    {
      flexpar::engine eng(comm, no_cache);
      without_cache = time_steps(steps, [&] { engine_step(eng, small, small_names); });
      wrong += wrong_after_one_step(eng, small, small_names, rank, size);
    }
    const double tiny_single =
        time_steps(steps, [&] { flexpar::allreduce(comm, std::span(tiny_fused), flexpar::reduce_op::sum); });
    if (rank == 0) {
      std::printf("# flexpar_engine_bench: %d ranks, median step time of the slowest rank, cycle %.3g ms\n", size,
                  static_cast<double>(base.cycle_time.count()) / 1000.0);
      std::printf("# (a) %d tensors x %zu bytes per step\n", tensors, tensor_bytes);
      std::printf("%-34s %12s %10s\n", "#", "step(us)", "ratio");
      std::printf("%-34s %12.1f %10s\n", "engine fused", fused, "1.00");
      std::printf("%-34s %12.1f %9.1fx  (unfused / fused)\n", "engine unfused (threshold 0)", unfused, unfused / fused);
      std::printf("%-34s %12.1f %9.2fx  (fused / this)\n", "one flexpar::allreduce of all", single, fused / single);
      std::printf("%-34s %12.1f %9.2fx  (fused / this)\n", "one MPI_Allreduce of all", mpi, fused / mpi);
      std::printf("# (b) %d tensors x 4 bytes per step, steady state\n", tiny);
      std::printf("%-34s %12s %16s\n", "#", "step(us)", "overhead/tensor");
      std::printf("%-34s %12.1f %13.2f us\n", "engine, response cache on", with_cache,
                  (with_cache - tiny_single) / tiny);
      std::printf("%-34s %12.1f %13.2f us\n", "engine, response cache off", without_cache,
                  (without_cache - tiny_single) / tiny);
      std::printf("%-34s %12.1f\n", "one allreduce of all (reference)", tiny_single);
      std::printf("# verified: one more step of each engine against the exact sums, %lld wrong\n", wrong);
    }
    if (wrong != 0) status = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flexpar_engine_bench: %s\n", e.what());
    status = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
