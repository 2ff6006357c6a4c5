// flexpar/search/profile.hpp — op times measured by running the local kernels (FlexFlow measures each
// op once per configuration and caches it), timed on this machine for every shard shape a set of candidate
// configs can produce: the linear ops' shard GEMMs, the conv2d ops' shard convolutions (forward, and the
// input and weight gradients), the relu ops' forward and backward
// passes as the executor runs them (a copy and a pass over the shard), and the optimizer update of every
// weight shard (a copy and w -= lr g). Ops without a measured kernel keep the simulator's FLOP-rate model.
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <vector>

#include <flexpar/search/config.hpp>

namespace flexpar {
class communicator;
}

namespace flexpar::search {

/// Measured local GEMM times by shape (m, n, k), cached in the object (no globals).
class kernel_profile {
 public:
  /// Times, on every rank of `comm`, the forward GEMM and the two backward GEMMs of every linear op of `g`
  /// under every config in `space[i]`, the relu passes of its element-wise ops and the update of every weight
  /// shard (median of `repeats`), keeping the slowest rank's time so that every
  /// rank holds the same profile (a search on it agrees across ranks). Collective over `comm`.
  static kernel_profile measure(communicator& comm, const graph& g, const std::vector<std::vector<soap_config>>& space,
                                int repeats = 3);
  /// The measured seconds of op o's local forward (`backward` false) or backward kernels under config c
  /// (linear: GEMMs; conv2d: the shard convolutions; relu: its passes), or a negative value when this profile has none.
  [[nodiscard]] double seconds(const op& o, const soap_config& c, bool backward) const;
  /// The measured seconds of the optimizer update of op o's weight shard under config c, or a negative value
  /// when this profile has no measurement for it.
  [[nodiscard]] double update_seconds(const op& o, const soap_config& c) const;
  /// Shapes measured (GEMM shapes, convolution shards, element-wise and update shard sizes).
  [[nodiscard]] std::size_t size() const noexcept {
    return gemm_.size() + conv_.size() + elementwise_.size() + update_.size();
  }

 private:
  std::map<std::array<std::size_t, 3>, double> gemm_;                 // (m, n, k) -> seconds
  std::map<std::size_t, std::array<double, 2>> elementwise_;          // shard elements -> forward, backward seconds
  std::map<std::size_t, double> update_;                              // weight shard elements -> seconds
  std::map<std::array<std::size_t, 5>, std::array<double, 2>> conv_;  // conv2d_shard -> forward, backward
};

/// The shard convolution of conv2d op `o` under `c`: (batch, input channels, side, output channels, kernel),
/// the map square (side = sqrt(spatial)) with 'same' padding. Balanced splits, the first device's shard.
std::array<std::size_t, 5> conv2d_shard(const op& o, const soap_config& c);
/// The elements of op o's output shard under c (balanced splits: the first device's, the largest).
std::size_t output_shard_elements(const op& o, const soap_config& c);
/// The elements of op o's weight shard under c (its weight split by the config's SBP signature).
std::size_t weight_shard_elements(const op& o, const soap_config& c);

/// The local GEMM shapes (m, n, k) of linear op `o` under `c`: forward y = x W, then backward dW = x^T dy
/// and dx = dy W^T. Balanced splits: a dimension cut in d parts has ceil(extent / d) on the first device.
std::array<std::array<std::size_t, 3>, 3> linear_gemm_shapes(const op& o, const soap_config& c);

}  // namespace flexpar::search
