// flexpar_perf — nccl-tests-style benchmark of flexpar's collectives, with MPICH's own collectives
// measured in the same run on the same buffers.
//
//   mpiexec -n 2 flexpar_perf -b 4K -e 64M -f 4 [-o allreduce,allgather] [-a ring,shared_memory]
//
// For each collective and size (bytes of the whole buffer, as nccl-tests counts them) it prints one
// row per flexpar algorithm and one `mpi` row: the median over iterations of the slowest rank's
// time (the rows of one size are interleaved: each iteration runs every row once, in turn, starting
// one row further each time), algbw = size / time, busbw = algbw * the nccl-tests factor (allreduce 2(p-1)/p;
// reduce_scatter, allgather, alltoall (p-1)/p; broadcast, reduce 1), #wrong (elements that differ
// from the exact answer after one more call, untimed, summed over the ranks; the exit status is 1
// when any row's is not 0) and vs_mpi = time(mpi) / time (busbw / busbw(mpi)
// where busbw is defined; on one rank it is 0 for the gathers). The `auto:<pick>` row's vs_best is
// its time over the fastest explicit algorithm's of the same size, and the last line counts the sizes
// where automatic picked that algorithm and where it came within 5% of its time. A second table gives
// the references of the same run: the single-thread `a[i] += b[i]` and memcpy bandwidth of rank 0,
// and the point-to-point bandwidth between ranks 0 and 1 (flexpar transport, streamed isends).
// All collectives run in place.
//
// --gpu (builds with CUDA): the buffers live on the GPU (device = node-local rank modulo the devices);
// rows for flexpar's device paths (`nccl` where built, `staged` through pinned host memory) next to
// MPICH's collective on a host buffer of the same size, and a device-to-device copy of the same bytes
// as the reference line. Timing: host clock around the call and a stream synchronize.
#include <mpi.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/version.hpp>
#include "bench_cli.hpp"
#if FLEXPAR_HAVE_CUDA
#include <flexpar/cuda/collective.hpp>
#endif

namespace {

using flexpar::algorithm;
using flexpar::communicator;
using flexpar::reduce_op;

enum class collective { allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall };

const std::map<std::string, collective> collective_names{
    {"allreduce", collective::allreduce}, {"reduce_scatter", collective::reduce_scatter},
    {"allgather", collective::allgather}, {"broadcast", collective::broadcast},
    {"reduce", collective::reduce},       {"alltoall", collective::alltoall}};

// The collectives' algorithms this bench measures, by their names in collective/algorithm.hpp.
const std::map<std::string, algorithm> algorithm_names = [] {
  std::map<std::string, algorithm> by_name;
  for (algorithm a : {algorithm::automatic, algorithm::ring, algorithm::halving_doubling, algorithm::hierarchical,
                      algorithm::shared_memory, algorithm::recursive_doubling, algorithm::chain,
                      algorithm::binomial_tree, algorithm::pairwise})
    by_name.emplace(name_of(a), a);
  return by_name;
}();

std::string name_of(collective c) {
  for (const auto& [name, value] : collective_names)
    if (value == c) return name;
  return "?";
}

/// The algorithms of `c` that this run measures, from the -a list (automatic is always allowed).
std::vector<algorithm> algorithms_for(collective c, const std::vector<algorithm>& asked, const communicator& comm) {
  std::vector<algorithm> offered;
  switch (c) {
    case collective::allreduce:
      offered = {algorithm::automatic, algorithm::ring, algorithm::halving_doubling, algorithm::shared_memory};
      if (comm.topology().node_count() > 1 && comm.topology().uniform()) offered.push_back(algorithm::hierarchical);
      if (comm.topology().node_count() > 1) std::erase(offered, algorithm::shared_memory);
      break;
    case collective::reduce_scatter:
      offered = {algorithm::automatic, algorithm::ring, algorithm::shared_memory};
      if (comm.topology().node_count() > 1) std::erase(offered, algorithm::shared_memory);
      break;
    case collective::allgather:
      offered = {algorithm::automatic, algorithm::ring, algorithm::recursive_doubling, algorithm::shared_memory};
      if (comm.topology().node_count() > 1) std::erase(offered, algorithm::shared_memory);
      break;
    case collective::broadcast:
    case collective::reduce: offered = {algorithm::automatic, algorithm::chain, algorithm::binomial_tree}; break;
    case collective::alltoall:
      offered = {algorithm::automatic, algorithm::pairwise, algorithm::shared_memory};
      if (comm.topology().node_count() > 1) std::erase(offered, algorithm::shared_memory);
      break;
  }
  std::vector<algorithm> chosen;
  for (algorithm a : offered)
    if (asked.empty() || std::find(asked.begin(), asked.end(), a) != asked.end()) chosen.push_back(a);
  return chosen;
}

double bus_factor(collective c, int p) {
  switch (c) {
    case collective::allreduce: return 2.0 * (p - 1) / p;
    case collective::reduce_scatter:
    case collective::allgather:
    case collective::alltoall: return static_cast<double>(p - 1) / p;
    case collective::broadcast:
    case collective::reduce: return 1.0;
  }
  return 1.0;
}

/// Exact inputs (small integers): rank r's element i.
float input_value(int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 9) - 4);
}

