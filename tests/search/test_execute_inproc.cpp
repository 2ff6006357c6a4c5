// Running strategies through the SBP layer (threads as ranks): every executable strategy of a small MLP
// on 1, 2 and 3 ranks computes the serial model's output and updated weights exactly (values in
// {-1, 0, 1}: every sum is a small integer); a searched strategy does too; non-executable ones are refused.
#include <gtest/gtest.h>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/search/execute.hpp>
#include <flexpar/search/mcmc.hpp>

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

cluster ranks_cluster(int p) {
  cluster c = preset("2-1-cpu");
  c.devices_per_node = p;
  return c;
}

/// Every strategy whose configs are 1-D meshes of all p ranks.
std::vector<strategy> all_executable(const graph& g, int p) {
  std::vector<std::vector<soap_config>> per_op;
  for (const op& o : g.ops) {
    std::vector<soap_config> mine;
    for (const soap_config& c : candidates(o, ranks_cluster(p))) {
      const int axes = (c.sample > 1) + (c.attribute > 1) + (c.parameter > 1);
      if (c.devices() == p && c.first_device == 0 && axes <= 1) mine.push_back(c);
    }
    per_op.push_back(mine);
  }
  std::vector<strategy> out{{}};
  for (const auto& choices : per_op) {
    std::vector<strategy> next;
    for (const strategy& s : out)
      for (const soap_config& c : choices) {
        strategy t = s;
        t.push_back(c);
        next.push_back(std::move(t));
      }
    out = std::move(next);
  }
  return out;
}

TEST(search_execute, every_executable_strategy_equals_the_serial_model) {
  const graph g = reference::mlp(5, {6, 7, 4, 3});  // uneven over 2 and 3 ranks
  const std::vector<float> x = values(5 * 6, 0);
  const execution_result serial = execute_serial(g, x, weights_of(g), 1.0f);
  for (int p : {1, 2, 3}) {
    const std::vector<strategy> all = all_executable(g, p);
    ASSERT_EQ(all.size(), p == 1 ? 1u : 3u * 2 * 3 * 2 * 3) << p;
    for (const strategy& s : all) ASSERT_TRUE(executable(g, s, p));
    flexpar::run_in_process(p, [&](flexpar::communicator& comm) {  // one world runs them all, in turn
      for (const strategy& s : all) {
        const execution_result r = execute_steps(comm, g, s, x, weights_of(g), 1.0f);
        std::string where("rank ");
        where.append(std::to_string(comm.rank())).append(" of ").append(std::to_string(p)).append(":");
        for (std::size_t i = 0; i < s.size(); ++i) where.append(" ").append(describe(g.ops[i], s[i]));
        ASSERT_EQ(r.output, serial.output) << where;
        ASSERT_EQ(r.weights, serial.weights) << where;
      }
    });
  }
}

TEST(search_execute, a_searched_strategy_runs_and_equals_the_serial_model) {
  const graph g = reference::mlp(8, {16, 64, 16});
  const std::vector<float> x = values(8 * 16, 3);
  const execution_result serial = execute_serial(g, x, weights_of(g), 1.0f);
  const cluster cl = ranks_cluster(2);
  simulator sim(g, cl);
  search_options o;
  o.iterations = 500;
  o.allow = [&](std::size_t, const soap_config& c) {
    return c.devices() == 2 && c.first_device == 0 && (c.sample > 1) + (c.attribute > 1) + (c.parameter > 1) <= 1;
  };
  const search_result r = mcmc_search(sim, 5, o).run();
  ASSERT_TRUE(executable(g, r.best, 2));
  flexpar::run_in_process(2, [&](flexpar::communicator& comm) {
    const execution_result run = execute_steps(comm, g, r.best, x, weights_of(g), 1.0f, 2);
    EXPECT_GT(run.median_step_seconds, 0);
    const execution_result once = execute_steps(comm, g, r.best, x, weights_of(g), 1.0f);
    EXPECT_EQ(once.output, serial.output);
    EXPECT_EQ(once.weights, serial.weights);
  });
}

TEST(search_execute, refuses_what_it_cannot_run) {
  const graph g = reference::mlp(8, {16, 64, 16});
  flexpar::run_in_process(2, [&](flexpar::communicator& comm) {
    const strategy one_device{{1, 1, 1, 0}, {1, 1, 1, 0}, {1, 1, 1, 0}};
    try {
      (void)execute_steps(comm, g, one_device, values(8 * 16, 0), weights_of(g), 1.0f);
      ADD_FAILURE() << "no usage_error";
    } catch (const flexpar::usage_error& e) {
      EXPECT_NE(std::string(e.what()).find("op 0 'fc1': config s=1 a=1 p=1 @[0..1) is not a 1-D mesh of all 2 ranks"),
                std::string::npos)
          << e.what();
    }
  });
  EXPECT_FALSE(executable(reference::cnn(4), data_parallel(reference::cnn(4), ranks_cluster(2)), 2));
}

}  // namespace
