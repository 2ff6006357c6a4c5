// Actors on one rank: register counts and back-pressure stepped by the deterministic scheduler,
// exactly-once delivery over 100 000 messages (seeded interleavings and seeded delays on the pool),
// errors with the actor's label, deadlines, and bad wiring.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <random>
#include <stdexcept>
#include <thread>

#include <flexpar/actor/deterministic_scheduler.hpp>
#include <flexpar/actor/executor.hpp>
#include <flexpar/timeline.hpp>

namespace flexpar {
namespace {

using std::chrono::seconds;

/// A source of 0, 1, ..., n-1.
auto counter(int n) {
  return [i = 0, n](int& x) mutable {
    if (i == n) return fire_result::done;
    x = i++;
    return fire_result::emit;
  };
}

TEST(actor_deterministic, producer_holds_at_most_its_register_count) {
  actor_graph g;
  auto& producer = g.add_actor<out<int, 3>>("producer", counter(100));
  std::vector<int> got;
  auto& consumer = g.add_actor<in<int>>("consumer", [&](const int& x) { got.push_back(x); });
  g.connect(producer.output<0>(), consumer.input<0>());
  deterministic_scheduler s(g);

  // The consumer never runs: the producer fires exactly 3 times, then waits for a register.
  int fired = 0;
  while (s.ready(producer)) {
    s.step(producer);
    ++fired;
    ASSERT_LE(producer.output<0>().in_use, 3u);
  }
  EXPECT_EQ(fired, 3);
  EXPECT_EQ(producer.output<0>().in_use, 3u);
  EXPECT_EQ(consumer.input<0>().queue.size(), 3u);
  try {
    s.step(producer);
    ADD_FAILURE() << "a producer with no free register fired";
  } catch (const usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("free register of output 0"), std::string::npos) << e.what();
  }
  // One consumption returns one register: the producer may fire once more, not twice.
  s.step(consumer);
  EXPECT_TRUE(s.ready(producer));
  s.step(producer);
  EXPECT_FALSE(s.ready(producer));
  std::mt19937_64 rng(1);
  s.run_random(rng, deadline_after(seconds(10)));
  ASSERT_EQ(got.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)], i);
  EXPECT_EQ(producer.output<0>().peak_registers_in_use(), 3u);
}

// A consumer chosen rarely: the producer runs ahead by exactly its register count and stalls there.
TEST(actor_deterministic, slow_consumer_stalls_the_producer) {
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    actor_graph g;
    auto& producer = g.add_actor<out<int, 2>>("producer", counter(2000));
    std::uint64_t consumed = 0;
    auto& consumer = g.add_actor<in<int>>("slow consumer", [&](const int& x) {
      ASSERT_EQ(static_cast<std::uint64_t>(x), consumed);
      ++consumed;
    });
    g.connect(producer.output<0>(), consumer.input<0>());
    deterministic_scheduler s(g);
    std::mt19937_64 rng(seed);
    std::uint64_t max_lead = 0, stalls = 0;
    while (!s.complete()) {
      const bool consumer_turn = s.ready(consumer) && (rng() % 10 == 0 || !s.ready(producer));
      if (consumer_turn) {
        s.step(consumer);
      } else if (s.ready(producer)) {
        s.step(producer);
      } else {
        break;
      }
      if (!s.ready(producer) && !s.complete() && producer.output<0>().in_use == 2) ++stalls;
      const std::uint64_t lead = producer.firings() - consumer.firings();
      max_lead = std::max(max_lead, lead);
      ASSERT_LE(producer.output<0>().in_use, 2u);
      ASSERT_LE(lead, 2u) << "the producer ran further ahead than its register count";
    }
    EXPECT_TRUE(s.complete());
    EXPECT_EQ(consumed, 2000u);
    EXPECT_EQ(max_lead, 2u);
    EXPECT_GT(stalls, 100u);
  }
}

/// source -> inc (N=1) -> fan-out to twice (N=2) and neg (N=3) -> join -> sink: the join pairs the
/// i-th messages of both branches; the sink checks every message once, in order.
struct diamond_check {
  std::uint64_t received = 0;
  bool ordered = true;
};

