// flexpar/relax/optimizer.hpp — the local optimizer rules the relaxations apply: SGD (momentum, weight decay) and Adam.
//
// An optimizer keeps its state per parameter index (the position of the parameter in the list that
// the relaxation is given), sized on the first apply() of that index. Both follow PyTorch's rules:
//
//   sgd:  g' = g + weight_decay * w;  b = momentum * b + g';  w -= learning_rate * (momentum ? b : g')
//   adam: g' = g + weight_decay * w;  m = beta1 m + (1 - beta1) g';  v = beta2 v + (1 - beta2) g'^2;
//         w -= learning_rate * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + epsilon)
//
// (t counts the apply() calls of that index, from 1). Not thread-safe: one relaxation drives it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include <flexpar/core/error.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax {

namespace detail {
/// Throws usage_error unless weight and gradient have the same length and match the state's length.
inline void check_apply(const char* who, std::size_t index, std::size_t weight, std::size_t gradient,
                        std::size_t state) {
  if (weight != gradient) {
    throw error_on<usage_error>(no_rank, who, "parameter ", index, " has ", weight, " weights but ", gradient,
                                " gradient values; they must have the same length");
  }
  if (state != weight) {
    throw error_on<usage_error>(no_rank, who, "parameter ", index, " has ", weight, " elements now but had ", state,
                                " when its state was made");
  }
}

/// The state vector of `index`, made (zero) on first use with `n` elements.
inline std::vector<float>& slot(std::vector<std::vector<float>>& state, std::vector<bool>& made, std::size_t index,
                                std::size_t n) {
  if (index >= state.size()) {
    state.resize(index + 1);
    made.resize(index + 1, false);
  }
  if (!made[index]) {
    state[index].assign(n, 0.0f);
    made[index] = true;
  }
  return state[index];
}

/// slot(), for state(): a usage_error when the state of `index` exists with another length than `n`.
inline std::span<float> checked_slot(const char* who, std::vector<std::vector<float>>& state, std::vector<bool>& made,
                                     std::size_t index, std::size_t n) {
  std::vector<float>& s = slot(state, made, index, n);
  if (s.size() != n)
    throw error_on<usage_error>(no_rank, who, "the state of parameter ", index, " has ", s.size(),
                                " elements; state() was asked for ", n);
  return s;
}
}  // namespace detail

/// Settings of sgd.
struct sgd_options {
  float learning_rate = 0.01f;  ///< step size
  float momentum = 0.0f;        ///< 0 = plain SGD
  float weight_decay = 0.0f;    ///< L2 penalty added to the gradient
};

/// Stochastic gradient descent with optional momentum and weight decay (rule in the file header).
class sgd final : public optimizer {
 public:
  /// An SGD optimizer with the given settings.
  explicit sgd(sgd_options o = {}) : options_(o) {}

  /// weight -= learning_rate * (momentum buffer or gradient); see the file header.
  /// @throws usage_error if the lengths of weight and gradient differ, or differ from the last call.
  void apply(std::size_t index, std::span<float> weight, std::span<const float> gradient) override {
    const std::size_t n = weight.size();
    std::vector<float>& b = detail::slot(buffer_, made_, index, n);
    detail::check_apply("relax::sgd", index, n, gradient.size(), b.size());
    const float lr = options_.learning_rate, mu = options_.momentum, wd = options_.weight_decay;
    for (std::size_t i = 0; i < n; ++i) {
      float g = gradient[i];
      if (wd != 0.0f) g += wd * weight[i];
      if (mu != 0.0f) {
        b[i] = mu * b[i] + g;
        g = b[i];
      }
      weight[i] -= lr * g;
    }
  }

  /// "momentum" (the buffer b) when momentum is not 0; nothing otherwise (plain SGD has no state).
  std::vector<optimizer_state> state(std::size_t index, std::size_t n) override {
    if (options_.momentum == 0.0f) return {};
    return {{"momentum", detail::checked_slot("relax::sgd", buffer_, made_, index, n), {}}};
  }

  /// The settings.
  [[nodiscard]] const sgd_options& options() const noexcept { return options_; }

 private:
  sgd_options options_;
  std::vector<std::vector<float>> buffer_;
  std::vector<bool> made_;
};

/// Settings of adam (and of the Adam family of relaxations: onebit_adam, qadam).
struct adam_options {
  float learning_rate = 0.001f;  ///< step size
  float beta1 = 0.9f;            ///< decay of the first moment (momentum)
  float beta2 = 0.999f;          ///< decay of the second moment (variance)
  float epsilon = 1e-8f;         ///< added to sqrt(v)
  float weight_decay = 0.0f;     ///< L2 penalty added to the gradient
};

/// Adam with bias correction (rule in the file header).
class adam final : public optimizer {
 public:
  /// An Adam optimizer with the given settings.
  explicit adam(adam_options o = {}) : options_(o) {}

  /// One Adam update of parameter `index`; see the file header.
  /// @throws usage_error if the lengths of weight and gradient differ, or differ from the last call.
  void apply(std::size_t index, std::span<float> weight, std::span<const float> gradient) override {
    const std::size_t n = weight.size();
    std::vector<float>& m = detail::slot(m_, made_m_, index, n);
    std::vector<float>& v = detail::slot(v_, made_v_, index, n);
    detail::check_apply("relax::adam", index, n, gradient.size(), m.size());
    if (index >= steps_.size()) steps_.resize(index + 1, 0);
    const double t = static_cast<double>(++steps_[index]);
    const float b1 = options_.beta1, b2 = options_.beta2, wd = options_.weight_decay;
    const auto c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
    const auto c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), t));
    for (std::size_t i = 0; i < n; ++i) {
      float g = gradient[i];
      if (wd != 0.0f) g += wd * weight[i];
      m[i] = b1 * m[i] + (1.0f - b1) * g;
      v[i] = b2 * v[i] + (1.0f - b2) * g * g;
      weight[i] -= options_.learning_rate * (m[i] / c1) / (std::sqrt(v[i] / c2) + options_.epsilon);
    }
  }

  /// "m" and "v" (the moments) and "t" (the apply() calls of `index` so far: the bias correction).
  std::vector<optimizer_state> state(std::size_t index, std::size_t n) override {
    std::span<float> m = detail::checked_slot("relax::adam", m_, made_m_, index, n);
    std::span<float> v = detail::checked_slot("relax::adam", v_, made_v_, index, n);
    if (index >= steps_.size()) steps_.resize(index + 1, 0);
    return {{"m", m, {}}, {"v", v, {}}, {"t", {}, std::span<std::int64_t>(&steps_[index], 1)}};
  }

  /// The settings.
  [[nodiscard]] const adam_options& options() const noexcept { return options_; }

 private:
  adam_options options_;
  std::vector<std::vector<float>> m_, v_;
  std::vector<bool> made_m_, made_v_;
  std::deque<std::int64_t> steps_;  // a deque: growing it never moves a count state() handed out
};

}  // namespace flexpar::relax
