// The simulator chooses the gradient synchronization (flexpar/search/simulator.hpp): exact allreduce
// algorithms and BAGUA's communication relaxations, priced by bytes on the wire plus the compressors'
// throughput. Checked against hand-computed costs, the crossover where the choice must flip, the policy
// (exact by default, relaxations only when allowed) and delta == full simulation with relaxations allowed.
#include <gtest/gtest.h>

#include <flexpar/collective.hpp>
#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/search/simulator.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <string>

namespace {

using namespace flexpar::search;
using flexpar::algorithm;

/// A machine with round numbers: gamma = 1 ns/byte, the compressors at 100 / 200 / 50 / 100 MB/s, Adam 40 MB/s.
cluster sync_cluster(int nodes, int per_node, double inter_bandwidth) {
  cluster c;
  c.nodes = nodes;
  c.devices_per_node = per_node;
  c.flops = 1e12;
  c.memory_bandwidth = 1e9;
  c.memory_bytes = 1ull << 40;
  c.kernel_latency = 0;
  c.intra = {1e-4, 1e8};
  c.inter = {1e-3, inter_bandwidth};
  c.compression = {1e8, 2e8, 5e7, 1e8, 4e7};
  return c;
}

constexpr algorithm every_algorithm[] = {algorithm::ring,          algorithm::hierarchical,
                                         algorithm::bytegrad,      algorithm::onebit_adam,
                                         algorithm::decentralized, algorithm::low_precision_decentralized};

TEST(search_sync, names_policies_and_semantics) {
  EXPECT_EQ(name_of(algorithm::bytegrad), "bytegrad");
  EXPECT_EQ(name_of(algorithm::low_precision_decentralized), "low_precision_decentralized");
  EXPECT_EQ(sync_policy_from("relaxed"), sync_policy::relaxed);
  EXPECT_EQ(sync_policy_from("exact"), sync_policy::exact);
  try {
    sync_policy_from("lossy");
    ADD_FAILURE() << "no usage_error";
  } catch (const flexpar::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("no policy 'lossy'; policies: exact compressed relaxed"), std::string::npos);
  }
  EXPECT_FALSE(changes_optimizer(algorithm::ring));
  EXPECT_FALSE(changes_optimizer(algorithm::hierarchical));
  EXPECT_FALSE(changes_optimizer(algorithm::bytegrad));  // same optimizer, quantized average
  EXPECT_TRUE(changes_optimizer(algorithm::onebit_adam));
  EXPECT_TRUE(changes_optimizer(algorithm::decentralized));
  EXPECT_TRUE(changes_optimizer(algorithm::low_precision_decentralized));
  EXPECT_EQ(policy_of(algorithm::bytegrad), sync_policy::compressed);
  // One naming (collective/algorithm.hpp): the simulator's choices parse back from their names.
  for (algorithm a : every_algorithm) EXPECT_EQ(flexpar::algorithm_from(name_of(a)), a) << name_of(a);
  EXPECT_EQ(flexpar::algorithm_from("none"), algorithm::none);
  EXPECT_FALSE(flexpar::algorithm_from("decentralized_shift_one").has_value());
}

