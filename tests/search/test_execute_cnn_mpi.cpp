// The small CNN's strategies executed under mpiexec (1-D meshes of all ranks): data parallelism with each
// op in turn given each of its executable configs, and 24 random executable strategies (a seeded RNG), of
// reference::cnn_small compute the serial model's output and updated weights exactly. (The in-process
// test runs every executable strategy; here each run pays process-to-process latency.)
#include <gtest/gtest.h>
#include <mpi.h>

#include <random>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/search/execute.hpp>

#include "cnn_fixtures.hpp"
#include "support/machine_skip.hpp"

namespace {

using namespace flexpar::search;
using namespace flexpar::search::testing_support;

TEST(search_execute_cnn_mpi, strategies_equal_the_serial_model) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) FLEXPAR_MACHINE_SKIP("not under mpiexec");
  flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  const int p = comm.size();
  cluster cl = preset("2-1-cpu");
  cl.devices_per_node = p;
  const graph g = reference::cnn_small(4, 4, 3, 5);  // 3 -> 3 -> 6 channels, 4 x 4 -> 2 x 2 -> 1 x 1, 6 -> 5
  const std::vector<float> x = values(4 * 3 * 4 * 4, 2);
  const execution_result serial = execute_serial(g, x, weights_of(g), 1.0f);
  std::vector<std::vector<soap_config>> per_op;  // the executable 1-D configs of each op
  for (const op& o : g.ops) per_op.push_back(executable_configs(o, cl, p));
  const strategy dp = data_parallel(g, cl);
  std::vector<strategy> all{dp};
  for (std::size_t i = 0; i < g.ops.size(); ++i)
    for (const soap_config& c : per_op[i]) {
      strategy s = dp;
      s[i] = c;
      all.push_back(s);
    }
  std::mt19937_64 rng(7);
  for (int k = 0; k < 24; ++k) {
    strategy s;
    for (const auto& configs : per_op) s.push_back(configs[rng() % configs.size()]);
    all.push_back(s);
  }
  std::size_t runs = 0;
  for (const strategy& s : all) {
    ASSERT_TRUE(executable(g, s, p));
    const execution_result r = execute_steps(comm, g, s, x, weights_of(g), 1.0f);
    std::string what;
    for (std::size_t i = 0; i < s.size(); ++i) what.append(i ? "; " : "").append(describe(g.ops[i], s[i]));
    EXPECT_EQ(r.output, serial.output) << what;
    EXPECT_EQ(r.weights, serial.weights) << what;
    ++runs;
  }
  EXPECT_EQ(runs, all.size());
  if (p > 1) {
    EXPECT_GE(per_op[0].size(), 3u) << "conv1: sample, output channels, input channels";
  }
}

}  // namespace
