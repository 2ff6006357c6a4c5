// flexpar_checkpoint_bench — a checkpoint's save next to a raw sequential write of the same bytes to
// the same disk, measured in one run, and the load of it, resharded.
//
// Each rank holds its shards of --tensors f32 tensors [rows, --cols] laid out S(0) over the world,
// --bytes in all. Every repeat runs the three writes in a rotated order (repeat i starts at variant
// i mod 3, so that a slow spell of the machine or the page cache one leaves falls on all alike), then
// the loads of the save's checkpoint:
//   raw        every rank writes the bytes its save writes (its shards, from the same memory) to a new
//              file in the same directory, in writes of --chunk bytes, then fsync and close: the disk's
//              sequential write bandwidth as a program without checkpoints gets it
//   save       checkpoint::save into a fresh directory (the previous one removed untimed)
//   async      async_saver::save: the call (what the training step waits for: the snapshot), and
//              until wait() returns
//   load       checkpoint::load of the save's checkpoint as S(0) on every rank (the saved layout), and
//              resharded as S(1) on the first --load-ranks ranks; warm (the files in the page cache, as
//              right after a save) and cold (posix_fadvise DONTNEED on every file first: read from disk)
// Each sample is the slowest rank's time; the table prints the medians over --repeat, in MB/s of the
// logical bytes (1 MB = 10^6 bytes), and save / raw. After the timing one more load (S(1) on
// --load-ranks ranks) is compared element by element with the values saved: the exit status is 1 when
// one differs.
//
//   mpiexec -n 2 flexpar_checkpoint_bench [--bytes 1G] [--tensors 8] [--cols 1024] [--repeat 5]
//                                         [--load-ranks P] [--chunk 4M] [--dir DIR]
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <flexpar/checkpoint/checkpoint.hpp>
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "bench_cli.hpp"
#include "bench_timing.hpp"

namespace {

using flexpar::sbp::global_tensor;
using flexpar::sbp::placement;
using flexpar::sbp::shape_t;
using flexpar::sbp::split;
namespace checkpoint = flexpar::checkpoint;

/// The saved value of element `index` (row-major in the logical tensor) of tensor `t`: integers
/// below 2^12, exact in f32, different between neighbours and between tensors.
float value_of(std::size_t t, std::size_t index) { return static_cast<float>((index * 7 + t * 131) % 4093); }

/// Seconds `f` took on the slowest rank (every rank starts together).
double slowest_seconds(const std::function<void()>& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  f();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), slowest = 0;
  FLEXPAR_CHECK_MPI(MPI_Allreduce(&s, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return slowest;
}

/// Removes what the previous run of a variant wrote (a rank's own file when `every_rank`, otherwise
/// a directory rank 0 removes), untimed, right before the variant runs again; every rank waits for it.
/// Every variant then starts from the same state: the pages of its own previous output just freed.
/// (On the VM of doc/checkpoint.md, writing into pages the kernel had not used before was 2-3x slower
/// than into freed ones: a raw write that ran after a delete of someone else's output measured the
/// page cache, not the disk.)
void remove_previous(int rank, const std::filesystem::path& path, bool every_rank) {
  if (every_rank || rank == 0) std::filesystem::remove_all(path);
  MPI_Barrier(MPI_COMM_WORLD);
}

/// Writes `shards` to `path` in writes of `chunk` bytes, then fsync and close: the raw baseline.
void raw_write(const std::filesystem::path& path, const std::vector<std::span<const std::byte>>& shards,
               std::size_t chunk) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path.string());
  for (std::span<const std::byte> s : shards)
    for (std::size_t at = 0; at < s.size();) {
      const ssize_t n = ::write(fd, s.data() + at, std::min(chunk, s.size() - at));
      if (n <= 0) throw std::runtime_error("write to " + path.string() + " failed");
      at += static_cast<std::size_t>(n);
    }
  if (::fsync(fd) != 0 || ::close(fd) != 0) throw std::runtime_error("fsync of " + path.string() + " failed");
}

/// Drops the page cache's copy of every file in `dir` (they are synced: clean pages), on rank 0.
void drop_cached(int rank, const std::filesystem::path& dir) {
  if (rank == 0)
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  MPI_Barrier(MPI_COMM_WORLD);
}