TEST(search_sync, hand_computed_costs_of_each_choice) {
  // 4 ranks on 2 nodes (2 each), inter-node link 1e-3 s + 1e6 B/s; M = 65536 bytes = 16384 floats.
  const cluster c = sync_cluster(2, 2, 1e6);
  const sync_group grp{4, 2, 2};
  const double M = 65536, a = 1e-3, b = 1e-6, g = 1e-9;
  const double ai = 1e-4, bi = 1e-8;  // the intra-node link: the hierarchical algorithm's in-node steps
  // ring: 2(p-1) = 6 steps, 2(p-1)/p M = 1.5 M on the wire, (p-1)/p M = 0.75 M reduced
  EXPECT_NEAR(sync_seconds(algorithm::ring, grp, M, c), 6 * a + 1.5 * M * b + 0.75 * M * g, 1e-12);
  // hierarchical: in-node reduce-scatter and allgather through the node's segment (one round each: 2
  // hand-offs each; M/2 packed and reduced, M copied out), a 2-node allreduce of M/2 (ring and
  // halving-doubling cost the same for 2 nodes: 2 steps, M/2 on the wire, M/4 reduced)
  const double hier = 4 * ai + 1.5 * M * bi + 2 * a + 0.5 * M * b + 0.25 * M * g + 0.5 * M * g;
  EXPECT_NEAR(sync_seconds(algorithm::hierarchical, grp, M, c), hier, 1e-12);
  // every relaxation: + 4 M of memory traffic (fuse into a bucket and back)
  // bytegrad: E8 = 16384 + 8 (16384 / 512 + 1) = 16648 bytes; alltoall + allgather: 6 steps, 1.5 E8 wire,
  // M reduced; encode (1 + 1/4) M at 1e8 B/s, decode 2 M at 2e8 B/s
  const double e8 = 16384 + 8.0 * 33;
  const double bytegrad = 6 * a + 1.5 * e8 * b + 5 * M * g + 1.25 * M / 1e8 + 2 * M / 2e8;
  EXPECT_NEAR(sync_seconds(algorithm::bytegrad, grp, M, c), bytegrad, 1e-12);
  // onebit_adam: E1 = 16384 / 8 + 4 (16384 / 2048 + 1) = 2084 bytes; the same pattern, 1-bit rates, and
  // its Adam passes over M at 4e7 B/s
  const double e1 = 2048 + 4.0 * 9;
  const double onebit = 6 * a + 1.5 * e1 * b + 5 * M * g + 1.25 * M / 5e7 + 2 * M / 1e8 + M / 4e7;
  EXPECT_NEAR(sync_seconds(algorithm::onebit_adam, grp, M, c), onebit, 1e-12);
  // decentralized shift_one: one message of M to one peer, one average pass
  EXPECT_NEAR(sync_seconds(algorithm::decentralized, grp, M, c), a + M * b + 5 * M * g, 1e-12);
  // low precision decentralized, p = 4: 2 neighbours: 2 messages of E8, 6 M of local passes, encode M, decode 3 M
  const double lpd = 2 * a + 2 * e8 * b + 10 * M * g + M / 1e8 + 3 * M / 2e8;
  EXPECT_NEAR(sync_seconds(algorithm::low_precision_decentralized, grp, M, c), lpd, 1e-12);
  // p = 2: one neighbour
  const sync_group two{2, 2, 1};
  EXPECT_NEAR(sync_seconds(algorithm::low_precision_decentralized, two, M, c),
              a + e8 * b + 8 * M * g + M / 1e8 + 2 * M / 2e8, 1e-12);
  // one node: the intra-node link; hierarchical does not apply; uneven groups neither
  const sync_group inside{4, 1, 4};
  EXPECT_NEAR(sync_seconds(algorithm::ring, inside, M, c), 6 * ai + 1.5 * M * bi + 0.75 * M * g, 1e-12);
  EXPECT_TRUE(std::isinf(sync_seconds(algorithm::hierarchical, inside, M, c)));
  EXPECT_TRUE(std::isinf(sync_seconds(algorithm::hierarchical, {3, 2, 0}, M, c)));
  // nothing to synchronize on one rank
  for (algorithm x : every_algorithm) EXPECT_EQ(sync_seconds(x, {1, 1, 1}, M, c), 0.0) << name_of(x);
}

/// One linear layer whose 4 * in * out weight bytes are the gradient.
graph one_layer(std::size_t in, std::size_t out) {
  graph g;
  g.add(make::linear("fc", 8, in, out));
  return g;
}

