// gradient_sync scenarios shared by the in-process and mpiexec tests.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <string>
#include <vector>

#include <flexpar/engine/gradient_sync.hpp>

namespace flexpar::testing_support {

/// Two passes of local accumulation, one parameter never marked ready, average or sum, fp16 or not:
/// the result equals the serial computation exactly (small integers and binary fractions).
inline void gradient_sync_steps(communicator& comm, const config& cfg, gradient_reduction reduction,
                                wire_compression compression) {
  engine eng(comm, cfg);
  gradient_sync sync(eng, {.reduction = reduction, .compression = compression, .backward_passes_per_step = 2});
  const int p = comm.size(), me = comm.rank();
  std::vector<float> w1(100, static_cast<float>(me)), g1(100), w2(7, static_cast<float>(me)), g2(7), w3(3), g3(3);
  sync.register_parameter("fc1.weight", std::span(w1), std::span(g1));
  sync.register_parameter("fc1.bias", std::span(w2), std::span(g2));
  sync.register_parameter("unused", std::span(w3), std::span(g3));
  EXPECT_THROW(sync.register_parameter("fc1.bias", std::span(w2), std::span(g2)), usage_error);
  EXPECT_THROW(sync.on_gradient_ready("nope"), usage_error);

  sync.broadcast_parameters(p - 1);
  EXPECT_EQ(w1, std::vector<float>(100, static_cast<float>(p - 1)));
  EXPECT_EQ(w2, std::vector<float>(7, static_cast<float>(p - 1)));

  for (int step = 0; step < 3; ++step) {
    std::fill(g1.begin(), g1.end(), 0.0f);
    std::fill(g2.begin(), g2.end(), 0.0f);
    std::fill(g3.begin(), g3.end(), static_cast<float>(me));
    for (int pass = 0; pass < 2; ++pass) {
      // "backward": bias first (readiness order differs from registration order), accumulate.
      for (auto& g : g2) g += static_cast<float>((me + 1) * (pass + 1));
      sync.on_gradient_ready("fc1.bias");
      for (std::size_t i = 0; i < g1.size(); ++i)
        g1[i] += static_cast<float>((me + 1) * (pass + 1) + static_cast<int>(i % 3));
      sync.on_gradient_ready("fc1.weight");
      const bool stepped = sync.synchronize();
      ASSERT_EQ(stepped, pass == 1) << "pass " << pass;
    }
    // Serial reference: sum over ranks of the two passes.
    const double ranks_sum = p * (p + 1) / 2.0;
    const double divide = reduction == gradient_reduction::average ? 2.0 * p : 1.0;
    for (std::size_t i = 0; i < g1.size(); ++i)
      ASSERT_EQ(g1[i], static_cast<float>((3 * ranks_sum + 2.0 * p * static_cast<double>(i % 3)) / divide)) << i;
    for (float g : g2) ASSERT_EQ(g, static_cast<float>(3 * ranks_sum / divide));
    for (float g : g3) ASSERT_EQ(g, static_cast<float>((p * (p - 1) / 2.0) / divide));
  }
}

/// fp16 on the wire must change the result where half precision rounds: rank r's gradient is
/// k + d with k = r + 1 + (i mod 4) / 4 (exact in half, and so are the sums of k over the ranks) and
/// d = +-2^-12 (the same sign on every rank, so that the d do not cancel in the sum), which f32 keeps
/// and half drops (it is below half the spacing of half at 1 and above).
/// With fp16 the sum is exactly the sum of the k (rounded away on every rank, whatever the order);
/// without it, exactly the sum of k + d. A sync that ignored the option (or always compressed) fails.
inline void gradient_sync_fp16_rounds(communicator& comm, const config& cfg) {
  const int p = comm.size(), me = comm.rank();
  const float d = 0x1p-12f;
  auto k = [](int r, std::size_t i) { return static_cast<float>(r + 1) + static_cast<float>(i % 4) / 4; };
  auto tiny = [d](int, std::size_t i) { return i % 2 == 0 ? d : -d; };  // one sign per element: no cancelling
  for (auto compression : {wire_compression::none, wire_compression::fp16}) {
    engine eng(comm, cfg);
    gradient_sync sync(eng, {.reduction = gradient_reduction::sum, .compression = compression});
    std::vector<float> w(37, 0.0f), g(w.size());
    sync.register_parameter("w", std::span(w), std::span(g));
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = k(me, i) + tiny(me, i);
    sync.on_gradient_ready("w");
    ASSERT_TRUE(sync.synchronize());
    for (std::size_t i = 0; i < g.size(); ++i) {
      float want = 0.0f;
      for (int r = 0; r < p; ++r) want += compression == wire_compression::fp16 ? k(r, i) : k(r, i) + tiny(r, i);
      ASSERT_EQ(g[i], want) << "[rank " << me << " of " << p << "] "
                            << (compression == wire_compression::fp16 ? "fp16" : "no compression") << ", element " << i;
    }
  }
}

/// Parameters of a small model (odd sizes, one larger than the test's buckets), their registration
/// order, and rank r's gradient of element i of parameter k in step s: small integers, exact in any sum.
inline const std::vector<std::size_t>& arena_model() {
  static const std::vector<std::size_t> counts{100, 7, 3, 1000, 1, 2049, 64};
  return counts;
}
inline float arena_gradient(int rank, int step, std::size_t k, std::size_t i) {
  return static_cast<float>((rank + 1) * ((static_cast<std::size_t>(step) + 2 * k + i) % 6 + 1));
}

/// One sync over `counts`, its gradients in the arena or in buffers of the caller's, stepped `steps`
/// times (two backward passes each, the last parameter never marked ready); returns every gradient
/// after the last step.
inline std::vector<std::vector<float>> run_gradient_sync(communicator& comm, engine& eng,
                                                         const std::vector<std::size_t>& counts, bool in_arena,
                                                         gradient_sync_options options, int steps) {
  gradient_sync sync(eng, options);
  const int me = comm.rank();
  std::vector<std::vector<float>> weights, own;
  std::vector<std::string> names;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    weights.emplace_back(counts[k], 0.0f);
    own.emplace_back(counts[k], 0.0f);
    names.push_back("p" + std::to_string(k));
    if (in_arena)
      sync.register_parameter(names.back(), std::span(weights.back()));
    else
      sync.register_parameter(names.back(), std::span(weights.back()), std::span(own.back()));
  }
  std::vector<std::span<float>> grads;
  for (std::size_t k = 0; k < counts.size(); ++k)
    grads.push_back(in_arena ? sync.gradient<float>(names[k]) : std::span<float>(own[k]));
  for (int step = 0; step < steps; ++step) {
    for (auto& g : grads) std::fill(g.begin(), g.end(), 0.0f);
    for (int pass = 0; pass < options.backward_passes_per_step; ++pass) {
      for (std::size_t k = counts.size(); k-- > 0;) {  // the backward pass: last parameter first
        for (std::size_t i = 0; i < counts[k]; ++i) grads[k][i] += arena_gradient(me, step, k, i);
        if (k + 1 != counts.size()) sync.on_gradient_ready(names[k]);
      }
      EXPECT_EQ(sync.synchronize(), pass + 1 == options.backward_passes_per_step);
    }
  }
  std::vector<std::vector<float>> out;
  for (const auto& g : grads) out.emplace_back(g.begin(), g.end());
  return out;
}

