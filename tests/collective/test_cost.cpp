// The alpha-beta cost functions (constexpr, so that the simulator and the docs can use them at
// compile time), the fit of the machine from timed calls, and what `automatic` picks with configured
// and with measured machine parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

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
static_assert(alltoall_pairwise_cost(4, 400).copy_bytes == 100);        // my own block
static_assert(alltoall_pairwise_cost(4, 400, true).copy_bytes == 500);  // and the buffer set aside first
static_assert(allreduce_shared_memory_cost(2, 4096).shm_steps == 1);    // one hand-off for small buffers
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
        // a hand-off through the segment is 40x cheaper than a message, a copy 20x cheaper than a wire byte
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

TEST(cost, fit_machine_recovers_the_machine_its_samples_were_timed_on) {
  const cost_params truth{7e-6, 1.0 / 3e9, 1.0 / 9e9, 0.6e-6, 1.0 / 12e9};
  std::vector<timed_cost> transport, node;
  for (int p : {2, 3})
    for (double bytes : {256.0, 65536.0, 1048576.0})
      for (const cost& c : {allreduce_ring_cost(p, bytes), allgather_ring_cost(p, bytes)})
        transport.push_back({c, c.seconds(truth)});
  for (double bytes : {256.0, 65536.0, 1048576.0, 4194304.0})
    for (const cost& c : {allreduce_shared_memory_cost(2, bytes), allgather_shared_memory_cost(2, bytes)})
      node.push_back({c, c.seconds(truth)});
  const cost_params fitted = fit_machine(transport, node, truth.gamma);
  EXPECT_NEAR(fitted.alpha / truth.alpha, 1.0, 1e-9);
  EXPECT_NEAR(fitted.beta / truth.beta, 1.0, 1e-9);
  EXPECT_NEAR(fitted.shm_alpha / truth.shm_alpha, 1.0, 1e-9);
  EXPECT_NEAR(fitted.copy_beta / truth.copy_beta, 1.0, 1e-9);
  EXPECT_EQ(fitted.gamma, truth.gamma);

  // no node samples (ranks on different nodes, no segment): that channel keeps the fallback's values
  const cost_params fallback{1, 2, 3, 4e-6, 5e-10};
  const cost_params transport_only = fit_machine(transport, {}, truth.gamma, fallback);
  EXPECT_NEAR(transport_only.alpha / truth.alpha, 1.0, 1e-9);
  EXPECT_EQ(transport_only.shm_alpha, fallback.shm_alpha);
  EXPECT_EQ(transport_only.copy_beta, fallback.copy_beta);
}

TEST(cost, fit_channel_holds_a_parameter_that_would_go_below_its_bound_and_refits_the_other) {
  // t = bytes / 1e9 - 0.2 us: the unconstrained latency is negative; it stays at its bound and the
  // bandwidth is refitted alone, close to 1 GB/s
  std::vector<timed_cost> samples;
  for (double bytes : {1e4, 1e5, 1e6}) samples.push_back({cost{.steps = 1, .wire_bytes = bytes}, bytes / 1e9 - 0.2e-6});
  const auto [alpha, beta] = fit_channel(
      samples, [](const cost& c) { return c.steps; }, [](const cost& c) { return c.wire_bytes; },
      [](const cost&) { return 0.0; }, 1e-8, 1e-13);
  EXPECT_EQ(alpha, 1e-8);
  EXPECT_NEAR(beta * 1e9, 1.0, 0.05);
  // the other bound: every sample the same time whatever its size (bytes cost nothing)
  samples.clear();
  for (double bytes : {1e4, 1e5, 1e6}) samples.push_back({cost{.steps = 1, .wire_bytes = bytes}, 3e-6});
  const auto [latency, per_byte] = fit_channel(
      samples, [](const cost& c) { return c.steps; }, [](const cost& c) { return c.wire_bytes; },
      [](const cost&) { return 0.0; }, 1e-8, 1e-13);
  EXPECT_GT(latency, 1e-6);
  EXPECT_GE(per_byte, 1e-13);
}

/// machine_of and every choose_* on `comm`, for sizes from 1 KiB to 16 MiB: what each rank records.
struct measured {
  cost_params machine;
  std::vector<algorithm> choices;
};

measured measure_and_choose(communicator& comm) {
  measured out{machine_of(comm), {}};
  for (std::size_t bytes : {std::size_t{1} << 10, std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{16} << 20}) {
    out.choices.push_back(choose_allreduce(comm, bytes));
    out.choices.push_back(choose_allgather(comm, bytes));
    out.choices.push_back(choose_reduce_scatter(comm, bytes));
    out.choices.push_back(choose_alltoall(comm, bytes, true));
    out.choices.push_back(choose_broadcast(comm, bytes));
    out.choices.push_back(choose_reduce(comm, bytes));
  }
  return out;
}

TEST(cost, the_measured_machine_is_positive_and_the_same_on_every_rank_which_all_choose_alike) {
  for (const auto& [ranks, per_node] : {std::pair{2, 0}, std::pair{3, 0}, std::pair{4, 2}, std::pair{3, 1}}) {
    std::vector<measured> seen(static_cast<std::size_t>(ranks));
    run_in_process(
        ranks, [&](communicator& comm) { seen[static_cast<std::size_t>(comm.rank())] = measure_and_choose(comm); },
        config{}, per_node);
    for (const measured& m : seen) {
      for (double v : {m.machine.alpha, m.machine.beta, m.machine.gamma, m.machine.shm_alpha, m.machine.copy_beta})
        EXPECT_TRUE(std::isfinite(v) && v > 0) << ranks << " ranks, " << per_node << " per node: " << v;
      EXPECT_EQ(std::memcmp(&m.machine, &seen[0].machine, sizeof(cost_params)), 0)
          << ranks << " ranks, " << per_node << " per node: the machine differs between ranks";
      EXPECT_EQ(m.choices, seen[0].choices) << ranks << " ranks, " << per_node << " per node";
    }
  }
}

}  // namespace
}  // namespace flexpar