struct run_setup {
  communicator& comm;
  collective c;
  std::size_t count;  // elements of the whole buffer
  std::vector<float>& buffer;
  std::vector<float>& scratch;
};

/// Sets the buffer to this rank's verified input of collective `c`.
void fill(const run_setup& s) {
  const int p = s.comm.size(), me = s.comm.rank();
  const std::size_t block = s.count / static_cast<std::size_t>(p);
  for (std::size_t i = 0; i < s.count; ++i) {
    switch (s.c) {
      case collective::allgather:
        s.buffer[i] = i / block == static_cast<std::size_t>(me) ? input_value(me, i) : -99.0f;
        break;
      case collective::broadcast: s.buffer[i] = me == 0 ? input_value(0, i) : -99.0f; break;
      default: s.buffer[i] = input_value(me, i); break;
    }
  }
}

/// Elements of the buffer that differ from the exact answer after one call of `c`.
long long count_wrong(const run_setup& s) {
  const int p = s.comm.size(), me = s.comm.rank();
  const std::size_t block = s.count / static_cast<std::size_t>(p);
  auto sum_over_ranks = [&](std::size_t i) {
    float sum = 0;
    for (int r = 0; r < p; ++r) sum += input_value(r, i);
    return sum;
  };
  long long wrong = 0;
  for (std::size_t i = 0; i < s.count; ++i) {
    float want = 0;
    switch (s.c) {
      case collective::allreduce: want = sum_over_ranks(i); break;
      case collective::reduce_scatter:
        if (i / block != static_cast<std::size_t>(me)) continue;
        want = sum_over_ranks(i);
        break;
      case collective::allgather: want = input_value(static_cast<int>(i / block), i); break;
      case collective::broadcast: want = input_value(0, i); break;
      case collective::reduce:
        if (me != 0) continue;
        want = sum_over_ranks(i);
        break;
      case collective::alltoall: {
        // block q of mine came from rank q, where it was that rank's block `me`
        const std::size_t q = i / block, offset = i % block;
        want = input_value(static_cast<int>(q), static_cast<std::size_t>(me) * block + offset);
        break;
      }
    }
    if (s.buffer[i] != want) ++wrong;
  }
  return wrong;
}

void run_flexpar(const run_setup& s, algorithm a) {
  std::span<float> data(s.buffer.data(), s.count);
  switch (s.c) {
    case collective::allreduce: flexpar::allreduce(s.comm, data, reduce_op::sum, a); break;
    case collective::reduce_scatter: flexpar::reduce_scatter(s.comm, data, reduce_op::sum, a); break;
    case collective::allgather: flexpar::allgather(s.comm, data, a); break;
    case collective::broadcast: flexpar::broadcast(s.comm, data, 0, a); break;
    case collective::reduce: flexpar::reduce(s.comm, data, reduce_op::sum, 0, a); break;
    case collective::alltoall: flexpar::alltoall(s.comm, data, a); break;
  }
}

