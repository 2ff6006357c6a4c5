// Point-to-point patterns shared by the in-process and the mpiexec tests: every transport must
// deliver the same bytes for the same pattern.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <numeric>
#include <vector>

#include <flexpar/comm/communicator.hpp>

namespace flexpar::testing_support {

/// The byte at `index` of the message `from` sends `to` (distinct per pair, size and position).
inline std::byte pattern_byte(int from, int to, std::size_t size, std::size_t index) {
  return static_cast<std::byte>((static_cast<std::size_t>(from) * 131u + static_cast<std::size_t>(to) * 31u +
                                 size * 17u + index * 7u + (index >> 12)) &
                                0xffu);
}

inline std::vector<std::byte> pattern_message(int from, int to, std::size_t size) {
  std::vector<std::byte> m(size);
  for (std::size_t i = 0; i < size; ++i) m[i] = pattern_byte(from, to, size, i);
  return m;
}

/// Compares byte for byte; on a difference reports the first differing index.
inline void expect_message(const std::vector<std::byte>& got, std::size_t received, int from, int to,
                           std::size_t size) {
  ASSERT_EQ(received, size) << "message " << from << " -> " << to;
  const std::vector<std::byte> want = pattern_message(from, to, size);
  if (size > 0 && std::memcmp(got.data(), want.data(), size) != 0) {  // (memcmp of null pointers is undefined)
    std::size_t i = 0;
    while (got[i] == want[i]) ++i;
    FAIL() << "message " << from << " -> " << to << " of " << size << " bytes differs first at byte " << i;
  }
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
/// round's messages in flight together when `all_at_once` (small sizes) or one round at a time.
inline void all_pairs_exchange(communicator& comm, std::size_t size, tag_t tag, bool all_at_once) {
  transport& t = comm.transport();
  const int p = t.size(), me = t.rank();
  const int rounds_in_flight = all_at_once ? p : 1;
  for (int first = 0; first < p; first += rounds_in_flight) {
    const int last = std::min(p, first + rounds_in_flight);
    std::vector<std::vector<std::byte>> outs, ins;
    std::vector<request> recvs, sends;
    for (int k = first; k < last; ++k) {
      ins.emplace_back(size);
      outs.push_back(pattern_message(me, (me + k) % p, size));
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

}  // namespace flexpar::testing_support