/// The arena's gradients (back to back, in the reverse of their registration order, reduced by bucket
/// in place) and the caller's own buffers give the same gradients, bit for bit, and the serial
/// oracle's: averaged or summed over two accumulated passes, with fp16 on the wire or without.
inline void arena_and_own_buffers_agree(communicator& comm, const config& cfg) {
  engine eng(comm, cfg);
  const int p = comm.size(), steps = 5;
  const std::vector<std::size_t>& counts = arena_model();
  for (auto reduction : {gradient_reduction::average, gradient_reduction::sum})
    for (auto compression : {wire_compression::none, wire_compression::fp16}) {
      const gradient_sync_options options{
          .reduction = reduction, .compression = compression, .backward_passes_per_step = 2, .bucket_bytes = 2048};
      const auto own = run_gradient_sync(comm, eng, counts, false, options, steps);
      const auto arena = run_gradient_sync(comm, eng, counts, true, options, steps);
      const double divide = reduction == gradient_reduction::average ? 2.0 * p : 1.0;
      for (std::size_t k = 0; k < counts.size(); ++k)
        for (std::size_t i = 0; i < counts[k]; ++i) {
          double sum = 0;
          for (int r = 0; r < p; ++r) sum += 2.0 * arena_gradient(r, steps - 1, k, i);
          ASSERT_EQ(own[k][i], static_cast<float>(sum / divide)) << "own buffers, parameter " << k << " element " << i;
          ASSERT_EQ(std::bit_cast<std::uint32_t>(arena[k][i]), std::bit_cast<std::uint32_t>(own[k][i]))
              << "parameter " << k << " element " << i;
        }
    }
  // the layout: one block, the last registered first, back to back
  gradient_sync sync(eng, {.bucket_bytes = 2048});
  std::vector<std::vector<float>> weights;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    weights.emplace_back(counts[k]);
    sync.register_parameter("q" + std::to_string(k), std::span(weights.back()));
  }
  for (std::size_t k = 0; k + 1 < counts.size(); ++k) {
    const std::span<float> g = sync.gradient<float>("q" + std::to_string(k + 1));
    EXPECT_EQ(g.data() + g.size(), sync.gradient<float>("q" + std::to_string(k)).data()) << k;
  }
  EXPECT_THROW((void)sync.gradient<double>("q0"), usage_error);
}