void run_mpi(const run_setup& s) {
  MPI_Comm comm = s.comm.mpi_comm();
  const auto p = static_cast<std::size_t>(s.comm.size());
  const auto block = static_cast<MPI_Count>(s.count / p);
  float* data = s.buffer.data();
  const auto n = static_cast<MPI_Count>(s.count);
  switch (s.c) {
    case collective::allreduce:
      FLEXPAR_CHECK_MPI(MPI_Allreduce_c(MPI_IN_PLACE, data, n, MPI_FLOAT, MPI_SUM, comm));
      break;
    case collective::reduce_scatter:
      // MPI's in-place reduce-scatter leaves the result at the start; keep flexpar's layout (block `rank`)
      FLEXPAR_CHECK_MPI(MPI_Reduce_scatter_block_c(data, s.scratch.data(), block, MPI_FLOAT, MPI_SUM, comm));
      std::memcpy(data + static_cast<std::size_t>(block) * static_cast<std::size_t>(s.comm.rank()), s.scratch.data(),
                  static_cast<std::size_t>(block) * sizeof(float));
      break;
    case collective::allgather:
      FLEXPAR_CHECK_MPI(MPI_Allgather_c(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, block, MPI_FLOAT, comm));
      break;
    case collective::broadcast: FLEXPAR_CHECK_MPI(MPI_Bcast_c(data, n, MPI_FLOAT, 0, comm)); break;
    case collective::reduce:
      FLEXPAR_CHECK_MPI(MPI_Reduce_c(s.comm.rank() == 0 ? MPI_IN_PLACE : data, s.comm.rank() == 0 ? data : nullptr, n,
                                     MPI_FLOAT, MPI_SUM, 0, comm));
      break;
    case collective::alltoall:
      FLEXPAR_CHECK_MPI(MPI_Alltoall_c(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, block, MPI_FLOAT, comm));
      break;
  }
}

using seconds = double;
double now() { return MPI_Wtime(); }

/// Medians over iterations of the slowest rank's time of each of `ops`, interleaved: iteration i
/// runs every op once, in turn, starting with op i mod n, so that a slow phase of the machine and
/// the op that ran just before weigh on all of them alike.
std::vector<seconds> time_medians(MPI_Comm comm, int warmup, int iterations,
                                  const std::vector<std::function<void()>>& ops) {
  for (const auto& op : ops)
    for (int i = 0; i < warmup; ++i) op();
  const std::size_t n = ops.size(), iters = static_cast<std::size_t>(iterations);
  std::vector<double> times(n * iters);  // op-major
  for (std::size_t i = 0; i < iters; ++i)
    for (std::size_t turn = 0; turn < n; ++turn) {
      const std::size_t k = (i + turn) % n;
      FLEXPAR_CHECK_MPI(MPI_Barrier(comm));
      const double start = now();
      ops[k]();
      times[k * iters + i] = now() - start;
    }
  FLEXPAR_CHECK_MPI(
      MPI_Allreduce(MPI_IN_PLACE, times.data(), static_cast<int>(times.size()), MPI_DOUBLE, MPI_MAX, comm));
  std::vector<seconds> medians;
  for (std::size_t k = 0; k < n; ++k) {
    const auto first = times.begin() + static_cast<std::ptrdiff_t>(k * iters);
    std::nth_element(first, first + iterations / 2, first + iterations);
    medians.push_back(*(first + iterations / 2));
  }
  return medians;
}

/// Median over iterations of the slowest rank's time of `op` alone.
template <class Op>
seconds time_median(MPI_Comm comm, int warmup, int iterations, Op&& op) {
  return time_medians(comm, warmup, iterations, {std::function<void()>(std::forward<Op>(op))}).front();
}