/// One row of the table: what was timed, its samples (seconds), and which columns it has.
struct row {
  std::string what;
  std::vector<double> seconds;
  bool bandwidth = true;  // MB/s of the logical bytes
  bool writes = false;    // and its bandwidth over the raw write's
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // the async saver's thread calls MPI
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CLI::App app{"flexpar_checkpoint_bench: a checkpoint's save next to a raw write of the same bytes, and its load"};
  std::string bytes_text = "1G", chunk_text = "4M", dir_text;
  std::size_t tensors = 8, cols = 1024;
  int repeat = 5, load_ranks = size;
  app.add_option("--bytes", bytes_text, "logical bytes of all the tensors together (K/M/G)");
  app.add_option("--tensors", tensors, "f32 tensors [rows, cols], each S(0) over the ranks")
      ->check(CLI::PositiveNumber);
  app.add_option("--cols", cols, "columns of each tensor")->check(CLI::PositiveNumber);
  app.add_option("--repeat", repeat, "timed runs of every row; the table prints medians")->check(CLI::PositiveNumber);
  app.add_option("--load-ranks", load_ranks, "ranks the resharded load (S(1)) runs on: the first M (default: all)")
      ->check(CLI::Range(1, size));
  app.add_option("--chunk", chunk_text, "save_options::chunk_bytes, and the raw write's write() size (K/M/G)");
  app.add_option("--dir", dir_text, "where to write (default: a directory under the system's temporary directory)");
  if (const auto done = flexpar::bench::parse_or_finalize(app, argc, argv, rank)) return *done;
  int status = 0;
  try {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, flexpar::config::from_environment(),
                                                                 flexpar::thread_need::multiple);
    const std::size_t total = flexpar::bench::parse_size(bytes_text), chunk = flexpar::bench::parse_size(chunk_text);
    const std::size_t rows = total / tensors / cols / sizeof(float);
    if (rows == 0) throw std::runtime_error("--bytes is too small for --tensors x --cols f32 columns");
    const shape_t shape{rows, cols};
    const std::size_t logical_bytes = tensors * rows * cols * sizeof(float);
    // one directory for every rank: rank 0's process id names the default
    long long pid = ::getpid();
    FLEXPAR_CHECK_MPI(MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD));
    const std::filesystem::path base =
        dir_text.empty() ? std::filesystem::temp_directory_path() / ("flexpar_checkpoint_bench_" + std::to_string(pid))
                         : std::filesystem::path(dir_text) / ("flexpar_checkpoint_bench_" + std::to_string(pid));
    if (rank == 0) std::filesystem::create_directories(base);
    MPI_Barrier(MPI_COMM_WORLD);

    // the model: my rows of every tensor, made in place (never the whole tensor on one rank)
    placement<1> mesh(comm, {size});
    std::vector<std::unique_ptr<global_tensor<float, split<0>>>> model;
    for (std::size_t t = 0; t < tensors; ++t) {
      const flexpar::sbp::box mine =
          flexpar::sbp::shard_box(shape, flexpar::sbp::nd_of<split<0>>::value, mesh.shape(), mesh.coords());
      flexpar::aligned_vector<float> local(mine.elements());
      for (std::size_t i = 0; i < local.size(); ++i) local[i] = value_of(t, mine.offset[0] * cols + i);
      model.push_back(std::make_unique<global_tensor<float, split<0>>>(
          global_tensor<float, split<0>>::from_local(mesh, shape, std::move(local))));
    }
    checkpoint::state saved;
    std::vector<std::span<const std::byte>> shards;
    for (std::size_t t = 0; t < tensors; ++t) {
      saved.add("layer" + std::to_string(t) + ".weight", *model[t]);
      shards.push_back(std::as_bytes(model[t]->to_local()));
    }
    const checkpoint::save_options options{.chunk_bytes = chunk};

    // the load targets: S(0) on every rank, S(1) on the first load_ranks
    std::vector<int> first_ranks;
    for (int r = 0; r < load_ranks; ++r) first_ranks.push_back(r);
    placement<1> fewer(comm, {load_ranks}, first_ranks);
    std::vector<std::unique_ptr<global_tensor<float, split<0>>>> same;
    std::vector<std::unique_ptr<global_tensor<float, split<1>>>> resharded;
    checkpoint::state as_saved, as_resharded;
    for (std::size_t t = 0; t < tensors; ++t) {
      const std::string name = "layer" + std::to_string(t) + ".weight";
      const std::size_t n0 =
          flexpar::sbp::shard_box(shape, flexpar::sbp::nd_of<split<0>>::value, mesh.shape(), mesh.coords()).elements();
      same.push_back(std::make_unique<global_tensor<float, split<0>>>(
          global_tensor<float, split<0>>::from_local(mesh, shape, flexpar::aligned_vector<float>(n0))));
      std::size_t n1 = 0;
      if (fewer.contains_me())
        n1 = flexpar::sbp::shard_box(shape, flexpar::sbp::nd_of<split<1>>::value, fewer.shape(), fewer.coords())
                 .elements();
      resharded.push_back(std::make_unique<global_tensor<float, split<1>>>(
          global_tensor<float, split<1>>::from_local(fewer, shape, flexpar::aligned_vector<float>(n1))));
      as_saved.add(name, *same.back());
      as_resharded.add(name, *resharded.back());
    }

    const std::filesystem::path raw_file = base / ("raw_" + std::to_string(rank) + ".bin");
    const std::filesystem::path save_dir = base / "save", async_dir = base / "async";
    checkpoint::async_saver saver(comm);
    const std::string reshard = "load S(1) on " + std::to_string(load_ranks);
    std::vector<row> rows_out{{"raw write+fsync", {}, true, true},
                              {"save", {}, true, true},
                              {"async save: the call", {}, false},
                              {"async save: to wait()", {}, true, true},
                              {"load S(0), warm", {}},
                              {"load S(0), cold", {}},
                              {reshard + ", warm", {}},
                              {reshard + ", cold", {}}};
    for (int rep = 0; rep < repeat; ++rep) {
      for (int k = 0; k < 3; ++k) switch ((k + rep) % 3) {
          case 0:
            remove_previous(rank, raw_file, true);
            rows_out[0].seconds.push_back(slowest_seconds([&] { raw_write(raw_file, shards, chunk); }));
            break;
          case 1:
            remove_previous(rank, save_dir, false);
            rows_out[1].seconds.push_back(slowest_seconds([&] { checkpoint::save(comm, save_dir, saved, options); }));
            break;
          default: {
            remove_previous(rank, async_dir, false);
            double call = 0;
            rows_out[3].seconds.push_back(slowest_seconds([&] {
              const auto start = std::chrono::steady_clock::now();
              checkpoint::save_handle h = saver.save(async_dir, saved, options);
              call = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
              h.wait();
            }));
            FLEXPAR_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &call, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
            rows_out[2].seconds.push_back(call);
          }
        }
      rows_out[4].seconds.push_back(slowest_seconds([&] { checkpoint::load(comm, save_dir, as_saved); }));
      drop_cached(rank, save_dir);
      rows_out[5].seconds.push_back(slowest_seconds([&] { checkpoint::load(comm, save_dir, as_saved); }));
      rows_out[6].seconds.push_back(slowest_seconds([&] { checkpoint::load(comm, save_dir, as_resharded); }));
      drop_cached(rank, save_dir);
      rows_out[7].seconds.push_back(slowest_seconds([&] { checkpoint::load(comm, save_dir, as_resharded); }));
    }

    // one more load, untimed, element by element against the values saved (cold: from the disk)
    for (auto& t : resharded)
      for (float& x : t->to_local()) x = -1;
    drop_cached(rank, async_dir);
    checkpoint::load(comm, async_dir, as_resharded);
    long long wrong = 0;
    if (fewer.contains_me()) {
      const flexpar::sbp::box mine =
          flexpar::sbp::shard_box(shape, flexpar::sbp::nd_of<split<1>>::value, fewer.shape(), fewer.coords());
      for (std::size_t t = 0; t < tensors; ++t) {
        const std::span<const float> got = resharded[t]->to_local();
        for (std::size_t r = 0; r < mine.extent[0]; ++r)
          for (std::size_t c = 0; c < mine.extent[1]; ++c)
            wrong += got[r * mine.extent[1] + c] != value_of(t, r * cols + mine.offset[1] + c);
      }
    }
    FLEXPAR_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));

    if (rank == 0) {
      std::printf(
          "# flexpar_checkpoint_bench: %d ranks, %zu f32 tensors [%zu, %zu] S(0), %zu bytes in all, chunks of %zu B, "
          "in %s; median of %d, slowest rank\n",
          size, tensors, rows, cols, logical_bytes, chunk, base.c_str(), repeat);
      std::printf("%-26s %12s %11s %17s %9s %7s\n", "what", "bytes", "median(ms)", "range(ms)", "MB/s", "/raw");
      const double raw = flexpar::bench::median_in_place(rows_out[0].seconds);
      for (row& r : rows_out) {
        const double s = flexpar::bench::median_in_place(r.seconds);  // sorts: front() and back() are the range
        char rate[32] = "-", ratio[32] = "-", range[48];
        if (r.bandwidth) std::snprintf(rate, sizeof rate, "%.1f", static_cast<double>(logical_bytes) / s / 1e6);
        if (r.writes) std::snprintf(ratio, sizeof ratio, "%.2fx", raw / s);
        std::snprintf(range, sizeof range, "%.1f-%.1f", r.seconds.front() * 1e3, r.seconds.back() * 1e3);
        std::printf("%-26s %12zu %11.1f %17s %9s %7s\n", r.what.c_str(), logical_bytes, s * 1e3, range, rate, ratio);
      }
      std::printf("# verified: one more load (S(1) on %d ranks, cold) against the values saved, %lld wrong\n",
                  load_ranks, wrong);
    }
    status = wrong == 0 ? 0 : 1;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) std::filesystem::remove_all(base);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flexpar_checkpoint_bench: %s\n", e.what());
    status = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
