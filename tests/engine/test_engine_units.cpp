// tests/engine/test_engine_units.cpp — the engine's units (lib/engine/) without its background
// thread: the messages, the response cache, the coordinator, the stall inspector and the fused
// executor, each driven directly with chosen inputs and a fake clock.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <flexpar/collective/automatic.hpp>
#include <flexpar/comm/run_in_process.hpp>

#include "engine/coordinator.hpp"
#include "engine/fused_executor.hpp"
#include "engine/protocol.hpp"
#include "engine/response_cache.hpp"
#include "engine/stall_inspector.hpp"
#include "engine/step_plan.hpp"

namespace flexpar::detail {
namespace {

/// "g3": appended apart, since "g" + to_string(...) trips GCC 12's -Wrestrict.
std::string numbered(std::string prefix, std::size_t k) {
  prefix += std::to_string(k);
  return prefix;
}

description allreduce_of(std::uint64_t count, dtype type = dtype::f32, reduce_op op = reduce_op::sum) {
  description d;
  d.kind = collective_kind::allreduce;
  d.type = type;
  d.op = op;
  d.count = count;
  return d;
}

/// The response run_full of `name` with every rank's count.
response run_full(std::string name, description d, std::vector<std::uint64_t> counts) {
  response r;
  r.type = response_type::run_full;
  r.name = std::move(name);
  r.desc = d;
  r.counts = std::move(counts);
  return r;
}

// ---- the messages ---------------------------------------------------------------------------------

TEST(engine_protocol, a_report_and_a_response_list_read_back_as_written) {
  report in;
  in.joined = true;
  in.slots = {3, 0, 7};
  description d = allreduce_of(12, dtype::f64, reduce_op::max);
  d.memory = memory_kind::cuda;
  in.full = {{"w", d}, {"b", allreduce_of(1)}};
  const report out = decode_report(encode(in));
  EXPECT_TRUE(out.joined);
  EXPECT_FALSE(out.shutting_down);
  EXPECT_EQ(out.slots, (std::vector<std::uint32_t>{3, 0, 7}));
  ASSERT_EQ(out.full.size(), 2u);
  EXPECT_EQ(out.full[0].name, "w");
  EXPECT_EQ(out.full[0].desc.type, dtype::f64);
  EXPECT_EQ(out.full[0].desc.op, reduce_op::max);
  EXPECT_EQ(out.full[0].desc.count, 12u);
  EXPECT_EQ(out.full[0].desc.memory, memory_kind::cuda);

  response_cache cache(8);
  cache.remember(run_full("cached", allreduce_of(5), {5, 6}));
  response_list list;
  list.all_shutdown = true;
  list.last_joined = -1;
  list.responses.push_back(run_full("new", allreduce_of(2, dtype::i32), {2, 2}));
  response by_slot;
  by_slot.type = response_type::run_cached;
  by_slot.slot = 0;
  list.responses.push_back(by_slot);
  response failed;
  failed.type = response_type::error;
  failed.name = "bad";
  failed.error = error_kind::usage;
  failed.text = "why";
  list.responses.push_back(failed);
  const response_list back = decode_response_list(encode(list), cache, 2);
  EXPECT_TRUE(back.all_shutdown);
  EXPECT_FALSE(back.all_joined);
  ASSERT_EQ(back.responses.size(), 3u);
  EXPECT_EQ(back.responses[0].name, "new");
  EXPECT_EQ(back.responses[0].desc.type, dtype::i32);
  EXPECT_EQ(back.responses[0].counts, (std::vector<std::uint64_t>{2, 2}));
  // A response by slot comes back with what the cache holds at that slot.
  EXPECT_EQ(back.responses[1].type, response_type::run_cached);
  EXPECT_EQ(back.responses[1].name, "cached");
  EXPECT_EQ(back.responses[1].counts, (std::vector<std::uint64_t>{5, 6}));
  EXPECT_EQ(back.responses[2].error, error_kind::usage);
  EXPECT_EQ(back.responses[2].text, "why");
}

TEST(engine_protocol, a_truncated_message_or_an_unknown_slot_is_a_protocol_error) {
  report in;
  in.full = {{"w", allreduce_of(4)}};
  std::vector<std::byte> bytes = encode(in);
  bytes.pop_back();
  EXPECT_THROW(decode_report(bytes), error);
  response_list list;
  response by_slot;
  by_slot.type = response_type::run_cached;
  by_slot.slot = 2;
  list.responses.push_back(by_slot);
  try {
    decode_response_list(encode(list), response_cache(8), 1);
    ADD_FAILURE() << "an unknown slot was accepted";
  } catch (const error& e) {
    EXPECT_STREQ(e.what(), "engine protocol error: cache slot 2 unknown");
  }
}

// ---- the response cache (step 6) ------------------------------------------------------------------

TEST(response_cache, slots_follow_the_order_of_the_responses) {
  response_cache cache(16);
  const std::vector<std::string> names{"layer3", "layer1", "layer2", "embedding"};
  for (const auto& n : names) cache.remember(run_full(n, allreduce_of(10), {10, 10}));
  ASSERT_EQ(cache.size(), names.size());
  for (std::uint32_t k = 0; k < names.size(); ++k) {
    EXPECT_EQ(cache.slot_of(names[k], allreduce_of(10), 0), std::optional(k)) << names[k];
    EXPECT_EQ(cache.at(k).name, names[k]);
  }
}

TEST(response_cache, two_caches_fed_the_same_responses_agree_on_every_slot) {
  response_cache a(5), b(5);  // room for 5 of the 8: both keep the same 5
  std::vector<response> list;
  for (int i = 0; i < 8; ++i) {
    const auto n = static_cast<std::uint64_t>(i + 1);
    list.push_back(run_full(numbered("t", static_cast<std::size_t>((i * 5) % 8)), allreduce_of(n), {n, 2 * n, 3 * n}));
  }
  for (const auto& r : list) a.remember(r);
  for (const auto& r : list) b.remember(r);
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  for (std::uint32_t k = 0; k < 5; ++k) {
    EXPECT_EQ(a.at(k).name, b.at(k).name);
    EXPECT_EQ(a.at(k).name, list[k].name);  // response order, not name order
    EXPECT_EQ(a.at(k).counts, b.at(k).counts);
  }
  // The tensors beyond the capacity are not cached: reported in full every time.
  for (std::size_t k = 5; k < list.size(); ++k) EXPECT_FALSE(a.slot_of(list[k].name, list[k].desc, 0));
}

TEST(response_cache, a_lookup_matches_the_name_and_the_whole_description) {
  response_cache cache(4);
  description d = allreduce_of(100, dtype::f32, reduce_op::avg);
  cache.remember(run_full("w", d, {100, 60}));
  EXPECT_EQ(cache.slot_of("w", d, 0), std::optional<std::uint32_t>(0));
  description on_rank1 = d;
  on_rank1.count = 60;  // each rank is checked against its own count
  EXPECT_EQ(cache.slot_of("w", on_rank1, 1), std::optional<std::uint32_t>(0));
  EXPECT_FALSE(cache.slot_of("w", d, 1));
  EXPECT_FALSE(cache.slot_of("v", d, 0));
  auto changed = [&](auto change) {
    description c = d;
    change(c);
    return cache.slot_of("w", c, 0);
  };
  EXPECT_FALSE(changed([](description& c) { c.count = 101; }));
  EXPECT_FALSE(changed([](description& c) { c.type = dtype::f64; }));
  EXPECT_FALSE(changed([](description& c) { c.op = reduce_op::sum; }));
  EXPECT_FALSE(changed([](description& c) { c.kind = collective_kind::broadcast; }));
  EXPECT_FALSE(changed([](description& c) { c.root = 0; }));
  EXPECT_FALSE(changed([](description& c) { c.memory = memory_kind::cuda; }));
  // Run again in full with the new description, the name keeps its slot.
  cache.remember(run_full("x", allreduce_of(1), {1, 1}));
  cache.remember(run_full("w", allreduce_of(101), {101, 101}));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.slot_of("w", allreduce_of(101), 1), std::optional<std::uint32_t>(0));
  EXPECT_FALSE(cache.slot_of("w", d, 0));
}

TEST(response_cache, capacity_zero_caches_nothing) {
  response_cache cache(0);
  cache.remember(run_full("w", allreduce_of(1), {1}));
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_FALSE(cache.slot_of("w", allreduce_of(1), 0));
}

// ---- the coordinator (steps 2–4) -----------------------------------------------------------------

using std::chrono::milliseconds;

description of_kind(collective_kind kind, std::uint64_t count, dtype type = dtype::f32) {
  description d = allreduce_of(count, type);
  d.kind = kind;
  return d;
}

/// A coordinator over `ranks` ranks with its own cache and stall settings, driven cycle by cycle at a
/// fake time that starts at t0 and moves only when the test says so.
struct coordinator_fixture {
  explicit coordinator_fixture(int ranks, milliseconds warning = milliseconds(60000),
                               milliseconds shutdown = milliseconds(300000))
      : p(ranks),
        co(
            ranks, cache, stall_inspector(warning, shutdown), [this](std::string_view l) { log.emplace_back(l); },
            nullptr) {}