/// The algorithm `automatic` picks for `c` on `bytes`.
algorithm automatic_choice(communicator& comm, collective c, std::size_t bytes) {
  switch (c) {
    case collective::allreduce: return flexpar::choose_allreduce(comm, bytes);
    case collective::reduce_scatter: return flexpar::choose_reduce_scatter(comm, bytes);
    case collective::allgather: return flexpar::choose_allgather(comm, bytes);
    case collective::broadcast: return flexpar::choose_broadcast(comm, bytes);
    case collective::reduce: return flexpar::choose_reduce(comm, bytes);
    case collective::alltoall: return flexpar::choose_alltoall(comm, bytes, true);  // the rows run in place
  }
  return algorithm::automatic;
}

using flexpar::bench::parse_size;

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

/// Single-thread references of rank 0 for `bytes`: a[i] += b[i] and memcpy, in bytes of `a` per second.
std::pair<double, double> local_references(std::size_t bytes, int iterations) {
  const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
  std::vector<float> a(n, 1.0f), b(n, 2.0f);
  std::vector<double> add_times, copy_times;
  for (int i = 0; i < iterations; ++i) {
    double start = now();
    flexpar::reduce_into(std::span(a), std::span<const float>(b), reduce_op::sum);
    add_times.push_back(now() - start);
    start = now();
    std::memcpy(b.data(), a.data(), n * sizeof(float));
    copy_times.push_back(now() - start);
  }
  std::sort(add_times.begin(), add_times.end());
  std::sort(copy_times.begin(), copy_times.end());
  const auto m = add_times.size() / 2;
  return {static_cast<double>(n * sizeof(float)) / add_times[m],
          static_cast<double>(n * sizeof(float)) / copy_times[m]};
}

/// Unidirectional bandwidth from rank 0 to rank 1 over the communicator's transport: a window of
/// isends of `bytes` each, acknowledged by one empty message.
double p2p_bandwidth(communicator& comm, std::size_t bytes, int iterations) {
  if (comm.size() < 2 || comm.rank() > 1) return 0;
  std::vector<std::byte> buffer(bytes);
  const int window = bytes >= (std::size_t{4} << 20) ? 2 : 8;
  const flexpar::tag_t tag = 7;
  auto once = [&] {
    std::vector<flexpar::request> requests;
    for (int w = 0; w < window; ++w)
      requests.push_back(comm.rank() == 0 ? comm.transport().isend(1, tag, buffer)
                                          : comm.transport().irecv(0, tag, buffer));
    flexpar::wait_all(requests, comm.default_deadline());
    if (comm.rank() == 0)
      comm.transport().recv(1, tag + 1, {}, comm.default_deadline());
    else
      comm.transport().send(0, tag + 1, {}, comm.default_deadline());
  };
  once();
  std::vector<double> times;
  for (int i = 0; i < iterations; ++i) {
    const double start = now();
    once();
    times.push_back(now() - start);
  }
  std::sort(times.begin(), times.end());
  return static_cast<double>(bytes) * window / times[times.size() / 2];
}

