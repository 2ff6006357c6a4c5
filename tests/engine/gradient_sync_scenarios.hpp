// gradient_sync scenarios shared by the in-process and mpiexec tests.
#pragma once

#include <gtest/gtest.h>

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

}  // namespace flexpar::testing_support
