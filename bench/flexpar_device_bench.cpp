// flexpar_device_bench: the device collectives of the ranks of one node, path by path (ipc in both
// barrier modes, staged, nccl where each rank has its own GPU), next to a device-to-device copy of the
// same bytes measured in the same run (doc/gpu.md, "The ipc path").
//
//   mpiexec.mpich -n 2 build/bench/flexpar_device_bench --sizes 64M,256M --ops allreduce
//
// Paths: ipc1 / ipc2 = the ipc allreduce's one-step / two-step script; (events) / (host) = how its
// steps wait. Per row: the median over the iterations of the slowest rank's time (each iteration: a
// barrier, the call, a host wait for the stream); algbw = bytes / time; "moved GB/s" = the bytes every rank on the
// GPU reads and writes in device memory for this path (the script of lib/cuda/ipc_group.hpp) / time,
// and "vs copy" = that over the copy's (2 x bytes / copy time), where both share one GPU's memory. The
// result of one call per row is checked against a serial oracle (small integers, exact); a wrong
// element ends the run with exit status 1. Exit 77 without a device.
#include <mpi.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/cuda/collective.hpp>
#include <flexpar/cuda/engine.hpp>
#include <flexpar/cuda/relax.hpp>
#include <flexpar/engine/gradient_sync.hpp>

#include "bench_cli.hpp"
#include "bench_timing.hpp"

namespace fc = flexpar::cuda;
using flexpar::reduce_op;

