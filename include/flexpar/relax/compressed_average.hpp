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

/// The steps of the compressed average (file header), written once for every memory kind. `Memory`
/// holds the buffers and the data, and does each step's work where they live (host_steps below; the
/// GPU's in flexpar/cuda/relax.hpp). Partition j is block j of block_layout::even(n, p); `first` and
/// `count` below are elements of the data, `bytes` are encoded bytes. Memory provides:
///   std::size_t encoded_size(std::size_t count) const;      E(count)
///   void size(const std::vector<std::size_t>& bytes, std::size_t widest, std::size_t mine);
///   void encode_part(int j, std::size_t first, std::size_t count);         step 1, into send slot j
///   std::uint64_t exchange_parts();           step 2: alltoall of the slots; returns the bytes sent
///   void reduce_mine(int i, std::size_t bytes, std::size_t count);  step 3: my partition += decode(slot i)
///   void average(int p);                      step 3: divide my partition by p
///   void encode_reduced();                    step 4: into my part of the gathered bytes
///   std::uint64_t gather_reduced();           step 5: every rank's reduced partition; bytes sent
///   void decode_part(int j, std::size_t first, std::size_t count);         step 6: into the data
/// Returns the bytes this rank handed to the transport.
template <class Memory>
std::uint64_t compressed_average_steps(Memory& m, std::size_t n, int p, int me) {
  const auto pp = static_cast<std::size_t>(p);
  const block_layout parts = block_layout::even(n, p);
  std::vector<std::size_t> enc(pp);
  std::size_t widest = 0;
  for (std::size_t j = 0; j < pp; ++j) {
    enc[j] = m.encoded_size(parts.counts[j]);
    widest = std::max(widest, enc[j]);
  }
  const std::size_t mine = parts.count(me);
  m.size(enc, widest, mine);
  // steps 1-2: encode each partition for its owner, exchange.
  for (int j = 0; j < p; ++j) m.encode_part(j, parts.displs[static_cast<std::size_t>(j)], parts.count(j));
  std::uint64_t sent = m.exchange_parts();
  // step 3: reduce my partition: every rank's version of it in rank order, then / p.
  for (int i = 0; i < p; ++i) m.reduce_mine(i, enc[static_cast<std::size_t>(me)], mine);
  m.average(p);
  // steps 4-5: encode my reduced partition, gather everyone's.
  m.encode_reduced();
  sent += m.gather_reduced();
  // step 6: decode everything.
  for (int j = 0; j < p; ++j) m.decode_part(j, parts.displs[static_cast<std::size_t>(j)], parts.count(j));
  return p == 1 ? 0 : sent;
}

/// Reusable buffers of compressed_average (kept by the algorithm between steps).
struct compressed_scratch {
  std::vector<std::uint8_t> send, recv, gathered;  ///< encoded bytes of steps 2 and 5
  std::vector<float> acc, tmp;                     ///< my partition while it is reduced
};

/// compressed_average_steps' memory for host data: the collectives over `comm`, a ring allgather_v of
/// the exact encoded sizes in step 5. The codec provides:
///   std::size_t encoded_size(std::size_t n) const;
///   void encode(int partition, std::span<const float> in, std::span<std::byte> out);
///   void encode_reduced(std::span<const float> in, std::span<std::byte> out);
///   void decode(std::span<const std::byte> in, std::span<float> out) const;
template <class Codec>
class host_steps {
 public:
  host_steps(communicator& comm, std::span<float> data, Codec& codec, compressed_scratch& s)
      : comm_(comm), data_(data), codec_(codec), s_(s) {}

