// The CNN's strategies run through the SBP layer (threads as ranks): every config and every pair of
// neighbouring configs of the executable strategies of reference::cnn_small (conv2d, relu, max_pool, conv2d, max_pool,
// linear over the flattened maps) with uneven sizes (batch 5; 3 -> 4 -> 8 channels and 8 * 4 flattened features over 3
// ranks) on 1, 2 and 3 ranks computes the serial model's output and updated weights exactly (values in {-1, 0, 1}, so
// every sum is an integer far below 2^24 and any order gives the same float); the searched strategy does too; what
// cannot run is refused naming the op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/sbp/ops.hpp>
#include <flexpar/search/execute.hpp>
#include <flexpar/search/mcmc.hpp>

#include "cnn_fixtures.hpp"

namespace {

using namespace flexpar::search;
using namespace flexpar::search::testing_support;

/// Every strategy whose configs are 1-D meshes of all p ranks.
std::vector<strategy> all_one_d(const graph& g, int p) {
  std::vector<strategy> out{{}};
  for (const op& o : g.ops) {
    std::vector<strategy> next;
    for (const strategy& s : out)
      for (const soap_config& c : candidates(o, ranks_cluster(p)))
        if (one_d_of_all(c, p)) {
          strategy t = s;
          t.push_back(c);
          next.push_back(std::move(t));
        }
    out = std::move(next);
  }
  return out;
}

std::string describe_all(const graph& g, const strategy& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) out.append(i ? "; " : "").append(describe(g.ops[i], s[i]));
  return out;
}

const graph small = reference::cnn_small(5, 8, 4, 10);  // 3 -> 4 -> 8 channels, 10 classes

TEST(search_execute_cnn, the_serial_model_stays_in_exact_float_range) {
  const execution_result serial = execute_serial(small, values(5 * 3 * 8 * 8, 0), weights_of(small), 1.0f);
  float biggest = 0;
  std::size_t nonzero = 0;
  for (float v : serial.output) {
    biggest = std::max(biggest, std::abs(v));
    nonzero += v != 0;
  }
  EXPECT_GT(nonzero, serial.output.size() / 2) << "a test input that the model maps to zeros would prove nothing";
  for (const auto& w : serial.weights)
    for (float v : w) {
      biggest = std::max(biggest, std::abs(v));
      ASSERT_EQ(v, std::round(v));
    }
  EXPECT_LT(biggest, float(1 << 22)) << "the exactness argument of this file needs integers below 2^24";
  EXPECT_NE(serial.weights, weights_of(small)) << "the step should move the weights";
}

/// The strategies of `all`, in order, that each run a pair of configs of two consecutive ops no earlier
/// one ran: together they run every config of every op and every pair of neighbours. What a strategy's
/// step computes is op by op, and what passes between two ops (the boxing of an activation forward, of
/// its gradient backward) depends on those two ops' configs only; a weight's update on its op's config
/// and the gradient reaching it, which the next op's config decides. So the pairs are everything the
/// strategies can differ in, in 23 of the 324 strategies on 2 ranks and on 3 (all 324 took 77 s of the
/// Release ctest on two cores).
std::vector<strategy> covering_every_pair_of_neighbours(const std::vector<strategy>& all) {
  std::vector<std::tuple<std::size_t, soap_config, soap_config>> ran;
  std::vector<strategy> out;
  for (const strategy& s : all) {
    bool adds = out.empty();
    for (std::size_t i = 0; i + 1 < s.size(); ++i)
      if (std::find(ran.begin(), ran.end(), std::tuple{i, s[i], s[i + 1]}) == ran.end()) {
        ran.emplace_back(i, s[i], s[i + 1]);
        adds = true;
      }
    if (adds) out.push_back(s);
  }
  return out;
}

TEST(search_execute_cnn, every_config_and_every_pair_of_neighbours_equals_the_serial_model) {
  const std::vector<float> x = values(5 * 3 * 8 * 8, 0);
  const execution_result serial = execute_serial(small, x, weights_of(small), 1.0f);
  for (int p : {1, 2, 3}) {
    const std::vector<strategy> all = all_one_d(small, p);
    std::vector<strategy> runnable;
    for (const strategy& s : all) {
      const bool pool_split = s[2].attribute > 1 || s[4].attribute > 1;  // max_pool over split positions: halos
      EXPECT_EQ(executable(small, s, p), !pool_split) << describe_all(small, s);
      if (!pool_split) runnable.push_back(s);
    }
    // conv1 3 configs, relu1 3, pool1 2, conv2 3, pool2 2, fc3 3
    ASSERT_EQ(runnable.size(), p == 1 ? 1u : 3u * 3 * 2 * 3 * 2 * 3) << p;
    const std::vector<strategy> chosen = covering_every_pair_of_neighbours(runnable);
    // at least the largest pair count (3 x 3 of conv1 and relu1), and far fewer than all
    ASSERT_GE(chosen.size(), p == 1 ? 1u : 9u) << p;
    ASSERT_LT(chosen.size(), p == 1 ? 2u : runnable.size() / 4) << p;
    flexpar::run_in_process(p, [&](flexpar::communicator& comm) {
      for (const strategy& s : chosen) {
        const execution_result r = execute_steps(comm, small, s, x, weights_of(small), 1.0f);
        std::string where("rank ");
        where.append(std::to_string(comm.rank())).append(" of ").append(std::to_string(p)).append(": ");
        ASSERT_EQ(r.output, serial.output) << where << describe_all(small, s);
        ASSERT_EQ(r.weights, serial.weights) << where << describe_all(small, s);
      }
    });
  }
}

