// flexpar/relax/bytegrad.hpp — bytegrad: gradients averaged through min-max uint8 compression (BAGUA's ByteGrad).
//
// Pattern of one step (compressed_average.hpp has the steps), M = model bytes (f32), p ranks, chunk
// = elements per min-max chunk (each chunk carries 8 bytes of min and max):
//   step 0: fuse the gradients into one flat buffer
//   step 1: split it into p partitions; min-max uint8 encode partition j for rank j
//   step 2: alltoall                                                   ~ (p - 1) / p * M / 4 sent
//   step 3: decode the p versions of my partition, average (rank order, then / p)
//   step 4: re-encode my averaged partition
//   step 5: allgather                                                  ~ (p - 1) / p * M / 4 sent
//   step 6: decode all partitions; copy into the gradients; opt.apply each parameter
// Bytes on the wire per step per rank: 2 (p - 1) / p * (M / 4 + 8 * ceil(M / (4 chunk))), about
// 4x less than gradient_allreduce. Every rank decodes the same bytes, so weights stay identical on
// every rank. The averaged gradient has two quantization errors, each at most (max - min) / 510 of
// its chunk (minmax_uint8.hpp). Use it when bandwidth, not latency, bounds the step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <flexpar/compress/minmax_uint8.hpp>
#include <flexpar/relax/compressed_average.hpp>
#include <flexpar/relax/flat_model.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax {

namespace detail {
/// min-max uint8 for both the partitions sent (step 1) and the reduced partition (step 4).
struct minmax_codec {
  compress::minmax_uint8 q;
  void prepare(const block_layout&, int) const noexcept {}
  [[nodiscard]] std::size_t encoded_size(std::size_t n) const noexcept { return q.encoded_size(n); }
  [[nodiscard]] std::size_t chunk() const noexcept { return q.chunk; }
  void encode(int, std::span<const float> in, std::span<std::byte> out) const { q.encode(in, out); }
  void encode(int, std::size_t, std::span<const float> in, std::span<std::byte> out) const { q.encode(in, out); }
  void encode_reduced(std::span<const float> in, std::span<std::byte> out) const { q.encode(in, out); }
  void encode_reduced(std::size_t, std::span<const float> in, std::span<std::byte> out) const { q.encode(in, out); }
  void decode(std::span<const std::byte> in, std::span<float> out) const { q.decode(in, out); }
};
}  // namespace detail

/// Average gradients through min-max uint8 compression (file header: pattern, bytes).
class bytegrad final : public relaxation {
 public:
  /// Over `comm` (kept by reference; it must outlive this object), with `chunk` elements per min-max
  /// chunk. @throws usage_error if chunk is 0.
  explicit bytegrad(communicator& comm, std::size_t chunk = 512) : comm_(comm), codec_{{chunk}} {
    if (chunk == 0) throw usage_error(detail::where(comm.rank(), "bytegrad", "make") + "chunk must be positive");
  }

  /// Bytes one rank sends per step for a model of `model_bytes` (f32) on `p` ranks.
  static constexpr double wire_bytes(double model_bytes, int p, std::size_t chunk = 512) noexcept {
    const double n = model_bytes / 4.0;
    return detail::compressed_average_bytes(n + 8.0 * (n / static_cast<double>(chunk) + 1.0), p);
  }

  [[nodiscard]] std::string_view name() const noexcept override { return "bytegrad"; }

  void start(std::span<const parameter> params) override {
    model_.bind(comm_, name(), params);
    model_.broadcast_weights(comm_, params);
    flat_.assign(model_.size(), 0.0f);
  }

  void step(std::span<const parameter> params, optimizer& opt) override {
    model_.check(comm_.rank(), "step", params);
    model_.gather_gradients(params, flat_);
    traffic_.bytes_sent += detail::compressed_average_streamed(comm_, std::span<float>(flat_), codec_, scratch_);
    model_.scatter_gradients(flat_, params);
    for (std::size_t i = 0; i < params.size(); ++i) opt.apply(i, params[i].weight, params[i].gradient);
    ++traffic_.steps;
    ++traffic_.exchanges;
  }

  void finish(std::span<const parameter> params) override { model_.check(comm_.rank(), "finish", params); }

  [[nodiscard]] traffic traffic_so_far() const noexcept override { return traffic_; }

 private:
  communicator& comm_;
  detail::minmax_codec codec_;
  detail::flat_model model_;
  detail::compressed_scratch scratch_;
  std::vector<float> flat_;
  traffic traffic_;
};

}  // namespace flexpar::relax