  [[nodiscard]] std::size_t encoded_size(std::size_t count) const { return codec_.encoded_size(count); }
  void size(const std::vector<std::size_t>& bytes, std::size_t widest, std::size_t mine) {
    enc_ = bytes;
    widest_ = widest;
    s_.send.assign(enc_.size() * widest, 0);
    s_.recv.assign(enc_.size() * widest, 0);
    s_.acc.assign(mine, 0.0f);
    s_.tmp.assign(mine, 0.0f);
    gathered_ = block_layout::of_counts(enc_);
    s_.gathered.assign(gathered_.total, 0);
  }
  void encode_part(int j, std::size_t first, std::size_t count) {
    codec_.encode(j, std::span<const float>(data_).subspan(first, count), slot(s_.send, j, enc_[idx(j)]));
  }
  std::uint64_t exchange_parts() {
    flexpar::alltoall(comm_, std::span<const std::uint8_t>(s_.send), std::span<std::uint8_t>(s_.recv),
                      flexpar::algorithm::pairwise);
    return static_cast<std::uint64_t>(enc_.size() - 1) * widest_;
  }
  void reduce_mine(int i, std::size_t bytes, std::size_t count) {
    const auto in = std::as_bytes(std::span<const std::uint8_t>(s_.recv).subspan(idx(i) * widest_, bytes));
    if (i == 0) return codec_.decode(in, std::span<float>(s_.acc));
    codec_.decode(in, std::span<float>(s_.tmp));
    for (std::size_t k = 0; k < count; ++k) s_.acc[k] += s_.tmp[k];
  }
  void average(int p) {
    const auto divisor = static_cast<float>(p);
    for (float& v : s_.acc) v = v / divisor;
  }
  void encode_reduced() {
    codec_.encode_reduced(s_.acc, std::as_writable_bytes(gathered_.of(std::span<std::uint8_t>(s_.gathered), me())));
  }
  std::uint64_t gather_reduced() {
    flexpar::allgather_v(comm_, std::span<std::uint8_t>(s_.gathered), std::span<const std::size_t>(enc_),
                         flexpar::algorithm::ring);
    return gathered_.total - enc_[static_cast<std::size_t>((me() + 1) % comm_.size())];
  }
  void decode_part(int j, std::size_t first, std::size_t count) {
    codec_.decode(std::as_bytes(gathered_.of(std::span<const std::uint8_t>(s_.gathered), j)),
                  data_.subspan(first, count));
  }

 private:
  static std::size_t idx(int j) { return static_cast<std::size_t>(j); }
  [[nodiscard]] int me() const { return comm_.rank(); }
  std::span<std::byte> slot(std::vector<std::uint8_t>& v, int j, std::size_t bytes) const {
    return std::as_writable_bytes(std::span<std::uint8_t>(v).subspan(idx(j) * widest_, bytes));
  }

  communicator& comm_;
  std::span<float> data_;
  Codec& codec_;
  compressed_scratch& s_;
  std::vector<std::size_t> enc_;
  std::size_t widest_ = 0;
  block_layout gathered_;
};

/// Collective: `data` becomes the compressed average over every rank (file header); returns the bytes
/// this rank handed to the transport. The codec: host_steps.
template <class Codec>
std::uint64_t compressed_average(communicator& comm, std::span<float> data, Codec& codec, compressed_scratch& s) {
  host_steps<Codec> m(comm, data, codec, s);
  return compressed_average_steps(m, data.size(), comm.size(), comm.rank());
}

/// compressed_average_streamed's hooks when there is nothing to fuse.
struct no_hook {
  void operator()(std::size_t, std::size_t) const noexcept {}
};

/// Elements per piece of compressed_average_streamed by default (1 MiB of f32; rounded up to a
/// multiple of the codec's chunk).
inline constexpr std::size_t stream_piece_elements = std::size_t{1} << 18;

