// Sharded data parallelism over threads-as-ranks: every stage against the serial data-parallel
// oracle on 1-5 ranks (uneven and empty parameters, small and large buckets, with and without the
// communication thread and prefetch, accumulated passes, unused parameters, SGD and Adam), the hybrid
// (B, S(0)) mesh, the memory accounting, and bad input.
#include <gtest/gtest.h>

#include <string>

#include <flexpar/comm/run_in_process.hpp>

#include "support/test_config.hpp"
#include "zero_scenarios.hpp"

namespace flexpar {
namespace {

config test_config() { return testing_support::with_timeout(std::chrono::seconds(30)); }

class zero_inproc : public ::testing::TestWithParam<int> {};

TEST_P(zero_inproc, every_stage_matches_data_parallel) {
  for (int stage : {1, 2, 3})
    for (std::size_t bucket : {std::size_t{36} * 4, std::size_t{1} << 20})
      for (bool overlap : {false, true}) {
        SCOPED_TRACE("stage " + std::to_string(stage) + " bucket " + std::to_string(bucket) + " overlap " +
                     std::to_string(overlap));
        testing_support::zero_case c;
        c.options = {.stage = stage, .bucket_bytes = bucket, .overlap = overlap, .prefetch = stage == 3 ? 2 : 1};
        run_in_process(
            GetParam(),
            [&](communicator& comm) { testing_support::zero_matches_data_parallel<1>(comm, {comm.size()}, c); },
            test_config());
      }
}

TEST_P(zero_inproc, adam_passes_and_unused_parameters) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    testing_support::zero_case c;
    c.options = {.stage = stage, .bucket_bytes = 144, .prefetch = 1, .backward_passes_per_step = 2};
    c.adam = true;
    c.skip_some = true;
    run_in_process(
        GetParam(), [&](communicator& comm) { testing_support::zero_matches_data_parallel<1>(comm, {comm.size()}, c); },
        test_config());
  }
}

TEST_P(zero_inproc, sum_instead_of_average_without_prefetch) {
  testing_support::zero_case c;
  c.options = {.stage = 3, .bucket_bytes = 140, .prefetch = 0, .average = false};
  run_in_process(
      GetParam(), [&](communicator& comm) { testing_support::zero_matches_data_parallel<1>(comm, {comm.size()}, c); },
      test_config());
}

TEST_P(zero_inproc, hybrid_mesh) {
  const int p = GetParam();
  for (int nodes : {1, 2, p}) {
    if (p % nodes != 0) continue;
    for (int stage : {2, 3}) {
      SCOPED_TRACE("nodes " + std::to_string(nodes) + " stage " + std::to_string(stage));
      testing_support::zero_case c;
      c.options = {.stage = stage, .bucket_bytes = 136, .prefetch = 1};
      c.adam = stage == 3;
      run_in_process(
          p,
          [&](communicator& comm) {
            testing_support::zero_matches_data_parallel<2>(comm, {nodes, p / nodes}, c);
          },
          test_config());
    }
  }
}

TEST_P(zero_inproc, quantized_weights_and_gradients_within_bounds) {
  const int p = GetParam();
  for (int stage : {2, 3})
    for (auto [w, g] : {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + " qwZ " + std::to_string(w) + " qgZ " + std::to_string(g));
      run_in_process(
          p, [&](communicator& comm) { testing_support::zero_quantized_within_bounds<1>(comm, {p}, stage, w, g); },
          test_config());
    }
  if (p % 2 == 0)
    run_in_process(
        p,
        [&](communicator& comm) {
          testing_support::zero_quantized_within_bounds<2>(comm, {2, p / 2}, 3, true, true);
        },
        test_config());
}

TEST_P(zero_inproc, quantized_traffic) {
  run_in_process(
      GetParam(), [](communicator& comm) { testing_support::zero_quantized_traffic(comm); }, test_config());
}

TEST_P(zero_inproc, memory_accounting) {
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    run_in_process(
        GetParam(), [&](communicator& comm) { testing_support::zero_memory_accounting(comm, stage); }, test_config());
  }
}

TEST_P(zero_inproc, prefetch_bucket_members_and_settings) {
  run_in_process(
      GetParam(), [](communicator& comm) { testing_support::zero_prefetch_and_introspection(comm); }, test_config());
}

TEST_P(zero_inproc, destroyed_with_gathers_queued) {
  run_in_process(
      GetParam(), [](communicator& comm) { testing_support::zero_destroyed_with_gathers_queued(comm); }, test_config());
}

INSTANTIATE_TEST_SUITE_P(ranks, zero_inproc, ::testing::Values(1, 2, 3, 4, 5),
                         [](const auto& info) { return "np" + std::to_string(info.param); });

// ---- bad input ------------------------------------------------------------------------------------