TEST(search_sync, ring_to_bytegrad_flips_at_the_hand_computed_bandwidth) {
  // 2 nodes of 1 device, data parallel: ring = 2a + M b + M/2 g; bytegrad = 2a + E8 b + 5 M g + 1.5 M/enc + 2 M/dec.
  // They are equal at b* = (4.5 M g + 1.5 M/enc + 2 M/dec) / (M - E8).
  const graph g = one_layer(256, 256);
  const double M = 4.0 * 256 * 256, n = M / 4, e8 = n + 8 * (n / 512 + 1);
  const double b_star = (4.5 * M * 1e-9 + 1.5 * M / 1e8 + 2 * M / 2e8) / (M - e8);
  for (double f : {0.8, 0.95, 1.05, 1.25}) {
    const double bandwidth = f / b_star;  // f > 1: a faster link than the crossover -> ring
    for (sync_policy p : {sync_policy::exact, sync_policy::compressed}) {
      simulator sim(g, sync_cluster(2, 1, bandwidth));
      sim.set_policy(p);
      sim.simulate({{2, 1, 1, 0}});
      const algorithm want = p == sync_policy::exact || f > 1 ? algorithm::ring : algorithm::bytegrad;
      EXPECT_EQ(sim.times_of(0).algorithm, want) << "bandwidth x" << f << ", policy " << name_of(p);
      const cluster cl = sync_cluster(2, 1, bandwidth);
      EXPECT_EQ(sim.times_of(0).gradient_allreduce, sync_seconds(want, {2, 2, 1}, M, cl));
    }
  }
}

TEST(search_sync, the_choice_is_the_cheapest_the_policy_allows) {
  const graph g = one_layer(512, 512);
  const double M = 4.0 * 512 * 512;
  for (double bandwidth : {1e5, 1e6, 1e7, 1e8, 1e9, 1e11}) {
    const cluster cl = sync_cluster(2, 2, bandwidth);
    for (sync_policy p : {sync_policy::exact, sync_policy::compressed, sync_policy::relaxed}) {
      algorithm best = algorithm::none;
      double best_seconds = std::numeric_limits<double>::infinity();
      for (algorithm a : every_algorithm)
        if (policy_of(a) <= p && sync_seconds(a, {4, 2, 2}, M, cl) < best_seconds) {
          best = a;
          best_seconds = sync_seconds(a, {4, 2, 2}, M, cl);
        }
      simulator sim(g, cl);
      sim.set_policy(p);
      sim.simulate({{4, 1, 1, 0}});
      EXPECT_EQ(sim.times_of(0).algorithm, best) << bandwidth << " " << name_of(p);
      EXPECT_EQ(sim.times_of(0).gradient_allreduce, best_seconds);
      EXPECT_LE(policy_of(sim.times_of(0).algorithm), p);
    }
  }
  // the extremes: a fast, low-latency link keeps the exact allreduce even when relaxations are allowed (with
  // a 1 ms latency, decentralized shift_one's single message would beat the ring's 6); a slow one takes a
  // compressed relaxation
  cluster quick = sync_cluster(2, 2, 1e11);
  quick.inter.latency = 1e-6;
  simulator fast(g, quick), slow(g, sync_cluster(2, 2, 1e5));
  fast.set_policy(sync_policy::relaxed);
  slow.set_policy(sync_policy::relaxed);
  fast.simulate({{4, 1, 1, 0}});
  slow.simulate({{4, 1, 1, 0}});
  EXPECT_EQ(policy_of(fast.times_of(0).algorithm), sync_policy::exact) << name_of(fast.times_of(0).algorithm);
  EXPECT_NE(policy_of(slow.times_of(0).algorithm), sync_policy::exact) << name_of(slow.times_of(0).algorithm);
}

TEST(search_sync, exact_is_the_default_and_policies_never_slow_a_step) {
  const cluster cl = preset("16-4-slow-inter");
  const graph g = reference::cnn(256);
  simulator plain(g, cl), exact(g, cl), loose(g, cl);
  EXPECT_EQ(plain.policy(), sync_policy::exact);
  exact.set_policy(sync_policy::exact);
  loose.set_policy(sync_policy::relaxed);
  const strategy dp = data_parallel(g, cl);
  const double t = plain.simulate(dp);
  EXPECT_EQ(exact.simulate(dp), t);
  EXPECT_LE(loose.simulate(dp), t);
  for (std::size_t i = 0; i < g.ops.size(); ++i)
    EXPECT_EQ(policy_of(plain.times_of(i).algorithm), sync_policy::exact) << g.ops[i].name;
  // a new policy needs a fresh simulate() before change()
  loose.set_policy(sync_policy::compressed);
  EXPECT_THROW(loose.change(0, dp[0]), flexpar::usage_error);
}

