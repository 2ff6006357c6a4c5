// Calibrating the simulator to a machine (doc/search.md, "Simulated vs real"): the link fitted to the SBP
// layer's boxings, a cluster whose devices block in their collectives (no overlap of communication with
// computation), and the profile of the relu passes and the optimizer update. Hand-computed times; delta ==
// full simulation with the blocking model.
#include <gtest/gtest.h>

#include <flexpar/collective.hpp>
#include <flexpar/collective/allreduce_ring.hpp>
#include <flexpar/collective/alltoall_pairwise.hpp>
#include <flexpar/collective/reduce_scatter_ring.hpp>
#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/search/simulator.hpp>

#include <random>
#include <string>

namespace {

using namespace flexpar::search;

TEST(search_calibration, fit_link_recovers_alpha_and_beta) {
  const double alpha = 3e-5, bandwidth = 2e8, gamma = 1e-9;
  flexpar::cost_params m;
  m.alpha = alpha;
  m.beta = 1 / bandwidth;
  m.gamma = gamma;
  m.shm_alpha = alpha;
  m.copy_beta = 1 / bandwidth;
  std::vector<link_sample> samples;
  for (double bytes : {16384.0, 131072.0, 1048576.0})
    for (int p : {2, 3}) {
      for (const flexpar::cost& c :
           {flexpar::allreduce_ring_cost(p, bytes), flexpar::reduce_scatter_ring_cost(p, bytes),
            flexpar::alltoall_pairwise_cost(p, bytes / p)})
        samples.push_back({c, c.seconds(m)});
    }
  const flexpar::search::link l = fit_link(samples, gamma);
  EXPECT_NEAR(l.latency, alpha, 1e-12);
  EXPECT_NEAR(l.bandwidth / bandwidth, 1.0, 1e-9);
}

TEST(search_calibration, fit_link_refits_without_a_negative_latency_and_refuses_too_few) {
  // t = bytes / 1e8 - a little: the unconstrained fit has alpha < 0, so alpha = 0 and beta from bytes alone
  std::vector<link_sample> samples;
  for (double bytes : {1e4, 1e5, 1e6}) samples.push_back({flexpar::cost{1, bytes, 0}, bytes / 1e8 - 1e-6});
  const flexpar::search::link l = fit_link(samples, 0);
  EXPECT_EQ(l.latency, 0.0);
  EXPECT_GT(l.bandwidth, 0.0);
  try {
    fit_link({samples[0]}, 0);
    ADD_FAILURE() << "no usage_error";
  } catch (const flexpar::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("at least 2 samples"), std::string::npos);
  }
}

cluster blocking_cluster(bool overlap) {
  cluster c;
  c.nodes = 1;
  c.devices_per_node = 2;
  c.flops = 1e9;
  c.memory_bandwidth = 1e300;
  c.memory_bytes = 1ull << 40;
  c.kernel_latency = 1e-3;
  c.intra = {1e-4, 1e6};
  c.inter = c.intra;
  c.overlap = overlap;
  return c;
}

TEST(search_calibration, a_blocking_device_runs_its_collectives_between_its_kernels) {
  graph g;
  const std::size_t a = g.add(make::linear("a", 4, 8, 16));
  op b = make::linear("b", 4, 16, 2);
  b.inputs = {a};
  g.add(b);
  const double L = 1e-3;
  const double fwd_a = L + 512e-9, fwd_b = L + 128e-9, bwd_b = L + 256e-9, bwd_a = L + 1024e-9;
  const double allreduce_b = 2e-4 + 128e-6, allreduce_a = 2e-4 + 512e-6;  // ring, p = 2
  const double t0 = fwd_a + fwd_b + bwd_b;
  simulator overlapping(g, blocking_cluster(true)), blocking(g, blocking_cluster(false));
  const strategy dp{{2, 1, 1, 0}, {2, 1, 1, 0}};
  // overlap: b's allreduce runs beside a's backward
  EXPECT_NEAR(overlapping.simulate(dp), std::max(t0 + bwd_a, t0 + allreduce_b) + allreduce_a + 2 * L, 1e-12);
  // blocking: program order on each device: a's backward, then b's allreduce, then a's, then the updates
  EXPECT_NEAR(blocking.simulate(dp), t0 + bwd_a + allreduce_b + allreduce_a + 2 * L, 1e-12);
  EXPECT_EQ(cluster_from_json(to_json(blocking_cluster(false))).overlap, false);
  EXPECT_EQ(cluster_from_json(to_json(blocking_cluster(true))).overlap, true);
}