void diamond_100k(int messages, const std::function<void(actor_graph&)>& run, std::uint64_t delay_seed = 0) {
  actor_graph g;
  std::mt19937_64 delays(delay_seed);
  auto jitter = [delay_seed](std::mt19937_64& rng) {
    if (delay_seed == 0) return;
    const auto spin = std::chrono::nanoseconds(rng() % 3000);
    const auto until = clock::now() + spin;
    while (clock::now() < until) {
    }
  };
  std::mt19937_64 d1(delay_seed + 1), d2(delay_seed + 2), d3(delay_seed + 3), d4(delay_seed + 4);
  auto& src = g.add_actor<out<long, 2>>("source", [i = 0L, messages](long& x) mutable {
    if (i == messages) return fire_result::done;
    x = i++;
    return fire_result::emit;
  });
  auto& inc = g.add_actor<in<long>, out<long, 1>>("inc", [&](const long& x, long& y) {
    jitter(d1);
    y = x + 1;
  });
  auto& twice = g.add_actor<in<long>, out<long, 2>>("twice", [&](const long& x, long& y) {
    jitter(d2);
    y = 2 * x;
  });
  auto& neg = g.add_actor<in<long>, out<long, 3>>("neg", [&](const long& x, long& y) {
    jitter(d3);
    y = -x;
  });
  auto& join = g.add_actor<in<long>, in<long>, out<long, 2>>("join", [&](const long& a, const long& b, long& y) {
    jitter(d4);
    y = a + 10 * b;  // 2(i+1) - 10(i+1) = -8(i+1)
  });
  diamond_check check;
  auto& sink = g.add_actor<in<long>>("sink", [&](const long& y) {
    const long expected = -8 * static_cast<long>(check.received + 1);
    if (y != expected) check.ordered = false;
    ++check.received;
  });
  g.connect(src.output<0>(), inc.input<0>());
  g.connect(inc.output<0>(), twice.input<0>());
  g.connect(inc.output<0>(), neg.input<0>());
  g.connect(twice.output<0>(), join.input<0>());
  g.connect(neg.output<0>(), join.input<1>());
  g.connect(join.output<0>(), sink.input<0>());
  run(g);
  EXPECT_EQ(check.received, static_cast<std::uint64_t>(messages)) << "messages lost or duplicated";
  EXPECT_TRUE(check.ordered);
  EXPECT_EQ(src.firings(), static_cast<std::uint64_t>(messages) + 1);  // + the firing that said done
  EXPECT_LE(inc.output<0>().peak_registers_in_use(), 1u);
  EXPECT_LE(twice.output<0>().peak_registers_in_use(), 2u);
  EXPECT_LE(neg.output<0>().peak_registers_in_use(), 3u);
  EXPECT_EQ(inc.output<0>().messages_published(), static_cast<std::uint64_t>(messages));
}

TEST(actor_deterministic, no_message_lost_or_duplicated_over_100000_seeded_interleavings) {
  for (std::uint64_t seed : {7u, 8u, 9u}) {
    diamond_100k(100000, [seed](actor_graph& g) {
      deterministic_scheduler s(g);
      std::mt19937_64 rng(seed);
      s.run_random(rng, deadline_after(seconds(60)));
    });
  }
}

TEST(actor_pool, no_message_lost_or_duplicated_over_100000_with_seeded_delays) {
  for (std::size_t threads : {1u, 2u, 3u}) {
    actor_executor pool(threads);
    diamond_100k(
        100000, [&](actor_graph& g) { pool.run(g, deadline_after(seconds(60))); }, 11 + threads);
  }
}

TEST(actor_pool, zero_messages_and_one_message) {
  actor_executor pool(2);
  for (int n : {0, 1}) diamond_100k(n, [&](actor_graph& g) { pool.run(g, deadline_after(seconds(10))); });
}

TEST(actor_pool, skip_accumulates_and_state_is_kept) {
  // Sums of 4 consecutive numbers: the accumulator publishes every 4th firing.
  actor_graph g;
  auto& src = g.add_actor<out<int, 2>>("numbers", counter(400));
  auto& acc = g.add_actor<in<int>, out<int, 1>>("sum of 4", [sum = 0, k = 0](const int& x, int& y) mutable {
    sum += x;
    if (++k < 4) return fire_result::skip;
    y = sum;
    sum = k = 0;
    return fire_result::emit;
  });
  std::vector<int> sums;
  auto& sink = g.add_actor<in<int>>("sink", [&](const int& y) { sums.push_back(y); });
  g.connect(src.output<0>(), acc.input<0>());
  g.connect(acc.output<0>(), sink.input<0>());
  actor_executor pool(2);
  pool.run(g, deadline_after(seconds(10)));
  ASSERT_EQ(sums.size(), 100u);
  for (int j = 0; j < 100; ++j) EXPECT_EQ(sums[static_cast<std::size_t>(j)], 16 * j + 6);
}

