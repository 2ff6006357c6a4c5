// The engine over threads-as-ranks: every scenario at several world sizes, plus stall and timeline.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include <flexpar/collective.hpp>
#include <flexpar/comm/run_in_process.hpp>

#include "engine_scenarios.hpp"
#include "gradient_sync_scenarios.hpp"
#include "plan_scenarios.hpp"

namespace flexpar {
namespace {

config test_config(std::size_t fusion = std::size_t{1} << 20) {
  config c;
  c.timeout = std::chrono::seconds(60);
  c.fusion_threshold = fusion;
  c.cycle_time = std::chrono::microseconds(500);
  return c;
}

class engine_inproc : public ::testing::TestWithParam<int> {};

TEST_P(engine_inproc, random_order_with_fusion) {
  run_in_process(GetParam(),
                 [](communicator& comm) { testing_support::random_order_allreduces(comm, test_config(), 300, 3000); });
}

TEST_P(engine_inproc, random_order_without_fusion) {
  run_in_process(GetParam(),
                 [](communicator& comm) { testing_support::random_order_allreduces(comm, test_config(0), 200, 300); });
}

TEST_P(engine_inproc, every_collective) {
  run_in_process(GetParam(), [](communicator& comm) { testing_support::every_collective(comm, test_config()); });
}

TEST_P(engine_inproc, join_with_uneven_steps) {
  run_in_process(GetParam(), [](communicator& comm) { testing_support::uneven_steps_with_join(comm, test_config()); });
}

TEST_P(engine_inproc, gradient_sync_average_and_sum_with_and_without_fp16) {
  run_in_process(GetParam(), [](communicator& comm) {
    for (auto reduction : {gradient_reduction::average, gradient_reduction::sum})
      for (auto compression : {wire_compression::none, wire_compression::fp16})
        testing_support::gradient_sync_steps(comm, test_config(), reduction, compression);
  });
}

TEST_P(engine_inproc, gradient_sync_fp16_rounds_what_half_cannot_hold) {
  run_in_process(GetParam(),
                 [](communicator& comm) { testing_support::gradient_sync_fp16_rounds(comm, test_config()); });
}

TEST_P(engine_inproc, gradient_sync_arena_and_own_buffers_agree_bit_for_bit) {
  run_in_process(GetParam(),
                 [](communicator& comm) { testing_support::arena_and_own_buffers_agree(comm, test_config()); });
}

TEST_P(engine_inproc, gradient_sync_frozen_and_added_parameters) {
  run_in_process(GetParam(), [](communicator& comm) {
    for (bool in_arena : {false, true}) testing_support::frozen_and_added_parameters(comm, test_config(), in_arena);
  });
}

TEST_P(engine_inproc, a_frozen_plan_replays_steps_in_any_order) {
  run_in_process(GetParam(),
                 [](communicator& comm) { testing_support::plan_replays_in_any_order(comm, test_config()); });
}

TEST_P(engine_inproc, a_new_tensor_drops_the_plan_and_it_freezes_again) {
  run_in_process(GetParam(), [](communicator& comm) {
    testing_support::a_new_tensor_drops_the_plan_and_freezes_again(comm, test_config());
  });
}

TEST_P(engine_inproc, quiet_engines_sleep_and_wait_past_the_timeout) {
  config cfg = test_config();
  cfg.timeout = std::chrono::milliseconds(400);  // the communicator's deadline, which the engine's waits take
  run_in_process(
      GetParam(),
      [&](communicator& comm) { testing_support::quiet_engines_sleep_and_wait_past_the_timeout(comm, cfg); }, cfg);
}

INSTANTIATE_TEST_SUITE_P(world, engine_inproc, ::testing::Values(1, 2, 3, 4, 5),
                         [](const auto& info) { return std::string("p").append(std::to_string(info.param)); });

TEST(engine_inproc_errors, mismatches_name_the_field_and_the_ranks) {
  for (int p : {2, 3}) run_in_process(p, [](communicator& comm) { testing_support::mismatches(comm, test_config()); });
}

TEST(engine_inproc_errors, every_field_on_every_collective) {
  for (int p : {2, 4})
    run_in_process(p, [](communicator& comm) { testing_support::mismatch_matrix(comm, test_config()); });
}

TEST(engine_inproc_errors, submitting_a_name_that_is_in_flight_is_a_usage_error) {
  run_in_process(2, [](communicator& comm) {
    engine eng(comm, test_config());
    std::vector<float> a(4, 1.0f), b(4, 1.0f);
    handle first, second;
    if (comm.rank() == 0) {
      first = eng.allreduce_async("x", std::span(a), reduce_op::sum);
      second = eng.allreduce_async("x", std::span(b), reduce_op::sum);
      EXPECT_NE(
          testing_support::what_of(second).find("\"x\" was submitted again while the previous one is still in flight"),
          std::string::npos)
          << testing_support::what_of(second);
      first.wait();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      eng.allreduce_async("x", std::span(a), reduce_op::sum).wait();
    }
    EXPECT_EQ(a[0], 2.0f);
  });
}

TEST(engine_inproc_errors, a_withheld_tensor_warns_then_times_out_on_the_ranks_that_submitted_it) {
  std::mutex log_mutex;
  std::vector<std::string> lines;
  run_in_process(3, [&](communicator& comm) {
    config cfg = test_config();
    cfg.stall_warning = std::chrono::milliseconds(200);
    cfg.stall_shutdown = std::chrono::milliseconds(1000);
    engine eng(comm, cfg, [&](std::string_view line) {
      std::lock_guard lock(log_mutex);
      lines.emplace_back(line);
    });
    std::vector<float> v(16, 1.0f);
    if (comm.rank() != 1) {
      const auto start = clock::now();
      handle h = eng.allreduce_async("withheld", std::span(v), reduce_op::sum);
      try {
        h.wait();
        ADD_FAILURE() << "a tensor rank 1 never submitted completed";
      } catch (const timeout_error& e) {
        const double waited = std::chrono::duration<double>(clock::now() - start).count();
        EXPECT_GE(waited, 0.95);
        EXPECT_LT(waited, 5.0);
        EXPECT_NE(std::string(e.what()).find("allreduce \"withheld\": rank {1} did not submit it within 1 s"),
                  std::string::npos)
            << e.what();
      }
    }
    // Everyone goes on working afterwards. Rank 1 comes later than the others' timeout (had it
    // submitted "next" at once, "next" would itself have stalled past the deadline while the
    // others were blocked waiting for "withheld").
    if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    eng.allreduce_async("next", std::span(v), reduce_op::sum).wait();
    EXPECT_EQ(v[0], 3.0f);
  });
  bool warned = false;
  for (const auto& l : lines)
    warned = warned || (l.find("stall: allreduce \"withheld\" submitted by ranks {0,2}") != std::string::npos &&
                        l.find("for rank {1}") != std::string::npos);
  EXPECT_TRUE(warned) << "no stall warning naming the tensor and rank 1 among " << lines.size() << " lines";
}

TEST(engine_plan, a_changed_count_is_a_mismatch_naming_both_sides) {
  for (int p : {2, 3})
    run_in_process(p, [](communicator& comm) {
      testing_support::a_changed_count_is_a_mismatch_naming_both_sides(comm, test_config());
    });
}

TEST(engine_plan, a_rank_that_ends_its_step_without_a_tensor_is_named_at_once) {
  for (int p : {2, 3})
    run_in_process(p, [](communicator& comm) {
      config cfg = test_config();
      cfg.plan_patience = std::chrono::seconds(3);  // named long before the plan would give up
      testing_support::a_rank_that_skips_a_tensor_is_named_at_once(comm, cfg);
    });
}

TEST(engine_plan, a_tensor_no_rank_submits_is_left_out_with_or_without_end_step) {
  for (bool end : {true, false})
    run_in_process(3, [end](communicator& comm) {
      config cfg = test_config();
      cfg.plan_patience = end ? std::chrono::microseconds(std::chrono::seconds(3)) : std::chrono::milliseconds(200);
      testing_support::a_tensor_no_rank_submits_is_left_out(comm, cfg, end);
    });
}

TEST(engine_plan, a_withheld_tensor_times_out_naming_the_rank_after_the_patience) {
  run_in_process(3, [](communicator& comm) {
    config cfg = test_config();
    cfg.plan_patience = std::chrono::milliseconds(200);
    cfg.stall_warning = std::chrono::milliseconds(200);
    cfg.stall_shutdown = std::chrono::milliseconds(500);
    testing_support::a_withheld_tensor_times_out_after_the_patience(comm, cfg);
  });
}

TEST(engine_plan, without_step_plan_every_step_is_negotiated) {
  run_in_process(2, [](communicator& comm) {
    config cfg = test_config();
    cfg.step_plan = false;
    engine eng(comm, cfg);
    testing_support::stepped_tensors m(testing_support::plan_counts());
    for (int step = 0; step < 6; ++step) m.step(eng, step);
    EXPECT_EQ(eng.stats().plans_frozen, 0u);
    EXPECT_EQ(eng.stats().planned_tensors, 0u);
  });
}

// Quiet (lib/engine/engine.cpp): rank 1 comes back with a tensor while rank 0 stays quiet; its wait
// for rank 0's answer has no deadline of its own, but warns every stall_warning and ends the engine
// at stall_shutdown with a timeout_error, never hanging.
TEST(engine_inproc_errors, a_rank_back_from_quiet_warns_then_gives_up_at_stall_shutdown) {
  std::mutex log_mutex;
  std::vector<std::string> lines;
  config cfg = test_config();
  cfg.timeout = std::chrono::seconds(1);  // rank 0's shutdown waits this long for rank 1's ended engine
  cfg.stall_warning = std::chrono::milliseconds(150);
  cfg.stall_shutdown = std::chrono::milliseconds(500);
  run_in_process(
      2,
      [&](communicator& comm) {
        engine eng(comm, cfg, [&](std::string_view line) {
          std::lock_guard lock(log_mutex);
          lines.emplace_back(line);
        });
        std::vector<float> v(8, 1.0f);
        eng.allreduce_async("first", std::span(v), reduce_op::sum).wait();  // then every rank is quiet
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (comm.rank() == 1) {
          const auto start = clock::now();
          try {
            eng.allreduce_async("second", std::span(v), reduce_op::sum).wait();
            ADD_FAILURE() << "a tensor rank 0 never submitted completed";
          } catch (const timeout_error& e) {
            EXPECT_GE(clock::now() - start, std::chrono::milliseconds(450));
            EXPECT_NE(std::string(e.what()).find("for rank 0's answer"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("FLEXPAR_STALL_SHUTDOWN_S"), std::string::npos) << e.what();
          }
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(800));
        }
      },
      cfg);
  std::size_t warned = 0;
  for (const auto& l : lines)
    if (l.find("has waited") != std::string::npos && l.find("for rank 0's answer") != std::string::npos) ++warned;
  EXPECT_GE(warned, 2u) << "fewer than two warnings (every 0.15 s for 0.5 s) among " << lines.size() << " lines";
}

TEST(engine_inproc_errors, join_has_a_deadline) {
  run_in_process(2, [](communicator& comm) {
    config cfg = test_config();
    cfg.timeout = std::chrono::milliseconds(400);
    engine eng(comm, cfg);
    if (comm.rank() == 0) {
      try {
        eng.join();
        ADD_FAILURE() << "join returned although rank 1 never joined";
      } catch (const timeout_error& e) {
        EXPECT_NE(std::string(e.what()).find("engine::join: not every rank joined within 0.4 s"), std::string::npos)
            << e.what();
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
    }
  });
}

/// Runs 3 steps of 6 fused gradients on 2 ranks (`ranks_per_node` 1: two nodes, the transport ring;
/// 2: one node, the shared-memory segment) with a timeline; returns the phases of every (rank, track)
/// and the ALLREDUCE's algorithm of every (rank, tensor), after checking that tracks never go back.
struct traced_phases {
  std::map<std::pair<int, std::string>, std::set<std::string>> phases;  // (rank, track) -> event names
  std::map<std::pair<int, std::string>, std::string> algorithm;         // (rank, tensor) -> its ALLREDUCE's
  std::map<std::tuple<int, std::string, std::string>, int> spans;       // (rank, track, event) -> how many
};

/// A machine on which the segment wins at every size (a measured one follows the load of this
/// machine, and under a parallel ctest the transport's blocking waits can win).
constexpr cost_params segment_wins{20e-6, 1.0 / 1e9, 1.0 / 10e9, 0.5e-6, 1.0 / 20e9};

traced_phases trace_fused_steps(int ranks_per_node, const cost_params& machine = segment_wins, int steps = 3) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("flexpar_engine_timeline_test" + std::to_string(ranks_per_node) + ".json"))
                               .string();
  std::filesystem::remove(path);
  run_in_process(
      2,
      [&](communicator& comm) {
        config cfg = test_config();
        cfg.timeline_path = path;
        cfg.timeline_mark_cycles = true;
        set_cost_params(comm, machine);  // the engine's communicator inherits it
        engine eng(comm, cfg);
        std::vector<std::vector<float>> grads(6, std::vector<float>(256, 1.0f));
        for (int step = 0; step < steps; ++step) {
          std::vector<handle> hs;
          for (std::size_t i = 0; i < grads.size(); ++i)
            hs.push_back(
                eng.allreduce_async("layer" + std::to_string(i) + ".grad", std::span(grads[i]), reduce_op::sum));
          for (auto& h : hs) h.wait();
        }
      },
      test_config(), ranks_per_node);
  traced_phases out;
  std::ifstream file(path);
  EXPECT_TRUE(file) << path;
  if (!file) return out;
  const nlohmann::json doc = nlohmann::json::parse(file);
  const auto& events = doc.at("traceEvents");
  std::map<std::pair<int, int>, std::string> track_names;
  for (const auto& e : events)
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      track_names[{e.at("pid").get<int>(), e.at("tid").get<int>()}] = e.at("args").at("name");
  std::map<std::pair<int, int>, double> last_ts;
  for (const auto& e : events) {
    if (e.at("ph") == "M") continue;
    const int pid = e.at("pid"), tid = e.at("tid");
    const double ts = e.at("ts");
    auto [it, fresh] = last_ts.try_emplace({pid, tid}, ts);
    EXPECT_GE(ts, it->second) << "track " << track_names[{pid, tid}] << " of rank " << pid << " goes back in time";
    it->second = ts;
    const std::string name = e.at("name").get<std::string>();
    out.phases[{pid, track_names[{pid, tid}]}].insert(name);
    if (name == "ALLREDUCE" && e.contains("args") && e.at("args").contains("algorithm"))
      out.algorithm[{pid, track_names[{pid, tid}]}] = e.at("args").at("algorithm").get<std::string>();
    if (e.at("ph") == "X") ++out.spans[{pid, track_names[{pid, tid}], name}];
  }
  std::filesystem::remove(path);
  return out;
}

TEST(engine_timeline, chrome_trace_has_every_phase_per_tensor_and_monotonic_tracks) {
  // two nodes: the fused tensors go through the fusion buffer (copied in and out)
  traced_phases t = trace_fused_steps(1);
  for (int rank : {0, 1})
    for (int i = 0; i < 6; ++i) {
      const auto& got = t.phases[{rank, "layer" + std::to_string(i) + ".grad"}];
      for (const char* want :
           {"NEGOTIATE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER", "ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"})
        EXPECT_TRUE(got.contains(want)) << "rank " << rank << " layer" << i << " has no " << want;
      if (rank == 0) {
        EXPECT_TRUE(got.contains("READY rank 1")) << "the coordinator marks each rank's readiness";
      }
    }
  EXPECT_FALSE((t.phases[{0, "cycles"}].empty()));
}

TEST(engine_timeline, the_engine_chooses_on_the_machine_of_the_communicator_it_was_made_from) {
  // one node, but a machine whose segment hand-offs cost a millisecond: the fused runs take the
  // transport (packed through the fusion buffer, whose copies this machine makes cheap), as
  // `automatic` on the user's communicator would
  traced_phases t = trace_fused_steps(2, cost_params{1e-6, 1.0 / 10e9, 1.0 / 10e9, 1e-3, 1.0 / 10e9});
  for (int rank : {0, 1}) {
    const auto& got = t.phases[{rank, "layer0.grad"}];
    EXPECT_NE((t.algorithm[{rank, "layer0.grad"}]), "shared_memory") << "rank " << rank;
    EXPECT_TRUE(got.contains("MEMCPY_IN_FUSION_BUFFER")) << "rank " << rank;
  }
}

TEST(engine_timeline, fused_tensors_on_one_node_are_reduced_in_place_without_fusion_buffer_copies) {
  traced_phases t = trace_fused_steps(2);
  for (int rank : {0, 1})
    for (int i = 0; i < 6; ++i) {
      const std::string tensor = "layer" + std::to_string(i) + ".grad";
      const auto& got = t.phases[{rank, tensor}];
      EXPECT_TRUE(got.contains("ALLREDUCE")) << "rank " << rank << " " << tensor;
      EXPECT_EQ((t.algorithm[{rank, tensor}]), "shared_memory") << "rank " << rank << " " << tensor;
      EXPECT_FALSE(got.contains("MEMCPY_IN_FUSION_BUFFER") || got.contains("MEMCPY_OUT_FUSION_BUFFER"))
          << "rank " << rank << " " << tensor << " was copied through the fusion buffer";
    }
}

TEST(engine_timeline, the_steady_state_still_shows_every_tensors_phases_in_every_step) {
  const int steps = 8;  // from the third on under the frozen plan
  traced_phases t = trace_fused_steps(2, segment_wins, steps);
  for (int rank : {0, 1})
    for (int i = 0; i < 6; ++i) {
      const std::string tensor = "layer" + std::to_string(i) + ".grad";
      for (const char* phase : {"NEGOTIATE", "QUEUE", "ALLREDUCE"})
        EXPECT_EQ((t.spans[{rank, tensor, phase}]), steps) << "rank " << rank << " " << tensor << " " << phase;
    }
  EXPECT_GT((t.phases[{0, "cycles"}].count("PLAN ROUND")), 0u) << "the rounds of the plan are marked";
}

TEST(engine_cache, steady_state_reports_cache_slots) {
  run_in_process(2, [](communicator& comm) {
    config cfg = test_config();
    cfg.step_plan = false;  // the response cache's own steady state, without the frozen plan above it
    engine eng(comm, cfg);
    std::vector<float> v(64, 1.0f);
    for (int step = 0; step < 5; ++step) eng.allreduce_async("w", std::span(v), reduce_op::sum).wait();
    const auto s = eng.stats();
    EXPECT_EQ(s.full_reports, 1u);
    EXPECT_EQ(s.cache_hits, 4u);
    // A new count for a cached name is negotiated in full again.
    std::vector<float> bigger(65, 1.0f);
    eng.allreduce_async("w", std::span(bigger), reduce_op::sum).wait();
    EXPECT_EQ(eng.stats().full_reports, 2u);
    EXPECT_EQ(bigger[64], 2.0f);
  });
}

}  // namespace
}  // namespace flexpar
