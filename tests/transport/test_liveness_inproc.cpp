// The liveness monitor (transport/liveness.hpp) among threads as ranks: real UDP heartbeats between
// three monitors of one process (their pids are all the same, so only beats and gossip decide).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/transport/liveness.hpp>
#include <flexpar/transport/transport.hpp>

namespace flexpar {
namespace {

using namespace std::chrono_literals;

constexpr auto interval = 20ms;

/// Polls `pred` every interval until it holds or 5 s passed.
template <class Pred>
bool eventually(Pred pred) {
  const deadline until = deadline_after(5s);
  while (!pred()) {
    if (clock::now() >= until) return false;
    std::this_thread::sleep_for(interval);
  }
  return true;
}

detail::request_info recv_from(int rank, int peer) {
  return {"inproc", message_direction::recv, rank, peer, 7, 64, std::chrono::microseconds(0)};
}

config test_config() {
  config cfg;
  cfg.timeout = 10s;
  return cfg;
}

TEST(liveness, a_declared_failure_reaches_every_rank_and_the_failed_rank_itself) {
  run_in_process(
      3,
      [](communicator& comm) {
        auto monitor = detail::liveness_monitor::start(comm.transport(), interval, 1000, comm.default_deadline());
        detail::liveness_view view(monitor, {0, 1, 2});
        EXPECT_TRUE(view.failed().empty());
        EXPECT_FALSE(view.blocks(recv_from(comm.rank(), (comm.rank() + 1) % 3)));
        detail::bootstrap_barrier(comm.transport(), "test", comm.default_deadline());
        if (comm.rank() == 0) monitor->declare_failed(2, detail::liveness_monitor::cause::silent, "by the test");
        // Rank 1 learns it from rank 0's beats; rank 2 learns that it was itself declared failed.
        ASSERT_TRUE(eventually([&] { return monitor->failed(2); })) << "rank " << comm.rank() << " never learned it";
        EXPECT_EQ(view.failed(), std::vector<int>{2});
        EXPECT_FALSE(monitor->failed(0));
        EXPECT_FALSE(monitor->failed(1));
        const std::string why = monitor->reason(2);
        if (comm.rank() == 0) {
          EXPECT_EQ(why, "by the test");
        } else if (comm.rank() == 1) {
          EXPECT_EQ(why, "its heartbeats stopped (seen by rank 0)");
        } else {
          EXPECT_NE(why.find("this rank was silent too long"), std::string::npos) << why;
        }
        // Strict: every request of the group fails, whichever peer it waits for.
        const detail::request_info from_live = recv_from(comm.rank(), comm.rank() == 0 ? 1 : 0);
        EXPECT_TRUE(view.blocks(from_live));
        try {
          view.throw_failure(from_live);
          ADD_FAILURE() << "throw_failure returned";
        } catch (const peer_failure& e) {
          EXPECT_NE(std::string(e.what()).find("cannot complete: rank 2 failed: "), std::string::npos) << e.what();
        }
        // Peer-only (shrink's agreement): only the failed peer's requests fail.
        view.peer_only();
        EXPECT_FALSE(view.blocks(from_live));
        EXPECT_TRUE(view.blocks(recv_from(comm.rank(), 2)));
        // A view of a sub-group without rank 2 sees no failure.
        detail::liveness_view pair(monitor, {0, 1});
        EXPECT_TRUE(pair.failed().empty());
        detail::bootstrap_barrier(comm.transport(), "test", comm.default_deadline());
      },
      test_config());
}

TEST(liveness, a_rank_that_leaves_says_goodbye_and_is_not_failed) {
  run_in_process(
      3,
      [](communicator& comm) {
        // 25 misses (0.5 s): a loaded machine must not make ranks 0 and 1 silent to each other.
        auto monitor = detail::liveness_monitor::start(comm.transport(), interval, 25, comm.default_deadline());
        detail::bootstrap_barrier(comm.transport(), "test", comm.default_deadline());
        if (comm.rank() == 2) monitor.reset();  // goodbye
        detail::bootstrap_barrier(comm.transport(), "test", comm.default_deadline());
        if (comm.rank() == 2) return;
        std::this_thread::sleep_for(interval * 50);  // twice the silence that fails a rank
        EXPECT_FALSE(monitor->failed(2)) << monitor->reason(2);
        EXPECT_EQ(monitor->failure_count(), 0);
      },
      test_config());
}

}  // namespace
}  // namespace flexpar