#if FLEXPAR_HAVE_CUDA
/// Runs the device collectives (in place for allreduce and broadcast; allgather and reduce_scatter out of
/// place into a second device buffer, compared in flexpar's in-place layout) and prints their rows.
/// Returns the sum over rows and ranks of #wrong.
long long run_gpu_mode(communicator& comm, const std::vector<collective>& ops, std::size_t min_bytes,
                       std::size_t max_bytes, int factor, int warmup, int iterations, bool check) {
  long long total_wrong = 0;
  namespace fc = flexpar::cuda;
  const int p = comm.size(), me = comm.rank();
  const int devices = fc::device_count();
  if (devices == 0) throw flexpar::usage_error("--gpu: no CUDA device is present");
  const int device = comm.topology().local_rank() % devices;
  const fc::device_guard on(device);
  fc::device_options options;  // NCCL puts one rank per GPU: ranks that share one run the staged path only
  options.use_nccl = devices >= comm.topology().local_size();
  fc::device_communicator gpu(comm, device, options);
  fc::stream stream;
  if (me == 0) {
    std::printf(
        "# flexpar_perf --gpu: %d ranks, device %d of %d on rank 0, paths: %s staged; reference: MPICH on host "
        "buffers\n",
        p, device, devices, gpu.has_nccl() ? "nccl," : "");
    std::printf("%12s %12s %-15s %-17s %11s %11s %11s %7s %8s\n", "size(B)", "count", "collective", "path", "time(us)",
                "algbw(GB/s)", "busbw(GB/s)", "#wrong", "vs_mpi");
  }
  const std::size_t max_count = max_bytes / sizeof(float) + static_cast<std::size_t>(p);
  std::vector<float> buffer(max_count), scratch(max_count);
  fc::device_buffer<float> data(max_count), other(max_count);
  for (collective c : ops) {
    if (c == collective::reduce || c == collective::alltoall) continue;  // not in the device API
    for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= static_cast<std::size_t>(factor)) {
      const std::size_t count = std::max<std::size_t>(static_cast<std::size_t>(p), bytes / sizeof(float)) /
                                static_cast<std::size_t>(p) * static_cast<std::size_t>(p);
      const std::size_t block = count / static_cast<std::size_t>(p);
      run_setup s{comm, c, count, buffer, scratch};
      auto upload = [&] {
        fill(s);
        if (c == collective::allgather)  // the input is my block
          fc::copy_async(data.span().first(block),
                         std::span<const float>(buffer.data() + block * static_cast<std::size_t>(me), block), stream);
        else
          fc::copy_async(data.span().first(count), std::span<const float>(buffer.data(), count), stream);
        fc::synchronize(stream, std::chrono::seconds(60), "upload");
      };
      auto download = [&] {  // into flexpar's in-place layout
        if (c == collective::allgather) {
          fc::copy_async(std::span<float>(buffer.data(), count), fc::device_span<const float>(other.data(), count),
                         stream);
        } else if (c == collective::reduce_scatter) {
          fc::copy_async(std::span<float>(buffer.data() + block * static_cast<std::size_t>(me), block),
                         fc::device_span<const float>(other.data(), block), stream);
        } else {
          fc::copy_async(std::span<float>(buffer.data(), count), fc::device_span<const float>(data.data(), count),
                         stream);
        }
        fc::synchronize(stream, std::chrono::seconds(60), "download");
      };
      auto call = [&](fc::device_path path) {
        switch (c) {
          case collective::allreduce: gpu.allreduce(data.span().first(count), reduce_op::sum, stream, path); break;
          case collective::allgather:
            gpu.allgather(fc::device_span<const float>(data.data(), block), other.span().first(count), stream, path);
            break;
          case collective::reduce_scatter:
            gpu.reduce_scatter(fc::device_span<const float>(data.data(), count), other.span().first(block),
                               reduce_op::sum, stream, path);
            break;
          default: gpu.broadcast(data.span().first(count), 0, stream, path); break;
        }
        gpu.synchronize(stream, "flexpar_perf --gpu");
      };
      struct row {
        std::string path;
        double time;
        long long wrong;
      };
      std::vector<row> rows;
      std::vector<fc::device_path> paths{fc::device_path::staged};
      if (gpu.has_nccl()) paths.insert(paths.begin(), fc::device_path::nccl);
      for (fc::device_path path : paths) {
        upload();
        const double t = time_median(comm.mpi_comm(), warmup, iterations, [&] { call(path); });
        long long wrong = 0;
        if (check) {
          upload();
          call(path);
          download();
          wrong = count_wrong(s);
          FLEXPAR_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, comm.mpi_comm()));
        }
        rows.push_back({std::string(fc::name_of(path)), t, wrong});
      }
      fill(s);
      const double mpi_time = time_median(comm.mpi_comm(), warmup, iterations, [&] { run_mpi(s); });
      long long mpi_wrong = 0;
      if (check) {  // one more call of MPICH's collective on a fresh host buffer, verified like the others
        fill(s);
        run_mpi(s);
        mpi_wrong = count_wrong(s);
        FLEXPAR_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &mpi_wrong, 1, MPI_LONG_LONG, MPI_SUM, comm.mpi_comm()));
      }
      rows.push_back({"mpi(host)", mpi_time, mpi_wrong});
      for (const row& r : rows) total_wrong += r.wrong;
      // the reference of the same run: a device-to-device copy of the same bytes on rank 0's GPU
      const double copy = time_median(comm.mpi_comm(), warmup, iterations, [&] {
        fc::copy_async(other.span().first(count), fc::device_span<const float>(data.data(), count), stream);
        fc::synchronize(stream, std::chrono::seconds(60), "copy");
      });
      if (me == 0) {
        const double size = static_cast<double>(count * sizeof(float));
        for (const row& r : rows) {
          const double algbw = size / r.time / 1e9, busbw = algbw * bus_factor(c, p);
          // MPICH's time over this path's: the ratio of their busbw where that is defined, and still
          // defined on one rank, where busbw is 0 for allgather and reduce_scatter
          char ratio[16] = "";
          if (r.path != "mpi(host)") std::snprintf(ratio, sizeof ratio, "%.2fx", mpi_time / r.time);
          std::printf("%12zu %12zu %-15s %-17s %11.1f %11.2f %11.2f %7lld %8s\n", count * sizeof(float), count,
                      name_of(c).c_str(), r.path.c_str(), r.time * 1e6, algbw, busbw, r.wrong, ratio);
        }
        std::printf("%12zu %12zu %-15s %-17s %11.1f %11.2f\n", count * sizeof(float), count, "reference", "d2d copy",
                    copy * 1e6, size / copy / 1e9);
      }
    }
  }
  return total_wrong;
}
#endif

}  // namespace

