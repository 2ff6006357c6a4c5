// Pipelines as actor graphs: their stash counts, the time their schedules take on a unit-time machine,
// any register counts under random interleavings, and threads as ranks, all against the serial oracle.
#include <gtest/gtest.h>

#include <random>

#include <flexpar/comm/run_in_process.hpp>

#include <flexpar/actor/pipeline_sbp.hpp>

#include "pipeline_scenarios.hpp"

namespace flexpar {
namespace {

using namespace testing_support;

TEST(pipeline_stash_registers, gpipe_stashes_m_and_1f1b_stashes_stages_minus_stage) {
  for (int p = 1; p <= 8; ++p)
    for (int m : {1, 2, 3, 4, 7, 8, 16})
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(stash_registers(pipeline_schedule::gpipe, p, s, m), static_cast<std::size_t>(m));
        EXPECT_EQ(stash_registers(pipeline_schedule::one_f_one_b, p, s, m),
                  static_cast<std::size_t>(std::min(p - s, m)));
      }
  EXPECT_THROW((void)stash_registers(pipeline_schedule::gpipe, 4, 4, 2), usage_error);
  EXPECT_THROW((void)stash_registers(pipeline_schedule::gpipe, 4, 0, 0), usage_error);
  EXPECT_THROW((void)stash_registers(pipeline_schedule::gpipe, 4, 0, 1, 0), usage_error);
  EXPECT_EQ(stash_registers(pipeline_schedule::one_f_one_b, 8, 2, 16, 2), 7u);  // interleaved: one more
  EXPECT_EQ(stash_registers(pipeline_schedule::one_f_one_b, 8, 2, 4, 2), 4u);
  EXPECT_EQ(stash_registers(pipeline_schedule::gpipe, 8, 2, 4, 2), 4u);
  EXPECT_DOUBLE_EQ(pipeline_bubble_theory(4, 1, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble_theory(4, 2, 8), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble_theory(1, 1, 8), 0.0);
}

config test_config() {
  config c;
  c.timeout = std::chrono::seconds(30);
  return c;
}

// On a machine where every firing takes one time unit (deterministic_scheduler::run_rounds), with
// each stage on a device of its own (streams), the schedules that follow from the register counts
// take exactly the theoretical time, 2 (m + p - 1) units (bubble (p - 1) / (m + p - 1)), and every
// stage fills its stash.
TEST(pipeline_rounds, gpipe_and_1f1b_take_the_theoretical_time_and_fill_their_stash) {
  for (pipeline_schedule schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b})
    for (int p = 1; p <= 6; ++p)
      for (int m : {1, 2, 3, 4, 7, 8, 16}) {
        pipeline_case c{std::vector<int>(static_cast<std::size_t>(p), 0), m, 3, schedule};
        for (int s = 0; s < p; ++s) c.streams.push_back(s);
        run_in_process(1, [&](communicator& comm) {
          const auto out = pipeline_matches_serial(comm, c, pipeline_drive::rounds);
          for (std::size_t rounds : out.rounds)
            EXPECT_EQ(rounds, 2u * static_cast<std::size_t>(m + p - 1))
                << name_of(schedule) << " p " << p << " m " << m;
          EXPECT_DOUBLE_EQ(1.0 - 2.0 * m / static_cast<double>(out.rounds.front()), pipeline_bubble_theory(p, 1, m));
          for (const auto& s : out.last.stages)
            EXPECT_EQ(s.peak_activations, s.stash_registers)
                << name_of(schedule) << " p " << p << " m " << m << " stage " << s.stage;
        });
      }
}

// Interleaved 1F1B: v stages per device, placed round-robin (stage j on device j mod p), with the
// 1F1B counts over all v p stages (+1). Each firing is 1/v of a device's layers, so the ideal step
// is 2 v m units and the theory's bubble is (p - 1) / (v m + p - 1): 2 (v m + p - 1) units. The
// greedy order of the actors (no hand-written op list) ends within p - 1 units of it, and is
// faster than 1F1B over the same layers in p stages, 2 v (m + p - 1) units.
TEST(pipeline_rounds, interleaved_1f1b_ends_within_p_minus_1_units_of_the_theory) {
  for (int p : {2, 3, 4})
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) {
        pipeline_case c{std::vector<int>(static_cast<std::size_t>(v * p), 0), m, 2, pipeline_schedule::one_f_one_b};
        for (int s = 0; s < v * p; ++s) c.streams.push_back(s % p);
        run_in_process(1, [&](communicator& comm) {
          const auto out = pipeline_matches_serial(comm, c, pipeline_drive::rounds);
          const auto theory = 2u * static_cast<std::size_t>(v * m + p - 1);
          const auto plain = 2u * static_cast<std::size_t>(v * (m + p - 1));
          for (std::size_t rounds : out.rounds) {
            EXPECT_GE(rounds, theory) << "p " << p << " v " << v << " m " << m;
            EXPECT_LE(rounds, theory + static_cast<std::size_t>(p - 1)) << "p " << p << " v " << v << " m " << m;
            EXPECT_LT(rounds, plain) << "p " << p << " v " << v << " m " << m;
          }
        });
      }
}

