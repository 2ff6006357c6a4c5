// samples/support/scheduled_optimizer.hpp — a learning-rate schedule around any relax::optimizer.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include <flexpar/relax/relaxation.hpp>

namespace flexpar::samples {

/// Scales the gradient by a learning-rate factor before the wrapped optimizer sees it. With SGD and
/// momentum this is the schedule applied inside the momentum buffer (b = mu b + s g; w -= lr b),
/// which for a smooth schedule such as the cosine one here behaves like scaling lr itself.
class scheduled_optimizer final : public flexpar::relax::optimizer {
 public:
  explicit scheduled_optimizer(flexpar::relax::optimizer& inner) : inner_(inner) {}
  void set_factor(float f) noexcept { factor_ = f; }
  void apply(std::size_t index, std::span<float> weight, std::span<const float> gradient) override {
    if (factor_ == 1.0f) return inner_.apply(index, weight, gradient);
    scratch_.resize(gradient.size());
    for (std::size_t i = 0; i < gradient.size(); ++i) scratch_[i] = gradient[i] * factor_;
    inner_.apply(index, weight, scratch_);
  }
  /// The wrapped optimizer's state (the schedule has none).
  std::vector<flexpar::relax::optimizer_state> state(std::size_t index, std::size_t n) override {
    return inner_.state(index, n);
  }

 private:
  flexpar::relax::optimizer& inner_;
  float factor_ = 1.0f;
  std::vector<float> scratch_;
};

}  // namespace flexpar::samples