  /// One cycle: `by_rank[r]` are the tensors rank r reports in full.
  response_list cycle(const std::vector<std::vector<reported_tensor>>& by_rank, milliseconds at = milliseconds(0),
                      const std::vector<int>& joined = {}) {
    std::vector<report> reports(static_cast<std::size_t>(p));
    for (std::size_t r = 0; r < by_rank.size(); ++r) reports[r].full = by_rank[r];
    for (int r : joined) reports[static_cast<std::size_t>(r)].joined = true;
    return co.coordinate(reports, t0 + at);
  }
  /// Every rank reports the same tensor in full.
  response_list everyone(const std::string& name, const description& d) {
    return cycle(std::vector<std::vector<reported_tensor>>(static_cast<std::size_t>(p), {{name, d}}));
  }
  /// Rank `odd` reports `other`, every other rank `usual`; the one response's error text.
  std::string mismatch(const std::string& name, const description& usual, const description& other, int odd = 1) {
    std::vector<std::vector<reported_tensor>> by_rank(static_cast<std::size_t>(p), {{name, usual}});
    by_rank[static_cast<std::size_t>(odd)] = {{name, other}};
    const response_list out = cycle(by_rank);
    if (out.responses.size() != 1 || out.responses[0].type != response_type::error ||
        out.responses[0].error != error_kind::mismatch)
      return "(no mismatch)";
    return out.responses[0].text;
  }

