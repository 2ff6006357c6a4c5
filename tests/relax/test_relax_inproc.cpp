// The relaxations over threads-as-ranks: each algorithm against its serial reference on 1-4 ranks,
// shift_one's pairing rule, traffic counts, bad input, the optimizers' state for checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <flexpar/comm/run_in_process.hpp>

#include "relax_scenarios.hpp"

namespace flexpar {
namespace {

config test_config() {
  config c;
  c.timeout = std::chrono::seconds(30);
  return c;
}

class relax_inproc : public ::testing::TestWithParam<int> {};

TEST_P(relax_inproc, gradient_allreduce) {
  run_in_process(
      GetParam(), [](communicator& comm) { testing_support::gradient_allreduce_matches_reference(comm, false); },
      test_config());
}

TEST_P(relax_inproc, gradient_allreduce_hierarchical_two_ranks_per_node) {
  if (GetParam() % 2 != 0) GTEST_SKIP() << "two ranks per node need an even world";
  run_in_process(
      GetParam(), [](communicator& comm) { testing_support::gradient_allreduce_matches_reference(comm, true); },
      test_config(), 2);
}

TEST_P(relax_inproc, bytegrad) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        testing_support::bytegrad_matches_reference(comm, 512);
        testing_support::bytegrad_matches_reference(comm, 3);
      },
      test_config());
}

TEST_P(relax_inproc, decentralized) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        testing_support::decentralized_matches_reference(comm, "shift_one", 1);
        testing_support::decentralized_matches_reference(comm, "shift_one", 2);
        testing_support::decentralized_matches_reference(comm, "ring", 1);
        testing_support::decentralized_matches_reference(comm, "ring", 3);
        testing_support::decentralized_matches_reference(comm, "all", 2);
      },
      test_config());
}

TEST_P(relax_inproc, local_sgd) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        testing_support::local_sgd_matches_reference(comm, 1);
        testing_support::local_sgd_matches_reference(comm, 3);
      },
      test_config());
}

TEST_P(relax_inproc, low_precision_decentralized) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        testing_support::low_precision_decentralized_matches_reference(comm, 1, 512);
        testing_support::low_precision_decentralized_matches_reference(comm, 2, 5);
      },
      test_config());
}

TEST_P(relax_inproc, onebit_adam_and_qadam) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        testing_support::momentum_adam_matches_reference(comm, "onebit_adam", 64);
        testing_support::momentum_adam_matches_reference(comm, "onebit_adam", 2048);
        testing_support::momentum_adam_matches_reference(comm, "qadam", 5);
      },
      test_config());
}

TEST_P(relax_inproc, onebit_error_feedback) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        testing_support::onebit_error_feedback_tracks_the_true_sum(comm, 16);
        testing_support::onebit_error_feedback_tracks_the_true_sum(comm, 2048);
      },
      test_config());
}

TEST_P(relax_inproc, streamed_compressed_average_is_bitwise_the_compressed_average) {
  run_in_process(
      GetParam(), [](communicator& comm) { testing_support::streamed_averages_are_the_averages_bitwise(comm); },
      test_config());
}

TEST_P(relax_inproc, async_model_average_abort_resume_finish) {
  run_in_process(
      GetParam(), [](communicator& comm) { testing_support::async_abort_resume_finish(comm); }, test_config());
}

TEST(relax_async, a_rank_leaving_early_ends_in_a_timeout_not_a_hang) {
  config c = test_config();
  c.timeout = std::chrono::milliseconds(500);
  for (int p : {2, 3})
    run_in_process(
        p, [](communicator& comm) { testing_support::async_rank_leaving_early_is_a_timeout(comm); }, c);
}

TEST_P(relax_inproc, traffic) {
  run_in_process(
      GetParam(), [](communicator& comm) { testing_support::traffic_follows_the_formulas(comm); }, test_config());
}

TEST_P(relax_inproc, every_algorithm_ends_with_one_model) {
  run_in_process(
      GetParam(), [](communicator& comm) { testing_support::every_algorithm_ends_with_one_model(comm); },
      test_config());
}

TEST_P(relax_inproc, bad_input) {
  run_in_process(
      GetParam(), [](communicator& comm) { testing_support::bad_input_is_a_usage_error(comm); }, test_config());
}

INSTANTIATE_TEST_SUITE_P(world, relax_inproc, ::testing::Values(1, 2, 3, 4, 5),
                         [](const auto& info) { return std::string("p").append(std::to_string(info.param)); });

// shift_one: pairs are symmetric and disjoint; for odd p exactly rank (round mod p) sits out; every
// pair of ranks meets once per p - 1 (even) or p (odd) rounds.
TEST(relax_shift_one, pairing_rule) {
  for (int p = 1; p <= 9; ++p) {
    const int period = p % 2 == 0 ? p - 1 : p;
    std::set<std::pair<int, int>> met;
    for (std::uint64_t round = 0; round < 3 * static_cast<std::uint64_t>(period); ++round) {
      int sitting = 0;
      for (int r = 0; r < p; ++r) {
        const int q = relax::shift_one_peer(r, p, round);
        EXPECT_EQ(q, testing_support::reference_shift_one_peer(r, p, round))
            << "p " << p << " round " << round << " rank " << r << ": not the circle method's table";
        if (q < 0) {
          ++sitting;
          if (p > 1) {
            EXPECT_EQ(static_cast<std::uint64_t>(r), round % static_cast<std::uint64_t>(p)) << "p " << p;
          }
          continue;
        }
        EXPECT_NE(q, r);
        EXPECT_LT(q, p);
        EXPECT_EQ(relax::shift_one_peer(q, p, round), r) << "p " << p << " round " << round << " rank " << r;
        if (round < static_cast<std::uint64_t>(period)) met.insert({std::min(r, q), std::max(r, q)});
      }
      EXPECT_EQ(sitting, p == 1 ? 1 : p % 2) << "p " << p << " round " << round;
    }
    EXPECT_EQ(met.size(), static_cast<std::size_t>(p * (p - 1) / 2)) << "p " << p;
  }
}