/// A frozen parameter is not reduced (its gradient keeps this rank's value) while the others are
/// exact; freezing during a step, or registering then, is a usage_error; unfrozen, it is reduced
/// again; a parameter registered between steps is reduced from the next step on.
inline void frozen_and_added_parameters(communicator& comm, const config& cfg, bool in_arena) {
  engine eng(comm, cfg);
  gradient_sync sync(eng, {.reduction = gradient_reduction::sum, .bucket_bytes = 2048});
  const int p = comm.size(), me = comm.rank();
  std::vector<std::size_t> counts = arena_model();
  std::vector<std::vector<float>> weights(counts.size() + 1), own(counts.size() + 1);
  std::vector<std::span<float>> grads;
  auto add = [&](std::size_t k) {
    weights[k].assign(counts[k], 0.0f);
    own[k].assign(counts[k], 0.0f);
    const std::string name = "p" + std::to_string(k);
    if (in_arena)
      sync.register_parameter(name, std::span(weights[k]));
    else
      sync.register_parameter(name, std::span(weights[k]), std::span(own[k]));
    grads.push_back(in_arena ? sync.gradient<float>(name) : std::span<float>(own[k]));
  };
  for (std::size_t k = 0; k < counts.size(); ++k) add(k);
  const std::size_t frozen = 3;
  auto step = [&](int s, bool reduce_frozen) {
    for (std::size_t k = 0; k < grads.size(); ++k)
      for (std::size_t i = 0; i < grads[k].size(); ++i) grads[k][i] = arena_gradient(me, s, k, i);
    for (std::size_t k = grads.size(); k-- > 0;) sync.on_gradient_ready("p" + std::to_string(k));
    ASSERT_TRUE(sync.synchronize());
    for (std::size_t k = 0; k < grads.size(); ++k)
      for (std::size_t i = 0; i < grads[k].size(); ++i) {
        float want = 0;
        for (int r = 0; r < p; ++r) want += arena_gradient(r, s, k, i);
        if (k == frozen && !reduce_frozen) want = arena_gradient(me, s, k, i);
        ASSERT_EQ(grads[k][i], want) << "step " << s << " parameter " << k << " element " << i;
      }
  };
  for (int s = 0; s < 3; ++s) step(s, true);
  sync.freeze("p3");
  for (int s = 3; s < 7; ++s) step(s, false);
  sync.on_gradient_ready("p0");  // a step has begun
  EXPECT_THROW(sync.freeze("p1"), usage_error);
  EXPECT_THROW(sync.register_parameter("late", std::span(weights[0])), usage_error);
  EXPECT_TRUE(sync.synchronize());
  sync.unfreeze("p3");
  for (int s = 7; s < 10; ++s) step(s, true);
  counts.push_back(33);
  add(counts.size() - 1);  // between steps: from now on
  for (int s = 10; s < 14; ++s) step(s, true);
  EXPECT_THROW(sync.freeze("nope"), usage_error);
}

}  // namespace flexpar::testing_support