// Any register counts >= 1 (stash and gradient edges) run to the serial result under random
// interleavings: back-pressure never deadlocks, it only stalls.
TEST(pipeline_random, any_register_counts_run_without_deadlock) {
  std::mt19937_64 pick(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int p = 1 + static_cast<int>(pick() % 4);
    const int m = 1 + static_cast<int>(pick() % 6);
    pipeline_case c{std::vector<int>(static_cast<std::size_t>(p), 0), m, 2,
                    pick() % 2 ? pipeline_schedule::gpipe : pipeline_schedule::one_f_one_b};
    for (int s = 0; s < p; ++s) c.stash.push_back(1 + pick() % static_cast<std::uint64_t>(m + 1));
    c.gradient_registers = 1 + pick() % 3;
    run_in_process(1, [&](communicator& comm) { pipeline_matches_serial(comm, c, pipeline_drive::random, pick()); });
  }
}

TEST(pipeline_inproc, equals_the_serial_result_with_the_measured_stash_bounds) {
  for (pipeline_schedule schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b})
    for (int p : {1, 2, 3, 4, 5})
      for (int m : {1, 3, 4, 8})
        for (std::size_t width : {std::size_t{0}, std::size_t{5}}) {
          pipeline_case c{{}, m, width, schedule};
          for (int s = 0; s < p; ++s) c.placement.push_back(s);
          for (pipeline_drive how : {pipeline_drive::pool, pipeline_drive::random})
            run_in_process(
                p, [&](communicator& comm) { pipeline_matches_serial(comm, c, how); }, test_config());
        }
}

TEST(pipeline_inproc, interleaved_stages_and_small_register_counts_across_ranks) {
  for (int p : {2, 3})
    for (int m : {1, 4, 6}) {
      pipeline_case c{{}, m, 4, pipeline_schedule::one_f_one_b};
      for (int s = 0; s < 2 * p; ++s) c.placement.push_back(s % p);
      run_in_process(
          p, [&](communicator& comm) { pipeline_matches_serial(comm, c); }, test_config());
      c.stash.assign(c.placement.size(), 1);
      c.gradient_registers = 1;
      for (pipeline_drive how : {pipeline_drive::pool, pipeline_drive::random})
        run_in_process(
            p, [&](communicator& comm) { pipeline_matches_serial(comm, c, how); }, test_config());
    }
}

TEST(pipeline_inproc, stages_on_any_ranks_and_idle_ranks) {
  // 4 stages on ranks 4, 2, 0, 1 of 6: ranks 3 and 5 hold no stage.
  for (pipeline_schedule schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b})
    run_in_process(
        6,
        [&](communicator& comm) {
          pipeline_matches_serial(comm, {{4, 2, 0, 1}, 6, 33, schedule});
        },
        test_config());
}