  int p;
  response_cache cache{64};
  std::vector<std::string> log;
  coordinator co;
  const clock::time_point t0 = clock::now();
};

TEST(coordinator, a_tensor_every_rank_reports_gets_one_response_with_every_count) {
  coordinator_fixture f(3);
  const response_list out = f.everyone("w", allreduce_of(8));
  ASSERT_EQ(out.responses.size(), 1u);
  const response& r = out.responses[0];
  EXPECT_EQ(r.type, response_type::run_full);
  EXPECT_EQ(r.name, "w");
  EXPECT_EQ(r.desc.kind, collective_kind::allreduce);
  EXPECT_EQ(r.counts, (std::vector<std::uint64_t>{8, 8, 8}));
  EXPECT_FALSE(out.all_joined);
  EXPECT_FALSE(out.all_shutdown);
  EXPECT_EQ(out.last_joined, -1);
  EXPECT_TRUE(f.cycle({}).responses.empty()) << "a tensor is answered once";
}

TEST(coordinator, a_tensor_waits_for_the_rank_that_has_not_reported_it) {
  coordinator_fixture f(3);
  EXPECT_TRUE(f.cycle({{{"w", allreduce_of(4)}}, {}, {{"w", allreduce_of(4)}}}).responses.empty());
  EXPECT_TRUE(f.cycle({}).responses.empty());
  const response_list out = f.cycle({{}, {{"w", allreduce_of(4)}}, {}});
  ASSERT_EQ(out.responses.size(), 1u);
  EXPECT_EQ(out.responses[0].name, "w");
  EXPECT_EQ(out.responses[0].type, response_type::run_full);
}

TEST(coordinator, complete_tensors_run_in_the_order_they_were_first_seen) {
  coordinator_fixture f(2);
  // Rank 0 reports c, a, b; rank 1 reports them a cycle later in another order, and d, which rank 0
  // never reports.
  f.cycle({{{"c", allreduce_of(1)}, {"a", allreduce_of(2)}, {"b", allreduce_of(3)}}, {}});
  const response_list out =
      f.cycle({{}, {{"b", allreduce_of(3)}, {"d", allreduce_of(9)}, {"a", allreduce_of(2)}, {"c", allreduce_of(1)}}});
  std::vector<std::string> order;
  for (const auto& r : out.responses) order.push_back(r.name);
  EXPECT_EQ(order, (std::vector<std::string>{"c", "a", "b"}));
}

TEST(coordinator, a_mismatch_names_the_field_and_which_ranks_hold_which_value) {
  coordinator_fixture f(3);
  description bigger = allreduce_of(2048);
  EXPECT_EQ(f.mismatch("fc1.grad", allreduce_of(1024), bigger),
            "allreduce \"fc1.grad\": count 1024 on ranks {0,2} but 2048 on rank {1}");
  EXPECT_EQ(f.mismatch("w", allreduce_of(16), allreduce_of(16, dtype::f64)),
            "allreduce \"w\": dtype f32 on ranks {0,2} but f64 on rank {1}");
  EXPECT_EQ(f.mismatch("rs", of_kind(collective_kind::reduce_scatter, 6),
                       [] {
                         description d = of_kind(collective_kind::reduce_scatter, 6);
                         d.op = reduce_op::max;
                         return d;
                       }()),
            "reduce_scatter \"rs\": op sum on ranks {0,2} but max on rank {1}");
  description on_device = allreduce_of(16);
  on_device.memory = memory_kind::cuda;
  EXPECT_EQ(f.mismatch("m", allreduce_of(16), on_device, 0),
            "allreduce \"m\": memory cuda on rank {0} but host on ranks {1,2}");
  description root0 = of_kind(collective_kind::broadcast, 8), root2 = root0;
  root0.root = 0;
  root2.root = 2;
  EXPECT_EQ(f.mismatch("b", root0, root2), "broadcast \"b\": root 0 on ranks {0,2} but 2 on rank {1}");
  EXPECT_EQ(f.mismatch("k", allreduce_of(4), of_kind(collective_kind::allgather, 4)),
            "tensor \"k\": collective allreduce on ranks {0,2} but allgather on rank {1}");
  // Three values: each with its ranks, the last after "but".
  const response_list three = f.cycle({{{"t", allreduce_of(1)}}, {{"t", allreduce_of(2)}}, {{"t", allreduce_of(3)}}});
  ASSERT_EQ(three.responses.size(), 1u);
  EXPECT_EQ(three.responses[0].text, "allreduce \"t\": count 1 on rank {0}, 2 on rank {1} but 3 on rank {2}");
  // An allgather's counts may differ.
  const response_list gathered = f.cycle({{{"g", of_kind(collective_kind::allgather, 1)}},
                                          {{"g", of_kind(collective_kind::allgather, 5)}},
                                          {{"g", of_kind(collective_kind::allgather, 2)}}});
  ASSERT_EQ(gathered.responses.size(), 1u);
  EXPECT_EQ(gathered.responses[0].type, response_type::run_full);
  EXPECT_EQ(gathered.responses[0].counts, (std::vector<std::uint64_t>{1, 5, 2}));
}

TEST(coordinator, what_the_ranks_agree_on_may_still_be_a_usage_error) {
  coordinator_fixture f(3);
  description outside = of_kind(collective_kind::broadcast, 8);
  outside.root = 3;
  const response_list a = f.everyone("b", outside);
  ASSERT_EQ(a.responses.size(), 1u);
  EXPECT_EQ(a.responses[0].error, error_kind::usage);
  EXPECT_EQ(a.responses[0].text, "broadcast \"b\": root 3 is outside the 3 ranks");
  const response_list b = f.everyone("a", of_kind(collective_kind::alltoall, 4));
  ASSERT_EQ(b.responses.size(), 1u);
  EXPECT_EQ(b.responses[0].error, error_kind::usage);
  EXPECT_EQ(b.responses[0].text, "alltoall \"a\": count 4 is not divisible by the 3 ranks");
}

TEST(coordinator, a_joined_rank_counts_as_having_every_tensor_until_every_rank_joined) {
  coordinator_fixture f(3);
  // Rank 2 joins: an allreduce of ranks 0 and 1 runs, rank 2's count taken from the others.
  const response_list one = f.cycle({{{"w", allreduce_of(5)}}, {{"w", allreduce_of(5)}}, {}}, {}, {2});
  ASSERT_EQ(one.responses.size(), 1u);
  EXPECT_EQ(one.responses[0].type, response_type::run_full);
  EXPECT_EQ(one.responses[0].counts, (std::vector<std::uint64_t>{5, 5, 5}));
  EXPECT_FALSE(one.all_joined);
  // Only allreduce and broadcast can run with a joined rank; a broadcast whose root joined cannot.
  const response_list two = f.cycle({{{"g", of_kind(collective_kind::allgather, 1)},
                                      {"b",
                                       [] {
                                         description d = of_kind(collective_kind::broadcast, 1);
                                         d.root = 2;
                                         return d;
                                       }()}},
                                     {{"g", of_kind(collective_kind::allgather, 1)},
                                      {"b",
                                       [] {
                                         description d = of_kind(collective_kind::broadcast, 1);
                                         d.root = 2;
                                         return d;
                                       }()}},
                                     {}});
  ASSERT_EQ(two.responses.size(), 2u);
  EXPECT_EQ(two.responses[0].text,
            "allgather \"g\" cannot run while a rank has joined (only allreduce and broadcast can)");
  EXPECT_EQ(two.responses[1].text, "broadcast \"b\": its root, rank 2, has joined and has no data to send");
  // Rank 0 joins, then rank 1: all joined, rank 1 last; then the join is over.
  EXPECT_FALSE(f.cycle({}, {}, {0}).all_joined);
  const response_list all = f.cycle({}, {}, {1});
  EXPECT_TRUE(all.all_joined);
  EXPECT_EQ(all.last_joined, 1);
  EXPECT_TRUE(f.cycle({{{"x", allreduce_of(1)}}, {}, {}}).responses.empty()) << "after the join ranks count again";
}

TEST(coordinator, every_rank_shutting_down_is_all_shut_down) {
  coordinator_fixture f(2);
  std::vector<report> reports(2);
  reports[0].shutting_down = true;
  EXPECT_FALSE(f.co.coordinate(reports, f.t0).all_shutdown);
  reports[1].shutting_down = true;
  EXPECT_TRUE(f.co.coordinate(reports, f.t0).all_shutdown);
}

TEST(coordinator, answers_by_cache_slot_only_when_every_rank_reported_the_slot) {
  coordinator_fixture f(2);
  const response_list first = f.everyone("w", allreduce_of(7));
  ASSERT_EQ(first.responses.size(), 1u);
  f.cache.remember(first.responses[0]);  // step 6, as every rank does
  std::vector<report> reports(2);
  reports[0].slots = {0};
  reports[1].slots = {0};
  const response_list cached = f.co.coordinate(reports, f.t0);
  ASSERT_EQ(cached.responses.size(), 1u);
  EXPECT_EQ(cached.responses[0].type, response_type::run_cached);
  EXPECT_EQ(cached.responses[0].slot, 0u);
  // Rank 1 reports it in full (say its cache was full): answered in full.
  reports[1].slots.clear();
  reports[1].full = {{"w", allreduce_of(7)}};
  const response_list mixed = f.co.coordinate(reports, f.t0);
  ASSERT_EQ(mixed.responses.size(), 1u);
  EXPECT_EQ(mixed.responses[0].type, response_type::run_full);
  EXPECT_EQ(mixed.responses[0].counts, (std::vector<std::uint64_t>{7, 7}));
}

TEST(coordinator, slots_every_rank_reports_in_one_cycle_run_in_rank_0s_order_and_the_others_wait) {
  coordinator_fixture f(3);
  for (const char* name : {"a", "b", "c", "d"}) {
    const response_list first = f.everyone(name, allreduce_of(5));
    ASSERT_EQ(first.responses.size(), 1u);
    f.cache.remember(first.responses[0]);  // slots a=0, b=1, c=2, d=3 on every rank
  }
  std::vector<report> reports(3);
  reports[0].slots = {2, 0, 3, 1};
  reports[1].slots = {0, 1, 2};  // d not yet on rank 1
  reports[2].slots = {1, 3, 2, 0};
  const response_list now = f.co.coordinate(reports, f.t0);
  std::vector<std::uint32_t> order;
  for (const response& r : now.responses) {
    EXPECT_EQ(r.type, response_type::run_cached);
    order.push_back(r.slot);
  }
  EXPECT_EQ(order, (std::vector<std::uint32_t>{2, 0, 1})) << "rank 0's order, d left waiting";
  std::vector<report> later(3);
  EXPECT_TRUE(f.co.coordinate(later, f.t0).responses.empty()) << "d still waits for rank 1";
  later[1].slots = {3};
  const response_list last = f.co.coordinate(later, f.t0);
  ASSERT_EQ(last.responses.size(), 1u);
  EXPECT_EQ(last.responses[0].type, response_type::run_cached);
  EXPECT_EQ(last.responses[0].slot, 3u);
  EXPECT_TRUE(f.co.coordinate(later = std::vector<report>(3), f.t0).responses.empty()) << "answered once";
}

TEST(coordinator, a_stalled_tensor_is_logged_then_answered_with_a_timeout_after_the_complete_ones) {
  coordinator_fixture f(3, milliseconds(100), milliseconds(1000));
  f.cycle({{{"late", allreduce_of(2)}}, {}, {{"late", allreduce_of(2)}}});
  f.cycle({}, milliseconds(150));
  ASSERT_EQ(f.log.size(), 1u);
  EXPECT_EQ(f.log[0],
            "stall: allreduce \"late\" submitted by ranks {0,2} has waited 0.15 s for rank {1} "
            "(FLEXPAR_STALL_WARNING_S)");
  const response_list out =
      f.cycle({{{"ok", allreduce_of(1)}}, {{"ok", allreduce_of(1)}}, {{"ok", allreduce_of(1)}}}, milliseconds(1000));
  ASSERT_EQ(out.responses.size(), 2u);
  EXPECT_EQ(out.responses[0].name, "ok");
  EXPECT_EQ(out.responses[1].name, "late");
  EXPECT_EQ(out.responses[1].error, error_kind::timeout);
  EXPECT_EQ(out.responses[1].text,
            "allreduce \"late\": rank {1} did not submit it within 1 s (FLEXPAR_STALL_SHUTDOWN_S); ranks {0,2} had "
            "submitted it");
  // Dropped from the table: rank 1's late report starts a new wait instead of running it.
  EXPECT_TRUE(f.cycle({{}, {{"late", allreduce_of(2)}}, {}}, milliseconds(1001)).responses.empty());
}

// ---- the stall inspector (step 3) -----------------------------------------------------------------

/// A table holding tensor `name`, reported by the ranks in `have` of `p`, first seen at `t0`.
tensor_table table_with(const std::string& name, int p, std::vector<int> have, clock::time_point t0,
                        collective_kind kind = collective_kind::allreduce) {
  tensor_table table;
  table_row& t = table[name];
  t.by_rank.resize(static_cast<std::size_t>(p));
  t.by_slot.assign(static_cast<std::size_t>(p), false);
  for (int r : have) t.by_rank[static_cast<std::size_t>(r)] = of_kind(kind, 4);
  t.first_seen = t.last_warning = t0;
  return table;
}

TEST(stall_inspector, warns_with_the_missing_ranks_every_warning_interval) {
  const stall_inspector inspector(milliseconds(100), milliseconds(1000));
  const clock::time_point t0 = clock::now();
  tensor_table table = table_with("w", 5, {0, 2, 4}, t0, collective_kind::broadcast);
  const std::vector<bool> none_joined(5, false);
  EXPECT_TRUE(inspector.inspect(table, none_joined, t0 + milliseconds(99)).warnings.empty());
  const stall_findings first = inspector.inspect(table, none_joined, t0 + milliseconds(100));
  ASSERT_EQ(first.warnings.size(), 1u);
  EXPECT_TRUE(first.timeouts.empty());
  EXPECT_EQ(first.warnings[0].name, "w");
  EXPECT_EQ(first.warnings[0].missing, (std::vector<int>{1, 3}));
  EXPECT_EQ(first.warnings[0].text,
            "stall: broadcast \"w\" submitted by ranks {0,2,4} has waited 0.1 s for ranks {1,3} "
            "(FLEXPAR_STALL_WARNING_S)");
  EXPECT_TRUE(inspector.inspect(table, none_joined, t0 + milliseconds(150)).warnings.empty()) << "not again yet";
  EXPECT_EQ(inspector.inspect(table, none_joined, t0 + milliseconds(200)).warnings.size(), 1u);
  EXPECT_EQ(table.size(), 1u) << "the inspector drops nothing";
}

TEST(stall_inspector, times_out_past_stall_shutdown_and_not_before) {
  const stall_inspector inspector(milliseconds(100), milliseconds(2500));
  const clock::time_point t0 = clock::now();
  tensor_table table = table_with("g", 3, {1}, t0);
  const std::vector<bool> none_joined(3, false);
  EXPECT_TRUE(inspector.inspect(table, none_joined, t0 + milliseconds(2499)).timeouts.empty());
  const stall_findings late = inspector.inspect(table, none_joined, t0 + milliseconds(2500));
  EXPECT_TRUE(late.warnings.empty()) << "a timed-out tensor is not warned about as well";
  ASSERT_EQ(late.timeouts.size(), 1u);
  EXPECT_EQ(late.timeouts[0].missing, (std::vector<int>{0, 2}));
  EXPECT_EQ(late.timeouts[0].text,
            "allreduce \"g\": ranks {0,2} did not submit it within 2.5 s (FLEXPAR_STALL_SHUTDOWN_S); rank {1} had "
            "submitted it");
}

TEST(stall_inspector, joined_ranks_and_complete_tensors_are_not_waited_for_and_zero_never_times_out) {
  const stall_inspector inspector(milliseconds(100), milliseconds(0));
  const clock::time_point t0 = clock::now();
  tensor_table table = table_with("w", 3, {0, 1}, t0);
  const stall_findings joined = inspector.inspect(table, {false, false, true}, t0 + std::chrono::hours(1));
  EXPECT_TRUE(joined.warnings.empty());
  EXPECT_TRUE(joined.timeouts.empty());
  const stall_findings waiting = inspector.inspect(table, {false, false, false}, t0 + std::chrono::hours(1));
  EXPECT_EQ(waiting.warnings.size(), 1u);
  EXPECT_TRUE(waiting.timeouts.empty());
}

// ---- the steady state: skipped tensors, the plan, its slots, its rounds, the recorder ---------------

TEST(engine_protocol, steps_skips_and_a_plan_read_back_as_written) {
  report in;
  in.slots = {4, 1};
  in.slot_steps = {7, 8};
  in.skipped = {{2, 7}, {5, 6}};
  const report out = decode_report(encode(in));
  EXPECT_EQ(out.slot_steps, (std::vector<std::uint32_t>{7, 8}));
  ASSERT_EQ(out.skipped.size(), 2u);
  EXPECT_EQ(out.skipped[1].slot, 5u);
  EXPECT_EQ(out.skipped[1].step, 6u);
  report zero;
  zero.slots = {3};
  zero.slot_steps = {0};
  EXPECT_TRUE(decode_report(encode(zero)).slot_steps.empty()) << "steps of 0 cost nothing on the wire";

  response_list list;
  response failed;
  failed.type = response_type::error;
  failed.name = "t3";
  failed.text = "why";
  failed.step = 9;
  list.responses.push_back(failed);
  list.plan = {{0, 2}, {1}};
  const response_list back = decode_response_list(encode(list), response_cache(4), 2);
  EXPECT_EQ(back.responses[0].step, 9u);
  EXPECT_EQ(back.plan, (std::vector<std::vector<std::uint32_t>>{{0, 2}, {1}}));
}

/// Rank `rank`'s report of `slots` by cache slot in step `step`.
report by_slot(std::vector<std::uint32_t> slots, std::uint32_t step = 0) {
  report r;
  r.slot_steps.assign(slots.size(), step);
  r.slots = std::move(slots);
  return r;
}

TEST(coordinator, a_tensor_some_ranks_submitted_and_another_skipped_is_a_mismatch_naming_both) {
  coordinator_fixture f(3);
  f.cache.remember(run_full("t3", allreduce_of(4), {4, 4, 4}));
  std::vector<report> reports{by_slot({0}, 5), by_slot({0}, 5), {}};
  reports[2].skipped = {{0, 5}};
  const response_list out = f.co.coordinate(reports, f.t0);
  ASSERT_EQ(out.responses.size(), 1u);
  EXPECT_EQ(out.responses[0].type, response_type::error);
  EXPECT_EQ(out.responses[0].error, error_kind::mismatch);
  EXPECT_EQ(out.responses[0].step, 5u);
  EXPECT_EQ(out.responses[0].text,
            "allreduce \"t3\" (step 5): submitted by ranks {0,1} but rank {2} ended the step without it "
            "(engine::end_step): the ranks' steps differ");
}

TEST(coordinator, a_tensor_every_rank_skipped_is_dropped_without_a_response) {
  coordinator_fixture f(2);
  f.cache.remember(run_full("t3", allreduce_of(4), {4, 4}));
  std::vector<report> reports(2);
  reports[0].skipped = {{0, 2}};
  EXPECT_TRUE(f.co.coordinate(reports, f.t0).responses.empty());
  reports[0].skipped.clear();
  reports[1].skipped = {{0, 2}};
  EXPECT_TRUE(f.co.coordinate(reports, f.t0).responses.empty()) << "no rank holds it: nothing to answer";
  // and nothing remains of it: the next step's submissions run at once
  EXPECT_EQ(f.co.coordinate(std::vector<report>{by_slot({0}, 3), by_slot({0}, 3)}, f.t0).responses.size(), 1u);
}

TEST(coordinator, the_same_tensor_of_two_steps_never_pairs) {
  coordinator_fixture f(2);
  f.cache.remember(run_full("t3", allreduce_of(4), {4, 4}));
  // rank 1 skipped t3 in step 5 and already submitted step 6's: rank 0's step 5 fails, naming it
  std::vector<report> reports{by_slot({0}, 5), by_slot({0}, 6)};
  reports[1].skipped = {{0, 5}};
  const response_list out = f.co.coordinate(reports, f.t0);
  ASSERT_EQ(out.responses.size(), 1u);
  EXPECT_EQ(out.responses[0].type, response_type::error);
  EXPECT_EQ(out.responses[0].step, 5u);
  // step 6's waits for rank 0's, and then runs
  const response_list next = f.co.coordinate(std::vector<report>{by_slot({0}, 6), {}}, f.t0);
  ASSERT_EQ(next.responses.size(), 1u);
  EXPECT_EQ(next.responses[0].type, response_type::run_cached);
  EXPECT_EQ(next.responses[0].step, 6u);
  // without a skip, two steps' submissions wait for their own step, and the stall says which
  coordinator_fixture g(2, milliseconds(100), milliseconds(1000));
  g.cache.remember(run_full("w", allreduce_of(4), {4, 4}));
  EXPECT_TRUE(g.co.coordinate(std::vector<report>{by_slot({0}, 2), by_slot({0}, 3)}, g.t0).responses.empty());
  const response_list late = g.co.coordinate(std::vector<report>(2), g.t0 + milliseconds(1500));
  ASSERT_EQ(late.responses.size(), 2u);
  for (const response& r : late.responses) EXPECT_EQ(r.error, error_kind::timeout);
  EXPECT_NE(late.responses[0].text.find("allreduce \"w\" (step "), std::string::npos) << late.responses[0].text;
}

/// A cache of `n` allreduces "t0"... of `count` floats on `p` ranks, slots in order.
response_cache cache_of(std::size_t n, std::uint64_t count, int p) {
  response_cache cache(64);
  for (std::size_t k = 0; k < n; ++k)
    cache.remember(run_full(numbered("t", k), allreduce_of(count),
                            std::vector<std::uint64_t>(static_cast<std::size_t>(p), count)));
  return cache;
}

TEST(step_plan, holds_the_announced_buckets_and_agrees_by_digest) {
  const response_cache cache = cache_of(5, 8, 2);
  const std::vector<std::vector<std::uint32_t>> buckets{{3, 0}, {4}, {1, 2}};
  const step_plan plan(cache, buckets, 1);
  ASSERT_EQ(plan.tensors(), 5u);
  ASSERT_EQ(plan.buckets(), 3u);
  EXPECT_EQ(plan.tensor(0).name, "t3");
  EXPECT_EQ(plan.find("t2"), std::optional<std::uint32_t>(4));
  EXPECT_EQ(plan.bucket_of(4), 2u);
  EXPECT_EQ(plan.size_of_bucket(0), 2u);
  EXPECT_EQ(plan.bucket_tensors(2)[1].name, "t2");
  EXPECT_EQ(plan.positions(2).size(), 2u);
  EXPECT_FALSE(plan.find("t9"));
  EXPECT_TRUE(plan.matches(0, allreduce_of(8)));
  EXPECT_FALSE(plan.matches(0, allreduce_of(9)));
  EXPECT_FALSE(plan.matches(0, allreduce_of(8, dtype::f64)));
  EXPECT_EQ(step_plan(cache, buckets, 0).digest(), plan.digest());
  const std::vector<std::vector<std::uint32_t>> regrouped{{3, 0, 4}, {1, 2}};
  EXPECT_NE(step_plan(cache, regrouped, 1).digest(), plan.digest()) << "the same tensors cut otherwise";
  EXPECT_THROW(step_plan(cache, std::vector<std::vector<std::uint32_t>>{{0}, {0}}, 0), error);
  EXPECT_THROW(step_plan(cache, std::vector<std::vector<std::uint32_t>>{{7}}, 0), error);
}

std::shared_ptr<engine_entry> submission(const std::string& name, std::uint64_t count) {
  auto e = std::make_shared<engine_entry>();
  e->name = name;
  e->desc = allreduce_of(count);
  return e;
}

TEST(plan_slots, submissions_fill_their_buckets_and_what_the_plan_lacks_stays_out) {
  const response_cache cache = cache_of(4, 8, 2);
  plan_slots slots(
      std::make_shared<const step_plan>(cache, std::vector<std::vector<std::uint32_t>>{{0, 1}, {2, 3}}, 0));
  using placed = plan_slots::placed;
  EXPECT_EQ(slots.place(submission("t1", 8)), placed::in_slot);
  EXPECT_FALSE(slots.waiting());
  EXPECT_EQ(slots.place(submission("t9", 8)), placed::not_in_plan);
  EXPECT_EQ(slots.place(submission("t0", 7)), placed::not_in_plan) << "another count";
  EXPECT_EQ(slots.place(submission("t1", 8)), placed::not_in_plan) << "its slot is still full";
  const auto t2 = submission("t2", 8);
  EXPECT_EQ(slots.place(t2), placed::in_slot);
  EXPECT_EQ(slots.bucket_of(*t2), 1u);
  EXPECT_EQ(slots.place(submission("t0", 8)), placed::completes_bucket);
  EXPECT_TRUE(slots.waiting());
  const plan_round r = slots.round(false);
  EXPECT_EQ(r.complete, (std::vector<bool>{true, false}));
  EXPECT_EQ(r.started, (std::vector<bool>{true, true}));
  const auto bucket0 = slots.take(0);
  ASSERT_EQ(bucket0.size(), 2u);
  EXPECT_EQ(bucket0[0]->name, "t0");  // plan order, not submission order
  EXPECT_EQ(bucket0[1]->name, "t1");
  EXPECT_FALSE(slots.waiting());
  EXPECT_EQ(slots.place(submission("t1", 8)), placed::in_slot) << "its slot is free again";
  // this step submitted t0, t1, t2, not t3
  EXPECT_EQ(slots.end_step(), (std::vector<std::uint32_t>{3}));
  EXPECT_TRUE(slots.end_step().empty()) << "a step with nothing of the plan is no step of it";
  const auto rest = slots.take_all();
  EXPECT_EQ(rest.size(), 2u);  // t1 (second), t2
  EXPECT_EQ(slots.round(false).started, (std::vector<bool>{false, false}));
}

TEST(plan_round, the_max_of_the_votes_says_what_runs_who_leaves_and_whether_the_plans_agree) {
  // three ranks, three buckets: bucket 0 complete everywhere, bucket 1 on two, bucket 2 begun on one
  std::vector<plan_round> votes(3);
  votes[0] = {false, {true, true, false}, {true, true, true}};
  votes[1] = {false, {true, true, false}, {true, true, false}};
  votes[2] = {false, {true, false, false}, {true, false, false}};
  const std::uint64_t digest = 0x0123456789abcdefull;
  std::vector<std::vector<std::uint8_t>> v;
  for (const plan_round& x : votes) v.push_back(encode_round(x, digest));
  auto reduce = [](const std::vector<std::vector<std::uint8_t>>& all) {
    std::vector<std::uint8_t> m = all[0];
    for (const auto& x : all)
      for (std::size_t i = 0; i < m.size(); ++i) m[i] = std::max(m[i], x[i]);
    return m;
  };
  plan_verdict out = decode_round(reduce(v), 3, digest);
  EXPECT_FALSE(out.leave);
  EXPECT_FALSE(out.digest_differs);
  EXPECT_EQ(out.complete_everywhere, (std::vector<bool>{true, false, false}));
  EXPECT_EQ(out.started_somewhere, (std::vector<bool>{true, true, true}));
  v[1][0] = 1;  // rank 1 leaves
  EXPECT_TRUE(decode_round(reduce(v), 3, digest).leave);
  // a rank with another plan: every rank sees it, whichever way the digests differ
  v[2] = encode_round(votes[2], digest ^ 0x10);
  for (std::uint64_t d : {digest, digest ^ 0x10}) EXPECT_TRUE(decode_round(reduce(v), 3, d).digest_differs);
  EXPECT_THROW(decode_round(reduce(v), 2, digest), error);
}

TEST(plan_recorder, proposes_a_step_that_ran_twice_by_slot_and_nothing_else) {
  // a step of four tensors: slots 0..3, fused as two runs by a 32-byte threshold (16 bytes each)
  plan_recorder rec(32);
  std::vector<fusion_item> items(4, fusion_item{true, dtype::f32, reduce_op::sum, memory_kind::host, 16});
  const std::vector<std::optional<std::uint32_t>> full(4), cached{0, 1, 2, 3};
  auto steps_of = [](std::uint32_t s) { return std::vector<std::uint32_t>(4, s); };
  EXPECT_FALSE(rec.observe(items, full, steps_of(0), true)) << "step 1: in full";
  EXPECT_FALSE(rec.observe(items, cached, steps_of(0), true)) << "step 2: after a step in full";
  EXPECT_FALSE(rec.observe(items, cached, steps_of(0), false)) << "step 3 like step 2, but something is pending";
  // step 4 like step 3, and quiet: proposed, as step 4's runs
  const auto plan = rec.observe(items, cached, steps_of(0), true);
  ASSERT_TRUE(plan);
  EXPECT_EQ(*plan, (std::vector<std::vector<std::uint32_t>>{{0, 1}, {2, 3}}));
  EXPECT_FALSE(rec.observe(items, cached, steps_of(0), true)) << "a proposal starts the watch over";
  // another set in the second step: nothing
  rec.reset();
  EXPECT_FALSE(rec.observe(items, cached, steps_of(0), true));
  EXPECT_FALSE(rec.observe(std::span(items).first(3), std::span(cached).first(3), steps_of(0), true));
  // steps counted by end_step: a step in two cycles, cut where the step changes, not where a tensor repeats
  plan_recorder by_step(0);
  EXPECT_FALSE(by_step.observe(std::span(items).first(2), std::span(cached).first(2), steps_of(4), true));
  EXPECT_FALSE(by_step.observe(std::span(items).last(2), std::span(cached).last(2), steps_of(4), true));
  EXPECT_FALSE(by_step.observe(std::span(items).last(2), std::span(cached).last(2), steps_of(5), false));
  const auto stepped = by_step.observe(std::span(items).first(2), std::span(cached).first(2), steps_of(5), true);
  ASSERT_TRUE(stepped);
  EXPECT_EQ(*stepped, (std::vector<std::vector<std::uint32_t>>{{2}, {3}, {0}, {1}}));
}

// ---- the fused executor (step 5) ------------------------------------------------------------------

response run_of(std::string name, description d, int p) {
  return run_full(std::move(name), d, std::vector<std::uint64_t>(static_cast<std::size_t>(p), d.count));
}

TEST(plan_fusion, compatible_allreduces_run_together_in_list_order_and_the_rest_alone) {
  description f32 = allreduce_of(10), f64 = allreduce_of(10, dtype::f64),
              max = allreduce_of(10, dtype::f32, reduce_op::max);
  description on_device = f32;
  on_device.memory = memory_kind::cuda;
  response failed;
  failed.type = response_type::error;
  const std::vector<response> list{run_of("a", f32, 2),
                                   run_of("b", f64, 2),
                                   run_of("c", of_kind(collective_kind::broadcast, 10), 2),
                                   run_of("d", f32, 2),
                                   failed,
                                   run_of("e", max, 2),
                                   run_of("f", on_device, 2),
                                   run_of("g", f64, 2),
                                   run_of("h", f32, 2),
                                   run_of("i", on_device, 2)};
  using runs = std::vector<std::vector<std::size_t>>;
  EXPECT_EQ(plan_fusion(list, 1 << 20), (runs{{0, 3, 8}, {1, 7}, {2}, {4}, {5}, {6, 9}}));
  // 0: nothing fuses. 80 bytes: a and d (40 each) fill it, h runs alone; so do f and i; b and g
  // (80 each) cannot share it.
  EXPECT_EQ(plan_fusion(list, 0), (runs{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}}));
  EXPECT_EQ(plan_fusion(list, 80), (runs{{0, 3}, {1}, {2}, {4}, {5}, {6, 9}, {7}, {8}}));
}

