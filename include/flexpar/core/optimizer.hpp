// flexpar/core/optimizer.hpp — the interface of a local optimizer rule (weight -= f(gradient), with
// per-parameter state), apart from any rule: the layers that apply an optimizer (the relaxations,
// ZeRO's sharded step) and those that save its state (checkpoints) share it without depending on each
// other. The rules themselves (SGD, Adam, ...) are relax/optimizer.hpp's; the relaxations name this
// interface relax::optimizer too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace flexpar {

/// One named piece of an optimizer's state for one parameter, as a checkpoint saves and loads it:
/// floats (a momentum buffer, a moment) or counters (Adam's step count). The spans point into the
/// optimizer and stay valid until it is destroyed.
struct optimizer_state {
  std::string name;                  ///< "momentum", "m", "v", "t": unique per optimizer
  std::span<float> floats;           ///< one per weight, or empty
  std::span<std::int64_t> counters;  ///< a count, or empty
};

/// A local optimizer rule applied to one parameter (index = its position in the list, for state).
class optimizer {
 public:
  virtual ~optimizer() = default;
  /// weight -= f(gradient) for parameter `index` (the optimizer keeps per-index state).
  virtual void apply(std::size_t index, std::span<float> weight, std::span<const float> gradient) = 0;
  /// The state of parameter `index`, of `n` weights, made (zero, as before its first apply()) when
  /// it does not exist yet, so that a fresh optimizer can be loaded into: writing these values into
  /// another optimizer of the same settings makes its next apply() do what this one's would.
  /// Empty for a rule without state (the default).
  /// @throws usage_error when the state of `index` exists with another length than `n`.
  virtual std::vector<optimizer_state> state(std::size_t index, std::size_t n) {
    (void)index;
    (void)n;
    return {};
  }
};
}  // namespace flexpar
