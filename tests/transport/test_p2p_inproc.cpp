// Point-to-point over the in-process transport, every world size of the unit tier.
#include <gtest/gtest.h>

#include <atomic>
#include <utility>
#include <vector>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/transport/inproc.hpp>

#include "p2p_patterns.hpp"
#include "support/world_sizes.hpp"

namespace flexpar {
namespace {

using testing_support::inproc_world_sizes;
using testing_support::p2p_message_sizes;

config short_timeouts() {
  config c;
  c.timeout = std::chrono::seconds(30);
  return c;
}

TEST(p2p_patterns, message_is_pattern_byte_at_every_index) {
  for (const std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4096},
                                 std::size_t{3 * 4096 + 5}, std::size_t{300 * 4096 + 17}})
    for (const auto& [from, to] : {std::pair{0, 0}, std::pair{1, 0}, std::pair{6, 7}, std::pair{3, 250}}) {
      const std::vector<std::byte> m = testing_support::pattern_message(from, to, size);
      ASSERT_EQ(m.size(), size);
      for (std::size_t i = 0; i < size; ++i)
        ASSERT_EQ(m[i], testing_support::pattern_byte(from, to, size, i))
            << "byte " << i << " of " << from << " -> " << to << ", " << size << " bytes";
    }
}

class inproc_p2p : public ::testing::TestWithParam<int> {};

TEST_P(inproc_p2p, ring_every_size) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        tag_t tag = 0;
        for (std::size_t size : p2p_message_sizes) testing_support::ring_exchange(comm, size, tag++);
      },
      short_timeouts());
}

TEST_P(inproc_p2p, all_pairs_every_size) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        tag_t tag = 100;
        for (std::size_t size : p2p_message_sizes)
          testing_support::all_pairs_exchange(comm, size, tag++, /*all_at_once=*/size <= (std::size_t{2} << 20));
      },
      short_timeouts());
}

TEST_P(inproc_p2p, same_tag_messages_keep_their_order) {
  run_in_process(
      GetParam(), [](communicator& comm) { testing_support::ordered_same_tag(comm); }, short_timeouts());
}

TEST_P(inproc_p2p, messages_are_matched_by_tag) {
  run_in_process(
      GetParam(), [](communicator& comm) { testing_support::matched_by_tag(comm); }, short_timeouts());
}

TEST_P(inproc_p2p, split_groups_do_not_mix_with_the_parent) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        // Two colors (even / odd ranks), reversed order inside each; then the same exchanges on both.
        std::optional<communicator> sub = comm.split(comm.rank() % 2, -comm.rank());
        ASSERT_TRUE(sub.has_value());
        const int expected_size = (comm.size() + (comm.rank() % 2 == 0 ? 1 : 0)) / 2;
        EXPECT_EQ(sub->size(), expected_size);
        EXPECT_EQ(sub->rank(), expected_size - 1 - comm.rank() / 2);
        testing_support::ring_exchange(*sub, 4095, 1);
        testing_support::ring_exchange(comm, 4095, 1);
        // A negative color leaves a rank out.
        std::optional<communicator> none = comm.split(comm.rank() == 0 ? -1 : 0, 0);
        EXPECT_EQ(none.has_value(), comm.rank() != 0);
      },
      short_timeouts());
}

INSTANTIATE_TEST_SUITE_P(world, inproc_p2p, ::testing::ValuesIn(inproc_world_sizes),
                         [](const auto& info) { return "p" + std::to_string(info.param); });

TEST(inproc_p2p_errors, a_peer_that_never_sends_times_out_at_the_deadline) {
  run_in_process(2, [](communicator& comm) {
    if (comm.rank() != 0) return;
    std::vector<std::byte> buffer(64);
    request r = comm.transport().irecv(1, 9, buffer);
    const auto started = clock::now();
    try {
      r.wait(deadline_after(std::chrono::milliseconds(200)));
      FAIL() << "the receive completed although nobody sent";
    } catch (const timeout_error& e) {
      const double waited = std::chrono::duration<double>(clock::now() - started).count();
      EXPECT_GE(waited, 0.19);
      EXPECT_LT(waited, 5.0);
      EXPECT_NE(std::string(e.what()).find("[rank 0] inproc: recv of up to 64 bytes from rank 1 (tag 9)"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(inproc_p2p_errors, bad_peer_and_bad_tag_are_usage_errors) {
  run_in_process(3, [](communicator& comm) {
    std::vector<std::byte> b(4);
    EXPECT_THROW((void)comm.transport().isend(3, 0, b), usage_error);
    EXPECT_THROW((void)comm.transport().irecv(-1, 0, b), usage_error);
    EXPECT_THROW((void)comm.transport().isend(0, comm.transport().max_tag(), b), usage_error);
    try {
      (void)comm.transport().isend(7, 0, b);
    } catch (const usage_error& e) {
      EXPECT_NE(std::string(e.what()).find("peer rank 7, outside the group of 3 ranks"), std::string::npos) << e.what();
    }
  });
}

TEST(inproc_p2p_errors, a_message_larger_than_the_receive_buffer_is_an_error_on_both_sides) {
  std::atomic<int> errors{0};
  run_in_process(2, [&](communicator& comm) {
    std::vector<std::byte> b(comm.rank() == 0 ? 100 : 10);
    request r = comm.rank() == 0 ? comm.transport().isend(1, 0, b) : comm.transport().irecv(0, 0, b);
    try {
      r.wait(comm.default_deadline());
    } catch (const transport_error& e) {
      EXPECT_NE(std::string(e.what()).find("truncation"), std::string::npos) << e.what();
      ++errors;
    }
  });
  EXPECT_EQ(errors.load(), 2);
}

TEST(node_topology, blocks_and_restriction_to_a_split) {
  const node_topology t = node_topology::blocks(7, 3, 4);
  EXPECT_EQ(t.node_count(), 3);
  EXPECT_EQ(t.my_node(), 1);
  EXPECT_EQ(t.local_rank(), 1);
  EXPECT_EQ(t.local_size(), 3);
  EXPECT_FALSE(t.uniform());
  EXPECT_TRUE(node_topology::blocks(8, 2, 0).uniform());
  run_in_process(
      6,
      [](communicator& comm) {
        communicator node = comm.split_node();
        EXPECT_EQ(node.size(), 2);
        EXPECT_EQ(node.topology().node_count(), 1);
        communicator across = comm.split_across_nodes();
        EXPECT_EQ(across.size(), 3);
        EXPECT_EQ(across.topology().node_count(), 3);
        EXPECT_EQ(across.rank(), comm.rank() / 2);
      },
      config{}, /*ranks_per_node=*/2);
}

}  // namespace
}  // namespace flexpar
