// Scenarios of the sharded data parallelism tests, written against a communicator so that the
// in-process tests (threads as ranks) and the mpiexec tests run the same code.
//
// The oracle is a serial data-parallel computation of the same logical result: the full weights, the
// sum over every rank's gradients (values that are small multiples of 1/8, so any order of the sum is
// exact), scaled by the same float, and the same optimizer rule applied to the full vector. The rules
// are elementwise, so sharding changes nothing: every gathered weight, every parameter after every
// step and the gathered optimizer state must equal the oracle's exactly (EXPECT_EQ on floats).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/zero/sharded_data_parallel.hpp>

namespace flexpar::testing_support {

/// Parameter sizes: uneven, a single value, an empty one, one larger than the small buckets.
inline const std::vector<std::size_t>& zero_sizes() {
  static const std::vector<std::size_t> sizes{7, 1, 13, 0, 5, 33, 2, 9};
  return sizes;
}

inline std::string zero_name(std::size_t i) { return "layer" + std::to_string(i / 2) + (i % 2 ? ".bias" : ".weight"); }

/// Initial weight j of parameter i (the same on every rank).
inline float zero_init(std::size_t i, std::size_t j) {
  return static_cast<float>(static_cast<int>((i * 7 + j * 3) % 11) - 5) * 0.125f;
}

/// Rank r's gradient value j of parameter i at step t, pass s: a multiple of 1/8 in [-1, 1].
inline float zero_grad(int r, int t, int s, std::size_t i, std::size_t j) {
  const auto v = static_cast<int>((static_cast<std::size_t>(r + 1) * (j + 3) + static_cast<std::size_t>(t) * (i + 1) +
                                   static_cast<std::size_t>(s) * 5) %
                                  17);
  return static_cast<float>(v - 8) * 0.125f;
}

/// The optimizers the scenarios run, built twice (one for the sharded model, one for the oracle).
inline std::unique_ptr<relax::optimizer> zero_optimizer(bool use_adam) {
  if (use_adam) return std::make_unique<relax::adam>(relax::adam_options{.learning_rate = 0.01f});
  return std::make_unique<relax::sgd>(relax::sgd_options{.learning_rate = 0.25f, .momentum = 0.5f});
}

/// The serial data-parallel run: one flat parameter per registered one, the sum over ranks.
struct zero_oracle {
  std::vector<std::vector<float>> w;
  std::unique_ptr<relax::optimizer> opt;
  explicit zero_oracle(bool use_adam) : opt(zero_optimizer(use_adam)) {
    for (std::size_t i = 0; i < zero_sizes().size(); ++i) {
      w.emplace_back(zero_sizes()[i]);
      for (std::size_t j = 0; j < w[i].size(); ++j) w[i][j] = zero_init(i, j);
    }
  }
  void step(int ranks, int t, int passes, bool average, const std::vector<bool>& skipped) {
    const float scale = average ? 1.0f / static_cast<float>(ranks * passes) : 1.0f;
    for (std::size_t i = 0; i < w.size(); ++i) {
      std::vector<float> g(w[i].size(), 0.0f);
      for (int s = 0; s < passes; ++s) {
        if (skipped[i]) continue;
        std::vector<float> pass(w[i].size(), 0.0f);
        for (int r = 0; r < ranks; ++r)
          for (std::size_t j = 0; j < g.size(); ++j) pass[j] += zero_grad(r, t, s, i, j);
        for (std::size_t j = 0; j < g.size(); ++j) g[j] += pass[j];
      }
      for (float& x : g) x *= scale;
      opt->apply(i, w[i], g);
    }
  }
};

struct zero_case {
  zero::options options;
  bool adam = false;
  int steps = 3;
  /// Every third parameter's gradient is never asked for (an unused parameter: step() reduces zeros).
  bool skip_some = false;
};

/// Runs `c` on a placement of `mesh` over comm and compares with the oracle after every gather and
/// every step. The optimizer's index is the bucket's, so the oracle (one index per parameter) runs
/// Adam with per-parameter step counts that equal the per-bucket ones (one apply per step).
template <std::size_t N>
void zero_matches_data_parallel(communicator& comm, std::array<int, N> mesh_shape, const zero_case& c) {
  sbp::placement<N> mesh(comm, mesh_shape);
  zero::sharded_data_parallel<N> model(mesh, c.options);
  const auto& sizes = zero_sizes();
  for (std::size_t i = 0; i < sizes.size(); ++i)
    model.add(zero_name(i), sizes[i], [i](std::size_t first, std::span<float> values) {
      for (std::size_t j = 0; j < values.size(); ++j) values[j] = zero_init(i, first + j);
    });
  model.start();
  zero_oracle oracle(c.adam);
  auto opt = zero_optimizer(c.adam);
  std::vector<bool> skipped(sizes.size(), false);
  if (c.skip_some)
    for (std::size_t i = 0; i < sizes.size(); i += 3) skipped[i] = true;
  const int passes = c.options.backward_passes_per_step;
  for (int t = 0; t < c.steps; ++t) {
    for (int s = 0; s < passes; ++s) {
      // forward: views of two parameters alive at once (a layer's weight and bias), in order
      for (std::size_t i = 0; i < sizes.size(); i += 2) {
        auto w = model.gather(zero_name(i));
        ASSERT_TRUE(std::equal(w.values().begin(), w.values().end(), oracle.w[i].begin(), oracle.w[i].end()))
            << "forward gather of " << zero_name(i) << " at step " << t << " pass " << s;
        if (i + 1 < sizes.size()) {
          auto b = model.gather(zero_name(i + 1));
          ASSERT_TRUE(std::equal(b.values().begin(), b.values().end(), oracle.w[i + 1].begin(), oracle.w[i + 1].end()))
              << "forward gather of " << zero_name(i + 1) << " at step " << t;
        }
      }
      // backward: reverse order, weights gathered again, gradients marked ready as produced
      for (std::size_t i = sizes.size(); i-- > 0;) {
        if (i % 2 == 0) {
          auto w = model.gather(zero_name(i));
          ASSERT_TRUE(std::equal(w.values().begin(), w.values().end(), oracle.w[i].begin(), oracle.w[i].end()))
              << "backward gather of " << zero_name(i) << " at step " << t;
        }
        if (skipped[i]) continue;
        std::span<float> g = model.gradient(zero_name(i));
        ASSERT_EQ(g.size(), sizes[i]);
        for (std::size_t j = 0; j < g.size(); ++j) g[j] = zero_grad(comm.rank(), t, s, i, j);
        model.gradient_ready(zero_name(i));
      }
      EXPECT_EQ(model.step(*opt), s + 1 == passes) << "pass " << s;
    }
    oracle.step(comm.size(), t, passes, c.options.average, skipped);
  }
  // stage 1 reduces once per step (its passes add up in its full gradients), 2 and 3 once per pass
  const std::uint64_t reductions =
      model.buckets() * static_cast<std::size_t>(c.steps) * static_cast<std::size_t>(c.options.stage == 1 ? 1 : passes);
  EXPECT_EQ(model.traffic().reduce_scatters, reductions);
  const auto full = model.full_parameters();
  ASSERT_EQ(full.size(), sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(full[i].first, zero_name(i));
    EXPECT_EQ(full[i].second, oracle.w[i]) << zero_name(i) << " after " << c.steps << " steps";
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    // the bucket's state as the oracle's per-parameter state (the same floats, sliced)
    const auto sharded = model.full_optimizer_state(*opt, zero_name(i));
    const auto mine = oracle.opt->state(i, sizes[i]);
    std::size_t floats = 0;
    for (const auto& s : mine)
      if (s.counters.empty()) {
        ASSERT_LT(floats, sharded.size());
        EXPECT_EQ(sharded[floats].first, s.name);
        EXPECT_TRUE(
            std::equal(s.floats.begin(), s.floats.end(), sharded[floats].second.begin(), sharded[floats].second.end()))
            << s.name << " of " << zero_name(i);
        ++floats;
      }
    EXPECT_EQ(floats, sharded.size());
  }
}

/// The quantized forms (ZeRO++ qwZ, qgZ) against the exact oracle, with plain SGD: gathered weights
/// within min-max's bound of the oracle's (range / 510 per chunk, ranges at most the weights' spread),
/// master weights equal to the oracle's with qwZ alone (the gradients do not depend on the weights
/// here) and within lr * 2 / 510 per step with qgZ (each rank's gradient part is off by at most its
/// range, at most 2, / 510; the average of p such errors too).
template <std::size_t N>
void zero_quantized_within_bounds(communicator& comm, std::array<int, N> mesh_shape, int stage, bool weights,
                                  bool gradients) {
  sbp::placement<N> mesh(comm, mesh_shape);
  const zero::options o{.stage = stage,
                        .bucket_bytes = 144,
                        .prefetch = 1,
                        .quantize_weights = weights,
                        .quantize_gradients = gradients,
                        .quantization_chunk = 5};
  zero::sharded_data_parallel<N> model(mesh, o);
  const auto& sizes = zero_sizes();
  for (std::size_t i = 0; i < sizes.size(); ++i)
    model.add(zero_name(i), sizes[i], [i](std::size_t first, std::span<float> values) {
      for (std::size_t j = 0; j < values.size(); ++j) values[j] = zero_init(i, first + j);
    });
  model.start();
  relax::sgd opt({.learning_rate = 0.25f});
  zero_oracle oracle(false);
  oracle.opt = std::make_unique<relax::sgd>(relax::sgd_options{.learning_rate = 0.25f});
  const std::vector<bool> none(sizes.size(), false);
  const float per_step = gradients ? 0.25f * 2.0f / 510.0f * 1.01f + 1e-6f : 0.0f;
  bool gathered_differ = false, masters_differ = false;  // the quantization is seen (not only bounded)
  for (int t = 0; t < 3; ++t) {
    float lo = 0, hi = 0;
    for (const auto& w : oracle.w)
      for (float x : w) lo = std::min(lo, x), hi = std::max(hi, x);
    const float drift = per_step * static_cast<float>(t);
    const float bound = (weights ? (hi - lo + 2 * drift) / 510.0f * 1.01f + 1e-6f : 0.0f) + drift;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto w = model.gather(zero_name(i));
      for (std::size_t j = 0; j < sizes[i]; ++j) {
        ASSERT_LE(std::abs(w.values()[j] - oracle.w[i][j]), bound) << zero_name(i) << "[" << j << "] step " << t;
        gathered_differ = gathered_differ || w.values()[j] != oracle.w[i][j];
      }
    }
    for (std::size_t i = sizes.size(); i-- > 0;) {
      std::span<float> g = model.gradient(zero_name(i));
      for (std::size_t j = 0; j < g.size(); ++j) g[j] = zero_grad(comm.rank(), t, 0, i, j);
      model.gradient_ready(zero_name(i));
    }
    model.step(opt);
    oracle.step(comm.size(), t, 1, true, none);
    const auto full = model.full_parameters();
    for (std::size_t i = 0; i < sizes.size(); ++i)
      for (std::size_t j = 0; j < sizes[i]; ++j) {
        ASSERT_LE(std::abs(full[i].second[j] - oracle.w[i][j]), per_step * static_cast<float>(t + 1))
            << "master " << zero_name(i) << "[" << j << "] after step " << t;
        masters_differ = masters_differ || full[i].second[j] != oracle.w[i][j];
      }
  }
  EXPECT_EQ(gathered_differ, weights || (gradients && masters_differ)) << "qwZ leaves gathered weights exact";
  EXPECT_EQ(masters_differ, gradients) << "qgZ leaves the reduced gradients exact";
}

