// flexpar/collective/algorithm.hpp — the names of the collective algorithms.
//
// Every collective takes an `algorithm`; `automatic` asks the cost model (cost.hpp) to pick the
// cheapest algorithm that the collective offers. Passing an algorithm that a collective does not
// implement is a usage_error whose text lists the ones it does.
//
// | algorithm          | allreduce | reduce_scatter(_v) | allgather(_v) | broadcast | reduce | alltoall | barrier |
// |--------------------|-----------|--------------------|---------------|-----------|--------|----------|---------|
// | ring               | x         | x                  | x             |           |        |          |         |
// | halving_doubling   | x         |                    |               |           |        |          |         |
// | hierarchical       | x         |                    |               |           |        |          |         |
// | shared_memory      | x         | x                  | x             |           |        | x        |         |
// | recursive_doubling |           |                    | x             |           |        |          |         |
// | chain              |           |                    |               | x         | x      |          |         |
// | binomial_tree      |           |                    |               | x         | x      |          |         |
// | pairwise           |           |                    |               |           |        | x        |         |
// | dissemination      |           |                    |               |           |        |          | x       |
//
// The same enum names the gradient synchronizations that relax the exact allreduce (BAGUA's
// relaxations, include/flexpar/relax/, doc/relaxations.md): relax::make builds them by these names
// and the search simulator prices those it models (search/simulator.hpp). No collective takes them.
// `none` is the simulator's choice for a weight that is not replicated. One naming for the
// collectives, the relaxations and the simulator: name_of() and algorithm_from() convert.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace flexpar {

enum class algorithm : std::uint8_t {
  automatic,           ///< the cheapest by the alpha-beta cost model
  ring,                ///< reduce-scatter / allgather around a ring, chunked and pipelined
  halving_doubling,    ///< recursive halving reduce-scatter + recursive doubling allgather (Rabenseifner)
  hierarchical,        ///< intra-node reduce-scatter, inter-node allreduce, intra-node allgather
  shared_memory,       ///< one node: through the communicator's shared-memory segment, read in cache
  recursive_doubling,  ///< allgather by doubling exchanges
  chain,               ///< pipelined chain (broadcast, reduce)
  binomial_tree,       ///< binomial tree (broadcast, reduce)
  pairwise,            ///< pairwise exchange (alltoall)
  dissemination,       ///< dissemination barrier
  // ---- relaxations (relax/): not collectives; relax::make's names ----
  gradient_allreduce,           ///< f32 allreduce of the gradients (exact; hierarchical or flat)
  bytegrad,                     ///< min-max uint8 compressed centralized average (lossy; replicas identical)
  decentralized,                ///< f32 weights averaged with peers (replicas differ; the simulator: shift_one peers)
  low_precision_decentralized,  ///< uint8 weight differences with the ring neighbours (replicas differ)
  onebit_adam,                  ///< 1-bit compressed momentum with error feedback (owns its optimizer: Adam)
  qadam,                        ///< 8-bit quantized momentum (owns its optimizer: Adam)
  async_model_average,          ///< weights averaged in the background, every period
  local_sgd,                    ///< local steps, weights averaged every k
  // ----
  none,  ///< no synchronization (the simulator's choice for a weight held by one rank)
};

constexpr std::string_view name_of(algorithm a) noexcept {
  switch (a) {
    case algorithm::automatic: return "automatic";
    case algorithm::ring: return "ring";
    case algorithm::halving_doubling: return "halving_doubling";
    case algorithm::hierarchical: return "hierarchical";
    case algorithm::shared_memory: return "shared_memory";
    case algorithm::recursive_doubling: return "recursive_doubling";
    case algorithm::chain: return "chain";
    case algorithm::binomial_tree: return "binomial_tree";
    case algorithm::pairwise: return "pairwise";
    case algorithm::dissemination: return "dissemination";
    case algorithm::gradient_allreduce: return "gradient_allreduce";
    case algorithm::bytegrad: return "bytegrad";
    case algorithm::decentralized: return "decentralized";
    case algorithm::low_precision_decentralized: return "low_precision_decentralized";
    case algorithm::onebit_adam: return "onebit_adam";
    case algorithm::qadam: return "qadam";
    case algorithm::async_model_average: return "async_model_average";
    case algorithm::local_sgd: return "local_sgd";
    case algorithm::none: return "none";
  }
  return "?";
}

/// The algorithm called `name` (name_of's spelling), or nothing for a name it does not know.
constexpr std::optional<algorithm> algorithm_from(std::string_view name) noexcept {
  for (auto i = static_cast<std::uint8_t>(algorithm::automatic); i <= static_cast<std::uint8_t>(algorithm::none); ++i)
    if (name_of(static_cast<algorithm>(i)) == name) return static_cast<algorithm>(i);
  return std::nullopt;
}

/// The relaxations, in the order of the design space (docs, CLIs, relax::algorithm_names()).
inline constexpr std::array<algorithm, 8> relaxations{
    algorithm::gradient_allreduce,          algorithm::bytegrad,    algorithm::decentralized,
    algorithm::low_precision_decentralized, algorithm::onebit_adam, algorithm::qadam,
    algorithm::async_model_average,         algorithm::local_sgd};

/// True for a relaxation (relax::make builds it), false for a collective's algorithm and `none`.
constexpr bool is_relaxation(algorithm a) noexcept {
  for (algorithm r : relaxations)
    if (r == a) return true;
  return false;
}

}  // namespace flexpar