TEST(search_execute_cnn, a_searched_strategy_runs_and_equals_the_serial_model) {
  const graph g = reference::cnn_small(6, 8, 4, 6);
  const std::vector<float> x = values(6 * 3 * 8 * 8, 3);
  const execution_result serial = execute_serial(g, x, weights_of(g), 1.0f);
  const cluster cl = ranks_cluster(2);
  simulator sim(g, cl);
  search_options o;
  o.iterations = 500;
  o.allow = [&](std::size_t i, const soap_config& c) {
    const std::vector<soap_config> ok = executable_configs(g.ops[i], cl, 2);
    return std::find(ok.begin(), ok.end(), c) != ok.end();
  };
  const search_result r = mcmc_search(sim, 5, o).run();
  ASSERT_TRUE(executable(g, r.best, 2)) << describe_all(g, r.best);
  ASSERT_TRUE(executable(g, expert(g, cl), 2)) << describe_all(g, expert(g, cl));
  flexpar::run_in_process(2, [&](flexpar::communicator& comm) {
    const execution_result run = execute_steps(comm, g, r.best, x, weights_of(g), 1.0f, 2);
    EXPECT_GT(run.median_step_seconds, 0);
    for (const strategy& s : {r.best, expert(g, cl), data_parallel(g, cl)}) {
      const execution_result once = execute_steps(comm, g, s, x, weights_of(g), 1.0f);
      EXPECT_EQ(once.output, serial.output) << describe_all(g, s);
      EXPECT_EQ(once.weights, serial.weights) << describe_all(g, s);
    }
  });
}

TEST(search_execute_cnn, every_conv2d_candidate_is_a_signature_of_the_sbp_layer) {
  const op conv = reference::cnn_small(8, 8, 4).ops[3];  // conv2: 4 -> 8 channels
  const cluster cl = preset("8-1");
  std::size_t reduction = 0;
  for (const soap_config& c : candidates(conv, cl)) {
    const sbp_signature s = signature_of(conv, c);
    for (std::size_t d = 0; d < s.mesh.size(); ++d) {
      const flexpar::sbp::signature_result r = flexpar::sbp::signature::conv2d(s.input[d], s.weight[d]);
      ASSERT_TRUE(r.ok) << to_string(c) << " axis " << d;
      EXPECT_EQ(r.out, s.output[d]) << to_string(c) << " axis " << d;
      reduction += s.dims[d] == soap_dim::attribute;
    }
  }
  EXPECT_GT(reduction, 0u);
  EXPECT_EQ(describe(conv, {1, 2, 1, 0}), "(S(1), S(1)) -> P(sum)");
  EXPECT_EQ(describe(conv, {1, 1, 2, 0}), "(B, S(0)) -> S(1)");
  EXPECT_EQ(describe(conv, {2, 1, 2, 0}), "((S(0), B), (B, S(0))) -> (S(0), S(1))");
  EXPECT_FALSE(valid(conv, {1, 8, 1, 0}, cl)) << "attribute is bounded by the 4 input channels";
}

TEST(search_execute_cnn, kernels_and_functions_round_trip_through_json) {
  const graph back = graph_from_json(to_json(small));
  EXPECT_EQ(to_json(back), to_json(small));
  ASSERT_EQ(back.ops.size(), small.ops.size());
  EXPECT_EQ(back.ops[0].kernel, 3u);
  EXPECT_EQ(back.ops[1].function, elementwise_fn::relu);
  EXPECT_EQ(back.ops[2].function, elementwise_fn::max_pool);
  EXPECT_EQ(back.ops[2].kernel, 2u);
  std::string text = to_json(small);
  text.replace(text.find("\"max_pool\""), 10, "\"avg_pool\"");
  try {
    (void)graph_from_json(text);
    ADD_FAILURE() << "no usage_error";
  } catch (const flexpar::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("op 2 'pool1': function 'avg_pool' is not one of other, relu, max_pool"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)reference::cnn_small(2, 6), flexpar::usage_error);  // side not a multiple of 4
}

TEST(search_execute_cnn, refuses_what_it_cannot_run) {
  flexpar::run_in_process(2, [&](flexpar::communicator& comm) {
    strategy s = data_parallel(small, ranks_cluster(2));
    s[2] = {1, 2, 1, 0};  // pool1 over split positions
    try {
      (void)execute_steps(comm, small, s, values(5 * 3 * 8 * 8, 0), weights_of(small), 1.0f);
      ADD_FAILURE() << "no usage_error";
    } catch (const flexpar::usage_error& e) {
      EXPECT_NE(std::string(e.what()).find("op 2 'pool1': max_pool with a spatial split (S(2)) needs halo exchanges"),
                std::string::npos)
          << e.what();
    }
  });
  // AlexNet: its softmax is an elementwise op the executor does not run; its sizes are runnable otherwise
  const graph alex = reference::cnn(2);
  const strategy one_device(alex.ops.size(), soap_config{});
  EXPECT_FALSE(executable(alex, one_device, 1));
  graph no_softmax = alex;
  no_softmax.ops.pop_back();
  EXPECT_TRUE(executable(no_softmax, strategy(no_softmax.ops.size(), soap_config{}), 1));
  graph even = small;
  even.ops[0].kernel = 2;
  EXPECT_FALSE(executable(even, strategy(even.ops.size(), soap_config{}), 1));
}

}  // namespace
