// A pipeline of scalar-weight stages checked against the serial computation, exactly (small integers),
// with the memory counter of each schedule. Shared by the threads-as-ranks and the mpiexec tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>

#include <flexpar/actor/pipeline.hpp>

namespace flexpar::testing_support {

/// Stage s multiplies by w_s = 1 + s % 2 and adds s; the loss of a micro-batch is the sum of the last
/// output, so d(loss)/d(out) = 1. Weight gradient of stage s: sum over micro-batches of
/// sum_k in_s[k] * d(out_s[k]).
inline float stage_weight(int s) { return static_cast<float>(1 + s % 2); }

inline std::vector<float> micro_batch_input(int mb, std::size_t width) {
  std::vector<float> x(width);
  for (std::size_t k = 0; k < width; ++k) x[k] = static_cast<float>((mb + static_cast<int>(k)) % 4);
  return x;
}

/// The serial oracle: losses per micro-batch and the weight gradient of every stage.
struct serial_result {
  std::vector<float> losses;
  std::vector<float> grads;
};
inline serial_result serial_pipeline(int stages, int m, std::size_t width) {
  serial_result r{std::vector<float>(static_cast<std::size_t>(m)),
                  std::vector<float>(static_cast<std::size_t>(stages))};
  for (int mb = 0; mb < m; ++mb) {
    std::vector<std::vector<float>> acts{micro_batch_input(mb, width)};
    for (int s = 0; s < stages; ++s) {
      std::vector<float> y(width);
      for (std::size_t k = 0; k < width; ++k) y[k] = acts.back()[k] * stage_weight(s) + static_cast<float>(s);
      acts.push_back(std::move(y));
    }
    r.losses[static_cast<std::size_t>(mb)] = std::accumulate(acts.back().begin(), acts.back().end(), 0.0f);
    std::vector<float> g(width, 1.0f);
    for (int s = stages - 1; s >= 0; --s) {
      for (std::size_t k = 0; k < width; ++k)
        r.grads[static_cast<std::size_t>(s)] += acts[static_cast<std::size_t>(s)][k] * g[k];
      for (auto& v : g) v *= stage_weight(s);
    }
  }
  return r;
}

/// Stage s on rank placement[s]; checks losses, gradients and the measured stash peaks.
inline void pipeline_matches_serial(communicator& comm, const std::vector<int>& placement, int m, std::size_t width,
                                    pipeline_schedule schedule) {
  const int p = static_cast<int>(placement.size());
  float weight_grad = 0;  // of this rank's stage
  pipeline_builder b(comm);
  for (int s = 0; s < p; ++s) {
    std::string label = "scale";
    label += std::to_string(s);
    b.stage(placement[static_cast<std::size_t>(s)],
            {label,
             [s](int, const std::vector<float>& x, std::vector<float>& y) {
               y.resize(x.size());
               for (std::size_t k = 0; k < x.size(); ++k) y[k] = x[k] * stage_weight(s) + static_cast<float>(s);
             },
             [s, &weight_grad](int, const std::vector<float>& x, const std::vector<float>&,
                               const std::vector<float>& gy, std::vector<float>& gx) {
               gx.resize(gy.size());
               for (std::size_t k = 0; k < gy.size(); ++k) {
                 weight_grad += x[k] * gy[k];
                 gx[k] = gy[k] * stage_weight(s);
               }
             }});
  }
  b.micro_batches(m).schedule(schedule);
  b.input([width](int mb, std::vector<float>& x) { x = micro_batch_input(mb, width); });
  b.loss([](int, const std::vector<float>& y, std::vector<float>& gy) {
    gy.assign(y.size(), 1.0f);
    return std::accumulate(y.begin(), y.end(), 0.0f);
  });
  pipeline pipe = b.build();
  const pipeline_step_stats stats = pipe.run_step(deadline_after(std::chrono::seconds(60)));
  if (pipe.stage() < 0) return;
  const serial_result expected = serial_pipeline(p, m, width);
  const int s = pipe.stage();
  EXPECT_EQ(weight_grad, expected.grads[static_cast<std::size_t>(s)]) << "stage " << s;
  if (s == p - 1) {
    EXPECT_EQ(stats.losses, expected.losses);
  }
  const std::size_t bound =
      schedule == pipeline_schedule::gpipe ? static_cast<std::size_t>(m) : static_cast<std::size_t>(std::min(p - s, m));
  EXPECT_EQ(stats.peak_activations, bound) << name_of(schedule) << " stage " << s << " of " << p << ", m = " << m;
}

}  // namespace flexpar::testing_support