/// The engine's side of the executor in a test: the tensors this rank has, and how each ended.
class test_owner final : public fused_executor::owner {
 public:
  struct ending {
    std::exception_ptr error;
    std::size_t result_count = 0;
  };
  /// A host tensor named `name` with `desc`, reading `in` and writing `out`.
  void add(const std::string& name, description desc, std::span<const std::byte> in, std::span<std::byte> out) {
    auto e = std::make_shared<engine_entry>();
    e->name = name;
    e->desc = desc;
    e->in = in;
    e->out = out;
    pending[name] = std::move(e);
  }
  std::shared_ptr<engine_entry> take(const std::string& name, std::optional<std::uint32_t> step) override {
    auto it = pending.find(name);
    if (it == pending.end() || (step && it->second->desc.step != *step)) return nullptr;
    auto e = std::move(it->second);
    pending.erase(it);
    return e;
  }
  void complete(std::span<const std::shared_ptr<engine_entry>> entries, std::exception_ptr error,
                std::span<const std::size_t> result_counts) override {
    for (std::size_t k = 0; k < entries.size(); ++k)
      if (entries[k]) endings[entries[k]->name] = {error, result_counts[k]};
  }
  void ran(std::size_t tensors) override { collectives.push_back(tensors); }
  void note(const std::string& text) override { notes.push_back(text); }

