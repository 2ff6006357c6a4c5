// flexpar/relax/onebit_adam.hpp — onebit_adam: 1-bit Adam (Tang et al. 2021; DeepSpeed) — exact Adam for a warm-up,
// then the variance is frozen and the momentum crosses the network as 1-bit signs with error feedback.
//
// The stages and their costs are in momentum_adam.hpp. The momentum average (its step 2) is
// compressed_average.hpp with this codec:
//   worker side: partition j of my momentum is encoded by compress::onebit with the residual of my
//                partition j (error feedback: what the sign dropped is added next step);
//   server side: my averaged partition is encoded by a second compress::onebit, with the residual of
//                my partition as its owner (the second error feedback of 1-bit Adam).
// E(M) = M / 32 + 4 bytes per chunk of `chunk` elements, so a compression-stage step sends about
// 2 (p - 1) / p * (M / 32 + 4 M / (4 chunk)) bytes per rank: ~30x less than gradient_allreduce.
// Error feedback makes the sum over steps of what was transmitted track the sum of the true
// averages: they differ by (mean over ranks of the worker residuals) + (the server residual),
// which stays bounded (tested). It owns its optimizer: the optimizer passed to step() is ignored;
// the Adam settings come from the constructor (options::adam through the registry).
// Use it for Adam-trained models on slow links after a warm-up long enough for the variance to settle.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include <flexpar/compress/onebit.hpp>
#include <flexpar/relax/momentum_adam.hpp>

namespace flexpar::relax {

namespace detail {
/// compressed_average codec of 1-bit Adam: two levels of error feedback (file header).
class onebit_codec {
 public:
  /// A codec with `chunk` elements per 1-bit chunk. @throws usage_error if chunk is 0.
  explicit onebit_codec(std::size_t chunk) : chunk_(chunk), sizer_(0, chunk) {}

  /// Sizes the residuals: one per partition (worker side), one for my partition (server side).
  void prepare(const block_layout& parts, int rank) {
    workers_.clear();
    for (std::size_t c : parts.counts) workers_.emplace_back(c, chunk_);
    server_.clear();
    server_.emplace_back(parts.count(rank), chunk_);
  }
  [[nodiscard]] std::size_t encoded_size(std::size_t n) const noexcept { return sizer_.encoded_size(n); }
  void encode(int partition, std::span<const float> in, std::span<std::byte> out) {
    workers_.at(static_cast<std::size_t>(partition)).encode(in, out);
  }
  void encode_reduced(std::span<const float> in, std::span<std::byte> out) { server_.at(0).encode(in, out); }
  /// Pieces (compressed_average_streamed): elements [at, at + in.size()) of a partition.
  [[nodiscard]] std::size_t chunk() const noexcept { return chunk_; }
  void encode(int partition, std::size_t at, std::span<const float> in, std::span<std::byte> out) {
    workers_.at(static_cast<std::size_t>(partition)).encode_at(at, in, out);
  }
  void encode_reduced(std::size_t at, std::span<const float> in, std::span<std::byte> out) {
    server_.at(0).encode_at(at, in, out);
  }
  void decode(std::span<const std::byte> in, std::span<float> out) const { sizer_.decode(in, out); }

  /// Worker-side residual of partition j (what my encodings of partition j have not yet sent).
  [[nodiscard]] std::span<const float> worker_residual(std::size_t j) const { return workers_.at(j).residual(); }
  /// Server-side residual of my partition.
  [[nodiscard]] std::span<const float> server_residual() const { return server_.at(0).residual(); }

 private:
  std::size_t chunk_;
  compress::onebit sizer_;  // sizes and decodes (decode needs no residual)
  std::vector<compress::onebit> workers_;
  std::vector<compress::onebit> server_;
};
}  // namespace detail

/// 1-bit Adam (file header; stages in momentum_adam.hpp).
class onebit_adam final : public detail::momentum_adam<detail::onebit_codec> {
 public:
  /// Over `comm` (kept by reference); `warmup` exact Adam steps, then 1-bit momentum with `chunk`
  /// elements per chunk. @throws usage_error if warmup < 0 or chunk == 0.
  onebit_adam(communicator& comm, int warmup, adam_options adam = {}, std::size_t chunk = 2048)
      : momentum_adam(comm, "onebit_adam", detail::onebit_codec(chunk), warmup, adam) {}

  /// Bytes one rank sends per compression-stage step for a model of `model_bytes` (f32) on `p` ranks.
  static constexpr double wire_bytes(double model_bytes, int p, std::size_t chunk = 2048) noexcept {
    const double n = model_bytes / 4.0;
    return detail::compressed_average_bytes(n / 8.0 + 4.0 * (n / static_cast<double>(chunk) + 1.0), p);
  }
};

}  // namespace flexpar::relax
