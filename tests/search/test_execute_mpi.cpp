// Strategies executed under mpiexec: every executable strategy of a small MLP (1-D meshes of all ranks)
// and a searched one compute the serial model's output and updated weights exactly.
#include <gtest/gtest.h>
#include <mpi.h>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/search/execute.hpp>
#include <flexpar/search/mcmc.hpp>

#include "support/machine_skip.hpp"

namespace {

using namespace flexpar::search;

std::vector<float> values(std::size_t n, std::size_t salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>((i * 5 + salt) % 3) - 1);
  return v;
}

std::vector<std::vector<float>> weights_of(const graph& g) {
  std::vector<std::vector<float>> w;
  for (std::size_t i = 0; i < g.ops.size(); ++i)
    w.push_back(g.ops[i].kind == op_kind::linear ? values(g.ops[i].in_channels * g.ops[i].out_channels, i + 1)
                                                 : std::vector<float>{});
  return w;
}

bool one_d_of_all(const soap_config& c, int p) {
  return c.devices() == p && c.first_device == 0 && (c.sample > 1) + (c.attribute > 1) + (c.parameter > 1) <= 1;
}

TEST(search_execute_mpi, strategies_equal_the_serial_model) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) FLEXPAR_MACHINE_SKIP("not under mpiexec");
  flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  const int p = comm.size();
  cluster cl = preset("2-1-cpu");
  cl.devices_per_node = p;
  const graph g = reference::mlp(7, {5, 9, 3});
  const std::vector<float> x = values(7 * 5, 2);
  const execution_result serial = execute_serial(g, x, weights_of(g), 1.0f);
  std::vector<std::vector<soap_config>> per_op;
  for (const op& o : g.ops) {
    std::vector<soap_config> mine;
    for (const soap_config& c : candidates(o, cl))
      if (one_d_of_all(c, p)) mine.push_back(c);
    per_op.push_back(mine);
  }
  std::size_t runs = 0;
  for (const soap_config& a : per_op[0])
    for (const soap_config& b : per_op[1])
      for (const soap_config& c : per_op[2]) {
        const strategy s{a, b, c};
        const execution_result r = execute_steps(comm, g, s, x, weights_of(g), 1.0f);
        EXPECT_EQ(r.output, serial.output) << describe(g.ops[0], a) << "; " << describe(g.ops[2], c);
        EXPECT_EQ(r.weights, serial.weights) << describe(g.ops[0], a) << "; " << describe(g.ops[2], c);
        ++runs;
      }
  EXPECT_EQ(runs, p == 1 ? 1u : 3u * 2 * 3);
  simulator sim(g, cl);
  search_options o;
  o.iterations = 300;
  o.allow = [p](std::size_t, const soap_config& c) { return one_d_of_all(c, p); };
  const search_result found = mcmc_search(sim, 9, o).run();
  const execution_result r = execute_steps(comm, g, found.best, x, weights_of(g), 1.0f);
  EXPECT_EQ(r.output, serial.output);
  EXPECT_EQ(r.weights, serial.weights);
}

}  // namespace