  std::vector<std::string> notes;
  std::map<std::string, std::shared_ptr<engine_entry>> pending;
  std::map<std::string, ending> endings;
  std::vector<std::size_t> collectives;  // tensors per collective run
};

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return {};
}

/// Rank r's element i of tensor k: small integers, so that any order of float sums is exact.
float value_of(int rank, std::size_t k, std::size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(k + 1) + static_cast<int>(i % 7) - 3);
}

class fused_executor_inproc : public ::testing::TestWithParam<int> {};

TEST_P(fused_executor_inproc, a_fused_group_of_allreduces_gives_the_serial_sums) {
  run_in_process(GetParam(), [](communicator& comm) {
    const int p = comm.size(), me = comm.rank();
    const std::vector<std::size_t> counts{1, 33, 0, 250, 7};
    std::vector<std::vector<float>> data(counts.size());
    std::vector<response> list;
    test_owner owner;
    for (std::size_t k = 0; k < counts.size(); ++k) {
      for (std::size_t i = 0; i < counts[k]; ++i) data[k].push_back(value_of(me, k, i));
      const std::string name = numbered("g", k);
      owner.add(name, allreduce_of(counts[k]), std::as_bytes(std::span(data[k])),
                std::as_writable_bytes(std::span(data[k])));
      list.push_back(run_of(name, allreduce_of(counts[k]), p));
    }
    fused_executor exec(comm, std::size_t{1} << 20, nullptr, nullptr, owner);
    exec.execute(list, clock::now());
    EXPECT_EQ(owner.collectives, std::vector<std::size_t>{counts.size()}) << "one collective for the whole group";
    EXPECT_TRUE(owner.pending.empty());
    for (std::size_t k = 0; k < counts.size(); ++k) {
      const auto& end = owner.endings.at(numbered("g", k));
      EXPECT_FALSE(end.error) << what_of(end.error);
      EXPECT_EQ(end.result_count, counts[k]);
      for (std::size_t i = 0; i < counts[k]; ++i) {
        float want = 0;  // the serial sum
        for (int r = 0; r < p; ++r) want += value_of(r, k, i);
        ASSERT_EQ(data[k][i], want) << "tensor " << k << " element " << i;
      }
    }
  });
}

