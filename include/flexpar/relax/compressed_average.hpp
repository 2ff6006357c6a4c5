// flexpar/relax/compressed_average.hpp — the centralized compressed average that bytegrad, onebit_adam and qadam share
// (BAGUA's scatter-reduce with compression; DeepSpeed's compressed_allreduce).
//
// n floats on p ranks; partition j = block j of block_layout::even(n, p) (sizes differ by at most one);
// E(k) = encoded bytes of k floats, B = max_j E(count_j):
//   step 1: encode partition j of my data for rank j (codec.encode(j, ...))   local
//   step 2: alltoall of the p encoded partitions, each padded to B bytes       (p - 1) B sent
//   step 3: decode the p versions of my partition; sum them in rank order; divide by p   local
//   step 4: encode my reduced partition (codec.encode_reduced)                local
//   step 5: ring allgather_v of the reduced partitions, E(count_j) bytes each  sum_j E(count_j) - E(count_{r+1}) sent
//   step 6: decode every partition into the data
// Bytes on the wire per rank: about 2 (p - 1) / p * E(n), i.e. for min-max uint8 about
// 2 (p - 1) / p * M / 4 and for 1-bit about 2 (p - 1) / p * M / 32 (M = model bytes in f32).
// Every rank decodes the same bytes in step 6, so every rank ends with bitwise identical data. The
// rank's own partition also goes through encode/decode in step 3, so the result depends on neither
// the rank that reduces nor the world size other than through the rule above (the serial reference
// in tests/relax applies the same rule).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <flexpar/collective.hpp>

namespace flexpar::relax::detail {

/// Reusable buffers of compressed_average (kept by the algorithm between steps).
struct compressed_scratch {
  std::vector<std::uint8_t> send, recv, gathered;  ///< encoded bytes of steps 2 and 5
  std::vector<float> acc, tmp;                     ///< my partition while it is reduced
};

/// Collective: `data` becomes the compressed average over every rank (file header); returns the bytes
/// this rank handed to the transport. The codec provides:
///   std::size_t encoded_size(std::size_t n) const;
///   void encode(int partition, std::span<const float> in, std::span<std::byte> out);
///   void encode_reduced(std::span<const float> in, std::span<std::byte> out);
///   void decode(std::span<const std::byte> in, std::span<float> out) const;
template <class Codec>
std::uint64_t compressed_average(communicator& comm, std::span<float> data, Codec& codec, compressed_scratch& s) {
  const int p = comm.size(), me = comm.rank();
  const auto pp = static_cast<std::size_t>(p);
  const block_layout parts = block_layout::even(data.size(), p);
  std::vector<std::size_t> enc(pp);
  std::size_t widest = 0;
  for (std::size_t j = 0; j < pp; ++j) {
    enc[j] = codec.encoded_size(parts.counts[j]);
    widest = std::max(widest, enc[j]);
  }
  // steps 1-2: encode each partition for its owner, exchange.
  s.send.assign(pp * widest, 0);
  s.recv.assign(pp * widest, 0);
  for (int j = 0; j < p; ++j) {
    auto out = std::as_writable_bytes(std::span<std::uint8_t>(s.send).subspan(static_cast<std::size_t>(j) * widest,
                                                                              enc[static_cast<std::size_t>(j)]));
    codec.encode(j, parts.of(std::span<const float>(data), j), out);
  }
  flexpar::alltoall(comm, std::span<const std::uint8_t>(s.send), std::span<std::uint8_t>(s.recv),
                    flexpar::algorithm::pairwise);
  // step 3: reduce my partition.
  const std::size_t mine = parts.count(me);
  s.acc.assign(mine, 0.0f);
  s.tmp.assign(mine, 0.0f);
  for (std::size_t i = 0; i < pp; ++i) {
    auto in =
        std::as_bytes(std::span<const std::uint8_t>(s.recv).subspan(i * widest, enc[static_cast<std::size_t>(me)]));
    codec.decode(in, i == 0 ? std::span<float>(s.acc) : std::span<float>(s.tmp));
    if (i > 0)
      for (std::size_t k = 0; k < mine; ++k) s.acc[k] += s.tmp[k];
  }
  const auto divisor = static_cast<float>(p);
  for (float& v : s.acc) v = v / divisor;
  // steps 4-5: encode my reduced partition, gather everyone's.
  const block_layout gathered = block_layout::of_counts(enc);
  s.gathered.assign(gathered.total, 0);
  codec.encode_reduced(s.acc, std::as_writable_bytes(gathered.of(std::span<std::uint8_t>(s.gathered), me)));
  flexpar::allgather_v(comm, std::span<std::uint8_t>(s.gathered), std::span<const std::size_t>(enc),
                       flexpar::algorithm::ring);
  // step 6: decode everything.
  for (int j = 0; j < p; ++j)
    codec.decode(std::as_bytes(gathered.of(std::span<const std::uint8_t>(s.gathered), j)), parts.of(data, j));
  if (p == 1) return 0;
  return static_cast<std::uint64_t>(pp - 1) * widest + (gathered.total - enc[static_cast<std::size_t>((me + 1) % p)]);
}

/// Bytes compressed_average makes one rank send for an encoding of E bytes of the whole model.
constexpr double compressed_average_bytes(double encoded_model_bytes, int p) noexcept {
  return p <= 1 ? 0.0 : 2.0 * (p - 1) / p * encoded_model_bytes;
}

}  // namespace flexpar::relax::detail