// Stages on sub-meshes: data and tensor parallelism inside stages, activations moved piecewise
// between layouts (a placement change on actor edges), gradients of broadcast inputs summed.
sbp::nd_parallel layout(std::initializer_list<sbp::parallel> axes) {
  sbp::nd_parallel l;
  l.rank = axes.size();
  std::size_t d = 0;
  for (const sbp::parallel& a : axes) l[d++] = a;
  return l;
}
const sbp::parallel B = sbp::parallel::B(), S0 = sbp::parallel::S(0), S1 = sbp::parallel::S(1);

TEST(pipeline_meshes, stages_on_sub_meshes_equal_the_serial_result) {
  // Four stages on two meshes of two ranks, alternating (rank 0 and 1 hold stages 0 and 2): every
  // pair of layouts across a boundary (B -> S(1), S(1) -> S(0), S(0) -> B, ...), even and uneven.
  const std::vector<stage_mesh> alternating = {{{0, 1}, {}, layout({B}), layout({S0})},
                                               {{2, 3}, {}, layout({S1}), layout({S1})},
                                               {{0, 1}, {}, layout({S0}), layout({S0})},
                                               {{2, 3}, {}, layout({B}), layout({B})}};
  for (pipeline_schedule schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b})
    for (std::size_t rows : {4, 5})
      for (pipeline_drive how : {pipeline_drive::pool, pipeline_drive::random})
        run_in_process(
            4,
            [&](communicator& comm) {
              mesh_pipeline_matches_serial(comm, {alternating, rows, 3, 4, schedule}, how);
            },
            test_config());
  // A 2 x 2 mesh holding two stages, nd layouts.
  const std::vector<stage_mesh> square = {{{0, 1, 2, 3}, {2, 2}, layout({S0, B}), layout({S0, S1})},
                                          {{0, 1, 2, 3}, {2, 2}, layout({B, B}), layout({S1, S0})}};
  run_in_process(
      4,
      [&](communicator& comm) {
        mesh_pipeline_matches_serial(comm, {square, 5, 3, 3});
      },
      test_config());
  // One-rank stages around a two-rank one, and a box left empty (1 row over 2 ranks); 3 ranks.
  const std::vector<stage_mesh> mixed = {
      {{0}, {}, {}, {}}, {{1, 2}, {}, layout({S0}), layout({S0})}, {{0}, {}, {}, {}}};
  for (std::size_t rows : {1, 4})
    run_in_process(
        3,
        [&](communicator& comm) {
          mesh_pipeline_matches_serial(comm, {mixed, rows, 3, 5});
        },
        test_config());
}

// Collectives inside the bodies (an allreduce over the stage's mesh in every forward and backward):
// every rank of a mesh fires in the order fixed at build, so the collectives match.
TEST(pipeline_meshes, collectives_inside_stages_follow_one_order) {
  const std::vector<stage_mesh> alternating = {{{0, 1}, {}, layout({B}), layout({S0})},
                                               {{2, 3}, {}, layout({S1}), layout({S1})},
                                               {{0, 1}, {}, layout({S0}), layout({S0})},
                                               {{2, 3}, {}, layout({S0}), layout({S0})}};
  for (pipeline_schedule schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b})
    for (pipeline_drive how : {pipeline_drive::pool, pipeline_drive::random}) {
      mesh_case c{alternating, 4, 3, 6, schedule};
      c.collective = true;
      run_in_process(
          4, [&](communicator& comm) { mesh_pipeline_matches_serial(comm, c, how); }, test_config());
    }
}