TEST_P(fused_executor_inproc, a_rank_without_the_tensor_contributes_the_identity) {
  run_in_process(GetParam(), [](communicator& comm) {
    const int p = comm.size(), me = comm.rank();
    const bool joined = me == p - 1;  // the last rank has joined: no tensor of its own
    std::vector<float> v(40), w(3);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = value_of(me, 0, i);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = value_of(me, 1, i);
    test_owner owner;
    if (!joined) {
      owner.add("v", allreduce_of(40), std::as_bytes(std::span(v)), std::as_writable_bytes(std::span(v)));
      owner.add("w", allreduce_of(3), std::as_bytes(std::span(w)), std::as_writable_bytes(std::span(w)));
    }
    fused_executor exec(comm, std::size_t{1} << 20, nullptr, nullptr, owner);
    exec.execute(std::vector<response>{run_of("v", allreduce_of(40), p), run_of("w", allreduce_of(3), p)},
                 clock::now());
    EXPECT_EQ(owner.collectives, std::vector<std::size_t>{2});
    if (joined) return;
    for (std::size_t i = 0; i < v.size(); ++i) {
      float want = 0;
      for (int r = 0; r + 1 < p; ++r) want += value_of(r, 0, i);
      ASSERT_EQ(v[i], want) << "element " << i;
    }
  });
}

