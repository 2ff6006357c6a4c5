// flexpar_p2p — point-to-point bandwidth and latency of flexpar's transports next to the raw
// libraries they stand on, measured in the same run:
//
//   raw-mpi      MPI_Isend/MPI_Irecv + MPI_Waitall on a duplicate of MPI_COMM_WORLD
//   flexpar-mpi  flexpar's MPI transport (same calls behind the type-erased interface)
//   raw-ucx      ucp_tag_send_nbx/ucp_tag_recv_nbx, busy-polling the worker
//   flexpar-ucx  flexpar's UCX transport (spins, then sleeps on the worker's event fd)
//
// Ping-pong between ranks 0 and 1 (other ranks wait): one-way time = round trip / 2, median over
// the iterations of a row; bandwidth = size / one-way time. #wrong counts bytes of the last
// message received that differ from what was sent.
//
//   mpiexec -n 2 flexpar_p2p -b 4K -e 64M -f 4
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/transport/mpi.hpp>
#include <flexpar/transport/ucx.hpp>
#include <flexpar/version.hpp>
#include "bench_cli.hpp"

#if FLEXPAR_HAVE_UCX
#include "p2p_raw_ucx.hpp"
#endif

namespace {

using flexpar::deadline_after;

using flexpar::bench::parse_size;

/// One round trip of `size` bytes between ranks 0 and 1: rank 0 sends first, rank 1 echoes.
using round_trip = std::function<void(std::span<const std::byte> out, std::span<std::byte> in)>;

struct row {
  double one_way_us;
  double gbps;
  std::size_t wrong;
};

row measure(int rank, const round_trip& trip, std::size_t size, int iterations, int warmup) {
  std::vector<std::byte> out(size), in(size);
  for (std::size_t i = 0; i < size; ++i) out[i] = static_cast<std::byte>((i * 7 + 3) & 0xff);
  std::vector<double> samples;
  samples.reserve(static_cast<std::size_t>(iterations));
  for (int i = 0; i < warmup + iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    trip(out, in);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (i >= warmup) samples.push_back(us / 2);
  }
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2), samples.end());
  const double median = samples[samples.size() / 2];
  std::size_t wrong = 0;
  if (rank <= 1)
    for (std::size_t i = 0; i < size; ++i) wrong += in[i] != out[i];
  return {median, static_cast<double>(size) / (median * 1e3), wrong};
}

round_trip transport_trip(flexpar::transport& t) {
  return [&t](std::span<const std::byte> out, std::span<std::byte> in) {
    const auto until = deadline_after(std::chrono::seconds(60));
    if (t.rank() == 0) {
      flexpar::request r = t.irecv(1, 1, in);
      t.send(1, 0, out, until);
      r.wait(until);
    } else if (t.rank() == 1) {
      t.recv(0, 0, in, until);
      t.send(0, 1, in, until);
    }
  };
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  CLI::App app{"flexpar_p2p: point-to-point bandwidth of flexpar's transports vs raw MPI and UCX"};
  std::string begin = "4K", end = "64M";
  int factor = 4, iterations = 0;
  std::vector<std::string> which{"raw-mpi", "flexpar-mpi", "raw-ucx", "flexpar-ucx"};
  app.add_option("-b,--minbytes", begin, "smallest message (suffix K, M, G)");
  app.add_option("-e,--maxbytes", end, "largest message");
  app.add_option("-f,--stepfactor", factor, "multiply the size by this between rows")->check(CLI::Range(2, 1 << 20));
  app.add_option("-n,--iters", iterations, "round trips per row (default: by size, 10..1000)");
  app.add_option("-t,--transports", which, "which of raw-mpi flexpar-mpi raw-ucx flexpar-ucx");
  if (const auto done = flexpar::bench::parse_or_finalize(app, argc, argv, rank)) return *done;
  if (size < 2) {
    if (rank == 0) std::fprintf(stderr, "flexpar_p2p needs at least 2 ranks (mpiexec -n 2 ...)\n");
    MPI_Finalize();
    return 2;
  }

  int status = 0;
  try {
    flexpar::config cfg = flexpar::config::from_environment();
    MPI_Comm raw_comm = MPI_COMM_NULL;
    FLEXPAR_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &raw_comm));
    std::unique_ptr<flexpar::transport> mpi_t = flexpar::make_mpi_transport(MPI_COMM_WORLD, cfg);
    std::unique_ptr<flexpar::transport> ucx_t;
