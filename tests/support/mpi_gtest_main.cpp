// main() of every flexpar test: GoogleTest inside MPI (when launched by mpiexec) or alone.
//
// Under MPI: MPI_Init_thread(MULTIPLE if available), only rank 0 prints the progress listener
// output (every rank prints its own failures, prefixed by its rank), and the exit status is the
// same on every rank: 1 if any rank failed. The test run itself is bounded by ctest's TIMEOUT.
// Compiled with FLEXPAR_TEST_REQUIRES_CUDA (the gpu tests' main): without a CUDA device it prints why
// and exits with ctest's skip code, 77, before anything else.
#include <gtest/gtest.h>
#include <mpi.h>
#ifdef FLEXPAR_TEST_REQUIRES_CUDA
#include <flexpar/cuda/runtime.hpp>
#endif

#include <cstdio>
#include <cstdlib>

namespace {

/// Prints nothing but failures, prefixed with the rank (for ranks other than 0).
class rank_failure_printer : public testing::EmptyTestEventListener {
 public:
  explicit rank_failure_printer(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
#ifdef FLEXPAR_TEST_REQUIRES_CUDA
  if (!flexpar::cuda::device_present()) {
    std::printf("%s: no CUDA device is present: skipped (exit 77)\n", argv[0]);
    return 77;
  }
#endif
  testing::InitGoogleTest(&argc, argv);
  // Launched by mpiexec (Hydra sets PMI_RANK) or asked to: initialize MPI. Unit tests do not need it
  // but may call MPI functions (e.g. MPI_Initialized), which works without initialization.
  const bool under_mpi = std::getenv("PMI_RANK") != nullptr || std::getenv("PMI_FD") != nullptr;
  int rank = 0;
  if (under_mpi) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank != 0) {
      auto& listeners = testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new rank_failure_printer(rank));
    }
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  if (under_mpi) {
    int any_failed = failed;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    failed = any_failed;
    MPI_Finalize();
  }
  return failed;
}