TEST(relax_optimizer, sgd_and_adam_by_hand) {
  relax::sgd plain({.learning_rate = 0.5f});
  std::vector<float> w{1.0f, -2.0f}, g{2.0f, 4.0f};
  plain.apply(0, w, g);
  EXPECT_EQ(w, (std::vector<float>{0.0f, -4.0f}));
  relax::sgd momentum({.learning_rate = 0.5f, .momentum = 0.5f, .weight_decay = 1.0f});
  w = {1.0f};
  g = {1.0f};
  momentum.apply(0, w, g);  // g' = 2, b = 2, w = 0
  EXPECT_EQ(w[0], 0.0f);
  momentum.apply(0, w, g);  // g' = 1, b = 1 + 1 = 2, w = -1
  EXPECT_EQ(w[0], -1.0f);
  relax::adam a({.learning_rate = 0.1f});
  w = {1.0f};
  g = {3.0f};
  a.apply(0, w, g);  // first Adam step moves by lr * sign(g) (m_hat = g, v_hat = g^2)
  EXPECT_NEAR(w[0], 0.9f, 1e-6f);
  std::vector<float> g2{1.0f, 2.0f};
  EXPECT_THROW(a.apply(0, w, g2), usage_error);
  std::vector<float> w2{1.0f, 2.0f};
  EXPECT_THROW(a.apply(0, w2, g2), usage_error);  // parameter 0 had 1 element
}

/// Runs `steps` applies of two parameters (3 and 5 weights) with gradients whose updates round.
void run_steps(relax::optimizer& opt, std::vector<std::vector<float>>& w, int first_step, int steps) {
  for (int s = first_step; s < first_step + steps; ++s)
    for (std::size_t i = 0; i < w.size(); ++i) {
      std::vector<float> g(w[i].size());
      for (std::size_t j = 0; j < g.size(); ++j) g[j] = 0.1f * static_cast<float>((s + 1) * (j + 2)) / 3.0f - 0.37f;
      opt.apply(i, w[i], g);
    }
}

/// Copies every state piece of `from` into `to` (what a checkpoint's save and load do).
void copy_state(relax::optimizer& from, relax::optimizer& to, const std::vector<std::vector<float>>& w) {
  for (std::size_t i = 0; i < w.size(); ++i) {
    const auto a = from.state(i, w[i].size()), b = to.state(i, w[i].size());
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t k = 0; k < a.size(); ++k) {
      ASSERT_EQ(a[k].name, b[k].name);
      ASSERT_EQ(a[k].floats.size(), b[k].floats.size());
      ASSERT_EQ(a[k].counters.size(), b[k].counters.size());
      std::copy(a[k].floats.begin(), a[k].floats.end(), b[k].floats.begin());
      std::copy(a[k].counters.begin(), a[k].counters.end(), b[k].counters.begin());
    }
  }
}

/// An optimizer whose state is copied into a fresh one after 4 steps goes on bitwise as the first;
/// without the copy it does not (the check can fail).
template <class Optimizer, class Options>
void state_carries_over(Options o, std::vector<std::string> names) {
  std::vector<std::vector<float>> w{{0.5f, -1.25f, 2.0f}, {1.0f, 0.75f, -0.5f, 3.0f, -2.0f}};
  Optimizer a(o);
  run_steps(a, w, 0, 4);
  std::vector<std::vector<float>> w_resumed = w, w_fresh = w;
  Optimizer resumed(o), fresh(o);
  copy_state(a, resumed, w);
  std::vector<std::string> seen;
  for (const auto& piece : a.state(0, 3)) seen.push_back(piece.name);
  EXPECT_EQ(seen, names);
  run_steps(a, w, 4, 3);
  run_steps(resumed, w_resumed, 4, 3);
  run_steps(fresh, w_fresh, 4, 3);
  EXPECT_EQ(w, w_resumed);
  EXPECT_NE(w, w_fresh);
  EXPECT_THROW((void)a.state(1, 4), usage_error);  // parameter 1 has 5 weights
}

TEST(relax_optimizer, state_carries_an_optimizer_over_to_a_fresh_one) {
  state_carries_over<relax::sgd>(relax::sgd_options{.learning_rate = 0.1f, .momentum = 0.9f}, {"momentum"});
  state_carries_over<relax::adam>(relax::adam_options{.learning_rate = 0.01f}, {"m", "v", "t"});
  relax::sgd plain({.learning_rate = 0.1f});
  EXPECT_TRUE(plain.state(0, 3).empty());
}

}  // namespace
}  // namespace flexpar