TEST(search_calibration, delta_equals_full_on_a_blocking_cluster) {
  cluster cl = preset("16-4-slow-inter");
  cl.overlap = false;
  const graph g = reference::mlp(64, {256, 1024, 1024, 256});
  std::vector<std::vector<soap_config>> space;
  for (const op& o : g.ops) space.push_back(candidates(o, cl));
  std::mt19937_64 rng(5);
  strategy s;
  for (const auto& c : space) s.push_back(c[rng() % c.size()]);
  for (sync_policy policy : {sync_policy::exact, sync_policy::relaxed}) {
    simulator delta(g, cl), full(g, cl);
    delta.set_policy(policy);
    full.set_policy(policy);
    delta.simulate(s);
    for (int step = 0; step < 100; ++step) {
      const std::size_t i = rng() % g.ops.size();
      s[i] = space[i][rng() % space[i].size()];
      ASSERT_EQ(delta.change(i, s[i]), full.simulate(s)) << "step " << step;
    }
  }
}

TEST(search_calibration, the_profile_times_convolutions_relus_and_updates) {
  graph g;
  const std::size_t c = g.add(make::conv2d("conv", 4, 3, 8, 36, 3));  // 6 x 6 maps
  op r = make::relu("relu", 4, 8, 36);
  r.inputs = {c};
  const std::size_t rl = g.add(r);
  op pool = make::max_pool("pool", 4, 8, 3, 2);
  pool.inputs = {rl};
  g.add(pool);
  const cluster cl = preset("2-1-cpu");
  std::vector<std::vector<soap_config>> space;
  for (const op& o : g.ops) space.push_back(candidates(o, cl));
  const soap_config by_channels{1, 1, 2, 0}, reduce{1, 3, 1, 0};
  EXPECT_EQ(conv2d_shard(g.ops[0], by_channels), (std::array<std::size_t, 5>{4, 3, 6, 4, 3}));
  EXPECT_EQ(conv2d_shard(g.ops[0], {2, 1, 1, 0}), (std::array<std::size_t, 5>{2, 3, 6, 8, 3}));
  EXPECT_EQ(conv2d_shard(g.ops[0], reduce), (std::array<std::size_t, 5>{4, 1, 6, 8, 3}));
  flexpar::run_in_process(2, [&](flexpar::communicator& comm) {
    const kernel_profile profile = kernel_profile::measure(comm, g, space, 1);
    const soap_config dp{2, 1, 1, 0};
    EXPECT_GT(profile.seconds(g.ops[0], dp, false), 0);
    EXPECT_GT(profile.seconds(g.ops[0], dp, true), 0);
    EXPECT_GT(profile.seconds(g.ops[0], by_channels, false), 0);
    EXPECT_GT(profile.seconds(g.ops[1], dp, true), 0);   // relu
    EXPECT_LT(profile.seconds(g.ops[2], dp, false), 0);  // max_pool: the FLOP model
    EXPECT_GT(profile.update_seconds(g.ops[0], dp), 0);  // conv's weight shard
    simulator sim(g, cl, profile);
    sim.simulate({dp, dp, dp});
    EXPECT_EQ(sim.times_of(0).forward, cl.kernel_latency + profile.seconds(g.ops[0], dp, false));
    EXPECT_EQ(sim.times_of(0).backward, cl.kernel_latency + profile.seconds(g.ops[0], dp, true));
    EXPECT_EQ(sim.times_of(0).update, cl.kernel_latency + profile.update_seconds(g.ops[0], dp));
  });
}

TEST(search_calibration, measured_cluster_blocks_and_fits_its_link_to_the_boxings) {
  for (int p : {1, 2, 3}) {
    flexpar::run_in_process(p, [](flexpar::communicator& comm) {
      const cluster c = measure_cluster(comm, 32);
      EXPECT_FALSE(c.overlap);
      EXPECT_GE(c.intra.latency, 0);
      EXPECT_GT(c.intra.bandwidth, 0);
      EXPECT_EQ(c.inter.bandwidth, c.intra.bandwidth);
      std::vector<double> mine{c.intra.latency, c.intra.bandwidth}, low = mine;
      flexpar::allreduce(comm, std::span<double>(low), flexpar::reduce_op::min);
      EXPECT_EQ(mine, low);  // every rank holds the same cluster
    });
  }
}

}  // namespace