/// compressed_average, streamed: every partition is cut into pieces of `piece` elements (a multiple
/// of the codec's chunk), and each piece goes through the steps on its own, so that encoding piece
/// k + 1 overlaps the transfer of piece k and decoding overlaps the later pieces' transfers:
///   piece k: encode it in every partition, send it to the partition's owner   (steps 1-2)
///            reduce piece k - 1 of my partition, encode it, send it to every rank   (steps 3-5)
///            decode piece k - 2 of every partition into the data   (step 6)
/// Every receive is posted before the first send (no message waits for its receive), and the
/// transport is polled between partitions while encoding. The codecs work chunk by chunk, so the
/// bytes of a piece are the bytes compressed_average sends for those elements, and the result (and
/// the codecs' residuals) are bitwise compressed_average's (tested); messages are not padded to the
/// widest partition. Data of at most one piece per partition, or one rank: compressed_average. The
/// codec provides, besides what host_steps needs:
///   std::size_t chunk() const;
///   void encode(int partition, std::size_t at, std::span<const float> in, std::span<std::byte> out);
///   void encode_reduced(std::size_t at, std::span<const float> in, std::span<std::byte> out);
/// (elements [at, at + in.size()) of the partition, `at` a multiple of chunk()). `before(first,
/// count)` runs on elements [first, first + count) of the data right before they are encoded, and
/// `after(first, count)` right after they are decoded (an optimizer fused with the average: one pass
/// over the data while it is in cache, not one before and one after). Returns the bytes this rank
/// handed to the transport.
template <class Codec, class Before = no_hook, class After = no_hook>
std::uint64_t compressed_average_streamed(communicator& comm, std::span<float> data, Codec& codec,
                                          compressed_scratch& s, std::size_t piece = stream_piece_elements,
                                          Before before = {}, After after = {}) {
  const int p = comm.size(), me = comm.rank();
  const std::size_t chunk = codec.chunk();
  piece = std::max<std::size_t>(1, (piece + chunk - 1) / chunk) * chunk;
  const block_layout parts = block_layout::even(data.size(), p);
  const std::size_t pieces = (parts.count(0) + piece - 1) / piece;  // partition 0 is the largest
  if (p == 1 || pieces <= 1) {
    before(std::size_t{0}, data.size());
    const std::uint64_t sent = compressed_average(comm, data, codec, s);
    after(std::size_t{0}, data.size());
    return sent;
  }
  const auto pp = static_cast<std::size_t>(p), my = static_cast<std::size_t>(me);
  std::vector<std::size_t> enc(pp);
  for (std::size_t j = 0; j < pp; ++j) enc[j] = codec.encoded_size(parts.counts[j]);
  const block_layout placed = block_layout::of_counts(enc);  // partition j's bytes in send and gathered
  const std::size_t mine = parts.count(me);
  s.send.resize(placed.total);
  s.gathered.resize(placed.total);
  s.recv.resize(pp * enc[my]);  // rank i's version of my partition at i * enc[my]
  s.acc.resize(mine);
  s.tmp.resize(mine);
  // piece k of a partition of `count` elements: its elements [lo, lo + n) and bytes [at, at + len)
  struct span_of_piece {
    std::size_t lo, n, at, len;
  };
  auto piece_of = [&](std::size_t count, std::size_t k) {
    const std::size_t lo = std::min(count, k * piece), n = std::min(count, lo + piece) - lo;
    const std::size_t at = codec.encoded_size(lo);
    return span_of_piece{lo, n, at, codec.encoded_size(lo + n) - at};
  };
  auto bytes = [](std::vector<std::uint8_t>& v, std::size_t at, std::size_t len) {
    return std::as_writable_bytes(std::span<std::uint8_t>(v).subspan(at, len));
  };
  const collective_call to_owners = begin_collective_call(comm);  // steps 1-2
  const collective_call to_all = begin_collective_call(comm);     // step 5
  std::vector<request> from_ranks(pieces * pp), reduced(pieces * pp), sent;
  for (std::size_t k = 0; k < pieces; ++k)
    for (std::size_t i = 0; i < pp; ++i) {
      if (i == my) continue;
      if (const span_of_piece x = piece_of(mine, k); x.n != 0)
        from_ranks[k * pp + i] = to_owners.irecv(static_cast<int>(i), bytes(s.recv, i * enc[my] + x.at, x.len));
      if (const span_of_piece x = piece_of(parts.counts[i], k); x.n != 0)
        reduced[k * pp + i] = to_all.irecv(static_cast<int>(i), bytes(s.gathered, placed.displs[i] + x.at, x.len));
    }
  std::uint64_t sent_bytes = 0;
  auto send = [&](const collective_call& c, int to, std::span<std::byte> what) {
    sent.push_back(c.t.isend(to, c.tag, what));
    sent_bytes += what.size();
  };
  std::size_t oldest = 0;  // sends before it have completed
  auto poll = [&] {
    for (std::size_t i = oldest; i < sent.size(); ++i)
      if (sent[i].pending()) sent[i].test();
    while (oldest < sent.size() && !sent[oldest].pending()) ++oldest;
  };
  auto encode_piece = [&](std::size_t k) {
    for (std::size_t j = 0; j < pp; ++j) {
      const span_of_piece x = piece_of(parts.counts[j], k);
      if (x.n == 0) continue;
      const std::span<std::byte> out = bytes(s.send, placed.displs[j] + x.at, x.len);
      before(parts.displs[j] + x.lo, x.n);
      codec.encode(static_cast<int>(j), x.lo, std::span<const float>(data).subspan(parts.displs[j] + x.lo, x.n), out);
      if (j != my) send(to_owners, static_cast<int>(j), out);
      poll();
    }
  };
  auto reduce_piece = [&](std::size_t k) {
    const span_of_piece x = piece_of(mine, k);
    if (x.n == 0) return;
    const std::span<float> acc = std::span<float>(s.acc).subspan(x.lo, x.n);
    const std::span<float> tmp = std::span<float>(s.tmp).subspan(x.lo, x.n);
    for (std::size_t i = 0; i < pp; ++i) {  // every rank's version of the piece, in rank order
      if (i != my) from_ranks[k * pp + i].wait(to_owners.until);
      const std::span<std::byte> in =
          i == my ? bytes(s.send, placed.displs[my] + x.at, x.len) : bytes(s.recv, i * enc[my] + x.at, x.len);
      if (i == 0) {
        codec.decode(in, acc);
        continue;
      }
      codec.decode(in, tmp);
      for (std::size_t e = 0; e < x.n; ++e) acc[e] += tmp[e];
    }
    const auto divisor = static_cast<float>(p);
    for (float& v : acc) v = v / divisor;
    const std::span<std::byte> out = bytes(s.gathered, placed.displs[my] + x.at, x.len);
    codec.encode_reduced(x.lo, std::span<const float>(acc), out);
    for (std::size_t j = 0; j < pp; ++j)
      if (j != my) send(to_all, static_cast<int>(j), out);
  };
  auto decode_piece = [&](std::size_t k) {
    for (std::size_t j = 0; j < pp; ++j) {
      const span_of_piece x = piece_of(parts.counts[j], k);
      if (x.n == 0) continue;
      if (j != my) reduced[k * pp + j].wait(to_all.until);
      codec.decode(bytes(s.gathered, placed.displs[j] + x.at, x.len), data.subspan(parts.displs[j] + x.lo, x.n));
      after(parts.displs[j] + x.lo, x.n);
    }
  };
  for (std::size_t k = 0; k < pieces; ++k) {
    encode_piece(k);
    if (k >= 1) reduce_piece(k - 1);
    if (k >= 2) decode_piece(k - 2);
  }
  reduce_piece(pieces - 1);
  decode_piece(pieces - 2);
  decode_piece(pieces - 1);
  wait_all(sent, to_all.until);
  return sent_bytes;
}

/// Bytes compressed_average makes one rank send for an encoding of E bytes of the whole model.
constexpr double compressed_average_bytes(double encoded_model_bytes, int p) noexcept {
  return p <= 1 ? 0.0 : 2.0 * (p - 1) / p * encoded_model_bytes;
}

}  // namespace flexpar::relax::detail