/// With chunks of 512 values a quantized step sends about a quarter of the exact one's bytes (and
/// the 8 bytes of each chunk's min and max): below 0.3 of them, for a gather and a reduction.
inline void zero_quantized_traffic(communicator& comm) {
  sbp::placement<1> mesh(comm, {comm.size()});
  double bytes[2] = {0, 0};
  for (bool quantized : {false, true}) {
    zero::sharded_data_parallel<1> model(mesh, {.stage = 3,
                                                .bucket_bytes = std::size_t{1} << 20,
                                                .quantize_weights = quantized,
                                                .quantize_gradients = quantized,
                                                .quantization_chunk = 512});
    model.add("w", 40000, [](std::size_t first, std::span<float> v) {
      for (std::size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>((first + j) % 13);
    });
    model.start();
    { auto w = model.gather("w"); }
    for (float& g : model.gradient("w")) g = 1.0f;
    model.gradient_ready("w");
    relax::sgd opt;
    model.step(opt);
    bytes[quantized ? 1 : 0] = static_cast<double>(model.traffic().wire_bytes);
  }
  if (comm.size() == 1) return;
  EXPECT_GT(bytes[1], 0.2 * bytes[0]);
  EXPECT_LT(bytes[1], 0.3 * bytes[0]);
}

/// Memory by the library's accounting after a step: shards only where the stage shards them.
inline void zero_memory_accounting(communicator& comm, int stage) {
  sbp::placement<1> mesh(comm, {comm.size()});
  // on the calling thread, so that what is held at once does not depend on the thread's timing
  zero::sharded_data_parallel<1> model(mesh, {.stage = stage, .bucket_bytes = 64 * sizeof(float), .overlap = false});
  const std::size_t n = 60;  // four parameters of 60: four buckets of 60
  const std::array<std::string, 4> names{"p0", "p1", "p2", "p3"};
  for (int i = 0; i < 4; ++i)
    model.add(names[static_cast<std::size_t>(i)], n,
              [](std::size_t, std::span<float> v) { std::fill(v.begin(), v.end(), 1.0f); });
  model.start();
  ASSERT_EQ(model.buckets(), 4u);
  relax::adam opt;
  for (int i = 0; i < 4; ++i) {
    auto w = model.gather(names[static_cast<std::size_t>(i)]);
  }
  for (int i = 4; i-- > 0;) {
    auto g = model.gradient(names[static_cast<std::size_t>(i)]);
    std::fill(g.begin(), g.end(), 1.0f);
    model.gradient_ready(names[static_cast<std::size_t>(i)]);
  }
  ASSERT_TRUE(model.step(opt));
  const zero::memory_report m = model.memory();
  std::size_t shard = 0;  // this rank's shard of the four buckets, in bytes
  for (int b = 0; b < 4; ++b) shard += sbp::balanced_part(n, comm.size(), comm.rank()).count * sizeof(float);
  const std::size_t full = 4 * n * sizeof(float);
  EXPECT_EQ(m.data_parallel_bytes, 2 * full + 2 * full + 4 * sizeof(std::int64_t));  // w, g, Adam m and v, t
  EXPECT_EQ(m.optimizer_bytes, 2 * shard + 4 * sizeof(std::int64_t));
  if (stage == 3) {
    EXPECT_EQ(m.parameter_bytes, shard);  // the full buckets are freed at step()
    EXPECT_LE(m.peak_parameter_bytes, shard + 3 * n * sizeof(float))
        << "more than the used, the viewed and one prefetched bucket were held at once";
  } else {
    EXPECT_GE(m.parameter_bytes, shard + full);  // full parameters kept (the next gathers may be in flight)
  }
  if (stage == 1) {
    EXPECT_EQ(m.gradient_bytes, shard + full);  // full gradients kept for the step
  } else {
    EXPECT_EQ(m.gradient_bytes, shard);
    EXPECT_LE(m.peak_gradient_bytes, shard + 2 * n * sizeof(float));
  }
}

/// Stage 3's prefetch, seen in the traffic counters (a gather is counted when it starts): in the second
/// step, asking for bucket 0 starts its gather and the next `prefetch` ones of the first step's order;
/// asking for bucket b > 0 then starts only the one that enters the window (b + prefetch), none past
/// the last. Without prefetch each bucket starts when asked for. Parameters of 8, 4, 4, 8 and 8 f32
/// in buckets of 8: {p0}, {p1, p2}, {p3}, {p4} (bucket_members); settings() are the options given.
inline void zero_prefetch_and_introspection(communicator& comm) {
  sbp::placement<1> mesh(comm, {comm.size()});
  const std::array<std::size_t, 5> sizes{8, 4, 4, 8, 8};
  const std::vector<std::vector<std::string>> members{{"p0"}, {"p1", "p2"}, {"p3"}, {"p4"}};
  for (int prefetch : {0, 1, 2}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    const zero::options o{.stage = 3, .bucket_bytes = 8 * sizeof(float), .overlap = true, .prefetch = prefetch};
    zero::sharded_data_parallel<1> model(mesh, o);
    for (std::size_t i = 0; i < sizes.size(); ++i)
      model.add("p" + std::to_string(i), sizes[i], [i](std::size_t first, std::span<float> v) {
        for (std::size_t j = 0; j < v.size(); ++j) v[j] = float(i * 100 + first + j);
      });
    model.start();
    EXPECT_EQ(model.settings().prefetch, prefetch);
    EXPECT_EQ(model.settings().bucket_bytes, o.bucket_bytes);
    EXPECT_EQ(model.settings().stage, 3);
    ASSERT_EQ(model.buckets(), members.size());
    for (std::size_t b = 0; b < members.size(); ++b) EXPECT_EQ(model.bucket_members(b), members[b]) << "bucket " << b;
    relax::sgd opt({.learning_rate = 0.0f});  // the weights stay: each gather gives the initial values
    for (int step = 0; step < 2; ++step) {
      for (std::size_t b = 0; b < members.size(); ++b) {
        const std::uint64_t before = model.traffic().gathers;
        {
          const std::string& name = members[b][0];
          auto w = model.gather(name);
          const std::size_t i = static_cast<std::size_t>(std::stoi(name.substr(1)));
          ASSERT_EQ(w.values().size(), sizes[i]);
          for (std::size_t j = 0; j < sizes[i]; ++j) ASSERT_EQ(w.values()[j], float(i * 100 + j)) << name;
        }
        const std::uint64_t started = model.traffic().gathers - before;
        const std::size_t last = members.size() - 1;
        std::uint64_t expected = 1;  // the first step: no order to prefetch along
        if (step == 1 && prefetch > 0)
          expected = b == 0 ? 1 + std::min<std::size_t>(last, static_cast<std::size_t>(prefetch))
                            : (b + static_cast<std::size_t>(prefetch) <= last ? 1 : 0);
        EXPECT_EQ(started, expected) << "gathers started by asking for bucket " << b << " in step " << step;
      }
      for (std::size_t i = sizes.size(); i-- > 0;) {
        const std::string name = "p" + std::to_string(i);
        auto g = model.gradient(name);
        std::fill(g.begin(), g.end(), 0.0f);
        model.gradient_ready(name);
      }
      ASSERT_TRUE(model.step(opt));
    }
    EXPECT_EQ(model.traffic().steps, 2u);
    EXPECT_EQ(model.traffic().gathers, 8u);  // every bucket once per step, prefetched or not
  }
}

/// A model destroyed right after step(), while the gathers step() started may still be queued on its
/// thread: every rank must run them all (a rank that dropped the ones it had not started left its
/// peers in a gather it never joined). Many times, each followed by a collective on the model's
/// communicator's parent: a hang is a deadline's error.
inline void zero_destroyed_with_gathers_queued(communicator& comm) {
  for (int round = 0; round < 20; ++round) {
    sbp::placement<1> mesh(comm, {comm.size()});
    zero::sharded_data_parallel<1> model(mesh, {.stage = 1 + round % 2, .bucket_bytes = 256 * sizeof(float)});
    for (const char* name : {"a", "b", "c", "d", "e"})
      model.add(name, 250, [](std::size_t, std::span<float> v) { std::fill(v.begin(), v.end(), 1.0f); });
    model.start();
    relax::sgd opt;
    ASSERT_TRUE(model.step(opt));
  }
  std::vector<int> one{1};
  allreduce(comm, std::span<int>(one), reduce_op::sum);
  EXPECT_EQ(one[0], comm.size());
}

}  // namespace flexpar::testing_support
