// flexpar/relax/qadam.hpp — qadam: BAGUA's QAdam — exact Adam for a warm-up, then the variance is frozen and the
// momentum crosses the network min-max uint8 compressed (no error feedback).
//
// The stages and their costs are in momentum_adam.hpp; the momentum average is bytegrad's
// compressed_average with min-max uint8 on both sides (chunks of `chunk` elements), so a
// compression-stage step sends 2 (p - 1) / p * (M / 4 + 8 * ceil(M / (4 chunk))) bytes per rank.
// Each averaged momentum carries two quantization errors of at most (max - min) / 510 of its chunk
// (minmax_uint8.hpp); unlike onebit_adam they are not fed back. It owns its optimizer: the optimizer
// passed to step() is ignored. Use it like onebit_adam where 8 bits per value are affordable and the
// simpler, feedback-free rule is preferred.
#pragma once

#include <cstddef>

#include <flexpar/relax/bytegrad.hpp>
#include <flexpar/relax/momentum_adam.hpp>

namespace flexpar::relax {

/// QAdam (file header; stages in momentum_adam.hpp).
class qadam final : public detail::momentum_adam<detail::minmax_codec> {
 public:
  /// Over `comm` (kept by reference); `warmup` exact Adam steps, then min-max uint8 momentum with
  /// `chunk` elements per chunk. @throws usage_error if warmup < 0 or chunk == 0.
  qadam(communicator& comm, int warmup, adam_options adam = {}, std::size_t chunk = 512)
      : momentum_adam(comm, "qadam", detail::minmax_codec{{chunk}}, warmup, adam) {
    if (chunk == 0) throw usage_error(detail::where(comm.rank(), "qadam", "make") + "chunk must be positive");
  }

  /// Bytes one rank sends per compression-stage step for a model of `model_bytes` (f32) on `p` ranks.
  static constexpr double wire_bytes(double model_bytes, int p, std::size_t chunk = 512) noexcept {
    return bytegrad::wire_bytes(model_bytes, p, chunk);
  }
};

}  // namespace flexpar::relax
