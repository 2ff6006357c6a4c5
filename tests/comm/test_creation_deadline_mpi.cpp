// A rank that skips a collective which creates state (issue 40, row 1) ends the others' wait at the
// deadline with a timeout_error naming it, instead of a hang in MPI_Comm_split or MPI_Comm_dup.
//
//   mpiexec -n N test_creation_deadline_mpi first_collective   the last rank skips the first allreduce
//   mpiexec -n N test_creation_deadline_mpi split              the last rank skips communicator::split
//   mpiexec -n N test_creation_deadline_mpi from_mpi           the last rank skips communicator::from_mpi
//
// Run with FLEXPAR_TIMEOUT=3 (and FLEXPAR_TRANSPORT=mpi or ucx). Every rank prints "rank R: ok ..."
// or "rank R: FAILED ..." and exits 1 on failure. Its own main, not GoogleTest's: after `from_mpi`
// the ranks that waited hold an MPI_Comm_idup that never completes (MPI allows neither freeing nor
// cancelling it), so no collective on MPI_COMM_WORLD may follow, and the ranks do not agree on an
// exit status through one.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <flexpar/collective.hpp>

namespace {

using flexpar::communicator;

struct outcome {
  bool ok = false;
  std::string what;
};

/// Runs `wait`; ok when it throws timeout_error between 0.9 and 1 + 3 s past the timeout and the
/// text contains every string of `want`.
template <class Wait>
outcome expect_timeout(Wait&& wait, std::chrono::milliseconds timeout, const std::vector<std::string>& want) {
  const auto started = std::chrono::steady_clock::now();
  try {
    wait();
  } catch (const flexpar::timeout_error& e) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const double limit = std::chrono::duration<double>(timeout).count();
    std::string text = e.what();
    if (waited < 0.9 * limit || waited > limit + 3.0)
      return {false, "timeout_error after " + std::to_string(waited) + " s, not at the deadline: " + text};
    for (const std::string& w : want)
      if (text.find(w) == std::string::npos) return {false, "the text lacks \"" + w + "\": " + text};
    return {true, "timeout_error after " + std::to_string(waited) + " s: " + text};
  } catch (const std::exception& e) {
    return {false, std::string("not a timeout_error: ") + e.what()};
  }
  return {false, "returned without an error"};
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const std::string scenario = argc > 1 ? argv[1] : "";
  const flexpar::config cfg = flexpar::config::from_environment();
  const int late = size - 1;  // the rank that skips
  const std::string named = "rank {" + std::to_string(late) + "}";
  outcome result{true, "skipped the call, as planned"};
  try {
    if (scenario == "first_collective" || scenario == "split") {
      auto comm = communicator::from_mpi(MPI_COMM_WORLD, cfg);
      if (rank != late) {
        std::vector<float> data(1024, 1.0f);
        if (scenario == "first_collective")
          result =
              expect_timeout([&] { flexpar::allreduce(comm, std::span(data), flexpar::reduce_op::sum); }, cfg.timeout,
                             {"[rank " + std::to_string(rank) + "]", named, "FLEXPAR_TIMEOUT",
                              "the first collective on a communicator"});
        else
          result = expect_timeout([&] { (void)comm.split(0, rank); }, cfg.timeout,
                                  {"[rank " + std::to_string(rank) + "]", "split", named, "FLEXPAR_TIMEOUT"});
      }
      // Only point-to-point messages were left behind: the world can still agree.
      MPI_Barrier(MPI_COMM_WORLD);
    } else if (scenario == "from_mpi") {
      if (rank != late)
        result = expect_timeout([&] { (void)communicator::from_mpi(MPI_COMM_WORLD, cfg); }, cfg.timeout,
                                {"[rank " + std::to_string(rank) + "] communicator::from_mpi",
                                 "not every one of the " + std::to_string(size) + " ranks", "FLEXPAR_TIMEOUT"});
    } else {
      result = {false, "unknown scenario '" + scenario + "' (first_collective, split or from_mpi)"};
    }
  } catch (const std::exception& e) {
    result = {false, std::string("unexpected: ") + e.what()};
  }
  std::printf("rank %d: %s %s: %s\n", rank, result.ok ? "ok" : "FAILED", scenario.c_str(), result.what.c_str());
  std::fflush(stdout);
  MPI_Finalize();
  return result.ok ? 0 : 1;
}
