// tests/engine/test_engine_units.cpp — the engine's units (lib/engine/) without its background
// thread: the messages, the response cache, the coordinator, the stall inspector and the fused
// executor, each driven directly with chosen inputs and a fake clock.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/protocol.hpp"
#include "engine/response_cache.hpp"

namespace flexpar::detail {
namespace {

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
    std::string name = "t";
    name += std::to_string((i * 5) % 8);  // appended apart: "t" + to_string(...) trips GCC 12's -Wrestrict
    list.push_back(run_full(name, allreduce_of(n), {n, 2 * n, 3 * n}));
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

}  // namespace
}  // namespace flexpar::detail