/// "allreduce, reduce_scatter, ..." (the keys of `names`).
template <class Map>
std::string known(const Map& names) {
  std::string text;
  for (const auto& [name, value] : names) text.append(text.empty() ? "" : ", ").append(name);
  return text;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  // Errors of the command line are the same on every rank: rank 0 alone says them, once per job.
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  CLI::App app{"flexpar_perf: flexpar collectives vs MPI's, nccl-tests style"};
  app.option_defaults()->always_capture_default();  // --help shows every default
  std::string min_text = "4K", max_text = "64M", ops_text = "allreduce", algorithms_text;
  int factor = 2, iterations = 20, warmup = 5, check = 1;
  app.add_option("-b,--minbytes", min_text, "smallest size (bytes; K, M, G suffixes)");
  app.add_option("-e,--maxbytes", max_text, "largest size");
  app.add_option("-f,--stepfactor", factor, "multiply the size by this between rows")->check(CLI::Range(2, 1024));
  app.add_option("-n,--iters", iterations, "timed iterations per row")->check(CLI::Range(1, 100000));
  app.add_option("-w,--warmup_iters", warmup, "untimed iterations first")->check(CLI::Range(0, 100000));
  app.add_option("-c,--check", check, "1: verify each row's result (#wrong)")->check(CLI::Range(0, 1));
  app.add_option("-o,--ops", ops_text,
                 "comma-separated: allreduce,reduce_scatter,allgather,broadcast,reduce,alltoall, or all");
  app.add_option("-a,--algorithms", algorithms_text,
                 "comma-separated flexpar algorithms (default: every one the op has)");
  bool gpu_mode = false;
  app.add_flag("--gpu", gpu_mode, "device buffers: flexpar's device paths (nccl, staged) vs MPICH on host buffers");
  int exit_code = 0;
  std::vector<collective> ops;
  std::vector<algorithm> asked;
  std::size_t min_bytes = 0, max_bytes = 0;
  try {
    app.parse(argc, argv);
    for (const auto& name :
         split_list(ops_text == "all" ? "allreduce,reduce_scatter,allgather,broadcast,reduce,alltoall" : ops_text)) {
      if (!collective_names.count(name))
        throw CLI::ValidationError(
            "--ops", "unknown collective '" + name + "' (known: " + known(collective_names) + ", or all)");
      ops.push_back(collective_names.at(name));
    }
    for (const auto& name : split_list(algorithms_text)) {
      if (!algorithm_names.count(name))
        throw CLI::ValidationError("--algorithms",
                                   "unknown algorithm '" + name + "' (known: " + known(algorithm_names) + ")");
      asked.push_back(algorithm_names.at(name));
    }
    min_bytes = parse_size(min_text);
    max_bytes = parse_size(max_text);
    if (min_bytes > max_bytes)
      throw CLI::ValidationError("-b/-e", "the smallest size " + min_text + " is larger than the largest " + max_text +
                                              ": no rows to measure");
  } catch (const CLI::ParseError& e) {
    std::ostringstream quiet;  // ranks other than 0 print nothing
    exit_code = world_rank == 0 ? app.exit(e) : app.exit(e, quiet, quiet);
    MPI_Finalize();
    return exit_code;
  }

  try {
    communicator comm = communicator::from_mpi(MPI_COMM_WORLD);
    const int p = comm.size(), me = comm.rank();
    long long total_wrong = 0;  // over every row and rank: the exit status is 1 unless it is 0
    bool gpu_mode_done = false;
    if (gpu_mode) {
#if FLEXPAR_HAVE_CUDA
      total_wrong = run_gpu_mode(comm, ops, min_bytes, max_bytes, factor, warmup, iterations, check != 0);
      std::fflush(stdout);
      gpu_mode_done = true;
#else
      throw flexpar::usage_error("--gpu: this build of flexpar has no CUDA (FLEXPAR_WITH_CUDA)");
#endif
    }
    if (!gpu_mode_done) {
      const flexpar::cost_params& machine = flexpar::machine_of(comm);

      if (me == 0) {
        std::printf(
            "# flexpar_perf: %d ranks on %d node(s), transport %s, f32 sum, in place, %d iterations (median of the "
            "slowest rank), %d warm-up\n",
            p, comm.topology().node_count(), std::string(flexpar::name_of(comm.transport().kind())).c_str(), iterations,
            warmup);
        std::printf(
            "# machine for `automatic` (fitted from timed calls, collective/automatic.hpp): alpha %.2f us, beta %.2f "
            "GB/s, gamma %.2f GB/s, shm_alpha %.2f us, copy %.2f GB/s\n#\n",
            machine.alpha * 1e6, 1e-9 / machine.beta, 1e-9 / machine.gamma, machine.shm_alpha * 1e6,
            1e-9 / machine.copy_beta);
        std::printf("%12s %12s %5s %5s %-15s %-21s %11s %11s %11s %7s %8s %8s\n", "size(B)", "count", "type", "redop",
                    "collective", "algorithm", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "vs_mpi", "vs_best");
      }
      std::vector<float> buffer(max_bytes / sizeof(float) + static_cast<std::size_t>(p)), scratch(buffer.size());
      struct verdict {  // automatic against the fastest explicit algorithm, one per row that has both
        std::string op;
        std::size_t bytes;
        std::string chose, fastest;
        double ratio;
      };
      std::vector<verdict> verdicts;
      for (collective c : ops) {
        for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= static_cast<std::size_t>(factor)) {
          // whole blocks of p elements, as nccl-tests rounds
          const std::size_t count = std::max<std::size_t>(static_cast<std::size_t>(p), bytes / sizeof(float)) /
                                    static_cast<std::size_t>(p) * static_cast<std::size_t>(p);
          const double size = static_cast<double>(count * sizeof(float));
          run_setup s{comm, c, count, buffer, scratch};
          struct row {
            std::string algorithm;
            std::function<void()> op;
            double time = 0;
            long long wrong = 0;
          };
          std::vector<row> rows;
          std::string chose;  // automatic's pick, "" when automatic is not measured
          for (algorithm a : algorithms_for(c, asked, comm)) {
            std::string label(flexpar::name_of(a));
            if (a == algorithm::automatic) {
              chose = flexpar::name_of(automatic_choice(comm, c, count * sizeof(float)));
              label = "auto:" + chose;
            }
            rows.push_back({label, [&s, a] { run_flexpar(s, a); }});
          }
          rows.push_back({"mpi", [&s] { run_mpi(s); }});
          fill(s);
          std::vector<std::function<void()>> ops;
          for (const row& r : rows) ops.push_back(r.op);
          const std::vector<seconds> medians = time_medians(comm.mpi_comm(), warmup, iterations, ops);
          for (std::size_t k = 0; k < rows.size(); ++k) {
            rows[k].time = medians[k];
            if (check) {
              fill(s);
              rows[k].op();
              long long wrong = count_wrong(s);
              FLEXPAR_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, comm.mpi_comm()));
              rows[k].wrong = wrong;
              total_wrong += wrong;
            }
          }
          // automatic against the fastest algorithm of the row (the explicit ones, not mpi)
          double best = 0, automatic_time = 0;
          std::string fastest;
          for (const row& r : rows) {
            if (r.algorithm == "mpi") continue;
            if (r.algorithm.starts_with("auto:")) {
              automatic_time = r.time;
            } else if (fastest.empty() || r.time < best) {
              best = r.time;
              fastest = r.algorithm;
            }
          }
          const bool compared = !chose.empty() && !fastest.empty();
          if (compared) verdicts.push_back({name_of(c), count * sizeof(float), chose, fastest, automatic_time / best});
          if (me == 0) {
            const double mpi_time = rows.back().time;
            for (const row& r : rows) {
              const double algbw = size / r.time / 1e9, busbw = algbw * bus_factor(c, p);
              char ratio[16] = "", vs_best[16] = "";
              if (r.algorithm != "mpi") std::snprintf(ratio, sizeof ratio, "%.2fx", mpi_time / r.time);
              if (compared && r.algorithm.starts_with("auto:"))
                std::snprintf(vs_best, sizeof vs_best, "%.2f", automatic_time / best);
              std::printf("%12zu %12zu %5s %5s %-15s %-21s %11.1f %11.2f %11.2f %7lld %8s %8s\n", count * sizeof(float),
                          count, "f32", "sum", name_of(c).c_str(), r.algorithm.c_str(), r.time * 1e6, algbw, busbw,
                          r.wrong, ratio, vs_best);
            }
          }
        }
      }
      if (me == 0 && !verdicts.empty()) {
        std::size_t picked = 0, within = 0;
        const verdict* worst = &verdicts.front();
        for (const verdict& v : verdicts) {
          picked += v.chose == v.fastest ? 1 : 0;
          within += v.ratio <= 1.05 ? 1 : 0;
          if (v.ratio > worst->ratio) worst = &v;
        }
        std::printf(
            "#\n# automatic: picked the fastest algorithm of its row at %zu of %zu sizes; within 5%% of its time at "
            "%zu of %zu; worst %s %zu B: auto:%s %.2fx the time of %s\n",
            picked, verdicts.size(), within, verdicts.size(), worst->op.c_str(), worst->bytes, worst->chose.c_str(),
            worst->ratio, worst->fastest.c_str());
      }

      // references of the same run
      if (me == 0)
        std::printf("#\n# references: %12s %16s %16s %16s\n", "size(B)", "a+=b(GB/s)", "memcpy(GB/s)",
                    "p2p 0->1(GB/s)");
      for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= static_cast<std::size_t>(factor)) {
        const double p2p = p2p_bandwidth(comm, bytes, std::max(3, iterations / 2));
        if (me == 0) {
          const auto [add, copy] = local_references(bytes, std::max(3, iterations / 2));
          std::printf("# references: %12zu %16.2f %16.2f %16.2f\n", bytes, add / 1e9, copy / 1e9, p2p / 1e9);
        }
        FLEXPAR_CHECK_MPI(MPI_Barrier(comm.mpi_comm()));
      }
    }
    if (check && me == 0)
      std::printf("# verified: one more call per row against the exact answer, %lld wrong in all\n", total_wrong);
    if (total_wrong != 0) exit_code = 1;
    std::fflush(stdout);
  } catch (const flexpar::usage_error& e) {
    if (world_rank == 0) std::fprintf(stderr, "flexpar_perf: %s\n", e.what());  // the same on every rank: once
    exit_code = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flexpar_perf: %s\n", e.what());  // names its rank: each rank's own
    exit_code = 1;
  }
  MPI_Finalize();
  return exit_code;
}