namespace {

float value(int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 5 + static_cast<std::size_t>(rank) * 7) % 13) - 6);
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    if (comma > start) items.push_back(text.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

// Bytes one rank reads + writes in device memory for `op` of `b` bytes on the ipc path
// (lib/cuda/ipc_group.hpp's scripts; the sums its cost() prices).
double ipc_traffic(const std::string& op, int p, double b, bool one_shot) {
  const double others = static_cast<double>(p - 1) / p;
  if (op == "allreduce") return one_shot ? (p + 3) * b : 4 * b * others + b + 3 * b / p;
  if (op == "reduce_scatter") return 2 * b * others + b + b / p;
  if (op == "allgather") return 4 * b / p + 2 * b * others;
  return 2 * b;  // broadcast (the root writes staging, the others read it), alltoall
}

/// Times `body` (a barrier, the body, the stream drained) and returns the slowest rank's median.
template <class Body>
double timed(int warmup, int iterations, cudaStream_t s, Body&& body) {
  std::vector<double> samples;
  for (int i = 0; i < warmup + iterations; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    body();
    fc::synchronize(s, std::chrono::seconds(120), "flexpar_device_bench");
    if (i >= warmup) samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return flexpar::bench::median_of_slowest(samples);
}

/// The engine on device tensors: `tensors` allreduces of `bytes` each, fused and unfused, against one
/// device allreduce of all their bytes; and gradient_sync over `parameters` floats in 50 tensors
/// against one device allreduce of the same bytes. Every result is checked once (exit 1 on a wrong one).
int engine_rows(flexpar::communicator& comm, fc::device_communicator& gpu, int tensors, std::size_t bytes,
                std::size_t parameters, int warmup, int iterations) {
  const int p = comm.size(), me = comm.rank();
  fc::stream s;
  const std::size_t count = bytes / sizeof(float);
  fc::device_buffer<float> all(count * static_cast<std::size_t>(tensors));
  auto reset = [&] {
    const std::vector<float> ones(all.size(), 1.0f);
    fc::copy_async(all.span(), std::span<const float>(ones), s);
  };
  auto check = [&](const char* what, float want) {
    std::vector<float> got(all.size());
    fc::copy_async(std::span<float>(got), fc::device_span<const float>(all.span()), s);
    fc::synchronize(s, std::chrono::seconds(60), "check");
    long long wrong = 0;
    for (float v : got) wrong += v != want;
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (wrong != 0 && me == 0) std::fprintf(stderr, "flexpar_device_bench: %s: %lld elements wrong\n", what, wrong);
    return wrong == 0;
  };
  bool ok = true;
  double engine_time[2] = {0, 0};
  for (int fused = 1; fused >= 0; --fused) {
    flexpar::config cfg = comm.settings();
    cfg.fusion_threshold = fused ? std::size_t{64} << 20 : 0;
    fc::engine_backend backend(gpu);
    flexpar::engine eng(comm, cfg, {}, &backend);
    std::vector<flexpar::handle> handles(static_cast<std::size_t>(tensors));
    auto round = [&] {
      for (int t = 0; t < tensors; ++t) {
        std::string name = std::to_string(t);
        handles[static_cast<std::size_t>(t)] = fc::allreduce_async(
            eng, name.insert(0, 1, 't'), all.span().subspan(static_cast<std::size_t>(t) * count, count),
            flexpar::reduce_op::sum, s);
      }
      for (auto& h : handles) fc::order_after(h, s);
    };
    reset();
    round();
    ok = check(fused ? "engine, fused" : "engine, unfused", static_cast<float>(p)) && ok;
    engine_time[fused] = timed(warmup, iterations, s, [&] {
      reset();
      round();
    });
  }
  const double bare = timed(warmup, iterations, s, [&] {
    reset();
    gpu.allreduce(all.span(), flexpar::reduce_op::sum, s);
  });
  const double reset_only = timed(warmup, iterations, s, reset);
  // gradient_sync over `parameters` floats in 50 tensors, one backward pass per step
  const std::size_t per = parameters / 50;
  fc::device_buffer<float> weights(per * 50), grads(per * 50);
  double sync_time = 0, sync_bare = 0;
  {
    fc::engine_backend backend(gpu);
    flexpar::engine eng(comm, comm.settings(), {}, &backend);
    flexpar::gradient_sync sync(eng, {.reduction = flexpar::gradient_reduction::sum});
    for (int t = 0; t < 50; ++t) {
      std::string name = std::to_string(t);
      fc::register_parameter(sync, name.insert(0, 1, 'p'),
                             weights.span().subspan(static_cast<std::size_t>(t) * per, per),
                             grads.span().subspan(static_cast<std::size_t>(t) * per, per));
    }
    sync_time = timed(warmup, iterations, s, [&] { fc::synchronize(sync, s); });
    sync_bare = timed(warmup, iterations, s, [&] { gpu.allreduce(grads.span(), flexpar::reduce_op::sum, s); });
  }
  if (me == 0) {
    std::printf("\n# the engine on device tensors (%d ranks): %d allreduces of %zu bytes\n", p, tensors, bytes);
    std::printf("%-44s %11s\n", "what", "time(us)");
    std::printf("%-44s %11.1f\n", "engine, fused (64 MiB threshold)", (engine_time[1] - reset_only) * 1e6);
    std::printf("%-44s %11.1f\n", "engine, unfused", (engine_time[0] - reset_only) * 1e6);
    std::printf("%-44s %11.1f\n", "one device allreduce of all the bytes", (bare - reset_only) * 1e6);
    std::printf("fused / one allreduce = %.2fx (target <= 1.5x); unfused / fused = %.1fx (target >= 20x)\n",
                (engine_time[1] - reset_only) / (bare - reset_only),
                (engine_time[0] - reset_only) / (engine_time[1] - reset_only));
    std::printf("\n# gradient_sync of %zu parameters in 50 device tensors vs one device allreduce of the bytes\n",
                per * 50);
    std::printf("%-44s %11.1f\n", "gradient_sync::synchronize(stream)", sync_time * 1e6);
    std::printf("%-44s %11.1f\n", "device allreduce", sync_bare * 1e6);
    std::printf("overhead %.1f%% (target <= 5%%)\n", (sync_time / sync_bare - 1) * 100);
  }
  return ok ? 0 : 1;
}

/// The device relaxations: one step() of each on a model of `floats` parameters (10 tensors), against
/// one device allreduce of the same bytes on the same communicator (the issue's "each relaxation vs
/// the device allreduce"), and its bytes sent per step. Decentralized and local algorithms are timed
/// on a communicating step (interval 1).
void relax_rows(fc::device_communicator& gpu, std::size_t floats, int warmup, int iterations) {
  const int me = gpu.rank();
  constexpr std::size_t tensors = 10;
  const std::size_t per = std::max<std::size_t>(1, floats / tensors);
  fc::stream s;
  std::vector<fc::device_buffer<float>> w, g;
  std::vector<fc::parameter> params;
  for (std::size_t t = 0; t < tensors; ++t) {
    w.emplace_back(per);
    g.emplace_back(per);
    fc::fill(w.back().span(), 0.5f, s);
    fc::fill(g.back().span(), 0.25f + static_cast<float>(me), s);
    params.push_back({"t" + std::to_string(t), w.back().span(), g.back().span()});
  }
  fc::device_buffer<float> flat(per * tensors);
  fc::fill(flat.span(), 1.0f, s);
  const double bare = timed(warmup, iterations, s, [&] { gpu.allreduce(flat.span(), flexpar::reduce_op::avg, s); });
  if (me == 0) {
    std::printf("\n# device relaxations (%d ranks): one step on %zu floats in %zu tensors\n", gpu.size(), per * tensors,
                tensors);
    std::printf("%-44s %11s %9s %13s\n", "algorithm", "time(us)", "vs_bare", "bytes/step");
    std::printf("%-44s %11.1f %9.2f %13s\n", "device allreduce of the bytes (bare)", bare * 1e6, 1.0, "-");
  }
  fc::sgd opt({.learning_rate = 1e-6f, .momentum = 0.9f});
  const std::vector<std::pair<std::string, std::string>> algorithms{
      {"gradient_allreduce", ""}, {"bytegrad", ""},
      {"decentralized", "all"},   {"decentralized", "shift_one"},
      {"decentralized", "ring"},  {"low_precision_decentralized", ""},
      {"local_sgd", ""},          {"qadam", ""},
      {"onebit_adam", ""}};
  for (const auto& [name, peers] : algorithms) {
    flexpar::relax::options o;
    o.interval = 1;
    if (!peers.empty()) o.peers = peers;
    o.warmup_steps = 0;  // the Adam family: time the compressed stage
    auto algo = fc::make_relaxation(name, gpu, o);
    algo->start(params, s);
    const double t = timed(warmup, iterations, s, [&] { algo->step(params, opt, s); });
    const auto traffic = algo->traffic_so_far();
    const std::string label = peers.empty() ? name : name + " (" + peers + ")";
    if (me == 0)
      std::printf("%-44s %11.1f %9.2f %13llu\n", label.c_str(), t * 1e6, t / bare,
                  static_cast<unsigned long long>(traffic.bytes_sent / std::max<std::uint64_t>(1, traffic.steps)));
    algo->finish(params, s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // the engine's thread calls MPI
  int status = 0;
  {
    CLI::App app{"flexpar_device_bench: device collectives on one node, path by path, next to a device copy"};
    std::string sizes_text = "1M,16M,64M,256M", ops_text = "allreduce,reduce_scatter,allgather,alltoall,broadcast";
    int iterations = 20, warmup = 3, engine_tensors = 0;
    std::string engine_bytes_text = "4K", parameters_text = "25M", relax_text = "0";
    app.add_option("--sizes", sizes_text, "bytes of the whole buffer (K, M, G suffixes), comma-separated")
        ->capture_default_str();
    app.add_option("--ops", ops_text, "collectives, comma-separated")->capture_default_str();
    app.add_option("-n,--iters", iterations, "timed iterations per row")->capture_default_str();
    app.add_option("-w,--warmup", warmup, "untimed iterations first")->capture_default_str();
    app.add_option("--engine", engine_tensors,
                   "also time the engine: this many device allreduces (fused, unfused) and gradient_sync")
        ->capture_default_str();
    app.add_option("--engine-bytes", engine_bytes_text, "bytes of each of the engine's tensors")->capture_default_str();
    app.add_option("--parameters", parameters_text, "floats of gradient_sync's model (50 tensors; K, M suffixes)")
        ->capture_default_str();
    app.add_option("--relax", relax_text,
                   "also time one step of each device relaxation on a model of this many floats (K, M suffixes; 0: "
                   "none) against the device allreduce of its bytes")
        ->capture_default_str();
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      const int code = app.exit(e);
      MPI_Finalize();
      return code;
    }
    if (fc::device_count() == 0) {
      std::fprintf(stderr, "flexpar_device_bench: no CUDA device is present\n");
      MPI_Finalize();
      return 77;
    }
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    const int p = comm.size(), me = comm.rank();
    const int devices = fc::device_count();
    const int device = comm.topology().local_rank() % devices;
    const fc::device_guard on(device);
    const bool shared = devices < comm.topology().local_size();
    auto options = [&](fc::ipc_sync sync, fc::ipc_allreduce script, bool nccl) {
      fc::device_options o;
      o.use_nccl = nccl && !shared;
      o.ipc_sync_mode = sync;
      o.ipc_allreduce_script = script;
      return o;
    };
    fc::device_communicator gpu(comm, device, options(fc::ipc_sync::events, fc::ipc_allreduce::one_shot, true));
    fc::device_communicator gpu_two(comm, device, options(fc::ipc_sync::events, fc::ipc_allreduce::two_step, false));
    fc::device_communicator gpu_host(comm, device, options(fc::ipc_sync::host, fc::ipc_allreduce::one_shot, false));
    fc::device_communicator gpu_host_two(comm, device, options(fc::ipc_sync::host, fc::ipc_allreduce::two_step, false));
    const int sharing = shared ? comm.topology().local_size() : 1;  // ranks whose memory traffic one GPU carries
    if (me == 0)
      std::printf("# flexpar_device_bench: %d ranks, %d GPU(s), %d rank(s) per GPU, ipc path: %s; median of %d\n", p,
                  devices, sharing, gpu.has_ipc() ? "yes" : "no", iterations);
    if (me == 0)
      std::printf("%12s %-15s %-13s %11s %11s %11s %9s %9s\n", "size(B)", "collective", "path", "time(us)",
                  "algbw(GB/s)", "moved(GB/s)", "vs_copy", "copy(us)");
    fc::stream s;
    if (const std::size_t floats = flexpar::bench::parse_size(relax_text); floats > 0)
      relax_rows(gpu, floats, warmup, iterations);
    if (engine_tensors > 0)
      status = engine_rows(comm, gpu, engine_tensors, flexpar::bench::parse_size(engine_bytes_text),
                           flexpar::bench::parse_size(parameters_text), warmup, iterations);
    for (const std::string& size_text : split_list(sizes_text)) {
      const std::size_t bytes = flexpar::bench::parse_size(size_text);
      const std::size_t count =
          std::max<std::size_t>(1, bytes / sizeof(float) / static_cast<std::size_t>(p)) * static_cast<std::size_t>(p);
      const std::size_t block = count / static_cast<std::size_t>(p);
      std::vector<float> host(count);
      fc::device_buffer<float> a(count), b(count);
      // the reference of this run: one device copy of the buffer on every rank's GPU at once
      std::vector<double> copy_samples;
      for (int i = 0; i < warmup + iterations; ++i) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = std::chrono::steady_clock::now();
        if (me == 0 || !shared) fc::copy_async(b.span(), fc::device_span<const float>(a.span()), s);
        fc::synchronize(s, std::chrono::seconds(60), "copy");
        if (i >= warmup)
          copy_samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      const double copy = flexpar::bench::median_of_slowest(copy_samples);
      for (const std::string& op : split_list(ops_text)) {
        auto upload = [&] {
          for (std::size_t i = 0; i < count; ++i) host[i] = value(me, i);
          fc::copy_async(a.span(), std::span<const float>(host), s);
          fc::synchronize(s, std::chrono::seconds(60), "upload");
        };
        auto call = [&](fc::device_communicator& g, fc::device_path path) {
          if (op == "allreduce")
            g.allreduce(a.span(), reduce_op::sum, s, path);
          else if (op == "reduce_scatter")
            g.reduce_scatter(fc::device_span<const float>(a.span()), b.span().first(block), reduce_op::sum, s, path);
          else if (op == "allgather")
            g.allgather(fc::device_span<const float>(a.span().first(block)), b.span(), s, path);
          else if (op == "alltoall")
            g.alltoall(fc::device_span<const float>(a.span()), b.span(), s, path);
          else if (op == "broadcast")
            g.broadcast(a.span(), 0, s, path);
          else
            throw flexpar::usage_error("flexpar_device_bench: unknown collective '" + op + "'");
        };
        auto wrong_elements = [&] {  // one call's result against the serial oracle
          std::vector<float> got(count);
          const bool into_b = op == "reduce_scatter" || op == "allgather" || op == "alltoall";
          fc::copy_async(std::span<float>(got), fc::device_span<const float>(into_b ? b.span() : a.span()), s);
          fc::synchronize(s, std::chrono::seconds(60), "download");
          long long wrong = 0;
          const std::size_t n = op == "reduce_scatter" ? block : count;
          for (std::size_t i = 0; i < n; ++i) {
            float want = 0;
            if (op == "allreduce")
              for (int r = 0; r < p; ++r) want += value(r, i);
            else if (op == "reduce_scatter")
              for (int r = 0; r < p; ++r) want += value(r, static_cast<std::size_t>(me) * block + i);
            else if (op == "allgather")
              want = value(static_cast<int>(i / block), i % block);
            else if (op == "alltoall")
              want = value(static_cast<int>(i / block), static_cast<std::size_t>(me) * block + i % block);
            else
              want = value(0, i);
            wrong += got[i] != want;
          }
          MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
          return wrong;
        };
        struct path_of {
          const char* name;
          fc::device_communicator* g;
          fc::device_path path;
          bool one_shot;
        };
        std::vector<path_of> paths;
        const bool reduce_all = op == "allreduce";
        if (gpu.has_ipc()) {
          paths.push_back({reduce_all ? "ipc1(events)" : "ipc(events)", &gpu, fc::device_path::ipc, true});
          if (reduce_all) paths.push_back({"ipc2(events)", &gpu_two, fc::device_path::ipc, false});
          paths.push_back({reduce_all ? "ipc1(host)" : "ipc(host)", &gpu_host, fc::device_path::ipc, true});
          if (reduce_all) paths.push_back({"ipc2(host)", &gpu_host_two, fc::device_path::ipc, false});
        }
        if (gpu.has_nccl()) paths.push_back({"nccl", &gpu, fc::device_path::nccl, false});
        paths.push_back({"staged", &gpu, fc::device_path::staged, false});
        for (const path_of& row : paths) {
          upload();
          call(*row.g, row.path);
          const long long wrong = wrong_elements();
          if (wrong != 0) {
            if (me == 0)
              std::fprintf(stderr, "flexpar_device_bench: %s %s of %zu bytes: %lld elements wrong\n", op.c_str(),
                           row.name, count * sizeof(float), wrong);
            status = 1;
          }
          std::vector<double> samples;
          for (int i = 0; i < warmup + iterations; ++i) {
            if (op == "allreduce" && i % 4 == 0) upload();  // keep the sums small (exact, no overflow)
            MPI_Barrier(MPI_COMM_WORLD);
            const auto t0 = std::chrono::steady_clock::now();
            call(*row.g, row.path);
            row.g->synchronize(s, "flexpar_device_bench");
            if (i >= warmup)
              samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          }
          const double t = flexpar::bench::median_of_slowest(samples);
          if (me == 0) {
            const double size = static_cast<double>(count * sizeof(float));
            const bool ipc = row.path == fc::device_path::ipc;
            const double moved = ipc ? ipc_traffic(op, p, size, row.one_shot) * sharing / t / 1e9 : 0.0;
            const double copy_rate = 2 * size / copy / 1e9;
            char moved_text[16] = "-", ratio[16] = "-";
            if (ipc) {
              std::snprintf(moved_text, sizeof moved_text, "%.0f", moved);
              std::snprintf(ratio, sizeof ratio, "%.2fx", moved / copy_rate);
            }
            std::printf("%12zu %-15s %-13s %11.1f %11.2f %11s %9s %9.1f\n", count * sizeof(float), op.c_str(), row.name,
                        t * 1e6, size / t / 1e9, moved_text, ratio, copy * 1e6);
            std::fflush(stdout);
          }
        }
      }
    }
  }
  MPI_Finalize();
  return status;
}
