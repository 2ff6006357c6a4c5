// flexpar/relax/registry.hpp — every relaxation by name, for command lines and benchmarks:
// relax::make("bytegrad", comm).
//
// Light on purpose (no collective templates): the algorithms are built in libflexpar
// (lib/relax/registry.cpp). Code that knows its algorithm at compile time can include its header
// (flexpar/relax/bytegrad.hpp, ...) and construct it directly instead.
//
//   flexpar::relax::sgd opt({.learning_rate = 0.05f, .momentum = 0.9f});
//   auto algo = flexpar::relax::make("decentralized", comm, {.peers = "ring"});
//   algo->start(params);
//   for (...) { backward(); algo->step(params, opt); }
//   algo->finish(params);
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <flexpar/relax/optimizer.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax {

/// The settings of every relaxation; each algorithm reads the fields named in its comment.
struct options {
  /// decentralized, low_precision_decentralized, local_sgd: communicate every `interval` steps.
  /// Default 1 (local_sgd: a larger value, e.g. 4, is its point).
  int interval = 1;
  /// decentralized: "all", "shift_one" or "ring" (low_precision_decentralized always uses ring).
  std::string peers = "shift_one";
  /// gradient_allreduce: the two-level (intra-node, inter-node) allreduce.
  bool hierarchical = false;
  /// bytegrad, low_precision_decentralized, qadam: elements per min-max uint8 chunk.
  std::size_t chunk = 512;
  /// onebit_adam: elements per 1-bit chunk (each chunk carries one float scale).
  std::size_t onebit_chunk = 2048;
  /// onebit_adam, qadam: steps of full-precision Adam before the variance is frozen.
  int warmup_steps = 100;
  /// onebit_adam, qadam: their own Adam settings (they ignore the optimizer passed to step()).
  adam_options adam{};
  /// async_model_average: milliseconds between two background averages.
  int period_ms = 10;
};

/// The names make() knows, in the order of the design space (docs, CLIs).
[[nodiscard]] std::span<const std::string_view> algorithm_names() noexcept;

/// The relaxation called `name` over `comm` (kept by reference: it must outlive the result).
/// Not collective: the algorithm's start() is.
/// @throws usage_error for an unknown name (listing the known ones) or invalid options.
[[nodiscard]] std::unique_ptr<relaxation> make(std::string_view name, communicator& comm, const options& o = {});

}  // namespace flexpar::relax
