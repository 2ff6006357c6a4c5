// communicator::from_mpi sizes the BLAS's threads (config::blas_threads): by default each rank gets
// the cores of its affinity mask divided among the ranks of its node, so that p ranks on a node do
// not run p threads per core; a number sets that many; -1, or a BLAS threads variable in the
// environment, leaves the BLAS alone. Run with OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS and
// OMP_NUM_THREADS unset (ctest's ENVIRONMENT_MODIFICATION).
#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/blas_threads.hpp>

#include "support/machine_skip.hpp"

namespace flexpar {
namespace {

int affinity_cores() {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  return ::sched_getaffinity(0, sizeof mine, &mine) == 0 ? CPU_COUNT(&mine) : 1;
}

TEST(blas_threads, auto_divides_my_cores_among_the_ranks_of_my_node) {
  if (blas_threads_now() == 0) FLEXPAR_MACHINE_SKIP("the BLAS is not OpenBLAS");
  ASSERT_FALSE(config::environment_lookup("OPENBLAS_NUM_THREADS")) << "run with OPENBLAS_NUM_THREADS unset";
  config cfg = config::from_environment();
  for (int per_node : {0, 1}) {  // the detected node (every rank), then a node per rank
    cfg.ranks_per_node = per_node;
    const communicator comm = communicator::from_mpi(MPI_COMM_WORLD, cfg);
    EXPECT_EQ(blas_threads_now(), std::max(1, affinity_cores() / comm.topology().local_size()))
        << "ranks on my node: " << comm.topology().local_size() << ", cores: " << affinity_cores();
  }
}

TEST(blas_threads, a_number_sets_that_many_and_minus_one_leaves_them) {
  if (blas_threads_now() == 0) FLEXPAR_MACHINE_SKIP("the BLAS is not OpenBLAS");
  config cfg = config::from_environment();
  cfg.blas_threads = 3;
  { const communicator comm = communicator::from_mpi(MPI_COMM_WORLD, cfg); }
  EXPECT_EQ(blas_threads_now(), 3);
  cfg.blas_threads = -1;
  { const communicator comm = communicator::from_mpi(MPI_COMM_WORLD, cfg); }
  EXPECT_EQ(blas_threads_now(), 3);
}

TEST(blas_threads, a_threads_variable_in_the_environment_rules) {
  for (const char* set : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"}) {
    static std::string_view only;
    only = set;
    const auto lookup = [](std::string_view name) -> std::optional<std::string> {
      return name == only ? std::optional<std::string>("2") : std::nullopt;
    };
    EXPECT_EQ(size_blas_threads(0, 1, lookup), 0) << set;
  }
  const auto none = [](std::string_view) -> std::optional<std::string> { return std::nullopt; };
  if (blas_threads_now() != 0) {
    EXPECT_EQ(size_blas_threads(0, 1 << 20, none), 1);  // at least one
    EXPECT_EQ(blas_threads_now(), 1);
  }
}

}  // namespace
}  // namespace flexpar