/// Runs `body` on `p` ranks and returns every rank's exception text (empty where none was thrown).
std::vector<std::string> texts_of(int p, const std::function<void(communicator&)>& body) {
  std::vector<std::string> texts(static_cast<std::size_t>(p));
  run_in_process(
      p,
      [&](communicator& comm) {
        try {
          body(comm);
        } catch (const usage_error& e) {
          texts[static_cast<std::size_t>(comm.rank())] = e.what();
        }
      },
      test_config());
  return texts;
}

TEST(zero_errors, registrations_that_differ_name_both_sides_on_every_rank) {
  const auto texts = texts_of(3, [](communicator& comm) {
    sbp::placement<1> mesh(comm, {comm.size()});
    zero::sharded_data_parallel<1> model(mesh);
    std::vector<float> w(8, 0.0f);
    model.add("fc1.weight", w);
    model.add(comm.rank() == 2 ? "fc1.b" : "fc1.bias", std::span<const float>(w).first(4));
    model.start();
  });
  for (std::size_t r = 0; r < texts.size(); ++r) {
    EXPECT_NE(texts[r].find("[rank " + std::to_string(r) + "] zero::start"), std::string::npos) << texts[r];
    EXPECT_NE(texts[r].find("parameter 1 is \"fc1.bias\" of 4 values on rank 0 but \"fc1.b\" of 4 values on rank 2"),
              std::string::npos)
        << texts[r];
  }
}

TEST(zero_errors, a_missing_parameter_on_one_rank_is_named) {
  const auto texts = texts_of(2, [](communicator& comm) {
    sbp::placement<1> mesh(comm, {comm.size()});
    zero::sharded_data_parallel<1> model(mesh);
    std::vector<float> w(8, 0.0f);
    model.add("a", w);
    if (comm.rank() == 0) model.add("b", w);
    model.start();
  });
  for (const auto& t : texts)
    EXPECT_NE(t.find("parameter 1 is \"b\" of 8 values on rank 0 but no parameter on rank 1"), std::string::npos) << t;
}

TEST(zero_errors, a_parameter_larger_than_a_bucket) {
  const auto texts = texts_of(2, [](communicator& comm) {
    sbp::placement<1> mesh(comm, {comm.size()});
    zero::sharded_data_parallel<1> model(mesh, {.bucket_bytes = 64});
    std::vector<float> w(17, 0.0f);
    model.add("small", std::span<const float>(w).first(3));
    model.add("embedding", w);
    model.start();
  });
  for (const auto& t : texts)
    EXPECT_NE(t.find("parameter 1 (\"embedding\") has 17 values (68 bytes), more than a bucket holds "
                     "(bucket_bytes = 64); raise options::bucket_bytes"),
              std::string::npos)
        << t;
}

TEST(zero_errors, a_name_never_registered) {
  const auto texts = texts_of(2, [](communicator& comm) {
    sbp::placement<1> mesh(comm, {comm.size()});
    zero::sharded_data_parallel<1> model(mesh);
    std::vector<float> w(8, 0.0f);
    model.add("fc1.weight", w);
    model.start();
    auto v = model.gather("fc2.weight");
  });
  for (std::size_t r = 0; r < texts.size(); ++r)
    EXPECT_NE(texts[r].find("[rank " + std::to_string(r) +
                            "] zero::gather: parameter \"fc2.weight\" was never registered (1 are: \"fc1.weight\")"),
              std::string::npos)
        << texts[r];
}

TEST(zero_errors, misuse_in_a_pass) {
  const auto texts = texts_of(1, [](communicator& comm) {
    sbp::placement<1> mesh(comm, {comm.size()});
    zero::sharded_data_parallel<1> model(mesh);
    std::vector<float> w(8, 0.0f);
    model.add("w", w);
    model.start();
    (void)model.gradient("w");
    model.gradient_ready("w");
    model.gradient_ready("w");
  });
  EXPECT_NE(texts[0].find("zero::gradient_ready: parameter \"w\" was marked ready twice in one pass"),
            std::string::npos)
      << texts[0];
  const auto alive = texts_of(1, [](communicator& comm) {
    sbp::placement<1> mesh(comm, {comm.size()});
    zero::sharded_data_parallel<1> model(mesh);
    std::vector<float> w(8, 0.0f);
    model.add("w", w);
    model.start();
    relax::sgd opt;
    auto v = model.gather("w");
    model.step(opt);
  });
  EXPECT_NE(alive[0].find("zero::step: a view of parameter \"w\"'s bucket is alive"), std::string::npos) << alive[0];
}

TEST(zero_errors, bad_options) {
  const auto texts = texts_of(1, [](communicator& comm) {
    sbp::placement<1> mesh(comm, {comm.size()});
    zero::sharded_data_parallel<1> model(mesh, {.stage = 4});
  });
  EXPECT_NE(texts[0].find("stage 4; ZeRO has stages 1, 2 and 3"), std::string::npos) << texts[0];
}

}  // namespace
}  // namespace flexpar