TEST_P(fused_executor_inproc, a_single_response_runs_on_its_own) {
  run_in_process(GetParam(), [](communicator& comm) {
    const int p = comm.size(), me = comm.rank();
    // An allgather: rank r gives r + 1 elements; every rank gets them all in rank order.
    std::vector<std::int32_t> mine(static_cast<std::size_t>(me + 1));
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = 100 * me + static_cast<int>(i);
    std::vector<std::int32_t> all(static_cast<std::size_t>(p * (p + 1) / 2) + 5, -1);
    test_owner owner;
    description d = of_kind(collective_kind::allgather, mine.size(), dtype::i32);
    owner.add("ag", d, std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)));
    response r = run_of("ag", d, p);
    for (int k = 0; k < p; ++k) r.counts[static_cast<std::size_t>(k)] = static_cast<std::uint64_t>(k + 1);
    fused_executor exec(comm, std::size_t{1} << 20, nullptr, nullptr, owner);
    exec.execute(std::vector<response>{r}, clock::now());
    EXPECT_EQ(owner.collectives, std::vector<std::size_t>{1});
    const auto& end = owner.endings.at("ag");
    EXPECT_FALSE(end.error) << what_of(end.error);
    EXPECT_EQ(end.result_count, static_cast<std::size_t>(p * (p + 1) / 2));
    std::vector<std::int32_t> want;
    for (int k = 0; k < p; ++k)
      for (int i = 0; i <= k; ++i) want.push_back(100 * k + i);
    want.resize(all.size(), -1);  // nothing written past the result
    EXPECT_EQ(all, want);
  });
}

