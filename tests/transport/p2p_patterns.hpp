// Point-to-point patterns shared by the in-process and the mpiexec tests: every transport must
// deliver the same bytes for the same pattern.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <span>
#include <vector>

#include <flexpar/comm/communicator.hpp>

namespace flexpar::testing_support {

/// The byte at `index` of the message `from` sends `to` (distinct per pair, size and position).
inline std::byte pattern_byte(int from, int to, std::size_t size, std::size_t index) {
  return static_cast<std::byte>((static_cast<std::size_t>(from) * 131u + static_cast<std::size_t>(to) * 31u +
                                 size * 17u + index * 7u + (index >> 12)) &
                                0xffu);
}

/// pattern_byte, a 4 KiB block at a time at memcpy speed (the 64 MiB messages of every pair in an
/// 8-rank world are gigabytes to make and check): within block b the bytes are (c + b + 7 j) mod 256
/// for j = index mod 4096 (7 * 4096 * b is 0 mod 256); 7 is odd, so that is the sequence 7 k mod 256
/// started at k = (c + b) * 7^-1 (7 * 183 = 5 * 256 + 1). `f(offset, expected bytes)` sees each block.
/// The test p2p_patterns.message_is_pattern_byte_at_every_index holds both to pattern_byte.
inline constexpr std::size_t pattern_block = 4096;

/// 7 k mod 256 for k in [0, 4096 + 256): every block of the pattern is a window of it (one table for
/// every caller, not one per instantiation of for_each_pattern_block).
inline std::span<const std::byte> pattern_sevens() {
  static const std::vector<std::byte> sevens = [] {
    std::vector<std::byte> t(pattern_block + 256);
    for (std::size_t k = 0; k < t.size(); ++k) t[k] = static_cast<std::byte>((k * 7u) & 0xffu);
    return t;
  }();
  return sevens;
}

template <class F>
void for_each_pattern_block(int from, int to, std::size_t size, F&& f) {
  constexpr std::size_t block = pattern_block;
  const std::span<const std::byte> sevens = pattern_sevens();
  const std::size_t c = static_cast<std::size_t>(from) * 131u + static_cast<std::size_t>(to) * 31u + size * 17u;
  for (std::size_t start = 0, b = 0; start < size; start += block, ++b)
    f(start, sevens.subspan(((c + b) * 183u) & 0xffu, std::min(block, size - start)));
}

/// Writes the message `from` sends `to` of `m.size()` bytes into `m`.
inline void fill_pattern(std::span<std::byte> m, int from, int to) {
  for_each_pattern_block(from, to, m.size(), [&](std::size_t at, std::span<const std::byte> want) {
    std::memcpy(m.data() + at, want.data(), want.size());
  });
}

inline std::vector<std::byte> pattern_message(int from, int to, std::size_t size) {
  std::vector<std::byte> m(size);
  fill_pattern(m, from, to);
  return m;
}

/// Compares byte for byte (with no copy of the expected message); on a difference reports the first
/// differing index.
inline void expect_message(std::span<const std::byte> got, std::size_t received, int from, int to, std::size_t size) {
  ASSERT_EQ(received, size) << "message " << from << " -> " << to;
  ASSERT_GE(got.size(), size) << "message " << from << " -> " << to;
  std::size_t first_bad = size;
  for_each_pattern_block(from, to, size, [&](std::size_t at, std::span<const std::byte> want) {
    if (first_bad == size && std::memcmp(got.data() + at, want.data(), want.size()) != 0)
      first_bad =
          at + static_cast<std::size_t>(std::mismatch(want.begin(), want.end(), got.begin() + at).first - want.begin());
  });
  if (first_bad != size)
    FAIL() << "message " << from << " -> " << to << " of " << size << " bytes differs first at byte " << first_bad;
}

/// Ring: rank r sends to r+1 and receives from r-1 (itself at size 1).
inline void ring_exchange(communicator& comm, std::size_t size, tag_t tag) {
  transport& t = comm.transport();
  const int p = t.size(), me = t.rank(), next = (me + 1) % p, prev = (me + p - 1) % p;
  const std::vector<std::byte> out = pattern_message(me, next, size);
  std::vector<std::byte> in(size);
  request r = t.irecv(prev, tag, in);
  request s = t.isend(next, tag, out);
  s.wait(comm.default_deadline());
  r.wait(comm.default_deadline());
  expect_message(in, r.bytes(), prev, me, size);
}

/// All pairs, self included: in round k rank r sends to r+k and receives from r-k, with every
/// round's messages in flight together when `all_at_once` (small sizes) or one round at a time. The
/// buffers are made once and refilled each round (fresh 64 MiB allocations each round spent most of
/// the test in page faults).
inline void all_pairs_exchange(communicator& comm, std::size_t size, tag_t tag, bool all_at_once) {
  transport& t = comm.transport();
  const int p = t.size(), me = t.rank();
  const int rounds_in_flight = all_at_once ? p : 1;
  std::vector<std::vector<std::byte>> outs(static_cast<std::size_t>(rounds_in_flight), std::vector<std::byte>(size));
  std::vector<std::vector<std::byte>> ins = outs;
  for (int first = 0; first < p; first += rounds_in_flight) {
    const int last = std::min(p, first + rounds_in_flight);
    std::vector<request> recvs, sends;
    for (int k = first; k < last; ++k) {
      std::vector<std::byte>& in = ins[static_cast<std::size_t>(k - first)];
      std::fill(in.begin(), in.end(), std::byte{0xA5});  // last round's bytes must not pass for this one's
      fill_pattern(outs[static_cast<std::size_t>(k - first)], me, (me + k) % p);
    }
    for (int k = first; k < last; ++k)
      recvs.push_back(t.irecv((me + p - k) % p, tag, ins[static_cast<std::size_t>(k - first)]));
    for (int k = first; k < last; ++k)
      sends.push_back(t.isend((me + k) % p, tag, outs[static_cast<std::size_t>(k - first)]));
    wait_all(sends, comm.default_deadline());
    wait_all(recvs, comm.default_deadline());
    for (int k = first; k < last; ++k)
      expect_message(ins[static_cast<std::size_t>(k - first)], recvs[static_cast<std::size_t>(k - first)].bytes(),
                     (me + p - k) % p, me, size);
  }
}

/// Several messages with one tag between one pair arrive in the order they were sent, and a
/// receive buffer larger than the message reports the size received.
inline void ordered_same_tag(communicator& comm) {
  transport& t = comm.transport();
  const int p = t.size(), me = t.rank(), next = (me + 1) % p, prev = (me + p - 1) % p;
  constexpr int count = 16;
  std::vector<std::vector<std::byte>> outs, ins;
  std::vector<request> recvs, sends;
  for (int i = 0; i < count; ++i) {
    outs.push_back(pattern_message(me, next, static_cast<std::size_t>(i) * 3));
    ins.emplace_back(static_cast<std::size_t>(count) * 3 + 5);  // room for any of them
  }
  for (int i = 0; i < count; ++i) recvs.push_back(t.irecv(prev, 5, ins[static_cast<std::size_t>(i)]));
  for (int i = 0; i < count; ++i) sends.push_back(t.isend(next, 5, outs[static_cast<std::size_t>(i)]));
  wait_all(sends, comm.default_deadline());
  wait_all(recvs, comm.default_deadline());
  for (int i = 0; i < count; ++i) {
    const std::size_t size = static_cast<std::size_t>(i) * 3;
    ASSERT_EQ(recvs[static_cast<std::size_t>(i)].bytes(), size) << "message " << i << " arrived out of order";
    expect_message(ins[static_cast<std::size_t>(i)], size, prev, me, size);
  }
}

/// Messages with different tags between one pair are matched by tag, not by arrival: tags 7, 8, 9
/// sent in that order (each its own size) into receives posted for 9, 8, 7 land each in its own.
inline void matched_by_tag(communicator& comm) {
  transport& t = comm.transport();
  const int p = t.size(), me = t.rank(), next = (me + 1) % p, prev = (me + p - 1) % p;
  const std::array<tag_t, 3> tags{7, 8, 9};
  std::vector<std::vector<std::byte>> outs, ins;
  for (std::size_t k = 0; k < tags.size(); ++k) {
    outs.push_back(pattern_message(me, next, 100 + 10 * k));
    ins.emplace_back(200);  // room for any of them
  }
  std::vector<request> recvs, sends;
  for (std::size_t k = tags.size(); k-- > 0;) recvs.push_back(t.irecv(prev, tags[k], ins[k]));
  for (std::size_t k = 0; k < tags.size(); ++k) sends.push_back(t.isend(next, tags[k], outs[k]));
  wait_all(sends, comm.default_deadline());
  wait_all(recvs, comm.default_deadline());
  for (std::size_t k = 0; k < tags.size(); ++k) {
    const std::size_t size = 100 + 10 * k, at = tags.size() - 1 - k;  // recvs were posted last tag first
    ASSERT_EQ(recvs[at].bytes(), size) << "the receive for tag " << tags[k] << " got another tag's message";
    expect_message(ins[k], size, prev, me, size);
  }
}

}  // namespace flexpar::testing_support