#if FLEXPAR_HAVE_UCX
    std::unique_ptr<flexpar::bench::raw_ucx_pair> raw_ucx =
        std::make_unique<flexpar::bench::raw_ucx_pair>(MPI_COMM_WORLD);
    ucx_t = flexpar::make_ucx_transport(MPI_COMM_WORLD, cfg);
#endif

    std::vector<std::pair<std::string, round_trip>> trips;
    for (const std::string& name : which) {
      if (name == "raw-mpi") {
        trips.emplace_back(name, [&](std::span<const std::byte> out, std::span<std::byte> in) {
          MPI_Request requests[2];
          const auto n = static_cast<MPI_Count>(out.size());
          if (rank == 0) {
            MPI_Irecv_c(in.data(), n, MPI_BYTE, 1, 1, raw_comm, &requests[0]);
            MPI_Isend_c(out.data(), n, MPI_BYTE, 1, 0, raw_comm, &requests[1]);
            MPI_Waitall(2, requests, MPI_STATUSES_IGNORE);
          } else if (rank == 1) {
            MPI_Recv_c(in.data(), n, MPI_BYTE, 0, 0, raw_comm, MPI_STATUS_IGNORE);
            MPI_Send_c(in.data(), n, MPI_BYTE, 0, 1, raw_comm);
          }
        });
      } else if (name == "flexpar-mpi") {
        trips.emplace_back(name, transport_trip(*mpi_t));
#if FLEXPAR_HAVE_UCX
      } else if (name == "raw-ucx") {
        trips.emplace_back(name, [&](std::span<const std::byte> out, std::span<std::byte> in) {
          if (rank == 0) {
            raw_ucx->send(1, 0, out.data(), out.size());
            raw_ucx->recv(1, in.data(), in.size());
          } else if (rank == 1) {
            raw_ucx->recv(0, in.data(), in.size());
            raw_ucx->send(0, 1, in.data(), in.size());
          }
        });
      } else if (name == "flexpar-ucx") {
        trips.emplace_back(name, transport_trip(*ucx_t));
#endif
      } else if (rank == 0) {
        std::fprintf(stderr, "flexpar_p2p: transport \"%s\" is unknown or not built; skipped\n", name.c_str());
      }
    }

    if (rank == 0) {
      const char* tls =
          std::getenv("FLEXPAR_P2P_UCX_TLS") ? std::getenv("FLEXPAR_P2P_UCX_TLS") : std::getenv("UCX_TLS");
      std::printf("# flexpar_p2p %s: ping-pong between ranks 0 and 1 of %d; one-way time = round trip / 2, median\n",
                  FLEXPAR_VERSION_STRING, size);
      std::printf(
          "# UCX transports (FLEXPAR_P2P_UCX_TLS, else UCX_TLS): %s; 'vs raw' = flexpar's bandwidth / the raw "
          "library's in the same run\n",
          tls ? tls : "(unset)");
      std::printf("#%11s %12s %6s %11s %9s %7s %7s\n", "size", "transport", "iters", "time(us)", "GB/s", "vs raw",
                  "#wrong");
    }
    for (std::size_t bytes = parse_size(begin); bytes <= parse_size(end); bytes *= static_cast<std::size_t>(factor)) {
      const int iters = iterations > 0 ? iterations
                                       : static_cast<int>(std::clamp<std::size_t>(
                                             (std::size_t{256} << 20) / std::max<std::size_t>(bytes, 1), 10, 1000));
      double raw_mpi = 0, raw_ucx_bw = 0;
      for (auto& [name, trip] : trips) {
        FLEXPAR_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
        const row r = measure(rank, trip, bytes, iters, std::max(2, iters / 10));
        if (name == "raw-mpi") raw_mpi = r.gbps;
        if (name == "raw-ucx") raw_ucx_bw = r.gbps;
        const double raw = name.ends_with("mpi") ? raw_mpi : raw_ucx_bw;
        if (rank == 0) {
          char ratio[16] = "     -";
          if (name.starts_with("flexpar") && raw > 0) std::snprintf(ratio, sizeof ratio, "%7.2f", r.gbps / raw);
          std::printf("%12zu %12s %6d %11.2f %9.3f %7s %7zu\n", bytes, name.c_str(), iters, r.one_way_us, r.gbps, ratio,
                      r.wrong);
          std::fflush(stdout);
        }
        if (r.wrong != 0) status = 1;
      }
    }
    FLEXPAR_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
    ucx_t.reset();
#if FLEXPAR_HAVE_UCX
    raw_ucx.reset();
#endif
    mpi_t.reset();
    MPI_Comm_free(&raw_comm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flexpar_p2p: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