TEST_P(fused_executor_inproc, an_error_completes_only_its_own_tensors) {
  run_in_process(GetParam(), [](communicator& comm) {
    const int p = comm.size(), me = comm.rank();
    std::vector<double> a(5, me + 1.0), b(6, 2.0 * (me + 1));
    std::vector<float> in(8, 1.0f), too_small(1);
    test_owner owner;
    owner.add("a", allreduce_of(5, dtype::f64), std::as_bytes(std::span(a)), std::as_writable_bytes(std::span(a)));
    owner.add("bad", allreduce_of(4), std::as_bytes(std::span(in)), std::as_writable_bytes(std::span(in)));
    owner.add("small", of_kind(collective_kind::allgather, 8), std::as_bytes(std::span(in)),
              std::as_writable_bytes(std::span(too_small)));
    owner.add("b", allreduce_of(6, dtype::f64), std::as_bytes(std::span(b)), std::as_writable_bytes(std::span(b)));
    response failed;
    failed.type = response_type::error;
    failed.name = "bad";
    failed.error = error_kind::mismatch;
    failed.text = "allreduce \"bad\": count 4 on rank {0} but 5 on rank {1}";
    const std::vector<response> list{run_of("a", allreduce_of(5, dtype::f64), p), failed,
                                     run_of("small", of_kind(collective_kind::allgather, 8), p),
                                     run_of("b", allreduce_of(6, dtype::f64), p)};
    fused_executor exec(comm, std::size_t{1} << 20, nullptr, nullptr, owner);
    EXPECT_NO_THROW(exec.execute(list, clock::now()));
    const std::string prefix = "[rank " + std::to_string(me) + "] ";
    const auto& bad = owner.endings.at("bad");
    EXPECT_EQ(what_of(bad.error), prefix + failed.text);
    EXPECT_THROW(std::rethrow_exception(bad.error), mismatch_error);
    const auto& small = owner.endings.at("small");
    EXPECT_EQ(what_of(small.error),
              prefix + "allgather \"small\": the output holds 1 elements but the result has " + std::to_string(8 * p));
    EXPECT_THROW(std::rethrow_exception(small.error), usage_error);
    EXPECT_FALSE(owner.endings.at("a").error);
    EXPECT_FALSE(owner.endings.at("b").error);
    const double sum = p * (p + 1) / 2.0;
    EXPECT_EQ(a, std::vector<double>(5, sum));
    EXPECT_EQ(b, std::vector<double>(6, 2 * sum));
    EXPECT_EQ(owner.collectives, (std::vector<std::size_t>{2})) << "a and b fused; the failed allgather not counted";
  });
}

/// reduce_scatter and alltoall run what `automatic` chooses for their bytes on this communicator
/// (shared_memory on one node with a segment, ring / pairwise otherwise), and the timeline names it.
TEST_P(fused_executor_inproc, reduce_scatter_and_alltoall_run_and_name_what_automatic_chooses) {
  run_in_process(GetParam(), [](communicator& comm) {
    const int p = comm.size(), me = comm.rank();
    const std::size_t n = 6 * static_cast<std::size_t>(p) + 1;  // uneven reduce_scatter blocks
    const std::size_t n_a2a = 3 * static_cast<std::size_t>(p);
    std::vector<std::int64_t> rs_in(n), rs_out(n), a2a_in(n_a2a), a2a_out(n_a2a);
    for (std::size_t i = 0; i < n; ++i) rs_in[i] = static_cast<std::int64_t>(i) * (me + 1);
    for (std::size_t i = 0; i < n_a2a; ++i) a2a_in[i] = 1000 * me + static_cast<std::int64_t>(i);
    test_owner owner;
    const description rs = of_kind(collective_kind::reduce_scatter, n, dtype::i64);
    const description a2a = of_kind(collective_kind::alltoall, n_a2a, dtype::i64);
    owner.add("rs", rs, std::as_bytes(std::span(rs_in)), std::as_writable_bytes(std::span(rs_out)));
    owner.add("a2a", a2a, std::as_bytes(std::span(a2a_in)), std::as_writable_bytes(std::span(a2a_out)));
    timeline trace(me);
    fused_executor exec(comm, std::size_t{1} << 20, nullptr, &trace, owner);
    const clock::time_point now = clock::now();
    owner.pending.at("rs")->submitted = owner.pending.at("a2a")->submitted = now;
    exec.execute(std::vector<response>{run_of("rs", rs, p), run_of("a2a", a2a, p)}, now);
    ASSERT_FALSE(owner.endings.at("rs").error) << what_of(owner.endings.at("rs").error);
    ASSERT_FALSE(owner.endings.at("a2a").error) << what_of(owner.endings.at("a2a").error);
    // Results against a serial oracle: my block of the sum, and block me of every rank's input.
    const std::size_t base = n / static_cast<std::size_t>(p), extra = n % static_cast<std::size_t>(p);
    const std::size_t mine = base + (static_cast<std::size_t>(me) < extra ? 1 : 0);
    const std::size_t first = static_cast<std::size_t>(me) * base + std::min<std::size_t>(me, extra);
    EXPECT_EQ(owner.endings.at("rs").result_count, mine);
    for (std::size_t k = 0; k < mine; ++k)
      EXPECT_EQ(rs_out[k], static_cast<std::int64_t>(first + k) * p * (p + 1) / 2) << "block element " << k;
    for (int from = 0; from < p; ++from)
      for (std::size_t e = 0; e < 3; ++e)
        EXPECT_EQ(a2a_out[3 * static_cast<std::size_t>(from) + e],
                  1000 * from + static_cast<std::int64_t>(3 * static_cast<std::size_t>(me) + e));
    // The timeline names the algorithm `automatic` picks for the same bytes.
    std::map<std::string, std::string> named;
    for (const auto& e : nlohmann::json::parse(trace.events_json()))
      if (e.contains("args") && e.at("args").contains("algorithm"))
        named[e.at("name").get<std::string>()] = e.at("args").at("algorithm").get<std::string>();
    EXPECT_EQ(named["REDUCE_SCATTER"], name_of(choose_reduce_scatter(comm, n * sizeof(std::int64_t))));
    EXPECT_EQ(named["ALLTOALL"], name_of(choose_alltoall(comm, n_a2a * sizeof(std::int64_t))));
  });
}

INSTANTIATE_TEST_SUITE_P(world, fused_executor_inproc, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return numbered("p", static_cast<std::size_t>(info.param)); });

}  // namespace
}  // namespace flexpar::detail
