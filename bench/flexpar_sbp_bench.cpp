// flexpar_sbp_bench — boxing next to the bare collective it calls, measured in one run.
//
// For each boxing (P -> B, P -> S(0), S(0) -> B, S(1) -> B, S(0) -> S(1)) and logical size, the
// median time of to<To>(std::move(t)) next to the flexpar collective doing the same data movement on
// buffers the caller owns: "bare" reuses a preallocated output (the best case of a hand-written
// program); "bare+alloc" allocates its output each time, as boxing must (a new tensor) — for the
// in-place P -> B, it runs on a buffer allocated fresh before the timing, as the tensor's is. The
// ratio boxing / bare+alloc is the cost of the SBP layer itself (packing, bookkeeping); boxing / bare
// adds what fresh memory costs (page faults, no huge pages). Medians over iterations, slowest rank.
//
//   mpiexec -n 2 flexpar_sbp_bench [-b 1M] [-e 16M] [-f 4] [--iters 20]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <flexpar/sbp/sbp.hpp>

#include "bench_cli.hpp"
#include "bench_timing.hpp"

namespace {

using namespace flexpar::sbp;

using flexpar::bench::median_of_slowest;

/// Median of `iters` timed calls of `run`, each after an untimed `prepare` and a barrier.
/// Results are moved into `sink`, which is emptied before each call (freeing is not timed).
double measure(int iters, std::vector<float>& sink, const std::function<void()>& prepare,
               const std::function<void()>& run) {
  std::vector<double> samples;
  for (int i = 0; i < iters + 2; ++i) {
    sink = {};
    prepare();
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    run();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (i >= 2) samples.push_back(us);
  }
  return median_of_slowest(std::move(samples));
}

struct row {
  std::string boxing;
  std::size_t bytes;
  double boxed_us, bare_us, bare_alloc_us;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CLI::App app{"flexpar_sbp_bench: boxing next to the bare collective it calls"};
  std::string begin = "1M", end = "16M";
  int factor = 4, iters = 20;
  app.add_option("-b,--minbytes", begin, "smallest logical tensor (bytes, K/M/G)");
  app.add_option("-e,--maxbytes", end, "largest logical tensor");
  app.add_option("-f,--stepfactor", factor, "size multiplier between rows");
  app.add_option("--iters", iters, "measured iterations per row");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = rank == 0 ? app.exit(e) : 0;
    MPI_Finalize();
    return code;
  }
  {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    placement<1> mesh(comm, {comm.size()});
    const int p = comm.size();
    std::vector<row> rows;
    std::vector<float> sink;
    for (std::size_t bytes = flexpar::bench::parse_size(begin); bytes <= flexpar::bench::parse_size(end);
         bytes *= static_cast<std::size_t>(factor)) {
      const std::size_t cols = 256,
                        n = bytes / sizeof(float) / cols / static_cast<std::size_t>(p) * static_cast<std::size_t>(p);
      const shape_t shape{n, cols};
      const std::size_t count = n * cols;
      std::vector<float> full(count, 1.0f), buffer(count), out(count);
      std::vector<std::size_t> even(static_cast<std::size_t>(p), count / static_cast<std::size_t>(p));
      const std::size_t block = count / static_cast<std::size_t>(p);

      {  // P -> B: allreduce
        std::optional<global_tensor<float, partial_sum>> t;
        const double boxed = measure(
            iters, sink, [&] { t.emplace(global_tensor<float, partial_sum>::from_local(mesh, shape, full)); },
            [&] { sink = to<broadcast>(std::move(*t)).release(); });
        const double bare = measure(
            iters, sink, [&] { buffer = full; },
            [&] { flexpar::allreduce(comm, std::span(buffer), flexpar::reduce_op::sum); });
        // in place, but on a buffer as new as the tensor's (made in the untimed prepare, as from_local does)
        const double bare_fresh = measure(
            iters, sink, [&] { sink = std::vector<float>(full); },
            [&] { flexpar::allreduce(comm, std::span(sink), flexpar::reduce_op::sum); });
        rows.push_back({"P(sum) -> B", bytes, boxed, bare, bare_fresh});
      }
      {  // P -> S(0): reduce-scatter
        std::optional<global_tensor<float, partial_sum>> t;
        const double boxed = measure(
            iters, sink, [&] { t.emplace(global_tensor<float, partial_sum>::from_local(mesh, shape, full)); },
            [&] { sink = to<split<0>>(std::move(*t)).release(); });
        const double bare = measure(
            iters, sink, [&] { buffer = full; },
            [&] {
              flexpar::reduce_scatter_v(comm, std::span(buffer), std::span<const std::size_t>(even),
                                        flexpar::reduce_op::sum);
            });
        const double bare_alloc = measure(
            iters, sink, [&] { buffer = full; },
            [&] {
              auto mine = flexpar::reduce_scatter_v(comm, std::span(buffer), std::span<const std::size_t>(even),
                                                    flexpar::reduce_op::sum);
              sink.assign(mine.begin(), mine.end());
            });
        rows.push_back({"P(sum) -> S(0)", bytes, boxed, bare, bare_alloc});
      }
      {  // S(0) -> B and S(1) -> B: allgather (the second also unpacks the columns)
        const std::vector<float> shard(block, 1.0f);
        std::optional<global_tensor<float, split<0>>> t0;
        std::optional<global_tensor<float, split<1>>> t1;
        const double boxed0 = measure(
            iters, sink, [&] { t0.emplace(global_tensor<float, split<0>>::from_local(mesh, shape, shard)); },
            [&] { sink = to<broadcast>(std::move(*t0)).release(); });
        const double boxed1 = measure(
            iters, sink, [&] { t1.emplace(global_tensor<float, split<1>>::from_local(mesh, shape, shard)); },
            [&] { sink = to<broadcast>(std::move(*t1)).release(); });
        const double bare = measure(
            iters, sink, [] {}, [&] { flexpar::allgather(comm, std::span<const float>(shard), std::span(out)); });
        const double bare_alloc = measure(
            iters, sink, [] {},
            [&] {
              std::vector<float> gathered(count);
              flexpar::allgather(comm, std::span<const float>(shard), std::span(gathered));
              sink = std::move(gathered);
            });
        rows.push_back({"S(0) -> B", bytes, boxed0, bare, bare_alloc});
        rows.push_back({"S(1) -> B", bytes, boxed1, bare, bare_alloc});
      }
      {  // S(0) -> S(1): alltoall
        const std::vector<float> shard(block, 1.0f);
        std::optional<global_tensor<float, split<0>>> t;
        const double boxed = measure(
            iters, sink, [&] { t.emplace(global_tensor<float, split<0>>::from_local(mesh, shape, shard)); },
            [&] { sink = to<split<1>>(std::move(*t)).release(); });
        std::vector<float> in(block, 1.0f), got(block);
        const double bare = measure(
            iters, sink, [] {}, [&] { flexpar::alltoall(comm, std::span<const float>(in), std::span(got)); });
        const double bare_alloc = measure(
            iters, sink, [] {},
            [&] {
              std::vector<float> fresh(block);
              flexpar::alltoall(comm, std::span<const float>(in), std::span(fresh));
              sink = std::move(fresh);
            });
        rows.push_back({"S(0) -> S(1)", bytes, boxed, bare, bare_alloc});
      }
    }
    if (rank == 0) {
      std::printf("# flexpar_sbp_bench: %d ranks, f32 tensors [n, 256], median of %d, slowest rank\n", p, iters);
      std::printf("%-16s %10s %12s %12s %14s %12s %14s\n", "boxing", "bytes", "boxing(us)", "bare(us)",
                  "bare+alloc(us)", "vs bare", "vs bare+alloc");
      for (const row& r : rows)
        std::printf("%-16s %10zu %12.1f %12.1f %14.1f %11.2fx %13.2fx\n", r.boxing.c_str(), r.bytes, r.boxed_us,
                    r.bare_us, r.bare_alloc_us, r.boxed_us / r.bare_us, r.boxed_us / r.bare_alloc_us);
    }
  }
  MPI_Finalize();
  return 0;
}
