// flexpar/relax/momentum_adam.hpp — the Adam family with compressed momentum (1-bit Adam, QAdam): what onebit_adam.hpp
// and qadam.hpp share.
//
// These algorithms own their optimizer: Adam with the adam_options given at construction; the
// optimizer passed to step() is ignored. n = model elements, t = step number from 1,
// T = warmup_steps, M = model bytes (f32), p ranks:
//   warm-up (t <= T), exact Adam on averaged gradients:
//     step 1: g = allreduce(avg) of the fused gradients                    2 (p - 1) / p * M sent
//     step 2: g += wd * x; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//             x -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)   local
//     at t = T: v is frozen as vf = v / (1 - b2^T) (never updated again)
//   compression stage (t > T), the momentum crosses the network compressed:
//     step 1: g = my local gradient (+ wd * x); m = b1 m + (1 - b1) g      local
//     step 2: m = compressed_average(m) (compressed_average.hpp; the codec below)
//                                                                          2 (p - 1) / p * E(M) sent
//     step 3: x -= lr * (m / (1 - b1^t)) / (sqrt(vf) + eps)                local
// Because step 2 leaves m identical on every rank and the frozen variance is identical too, the
// weights stay identical on every rank in both stages; finish() has nothing to do. With T = 0 the
// variance is frozen at zero (vf = 0): the update is then m / eps — give a warm-up.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/relax/compressed_average.hpp>
#include <flexpar/relax/flat_model.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax::detail {

/// Adam with a compressed momentum average after `warmup` exact steps (file header). `Codec` is a
/// compressed_average codec with `void prepare(const block_layout& parts, int rank)` called at start.
template <class Codec>
class momentum_adam : public relaxation {
 public:
  /// Over `comm` (kept by reference; it must outlive this object).
  /// @throws usage_error if warmup < 0.
  momentum_adam(communicator& comm, std::string_view name, Codec codec, int warmup, adam_options adam)
      : comm_(comm), name_(name), codec_(std::move(codec)), warmup_(warmup), adam_(adam) {
    if (warmup < 0)
      throw usage_error(where(comm.rank(), name, "make") + "warm-up of " + std::to_string(warmup) +
                        " steps; it must be 0 or more");
  }

  [[nodiscard]] std::string_view name() const noexcept override { return name_; }

  void start(std::span<const parameter> params) override {
    model_.bind(comm_, name_, params);
    model_.broadcast_weights(comm_, params);
    const std::size_t n = model_.size();
    g_.assign(n, 0.0f);
    x_.assign(n, 0.0f);
    m_.assign(n, 0.0f);
    v_.assign(n, 0.0f);
    codec_.prepare(block_layout::even(n, comm_.size()), comm_.rank());
    t_ = 0;
  }

  /// One step; `opt` is ignored (this algorithm is its own Adam; file header).
  void step(std::span<const parameter> params, optimizer& /*opt*/) override {
    model_.check(comm_.rank(), "step", params);
    ++t_;
    ++traffic_.steps;
    ++traffic_.exchanges;
    model_.gather_gradients(params, g_);
    model_.gather_weights(params, x_);
    const float b1 = adam_.beta1, b2 = adam_.beta2, wd = adam_.weight_decay;
    const auto c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), static_cast<double>(t_)));
    const std::size_t n = g_.size();
    if (t_ <= static_cast<std::uint64_t>(warmup_)) {
      flexpar::allreduce(comm_, std::span<float>(g_), reduce_op::avg);
      traffic_.bytes_sent += ring_allreduce_bytes(n, comm_.size());
      const auto c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), static_cast<double>(t_)));
      for (std::size_t i = 0; i < n; ++i) {
        float g = g_[i];
        if (wd != 0.0f) g += wd * x_[i];
        m_[i] = b1 * m_[i] + (1.0f - b1) * g;
        v_[i] = b2 * v_[i] + (1.0f - b2) * g * g;
        x_[i] -= adam_.learning_rate * (m_[i] / c1) / (std::sqrt(v_[i] / c2) + adam_.epsilon);
      }
      if (t_ == static_cast<std::uint64_t>(warmup_))
        for (float& v : v_) v = v / c2;  // frozen, bias-corrected
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        float g = g_[i];
        if (wd != 0.0f) g += wd * x_[i];
        m_[i] = b1 * m_[i] + (1.0f - b1) * g;
      }
      traffic_.bytes_sent += compressed_average(comm_, std::span<float>(m_), codec_, scratch_);
      for (std::size_t i = 0; i < n; ++i)
        x_[i] -= adam_.learning_rate * (m_[i] / c1) / (std::sqrt(v_[i]) + adam_.epsilon);
    }
    model_.scatter_weights(x_, params);
  }

  void finish(std::span<const parameter> params) override { model_.check(comm_.rank(), "finish", params); }

  [[nodiscard]] traffic traffic_so_far() const noexcept override { return traffic_; }

  /// The (averaged) momentum, flat.
  [[nodiscard]] std::span<const float> momentum() const noexcept { return m_; }
  /// The variance (frozen after the warm-up), flat.
  [[nodiscard]] std::span<const float> variance() const noexcept { return v_; }
  /// The codec (for its error-feedback residuals).
  [[nodiscard]] const Codec& codec() const noexcept { return codec_; }

 private:
  communicator& comm_;
  std::string name_;
  Codec codec_;
  int warmup_;
  adam_options adam_;
  flat_model model_;
  compressed_scratch scratch_;
  std::vector<float> g_, x_, m_, v_;
  std::uint64_t t_ = 0;
  traffic traffic_;
};

}  // namespace flexpar::relax::detail