TEST(search_sync, delta_equals_full_with_relaxations_allowed) {
  for (const char* machine : {"16-4-slow-inter", "64-8"}) {
    cluster cl = preset(machine);
    cl.inter.bandwidth = 125e6;  // 1 Gbit/s between nodes: the relaxations win somewhere
    for (const graph& g :
         {reference::cnn(256), reference::mlp(64, {256, 1024, 1024, 256}), reference::transformer(2, 16, 64, 256)}) {
      std::mt19937_64 rng(11);
      std::vector<std::vector<soap_config>> space;
      for (const op& o : g.ops) space.push_back(candidates(o, cl));
      strategy s;
      for (const auto& c : space) s.push_back(c[rng() % c.size()]);
      for (sync_policy p : {sync_policy::compressed, sync_policy::relaxed}) {
        simulator delta(g, cl), full(g, cl);
        delta.set_policy(p);
        full.set_policy(p);
        delta.simulate(s);
        std::size_t relaxed_seen = 0;
        for (int step = 0; step < 100; ++step) {
          const std::size_t i = rng() % g.ops.size();
          s[i] = space[i][rng() % space[i].size()];
          const double t = delta.change(i, s[i]);
          ASSERT_EQ(t, full.simulate(s)) << g.name << " on " << machine << ", step " << step;
          for (std::size_t k = 0; k < g.ops.size(); ++k) {
            ASSERT_EQ(delta.times_of(k).algorithm, full.times_of(k).algorithm);
            if (policy_of(full.times_of(k).algorithm) != sync_policy::exact) ++relaxed_seen;
          }
        }
        EXPECT_GT(relaxed_seen, 0u) << g.name << " on " << machine << ": the test never exercised a relaxation";
      }
    }
  }
}

TEST(search_sync, compression_rates_are_measured_and_kept_in_the_cluster) {
  const compression_rates r = measure_compression(1 << 16);
  EXPECT_GT(r.minmax_encode, 1e6);
  EXPECT_GT(r.minmax_decode, 1e6);
  EXPECT_GT(r.onebit_encode, 1e6);
  EXPECT_GT(r.onebit_decode, 1e6);
  EXPECT_GT(r.adam_update, 1e6);
  cluster c = preset("2-1-cpu");
  c.compression = {1.5e9, 2.5e9, 3.5e9, 4.5e9, 5.5e9};
  const cluster back = cluster_from_json(to_json(c));
  EXPECT_EQ(back.compression.minmax_encode, 1.5e9);
  EXPECT_EQ(back.compression.minmax_decode, 2.5e9);
  EXPECT_EQ(back.compression.onebit_encode, 3.5e9);
  EXPECT_EQ(back.compression.onebit_decode, 4.5e9);
  EXPECT_EQ(back.compression.adam_update, 5.5e9);
  try {
    cluster_from_json(R"({"compression": {"onebit_decode": 0}})");
    ADD_FAILURE() << "no usage_error";
  } catch (const flexpar::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("compression.onebit_decode must be > 0"), std::string::npos);
  }
  for (int p : {1, 3}) {  // measure_cluster keeps the slowest rank's rates, the same on every rank
    flexpar::run_in_process(p, [](flexpar::communicator& comm) {
      const cluster m = measure_cluster(comm, 32);
      EXPECT_GT(m.compression.minmax_encode, 1e6);
      std::vector<double> mine{m.compression.minmax_encode, m.compression.onebit_decode}, low = mine;
      flexpar::allreduce(comm, std::span<double>(low), flexpar::reduce_op::min);
      EXPECT_EQ(mine, low);
    });
  }
}

}  // namespace
