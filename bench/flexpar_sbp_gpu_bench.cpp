// flexpar_sbp_gpu_bench: SBP boxing of device tensors next to the bare device collective on buffers of
// the same sizes, and the SBP matmul next to cuBLAS's own GEMM on the same local shapes, measured in
// the same run (doc/sbp.md, "Device tensors").
//
//   mpiexec.mpich -n 2 build/bench/flexpar_sbp_gpu_bench --sizes 16M,64M,256M
//
// Boxings of a float tensor [rows, 1024] of the given bytes on a 1-D mesh of every rank:
//   P -> B      vs allreduce(bytes)             P -> S(0)      vs reduce_scatter(bytes)
//   S(0) -> B   vs allgather(bytes)             S(0) -> S(1)   vs alltoall(bytes / p)
// Each iteration boxes a fresh copy (made and waited for before the clock starts); the time is a
// barrier, the boxing, a wait for the placement's stream: the median of the slowest rank. "vs bare" is
// the boxing's time over the collective's. Every boxing's result is checked once against the logical
// tensor (small integers, exact): a wrong element ends the run with exit status 1. Exit 77 without a
// device. --sync events,host runs the boxing table once per way the ipc path's steps wait for each
// other (device_options::ipc_sync_mode). The pack table times the layout change of S(0) -> S(1) alone:
// the library's copy_box next to the copy engines' 2-D copy and a plain copy of the same bytes.
#include <mpi.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/cuda/sbp.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "bench_cli.hpp"
#include "bench_timing.hpp"

namespace fc = flexpar::cuda;
namespace fs = flexpar::sbp;
using flexpar::reduce_op;

namespace {

using clock_type = std::chrono::steady_clock;

std::vector<float> logical(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>(i % 13) - 6);
  return v;
}

// Times `run` (after `prepare`, untimed) over iterations: the median of the slowest rank, in seconds.
template <class Prepare, class Run>
double time_it(const fc::device_placement<1>& gpu, int iterations, int warmup, Prepare prepare, Run run) {
  std::vector<double> samples;
  for (int i = 0; i < warmup + iterations; ++i) {
    auto state = prepare();
    gpu.synchronize("prepare");
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = clock_type::now();
    run(state);
    gpu.synchronize("timed");
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (i >= warmup) samples.push_back(s);
  }
  return flexpar::bench::median_of_slowest(samples);
}

