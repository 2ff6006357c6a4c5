// flexpar/search/profile.hpp — op times measured by running the local kernels (FlexFlow measures each
// op once per configuration and caches it): the linear ops' shard GEMMs, timed on this machine, for
// every shard shape a set of candidate configs can produce. Ops without a measured kernel keep the
// simulator's FLOP-rate model.
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
  /// under every config in `space[i]` (median of `repeats`), keeping the slowest rank's time so that every
  /// rank holds the same profile (a search on it agrees across ranks). Collective over `comm`.
  static kernel_profile measure(communicator& comm, const graph& g, const std::vector<std::vector<soap_config>>& space,
                                int repeats = 3);
  /// The measured seconds of op o's local forward (`backward` false) or backward GEMMs under config c, or
  /// a negative value when this profile has no measurement for them.
  [[nodiscard]] double seconds(const op& o, const soap_config& c, bool backward) const;
  /// Shapes measured.
  [[nodiscard]] std::size_t size() const noexcept { return gemm_.size(); }

 private:
  std::map<std::array<std::size_t, 3>, double> gemm_;  // (m, n, k) -> seconds
};

/// The local GEMM shapes (m, n, k) of linear op `o` under `c`: forward y = x W, then backward dW = x^T dy
/// and dx = dy W^T. Balanced splits: a dimension cut in d parts has ceil(extent / d) on the first device.
std::array<std::array<std::size_t, 3>, 3> linear_gemm_shapes(const op& o, const soap_config& c);

}  // namespace flexpar::search
