// Pipeline schedules (pure functions) and pipelines over threads as ranks against the serial oracle.
#include <gtest/gtest.h>

#include <map>

#include <flexpar/comm/run_in_process.hpp>

#include "pipeline_scenarios.hpp"

namespace flexpar {
namespace {

using namespace testing_support;

/// Every micro-batch forwarded once then backwarded once; the stash peak the ops imply.
std::size_t check_ops_and_peak(const std::vector<pipeline_op>& ops, int m) {
  std::map<int, int> state;  // 0 none, 1 forwarded, 2 backwarded
  std::size_t live = 0, peak = 0;
  int last_backward = -1;
  for (const auto& op : ops) {
    int& st = state[op.micro_batch];
    if (op.what == pipeline_op::kind::forward) {
      EXPECT_EQ(st, 0);
      st = 1;
      peak = std::max(peak, ++live);
    } else {
      EXPECT_EQ(st, 1);
      EXPECT_EQ(op.micro_batch, last_backward + 1) << "backwards run in micro-batch order";
      last_backward = op.micro_batch;
      st = 2;
      --live;
    }
  }
  EXPECT_EQ(static_cast<int>(state.size()), m);
  EXPECT_EQ(ops.size(), 2 * static_cast<std::size_t>(m));
  return peak;
}

TEST(pipeline_schedule_ops, gpipe_stashes_m_and_1f1b_stashes_p_minus_stage) {
  for (int p = 1; p <= 8; ++p)
    for (int m : {1, 2, 3, 4, 7, 8, 16})
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(check_ops_and_peak(schedule_ops(pipeline_schedule::gpipe, p, s, m), m), static_cast<std::size_t>(m));
        EXPECT_EQ(check_ops_and_peak(schedule_ops(pipeline_schedule::one_f_one_b, p, s, m), m),
                  static_cast<std::size_t>(std::min(p - s, m)));
      }
  using k = pipeline_op::kind;
  const std::vector<pipeline_op> stage1_of_4 = {{k::forward, 0}, {k::forward, 1},  {k::forward, 2},  {k::backward, 0},
                                                {k::forward, 3}, {k::backward, 1}, {k::backward, 2}, {k::backward, 3}};
  EXPECT_EQ(schedule_ops(pipeline_schedule::one_f_one_b, 4, 1, 4), stage1_of_4);
  EXPECT_THROW(schedule_ops(pipeline_schedule::gpipe, 4, 4, 2), usage_error);
  EXPECT_THROW(schedule_ops(pipeline_schedule::gpipe, 4, 0, 0), usage_error);
}

config test_config() {
  config c;
  c.timeout = std::chrono::seconds(30);
  return c;
}

TEST(pipeline_inproc, equals_the_serial_result_with_the_measured_stash_bounds) {
  for (pipeline_schedule schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b})
    for (int p : {1, 2, 3, 4, 5})
      for (int m : {1, 3, 4, 8})
        for (std::size_t width : {std::size_t{0}, std::size_t{5}}) {
          std::vector<int> placement(static_cast<std::size_t>(p));
          for (int s = 0; s < p; ++s) placement[static_cast<std::size_t>(s)] = s;
          run_in_process(
              p, [&](communicator& comm) { pipeline_matches_serial(comm, placement, m, width, schedule); },
              test_config());
        }
}

TEST(pipeline_inproc, stages_on_any_ranks_and_idle_ranks) {
  // 4 stages on ranks 4, 2, 0, 1 of 6: ranks 3 and 5 hold no stage.
  for (pipeline_schedule schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b})
    run_in_process(
        6,
        [&](communicator& comm) {
          pipeline_matches_serial(comm, {4, 2, 0, 1}, 6, 33, schedule);
        },
        test_config());
}

TEST(pipeline_inproc, bad_placement_is_a_usage_error) {
  run_in_process(
      2,
      [&](communicator& comm) {
        EXPECT_THROW(pipeline_matches_serial(comm, {0, 2}, 2, 1, pipeline_schedule::gpipe), usage_error);
        EXPECT_THROW(pipeline_matches_serial(comm, {0, 0}, 2, 1, pipeline_schedule::gpipe), usage_error);
      },
      test_config());
}

}  // namespace
}  // namespace flexpar
