// flexpar/relax/relaxation.hpp — the one interface behind every communication relaxation (BAGUA).
//
// A training loop hands its parameters to one relaxation and calls step() once per iteration, after
// its backward pass; the relaxation decides what crosses the network (full gradients, compressed
// gradients, weights with some peers, nothing this step) and applies the optimizer:
//
//   flexpar::relax::sgd opt({.learning_rate = 0.05f, .momentum = 0.9f});
//   auto algo = flexpar::relax::make("bytegrad", comm, {});
//   algo->start(params);                       // collective: every rank starts from rank 0's weights
//   for (each step) { forward(); backward(); algo->step(params, opt); }
//   algo->finish(params);                      // collective: final consensus (decentralized, local_sgd)
//
// Every algorithm's result is checked against a serial computation of the same rule (tests/relax/).
//
// Names: the interface is `relaxation`; each implementation is one of BAGUA's algorithms, chosen
// by its name (make(), algorithm_names(), the samples' --algorithm). The type is not called
// `algorithm`: that is the collectives' enum, flexpar::algorithm, which relaxations also use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/core/optimizer.hpp>

namespace flexpar {
class communicator;
}

namespace flexpar::relax {

/// One trainable tensor as the relaxations see it: f32 weights and the gradient of this step (same
/// length). The same names, lengths and order on every rank.
struct parameter {
  std::string name;         ///< the tensor's name (in error messages; must agree across ranks)
  std::span<float> weight;  ///< the weights, updated in place by step()
  /// This step's gradient (same length); the centralized algorithms overwrite it with the average.
  std::span<float> gradient;
};

/// The optimizer interface every relaxation applies (flexpar/core/optimizer.hpp), by its names here.
using flexpar::optimizer;
using flexpar::optimizer_state;

/// What a relaxation has done so far on this rank (for benchmarks and the training sample).
struct traffic {
  std::uint64_t bytes_sent = 0;  ///< payload bytes this rank handed to the transport
  std::uint64_t steps = 0;       ///< step() calls
  std::uint64_t exchanges = 0;   ///< steps on which it communicated
};

/// The interface of every relaxation: one object per training run, owned by the caller.
class relaxation {
 public:
  virtual ~relaxation() = default;
  /// The registry name (`make(name)` builds it again).
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// Collective, once before training: every rank's weights become rank 0's; state is sized.
  virtual void start(std::span<const parameter> params) = 0;
  /// One training step, after the local backward pass: communicate, apply `opt`, communicate.
  virtual void step(std::span<const parameter> params, optimizer& opt) = 0;
  /// Collective, once after training: where replicas may differ (decentralized, local SGD,
  /// asynchronous averaging) they are averaged into one model; otherwise nothing.
  virtual void finish(std::span<const parameter> params) = 0;
  /// Bytes and exchanges so far on this rank.
  [[nodiscard]] virtual traffic traffic_so_far() const noexcept = 0;
};

}  // namespace flexpar::relax
