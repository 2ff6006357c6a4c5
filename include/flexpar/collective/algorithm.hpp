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
#pragma once

#include <cstdint>
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
  }
  return "?";
}

}  // namespace flexpar
