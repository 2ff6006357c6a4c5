// Cross-rank actor graphs with threads as ranks (the in-process transport), world sizes 1-8.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/transport/inproc.hpp>

#include "cross_rank_scenarios.hpp"
#include "support/world_sizes.hpp"

namespace flexpar {
namespace {

using namespace testing_support;

config test_config() {
  config c;
  c.timeout = std::chrono::seconds(30);
  return c;
}

class actor_cross_rank_inproc : public ::testing::TestWithParam<int> {};

TEST_P(actor_cross_rank_inproc, chain_equals_the_serial_result) {
  for (std::size_t width : {std::size_t{0}, std::size_t{1}, std::size_t{4099}})
    for (drive how : {drive::pool, drive::deterministic})
      run_in_process(
          GetParam(), [&](communicator& comm) { chain_across_ranks(comm, 300, width, how); }, test_config());
}

TEST_P(actor_cross_rank_inproc, chain_of_large_payloads) {
  run_in_process(
      GetParam(), [&](communicator& comm) { chain_across_ranks(comm, 8, (std::size_t{1} << 20) + 3, drive::pool); },
      test_config());
}

TEST_P(actor_cross_rank_inproc, diamond_equals_the_serial_result) {
  for (drive how : {drive::pool, drive::deterministic})
    run_in_process(
        GetParam(), [&](communicator& comm) { diamond_across_ranks(comm, 2000, how); }, test_config());
}

TEST_P(actor_cross_rank_inproc, a_failure_on_one_rank_ends_every_rank) {
  for (drive how : {drive::pool, drive::deterministic})
    run_in_process(
        GetParam(), [&](communicator& comm) { failure_across_ranks(comm, how); }, test_config());
}

// Register counts across ranks: a fast producer on rank 0 and a slow consumer on the last rank. The
// threads share memory, so the producer can see how far ahead of the consumer it is at each firing:
// at most N of its own registers unacknowledged plus N received by the consumer's end.
TEST(actor_cross_rank_inproc_counts, a_slow_remote_consumer_stalls_the_producer) {
  constexpr std::size_t N = 2;
  for (int p : {2, 3}) {
    std::atomic<std::int64_t> consumed{0};
    std::atomic<std::int64_t> max_lead{0};
    run_in_process(
        p,
        [&](communicator& comm) {
          actor_graph g(comm);
          auto& fast = g.add_actor<out<std::int64_t, N>>(0, "fast", [&, i = std::int64_t{0}](std::int64_t& x) mutable {
            if (i == 200) return fire_result::done;
            const std::int64_t lead = i - consumed.load();
            std::int64_t seen = max_lead.load();
            while (lead > seen && !max_lead.compare_exchange_weak(seen, lead)) {
            }
            x = i++;
            return fire_result::emit;
          });
          auto& slow = g.add_actor<in<std::int64_t>>(p - 1, "slow", [&](const std::int64_t& x) {
            EXPECT_EQ(x, consumed.load());
            std::this_thread::sleep_for(std::chrono::microseconds(300));
            ++consumed;
          });
          g.connect(fast.output<0>(), slow.input<0>());
          actor_executor pool(1);
          pool.run(g, deadline_after(std::chrono::seconds(30)));
        },
        test_config());
    EXPECT_EQ(consumed.load(), 200);
    EXPECT_LE(max_lead.load(), static_cast<std::int64_t>(2 * N)) << "the producer ran past the register counts";
    EXPECT_GE(max_lead.load(), static_cast<std::int64_t>(N)) << "the producer never ran ahead (no pipelining)";
  }
}

INSTANTIATE_TEST_SUITE_P(world, actor_cross_rank_inproc, ::testing::ValuesIn(inproc_world_sizes), [](const auto& info) {
  std::string name = "p";
  name += std::to_string(info.param);
  return name;
});

}  // namespace
}  // namespace flexpar
