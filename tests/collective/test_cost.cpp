// The alpha-beta cost functions (constexpr, so that the simulator and the docs can use them at
// compile time) and what `automatic` picks with configured machine parameters.
#include <gtest/gtest.h>

#include <flexpar/collective.hpp>
#include <flexpar/comm/run_in_process.hpp>

namespace flexpar {
namespace {

// The textbook volumes, checked at compile time.
static_assert(allreduce_ring_cost(4, 1024).steps == 6);
static_assert(allreduce_ring_cost(4, 1024).wire_bytes == 2.0 * 3 / 4 * 1024);
static_assert(allreduce_ring_cost(4, 1024).reduce_bytes == 3.0 / 4 * 1024);
static_assert(allreduce_halving_doubling_cost(8, 1024).steps == 6);
static_assert(allreduce_halving_doubling_cost(8, 1024).wire_bytes == 2.0 * 7 / 8 * 1024);
static_assert(allreduce_halving_doubling_cost(6, 1024).steps == 2 * 2 + 2);  // p' = 4, plus fold and unfold
static_assert(allgather_ring_cost(5, 500).wire_bytes == 400);
static_assert(reduce_scatter_ring_cost(5, 500).reduce_bytes == 400);
static_assert(broadcast_binomial_tree_cost(8, 100).steps == 3);
static_assert(broadcast_binomial_tree_cost(5, 100).steps == 3);
static_assert(barrier_dissemination_cost(5).steps == 3);
static_assert(alltoall_pairwise_cost(4, 400).wire_bytes == 300);
static_assert(allreduce_shared_memory_cost(2, 4096).shm_steps == 1);  // one hand-off for small buffers
static_assert(allreduce_shared_memory_cost(2, 4.0 * shm_round_bytes).shm_steps == 12);
static_assert(allreduce_shared_memory_cost(2, 4.0 * shm_round_bytes).steps == 0);
static_assert(allreduce_ring_cost(1, 1024).seconds(cost_params{}) == 0);
// shared-memory rounds: 2 hand-offs per 256 KiB chunk of a block (at least one round), no transport
static_assert(allgather_shared_memory_cost(2, 1024.0 * 1024).shm_steps == 4);
static_assert(allgather_shared_memory_cost(2, 1024.0 * 1024).copy_bytes == 1024.0 * 1024);
static_assert(allgather_shared_memory_cost(3, 30).shm_steps == 2);
static_assert(alltoall_shared_memory_cost(4, 4.0 * 1024 * 1024).shm_steps == 8);
static_assert(alltoall_shared_memory_cost(4, 4.0 * 1024 * 1024).steps == 0);
static_assert(alltoall_shared_memory_cost(1, 100).copy_bytes == 0);
// reduce_scatter: 2 MiB over 2 ranks is 4 rounds of 256 KiB; half the buffer packed, half reduced
static_assert(reduce_scatter_shared_memory_cost(2, 2.0 * 1024 * 1024).shm_steps == 8);
static_assert(reduce_scatter_shared_memory_cost(2, 2.0 * 1024 * 1024).reduce_bytes == 1024.0 * 1024);
static_assert(reduce_scatter_shared_memory_cost(4, 400).copy_bytes == 300);
static_assert(reduce_scatter_shared_memory_cost(1, 100).shm_steps == 0);

TEST(cost, seconds_weigh_each_term_with_its_channel) {
  const cost_params m{1e-6, 1e-9, 1e-10, 1e-7, 1e-11};
  const cost c{.steps = 2, .wire_bytes = 1000, .reduce_bytes = 100};
  EXPECT_DOUBLE_EQ(c.seconds(m), 2e-6 + 1000e-9 + 100e-10);
  const cost s = within_node(c);
  EXPECT_DOUBLE_EQ(s.seconds(m), 2e-7 + 1000e-11 + 100e-10);
  EXPECT_DOUBLE_EQ((c + s).seconds(m), c.seconds(m) + s.seconds(m));
}

TEST(cost, automatic_picks_halving_doubling_for_latency_and_ring_for_bandwidth_across_nodes) {
  // 8 ranks, one per node: shared memory and hierarchical are out; a slow-start, fast link
  run_in_process(
      8,
      [](communicator& comm) {
        set_cost_params(comm, cost_params{50e-6, 1.0 / 10e9, 1.0 / 20e9, 1e-6, 1.0 / 20e9});
        EXPECT_EQ(choose_allreduce(comm, 4096), algorithm::halving_doubling);
        // ring: 14 alpha + 1.75 n beta; hd: 6 alpha + 1.75 n beta: hd stays ahead for equal volumes,
        // unless p is not a power of two (fold), checked below
        EXPECT_EQ(choose_allreduce(comm, std::size_t{64} << 20), algorithm::halving_doubling);
      },
      config{}, 1);
  run_in_process(
      6,
      [](communicator& comm) {
        set_cost_params(comm, cost_params{50e-6, 1.0 / 10e9, 1.0 / 20e9, 1e-6, 1.0 / 20e9});
        EXPECT_EQ(choose_allreduce(comm, 1024), algorithm::halving_doubling);
        EXPECT_EQ(choose_allreduce(comm, std::size_t{64} << 20),
                  algorithm::ring);  // the fold moves the whole buffer twice
      },
      config{}, 1);
}

TEST(cost, automatic_picks_shared_memory_on_one_node_and_hierarchical_across_nodes) {
  const cost_params m{20e-6, 1.0 / 1e9, 1.0 / 10e9, 0.5e-6, 1.0 / 20e9};
  run_in_process(
      4,
      [&](communicator& comm) {
        set_cost_params(comm, m);
        EXPECT_EQ(choose_allreduce(comm, std::size_t{16} << 20), algorithm::shared_memory);
        EXPECT_EQ(choose_allreduce(comm, 4096), algorithm::shared_memory);
        // allgather and alltoall take the segment on one node at every size
        EXPECT_EQ(choose_allgather(comm, 4096), algorithm::shared_memory);
        EXPECT_EQ(choose_alltoall(comm, std::size_t{16} << 20), algorithm::shared_memory);
      },
      config{});
  run_in_process(
      8,
      [&](communicator& comm) {  // 2 nodes of 4
        set_cost_params(comm, m);
        EXPECT_EQ(choose_allreduce(comm, std::size_t{16} << 20), algorithm::hierarchical);
        EXPECT_NE(choose_allgather(comm, 4096), algorithm::shared_memory);
        EXPECT_EQ(choose_alltoall(comm, 4096), algorithm::pairwise);
      },
      config{}, 4);
}

TEST(cost, automatic_broadcast_and_reduce_choose_the_tree_for_small_and_the_chain_for_large) {
  run_in_process(
      8,
      [](communicator& comm) {
        set_cost_params(comm, cost_params{20e-6, 1.0 / 5e9, 1.0 / 10e9, 1e-6, 1.0 / 10e9});
        EXPECT_EQ(choose_broadcast(comm, 1024), algorithm::binomial_tree);
        EXPECT_EQ(choose_broadcast(comm, std::size_t{64} << 20), algorithm::chain);
        EXPECT_EQ(choose_reduce(comm, 1024), algorithm::binomial_tree);
        EXPECT_EQ(choose_reduce(comm, std::size_t{64} << 20), algorithm::chain);
      },
      config{}, 1);
}

}  // namespace
}  // namespace flexpar