// stage_on<In, Out>(placement): the same mesh as written out by hand, from the SBP types.
TEST(pipeline_meshes, stage_on_a_placement_takes_its_ranks_and_the_types_layouts) {
  run_in_process(
      4,
      [&](communicator& comm) {
        using sbp::broadcast;
        using sbp::split;
        sbp::placement<2> square(comm, {2, 2});
        sbp::placement<1> pair(comm, {2}, {3, 1});
        const stage_mesh a = stage_on<sbp::sbp<split<0>, broadcast>, sbp::sbp<split<0>, split<1>>>(square);
        EXPECT_EQ(a.ranks, (std::vector<int>{0, 1, 2, 3}));
        EXPECT_EQ(a.shape, (std::vector<int>{2, 2}));
        EXPECT_TRUE(a.input == layout({S0, B}));
        EXPECT_TRUE(a.output == layout({S0, S1}));
        const stage_mesh b = stage_on<broadcast, split<1>>(pair);  // a one-axis SBP on a one-axis mesh
        EXPECT_EQ(b.ranks, (std::vector<int>{3, 1}));
        EXPECT_TRUE(b.input == layout({B}) && b.output == layout({S1}));
        mesh_pipeline_matches_serial(
            comm, {{a, stage_on<sbp::sbp<broadcast, broadcast>, sbp::sbp<split<1>, split<0>>>(square)}, 5, 3, 4});
      },
      test_config());
}

TEST(pipeline_meshes, bad_meshes_are_usage_errors) {
  run_in_process(
      3,
      [&](communicator& comm) {
        auto bad = [&](std::vector<stage_mesh> meshes, std::vector<sbp::shape_t> shapes) {
          pipeline_builder b(comm);
          for (std::size_t s = 0; s < meshes.size(); ++s)
            b.stage(meshes[s], {"s", [](int, const std::vector<float>&, std::vector<float>&) {},
                                [](int, const std::vector<float>&, const std::vector<float>&, const std::vector<float>&,
                                   std::vector<float>&) {}});
          b.activation_shapes(shapes)
              .input([](int, std::vector<float>&) {})
              .loss([](int, const std::vector<float>&, std::vector<float>&) { return 0.0f; });
          EXPECT_THROW(b.build(), usage_error);
        };
        const sbp::shape_t shape{4, 3};
        bad({{{0, 1}, {}, layout({S0}), layout({S0})}, {{1, 2}, {}, layout({S0}), layout({S0})}}, {shape});  // overlap
        bad({{{0, 1}, {}, layout({S0, B}), layout({S0})}, {{2}, {}, {}, {}}}, {shape});  // 2 entries on 1 axis
        bad({{{0, 1}, {}, layout({sbp::parallel::P()}), layout({S0})}, {{2}, {}, {}, {}}}, {shape});   // partial
        bad({{{0, 1}, {}, layout({S0}), layout({S0})}, {{2}, {}, {}, {}}}, {});                        // no shape
        bad({{{0, 1}, {}, layout({S0}), layout({sbp::parallel::S(2)})}, {{2}, {}, {}, {}}}, {shape});  // axis 2 of 2-D
        bad({{{0, 1}, {3}, layout({S0}), layout({S0})}, {{2}, {}, {}, {}}}, {shape});  // 3 cells, 2 ranks
        bad({{{0, 0}, {}, layout({S0}), layout({S0})}, {{2}, {}, {}, {}}}, {shape});   // a rank twice
      },
      test_config());
}

TEST(pipeline_inproc, bad_settings_are_usage_errors) {
  run_in_process(
      2,
      [&](communicator& comm) {
        EXPECT_THROW(pipeline_matches_serial(comm, {{0, 2}, 2, 1, pipeline_schedule::gpipe}), usage_error);
        pipeline_case c{{0, 1}, 2, 1, pipeline_schedule::gpipe};
        c.stash = {1};
        EXPECT_THROW(pipeline_matches_serial(comm, c), usage_error);
        c.stash = {1, 0};
        EXPECT_THROW(pipeline_matches_serial(comm, c), usage_error);
        c.stash = {};
        c.gradient_registers = 0;
        EXPECT_THROW(pipeline_matches_serial(comm, c), usage_error);
        c.gradient_registers = 1;
        c.streams = {0};
        EXPECT_THROW(pipeline_matches_serial(comm, c), usage_error);
      },
      test_config());
}

}  // namespace
}  // namespace flexpar