TEST(actor_pool, firings_go_to_the_timeline_on_a_track_per_actor) {
  actor_graph g;
  auto& src = g.add_actor<out<int, 2>>("numbers", counter(5));
  auto& sink = g.add_actor<in<int>>("printer", [](const int&) {});
  g.connect(src.output<0>(), sink.input<0>());
  timeline trace(0);
  g.record(trace);
  actor_executor pool(2);
  pool.run(g, deadline_after(seconds(10)));
  const std::string json = trace.events_json();
  std::size_t spans = 0;
  for (std::size_t at = json.find("\"ph\":\"X\""); at != std::string::npos; at = json.find("\"ph\":\"X\"", at + 1))
    ++spans;
  EXPECT_EQ(spans, 11u) << json;  // 6 firings of the source (the last says done), 5 of the sink
  EXPECT_NE(json.find("\"printer\""), std::string::npos) << json;
}

TEST(actor_errors, a_throwing_actor_stops_the_graph_and_names_itself) {
  for (int mode = 0; mode < 2; ++mode) {
    actor_graph g;
    auto& src = g.add_actor<out<int, 2>>("numbers", counter(1000000));
    auto& bad = g.add_actor<in<int>>("fc2.backward", [](const int& x) {
      if (x == 10) throw std::runtime_error("shape mismatch at message 10");
    });
    g.connect(src.output<0>(), bad.input<0>());
    try {
      if (mode == 0) {
        actor_executor pool(2);
        pool.run(g, deadline_after(seconds(10)));
      } else {
        deterministic_scheduler s(g);
        std::mt19937_64 rng(3);
        s.run_random(rng, deadline_after(seconds(10)));
      }
      ADD_FAILURE() << "no exception";
    } catch (const actor_failure& e) {
      EXPECT_EQ(e.label(), "fc2.backward");
      const std::string what = e.what();
      EXPECT_NE(what.find("actor 'fc2.backward'"), std::string::npos) << what;
      EXPECT_NE(what.find("shape mismatch at message 10"), std::string::npos) << what;
      EXPECT_NE(what.find("[rank 0]"), std::string::npos) << what;
      try {
        std::rethrow_if_nested(e);
        ADD_FAILURE() << "the body's exception is not nested";
      } catch (const std::runtime_error& inner) {
        EXPECT_STREQ(inner.what(), "shape mismatch at message 10");
      }
    }
    EXPECT_EQ(bad.firings(), 10u);  // stopped: nothing fired after the failure
  }
}

TEST(actor_errors, the_deadline_names_what_each_actor_waits_for) {
  actor_graph g;
  auto& src = g.add_actor<out<int, 1>>("numbers", counter(1000));
  auto& slow =
      g.add_actor<in<int>>("slow sink", [](const int&) { std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
  g.connect(src.output<0>(), slow.input<0>());
  actor_executor pool(2);
  const auto begin = clock::now();
  try {
    pool.run(g, deadline_after(std::chrono::milliseconds(100)));
    ADD_FAILURE() << "no timeout";
  } catch (const timeout_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'numbers' waits for"), std::string::npos) << what;
    EXPECT_NE(what.find("'slow sink'"), std::string::npos) << what;
  }
  EXPECT_LT(clock::now() - begin, seconds(5));
}

TEST(actor_errors, bad_wiring_is_a_usage_error) {
  {
    actor_graph g;
    auto& src = g.add_actor<out<int, 1>>("dangling source", counter(3));
    (void)src;
    actor_executor pool(1);
    try {
      pool.run(g, deadline_after(seconds(5)));
      ADD_FAILURE() << "no error";
    } catch (const usage_error& e) {
      EXPECT_NE(std::string(e.what()).find("'dangling source': output 0 feeds no input"), std::string::npos)
          << e.what();
    }
  }
  {
    actor_graph g;
    auto& a = g.add_actor<out<int, 1>>("a", counter(3));
    auto& b = g.add_actor<out<int, 1>>("b", counter(3));
    auto& c = g.add_actor<in<int>>("c", [](const int&) {});
    g.connect(a.output<0>(), c.input<0>());
    EXPECT_THROW(g.connect(b.output<0>(), c.input<0>()), usage_error);
    actor_executor pool(1);
    EXPECT_THROW(pool.run(g, deadline_after(seconds(5))), usage_error);  // b feeds nothing
  }
  {
    actor_graph g;
    auto& a = g.add_actor<out<int, 1>>("a", counter(3));
    auto& c = g.add_actor<in<int>>("c", [](const int&) {});
    g.connect(a.output<0>(), c.input<0>());
    actor_executor pool(1);
    pool.run(g, deadline_after(seconds(5)));
    EXPECT_THROW(pool.run(g, deadline_after(seconds(5))), usage_error);  // a graph runs once
  }
  EXPECT_THROW(actor_executor(0), usage_error);
}

}  // namespace
}  // namespace flexpar
