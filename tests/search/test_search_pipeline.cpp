// Pipeline stages in the search (search/pipeline.hpp): the timed schedule against the theory and the
// actor runtime's unit-time results, the 3-D strategy's estimate, memory limit, validity rules, the
// search (the best strategy of an exhaustive enumeration on spaces small enough to enumerate, whatever
// the costs favour; deterministic per seed) and the JSON form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <flexpar/core/error.hpp>
#include <flexpar/search/mcmc.hpp>
#include <flexpar/search/pipeline.hpp>
#include <flexpar/search/simulator.hpp>

namespace flexpar::search {
namespace {

std::vector<stage_timing> equal_stages(int p, double f, double b) {
  return std::vector<stage_timing>(static_cast<std::size_t>(p), stage_timing{f, b, 0, -1});
}

TEST(search_pipeline, unit_stages_take_exactly_two_m_plus_p_minus_one) {
  // the actor runtime's unit-time machine gives 2 (m + p - 1) for both (tests/actor/test_pipeline_inproc.cpp)
  for (int p = 1; p <= 6; ++p)
    for (int m : {1, 2, 3, 4, 7, 8, 16})
      for (pipeline_schedule s : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
        const pipeline_timeline t = simulate_pipeline(equal_stages(p, 1, 1), m, s);
        EXPECT_EQ(t.seconds, 2.0 * (m + p - 1)) << "p " << p << " m " << m << " " << name_of(s);
        for (int j = 0; j < p; ++j) {
          const auto want = static_cast<std::size_t>(s == pipeline_schedule::gpipe ? m : std::min(p - j, m));
          if (s == pipeline_schedule::one_f_one_b || j == 0) {
            EXPECT_EQ(t.peak_stash[static_cast<std::size_t>(j)], want) << "stage " << j << " p " << p << " m " << m;
          }
          EXPECT_LE(t.peak_stash[static_cast<std::size_t>(j)], stash_registers(s, p, j, m));
        }
        EXPECT_NEAR(t.bubble, pipeline_bubble_theory(p, 1, m), 1e-12);
      }
}

TEST(search_pipeline, backward_twice_the_forward) {
  for (int p : {2, 3, 4})
    for (int m : {4, 8, 16})
      for (pipeline_schedule s : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b})
        EXPECT_DOUBLE_EQ(simulate_pipeline(equal_stages(p, 1, 2), m, s).seconds, 3.0 * (m + p - 1));
}

TEST(search_pipeline, a_slow_stage_sets_the_pace_and_transfers_add_latency) {
  std::vector<stage_timing> st{{1, 2, 0, -1}, {3, 6, 0, -1}, {1, 2, 0, -1}};
  for (pipeline_schedule s : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
    const double t = simulate_pipeline(st, 8, s).seconds;
    EXPECT_GE(t, 1 + 8 * 9.0 + 2);  // stage 0's first forward, the slow stage's work, stage 0's last backward
    EXPECT_LE(t, 1 + 8 * 9.0 + 2 + 6);
    double before = t;
    for (double c : {0.5, 1.0, 2.0}) {
      for (auto& x : st) x.send = c;
      const double with = simulate_pipeline(st, 8, s).seconds;
      EXPECT_GT(with, before);
      before = with;
    }
    for (auto& x : st) x.send = 0;
  }
}

TEST(search_pipeline, any_stash_count_runs_and_smaller_never_helps) {
  const auto st = equal_stages(4, 1, 2);
  const double full = simulate_pipeline(st, 8, pipeline_schedule::gpipe).seconds;
  for (std::size_t k : {1, 2, 3})
    EXPECT_GE(simulate_pipeline(st, 8, pipeline_schedule::gpipe, std::vector<std::size_t>(4, k)).seconds, full);
  const auto t = simulate_pipeline(st, 8, pipeline_schedule::one_f_one_b, {1, 1, 1, 1});
  for (std::size_t k : t.peak_stash) EXPECT_EQ(k, 1u);
  EXPECT_THROW((void)simulate_pipeline(st, 8, pipeline_schedule::gpipe, {1, 0, 1, 1}), usage_error);
  EXPECT_THROW((void)simulate_pipeline({}, 8, pipeline_schedule::gpipe), usage_error);
}

TEST(search_pipeline, stages_sharing_a_device_take_turns) {
  // two stages per device (interleaved placement): never faster than one device's total work
  std::vector<stage_timing> st{{1, 2, 0, 0}, {1, 2, 0, 1}, {1, 2, 0, 0}, {1, 2, 0, 1}};
  const auto t = simulate_pipeline(st, 8, pipeline_schedule::one_f_one_b,
                                   {stash_registers(pipeline_schedule::one_f_one_b, 4, 0, 8, 2),
                                    stash_registers(pipeline_schedule::one_f_one_b, 4, 1, 8, 2),
                                    stash_registers(pipeline_schedule::one_f_one_b, 4, 2, 8, 2),
                                    stash_registers(pipeline_schedule::one_f_one_b, 4, 3, 8, 2)});
  ASSERT_EQ(t.busy.size(), 2u);
  EXPECT_DOUBLE_EQ(t.busy[0], 2 * 8 * 3.0);
  EXPECT_GE(t.seconds, 2 * 8 * 3.0);
  EXPECT_LT(t.seconds, simulate_pipeline(equal_stages(2, 2, 4), 8, pipeline_schedule::one_f_one_b).seconds);
}

TEST(search_pipeline, interleaved_within_p_minus_one_units_as_on_the_runtime) {
  // the actor runtime's unit-time machine: interleaved 1F1B ends within p - 1 units of 2 (v m + p - 1)
  // and before plain 1F1B on the same layers (tests/actor/test_pipeline_inproc.cpp). Here within p: when
  // two firings become ready at the same instant, the runtime takes them in the order their inputs
  // arrived, this model by stage; that costs one unit at p = 4, v = 3, m = 8 and 16.
  for (int p : {2, 3, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        std::vector<stage_timing> st;
        std::vector<std::size_t> stash;
        for (int j = 0; j < p * v; ++j) {
          st.push_back({1, 1, 0, j % p});
          stash.push_back(stash_registers(pipeline_schedule::one_f_one_b, p * v, j, m, v));
        }
        const double t = simulate_pipeline(st, m, pipeline_schedule::one_f_one_b, stash).seconds;
        EXPECT_LE(t, 2.0 * (v * m + p - 1) + p) << "p " << p << " v " << v << " m " << m;
        EXPECT_LT(t, simulate_pipeline(equal_stages(p, v, v), m, pipeline_schedule::one_f_one_b).seconds)
            << "p " << p << " v " << v << " m " << m;
      }
}

/// A synthetic layered model: a block costs 4 units of compute split over data x tensor ranks, tensor
/// parallelism pays 0.5 per block per extra rank in allreduces, data parallelism pays `sync` per block
/// of weights replicated; the first and last parts cost 1 each.
stage_cost_fn synthetic(double sync) {
  return [sync](const stage_shape& s) {
    const double m = s.micro_batches;
    const double work = (4.0 * s.blocks + (s.first ? 1 : 0) + (s.last ? 1 : 0)) / (s.data * s.tensor) / m;
    const double tp = s.tensor > 1 ? 0.5 * s.blocks * (s.tensor - 1) / m : 0.0;
    stage_cost c;
    c.forward = work / 3 + tp;
    c.backward = 2 * work / 3 + tp;
    c.step = s.data > 1 ? sync * s.blocks / s.tensor : 0.0;
    c.weight_bytes = static_cast<std::uint64_t>(100 * s.blocks / s.tensor);
    c.activation_bytes = static_cast<std::uint64_t>(10 * s.blocks / m);
    return c;
  };
}

TEST(search_pipeline, estimate_memory_and_validity) {
  pipeline_space space{4, 4, 16, 4, 256};
  const pipeline_strategy pp{1, 1, 4, pipeline_schedule::one_f_one_b, {1, 1, 1, 1}};
  EXPECT_TRUE(space.valid(pp));
  EXPECT_FALSE(space.valid(pipeline_strategy{1, 1, 4, pipeline_schedule::gpipe, {2, 1, 1}}));     // 3 ranks
  EXPECT_FALSE(space.valid(pipeline_strategy{1, 1, 4, pipeline_schedule::gpipe, {2, 2, 0, 0}}));  // an empty stage
  EXPECT_FALSE(space.valid(pipeline_strategy{1, 3, 1, pipeline_schedule::gpipe, {4}}));      // 3 ranks, 3 !| 4 heads
  EXPECT_FALSE(space.valid(pipeline_strategy{4, 1, 8, pipeline_schedule::gpipe, {4}}));      // m without a pipeline
  EXPECT_FALSE(space.valid(pipeline_strategy{2, 1, 16, pipeline_schedule::gpipe, {2, 2}}));  // 2 x 16 !| 16
  EXPECT_FALSE(space.valid(pipeline_strategy{4, 1, 1, pipeline_schedule::gpipe, {4}}));      // a schedule, no pipeline
  EXPECT_TRUE(space.valid(pipeline_strategy{4, 1, 1, pipeline_schedule::one_f_one_b, {4}}));
  const auto e = estimate(pp, synthetic(1.0));
  // stage work per micro-batch: 5/4 (first and last: 1.25, middle: 1.0); the last stage's 1.25 paces
  EXPECT_GT(e.seconds, 4 * 1.25);
  EXPECT_EQ(e.seconds, e.pipeline_seconds);  // no data parallelism: nothing per step
  EXPECT_EQ(e.peak_memory, 100u + 4 * 2u);   // stage 0 stashes min(4 - 0, 4) micro-batches of 10 / 4 bytes
  EXPECT_TRUE(e.fits);
  const auto tight = estimate(pp, synthetic(1.0), 100);
  EXPECT_FALSE(tight.fits);
  EXPECT_TRUE(std::isinf(tight.seconds));
  const auto pure = space.pure();
  ASSERT_EQ(pure.size(), 3u);
  EXPECT_EQ(pure[0].data, 4);
  EXPECT_EQ(pure[1].tensor, 4);
  EXPECT_EQ(pure[2].stages(), 4);
  EXPECT_EQ(pure[2].micro_batches, 8);
}

/// Every strategy of `space`, enumerated independently of the search's proposals: each stage count that
/// divides the ranks, each data x tensor split of the rest, each cut of the blocks into that many
/// stages (compositions), each m and schedule; kept when space.valid.
std::vector<pipeline_strategy> every_strategy(const pipeline_space& space) {
  std::vector<pipeline_strategy> out;
  for (int p = 1; p <= space.ranks; ++p) {
    if (space.ranks % p != 0) continue;
    std::vector<std::vector<int>> cuts;  // compositions of space.blocks into p parts >= 1
    std::vector<int> cut;
    auto compose = [&](auto&& self, int left, int parts) -> void {
      if (parts == 0) {
        if (left == 0) cuts.push_back(cut);
        return;
      }
      for (int b = 1; b <= left; ++b) {
        cut.push_back(b);
        self(self, left - b, parts - 1);
        cut.pop_back();
      }
    };
    compose(compose, space.blocks, p);
    const int rest = space.ranks / p;
    for (int t = 1; t <= rest; ++t)
      if (rest % t == 0)
        for (const auto& blocks : cuts)
          for (int m : space.micro_batch_choices)
            for (auto schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
              pipeline_strategy s{rest / t, t, m, schedule, blocks};
              if (space.valid(s)) out.push_back(s);
            }
  }
  return out;
}

/// The least estimated step over `all` (+infinity when none fits).
double exhaustive_best(pipeline_search& search, const std::vector<pipeline_strategy>& all) {
  double best = INFINITY;
  for (const auto& s : all) best = std::min(best, search.estimate_of(s).seconds);
  return best;
}

TEST(search_pipeline, every_strategy_enumerates_the_space) {
  // 4 ranks, 4 blocks, batch 16, m in {1, 2, 4, 8}: one stage (3 meshes, m = 1, 1F1B); two stages
  // (2 meshes x 3 cuts x m with data x m | 16: 4 for data 1, 4 for data 2 x 2 schedules = 48); four
  // stages (1 cut x 4 m x 2 schedules = 8)
  const auto all = every_strategy(pipeline_space{4, 4, 16, 4, 256});
  EXPECT_EQ(all.size(), 3u + 48u + 8u);
  for (const auto& s : pipeline_space{4, 4, 16, 4, 256}.pure())
    EXPECT_TRUE(std::any_of(all.begin(), all.end(), [&](const auto& a) { return a.describe() == s.describe(); }))
        << s.describe();
}

TEST(search_pipeline, search_finds_the_exhaustive_best_and_is_deterministic) {
  pipeline_space space{4, 4, 16, 4, 256};
  const auto all = every_strategy(space);
  for (double sync : {0.0, 0.5, 4.0}) {
    for (std::uint64_t memory : {std::uint64_t{0}, std::uint64_t{260}}) {
      pipeline_search a(space, synthetic(sync), 1, memory), b(space, synthetic(sync), 1, memory);
      const pipeline_strategy found = a.run(400);
      EXPECT_TRUE(space.valid(found)) << found.describe();
      EXPECT_EQ(found.describe(), b.run(400).describe());
      const double best = exhaustive_best(a, all);
      ASSERT_TRUE(std::isfinite(best)) << "sync " << sync << " memory " << memory;
      EXPECT_EQ(a.estimate_of(found).seconds, best)
          << "sync " << sync << " memory " << memory << ": " << found.describe();
      if (sync == 0.0 && memory == 0) {
        EXPECT_EQ(found.data, 4) << found.describe();  // free allreduces: data parallel wins
      }
      if (sync == 4.0) {
        EXPECT_EQ(found.data, 1) << found.describe();  // dear allreduces: none
      }
    }
  }
}

TEST(search_pipeline, search_reaches_every_corner_of_the_space) {
  // For each strategy of a 6-rank space in turn, costs that favour it (each stage pays for every
  // feature in which it differs from the target's stage at that place): the search, started from the
  // pure strategies, must find the exhaustive best. A proposal kind that cannot reach some stage
  // count, mesh split, cut, m or schedule leaves a target unfound.
  pipeline_space space{6, 3, 24, 6, 6};
  space.micro_batch_choices = {1, 2, 4};
  const auto all = every_strategy(space);
  ASSERT_GT(all.size(), 30u);
  int missed = 0;
  for (const pipeline_strategy& target : all) {
    auto favour = [target](const stage_shape& s) {
      const int at = s.first ? 0 : s.last ? target.stages() - 1 : 1;  // a middle stage: compare the second
      const int want_blocks = at < target.stages() ? target.blocks[static_cast<std::size_t>(at)] : 1;
      const int differences = (s.stages != target.stages()) + (s.data != target.data) + (s.tensor != target.tensor) +
                              (s.micro_batches != target.micro_batches) + (s.blocks != want_blocks);
      stage_cost c;
      c.forward = (1.0 + 10.0 * differences) / s.micro_batches;
      c.backward = 2 * c.forward;
      return c;
    };
    pipeline_search search(space, favour, 3);
    const pipeline_strategy found = search.run(600);
    const double best = exhaustive_best(search, all);
    if (search.estimate_of(found).seconds != best) {
      ++missed;
      ADD_FAILURE() << "target " << target.describe() << ": found " << found.describe() << " ("
                    << search.estimate_of(found).seconds << " s), the best is " << best << " s";
    }
  }
  EXPECT_EQ(missed, 0) << "of " << all.size() << " targets";
}

TEST(search_pipeline, stages_priced_by_the_op_graph_simulator) {
  // a 16-device cluster of 4 nodes with a slow inter-node link; each stage's per-op configs searched
  const cluster cl = preset("16-4-slow-inter");
  const std::size_t batch = 64, seq = 128, hidden = 1024;
  auto stage_graph = [&](const stage_shape& s) {
    return reference::transformer_stage(static_cast<std::size_t>(s.blocks), s.first, s.last,
                                        batch / static_cast<std::size_t>(s.micro_batches), seq, hidden, 0);
  };
  auto activation = [&](const stage_shape& s) {
    return 4.0 * double(batch) / s.micro_batches * double(seq) * double(hidden) / s.data;
  };
  const stage_cost_fn cost = simulated_stage_costs(stage_graph, cl, activation, 1, 200);
  const stage_shape middle{4, 4, 1, 4, 2, false, false};
  const stage_cost a = cost(middle), b = cost(middle);  // memoized: the same answer
  EXPECT_EQ(a.forward, b.forward);
  EXPECT_GT(a.forward, 0);
  EXPECT_GT(a.backward, a.forward);  // a backward is two forwards' work
  EXPECT_DOUBLE_EQ(a.send, cl.inter.latency + activation(middle) / cl.inter.bandwidth);  // a stage fills a node
  EXPECT_EQ(cost({8, 2, 1, 4, 1, false, false}).send,
            cl.intra.latency + 4.0 * 16 * 128 * 1024 / 2 / cl.intra.bandwidth);  // two stages per node
  EXPECT_THROW((void)cost({2, 6, 1, 1, 4, true, false}), usage_error);           // 6 devices: not whole nodes
  // one stage is the whole model: priced by the per-op search's simulated step on the whole cluster
  simulator full(reference::transformer(8, batch, seq, hidden), cl);
  search_options options;
  options.iterations = 200;
  const double whole = mcmc_search(full, 1, options).run().best_time;
  EXPECT_EQ(cost({1, 16, 1, 1, 8, true, true}).forward, whole);
  pipeline_space space{16, 8, 64, 16, 1000};
  pipeline_search search(space, cost, 1);
  const pipeline_strategy found = search.run(300);
  EXPECT_TRUE(space.valid(found)) << found.describe();
  for (const auto& s : space.pure()) EXPECT_LE(search.estimate_of(found).seconds, search.estimate_of(s).seconds);
  // the slow inter-node link: stages keep the weights' synchronization off it, only activations cross
  EXPECT_GT(found.stages(), 1) << found.describe();
  EXPECT_LT(search.estimate_of(found).seconds, whole) << found.describe();
}

TEST(search_pipeline, json_round_trip) {
  const pipeline_strategy s{2, 1, 4, pipeline_schedule::gpipe, {3, 1}};
  const pipeline_strategy r = pipeline_strategy_from_json(to_json(s));
  EXPECT_EQ(r.describe(), s.describe());
  EXPECT_THROW((void)pipeline_strategy_from_json("{\"data\": 1}"), usage_error);
  EXPECT_THROW((void)pipeline_strategy_from_json("not json"), usage_error);
  EXPECT_THROW((void)pipeline_strategy_from_json(
                   R"({"data": 1, "tensor": 1, "micro_batches": 1, "schedule": "zigzag", "blocks": [1]})"),
               usage_error);
}

}  // namespace
}  // namespace flexpar::search