template <class From, class To>
double time_boxing(const fc::device_placement<1>& gpu, const fs::shape_t& shape, const std::vector<float>& full,
                   int iterations, int warmup, bool& ok) {
  using tensor = fs::global_tensor<float, From, flexpar::memory::cuda>;
  const tensor source = tensor::from_full(gpu, shape, full);
  if (fs::to<To>(source.clone()).to_full() != full) ok = false;  // from_full's logical tensor is `full`
  return time_it(
      gpu, iterations, warmup, [&] { return source.clone(); },
      [&](tensor& t) { auto boxed = fs::to<To>(std::move(t)); });
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  {
    CLI::App app{"flexpar_sbp_gpu_bench: device boxing and matmul next to the bare device collective and cuBLAS"};
    std::string sizes_text = "16M,64M,256M";
    int iterations = 10, warmup = 2;
    std::size_t gemm = 4096;
    app.add_option("--sizes", sizes_text, "bytes of the logical tensor (K, M, G suffixes), comma-separated")
        ->capture_default_str();
    app.add_option("-n,--iters", iterations, "timed iterations per row")->capture_default_str();
    app.add_option("-w,--warmup", warmup, "untimed iterations first")->capture_default_str();
    std::vector<std::string> syncs{"events"};
    app.add_option("--sync", syncs, "how the ipc path's steps wait for each other: events, host (comma-separated)")
        ->delimiter(',')
        ->check(CLI::IsMember({"events", "host"}))
        ->capture_default_str();
    app.add_option("--gemm", gemm, "m = n = k of the local GEMM of the matmul rows (0: none)")->capture_default_str();
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (const auto done = flexpar::bench::parse_or_finalize(app, argc, argv, world_rank)) return *done;
    if (fc::device_count() == 0) {
      std::fprintf(stderr, "flexpar_sbp_gpu_bench: no CUDA device is present\n");
      MPI_Finalize();
      return 77;
    }
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    const int p = comm.size(), me = comm.rank();
    const int device = comm.topology().local_rank() % fc::device_count();
    const fc::device_guard on(device);
    fs::placement<1> mesh(comm, {p});
    fc::device_placement gpu(mesh, device);
    bool ok = true;
    std::vector<std::size_t> sizes;
    for (std::size_t start = 0; start <= sizes_text.size();) {
      const std::size_t comma = std::min(sizes_text.find(',', start), sizes_text.size());
      const std::string item = sizes_text.substr(start, comma - start);
      start = comma + 1;
      if (!item.empty()) sizes.push_back(flexpar::bench::parse_size(item));
    }

    for (const std::string& mode : syncs) {
      // the placement whose device communicator syncs the ipc path's steps this way (boxing and bare alike)
      fc::device_options options;
      options.ipc_sync_mode = mode == "host" ? fc::ipc_sync::host : fc::ipc_sync::events;
      fc::device_placement synced(mesh, device, options);
      if (me == 0)
        std::printf(
            "# %d ranks, GPU %d, ipc sync %s; medians of %d iterations, slowest rank\n%-14s %10s %12s %12s %9s\n", p,
            device, mode.c_str(), iterations, "boxing", "MiB", "boxing ms", "bare ms", "vs bare");
      for (const std::size_t bytes : sizes) {
        const std::size_t cols = 1024, rows = std::max<std::size_t>(bytes / sizeof(float) / cols / p, 1) * p;
        const fs::shape_t shape{rows, cols};
        const std::size_t n = rows * cols;
        const std::vector<float> full = logical(n);
        fc::device_communicator& bare = synced.axis(0);  // the boxing's own communicator
        fc::device_buffer<float> a(n), b(n);
        auto bare_time = [&](auto op) {
          return time_it(
              synced, iterations, warmup, [] { return 0; }, [&](int) { op(); });
        };
        const cudaStream_t s = synced.stream();
        struct row {
          const char* name;
          double boxing, bare;
        };
        const row rows_out[] = {
            {"P -> B", time_boxing<fs::partial_sum, fs::broadcast>(synced, shape, full, iterations, warmup, ok),
             bare_time([&] { bare.allreduce(a.span(), reduce_op::sum, s); })},
            {"P -> S(0)", time_boxing<fs::partial_sum, fs::split<0>>(synced, shape, full, iterations, warmup, ok),
             bare_time([&] {
               bare.reduce_scatter(fc::device_span<const float>(a.span()), b.span().first(n / p), reduce_op::sum, s);
             })},
            {"S(0) -> B", time_boxing<fs::split<0>, fs::broadcast>(synced, shape, full, iterations, warmup, ok),
             bare_time([&] { bare.allgather(fc::device_span<const float>(a.span().first(n / p)), b.span(), s); })},
            {"S(0) -> S(1)", time_boxing<fs::split<0>, fs::split<1>>(synced, shape, full, iterations, warmup, ok),
             bare_time([&] {
               bare.alltoall(fc::device_span<const float>(a.span().first(n / p)), b.span().first(n / p), s);
             })},
        };
        if (me == 0)
          for (const row& r : rows_out)
            std::printf("%-14s %10.1f %12.3f %12.3f %9.3f\n", r.name,
                        static_cast<double>(n * sizeof(float)) / (1 << 20), r.boxing * 1e3, r.bare * 1e3,
                        r.boxing / r.bare);
      }
    }

    // The pack of S(0) -> S(1) alone (no communication, every rank at once): my rows [rows / p, cols]
    // cut into p column blocks laid one after another, by the library's copy_box, by the copy engines'
    // 2-D copy of the same boxes, and a plain copy of the same bytes (the floor).
    if (me == 0) std::printf("\n%-14s %10s %12s %12s %12s\n", "pack", "MiB", "copy_box ms", "memcpy2D ms", "memcpy ms");
    for (const std::size_t bytes : sizes) {
      const std::size_t cols = 1024, rows = std::max<std::size_t>(bytes / sizeof(float) / cols / p, 1);  // mine
      const std::size_t n = rows * cols, w = cols / static_cast<std::size_t>(p);
      fc::device_buffer<float> a(n), b(n);
      const cudaStream_t s = gpu.stream();
      auto local_time = [&](auto op) {
        return time_it(
            gpu, iterations, warmup, [] { return 0; }, [&](int) { op(); });
      };
      const double library = local_time([&] {
        for (std::size_t k = 0; k < static_cast<std::size_t>(p); ++k)
          fc::copy_box<float>(fc::device_span<const float>(a.span()), {rows, cols}, {0, k * w},
                              b.span().subspan(k * rows * w, rows * w), {rows, w}, {0, 0}, {rows, w}, s);
      });
      const double engines = local_time([&] {
        for (std::size_t k = 0; k < static_cast<std::size_t>(p); ++k)
          FLEXPAR_CHECK_CUDA(
              me, cudaMemcpy2DAsync(b.data() + k * rows * w, w * sizeof(float), a.data() + k * w, cols * sizeof(float),
                                    w * sizeof(float), rows, cudaMemcpyDeviceToDevice, s));
      });
      const double plain = local_time([&] {
        FLEXPAR_CHECK_CUDA(me, cudaMemcpyAsync(b.data(), a.data(), n * sizeof(float), cudaMemcpyDeviceToDevice, s));
      });
      if (me == 0)
        std::printf("%-14s %10.1f %12.3f %12.3f %12.3f\n", "S(0) -> S(1)",
                    static_cast<double>(n * sizeof(float) * static_cast<std::size_t>(p)) / (1 << 20), library * 1e3,
                    engines * 1e3, plain * 1e3);
    }

    if (gemm > 0) {
      // matmul (S(0), B) -> S(0): each rank's local GEMM is [gemm, gemm] x [gemm, gemm]
      const std::size_t m = gemm * static_cast<std::size_t>(p), k = gemm, ncols = gemm;
      using left = fs::global_tensor<float, fs::split<0>, flexpar::memory::cuda>;
      using right = fs::global_tensor<float, fs::broadcast, flexpar::memory::cuda>;
      std::vector<float> fa(m * k), fb(k * ncols);
      for (std::size_t i = 0; i < fa.size(); ++i) fa[i] = static_cast<float>(static_cast<int>(i % 5) - 2);
      for (std::size_t i = 0; i < fb.size(); ++i) fb[i] = static_cast<float>(static_cast<int>(i % 3) - 1);
      const left da = left::from_full(gpu, {m, k}, fa);
      const right db = right::from_full(gpu, {k, ncols}, fb);
      fc::device_buffer<float> c(gemm * ncols);
      const double sbp = time_it(
          gpu, iterations, warmup, [] { return 0; }, [&](int) { auto out = fs::matmul(da, db); });
      const double raw = time_it(
          gpu, iterations, warmup, [] { return 0; },
          [&](int) {
            gpu.linear_algebra().gemm(fc::transpose::no, fc::transpose::no, gemm, ncols, k, 1.0f, da.to_local(),
                                      db.to_local(), 0.0f, c.span(), gpu.stream());
          });
      const double flops = 2.0 * static_cast<double>(gemm) * static_cast<double>(ncols) * static_cast<double>(k);
      if (me == 0)
        std::printf("\n%-24s %12s %12s\nmatmul (S(0), B) %5zu^3 %12.2f %12.2f   SBP / cuBLAS throughput %.3f\n",
                    "local GEMM", "SBP TFLOP/s", "cuBLAS", gemm, flops / sbp / 1e12, flops / raw / 1e12, raw / sbp);
    }
    if (!ok) {
      std::fprintf(stderr, "flexpar_sbp_gpu_bench: rank %d: a boxing gave a wrong tensor\n", me);
      status = 1;
    }
  }
  MPI_Finalize();
  return status;
}
