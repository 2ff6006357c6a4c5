// flexpar/collective/allgather_pairwise_placed.hpp — an allgather whose blocks the caller places,
// streamed through a few cache-sized staging slots.
//
// Why: when a rank's block is not contiguous in the destination (S(i) -> B boxing with i not the
// outermost tensor axis), gathering into a full-size staging buffer and unpacking it afterwards reads
// and writes all n bytes once more, from memory. Here each chunk lands in a small slot and is placed
// (unpacked) at once, while it is still in cache, as the next chunks are in flight; the destination
// is written once, as by the bare allgather.
//
// Pairwise, not a ring: a ring forwards what it receives, so a slot would stay busy until the next
// rank has taken the chunk, and with every rank's slots full the ring would wait on itself. Sent
// straight from my input to every peer, nothing I send waits on a slot, and a slot is freed by my own
// placing alone. The bytes are the ring's: each rank sends its block p-1 times and receives p-1
// blocks, in p-1 steps.
//
// Script (p ranks, my block r, every block cut into chunks of staging::chunk_bytes):
//   step 0: my block to every other rank, chunk by chunk, straight from my input (all posted now);
//   step s = 1 .. p-1: receive block r-s from rank r-s chunk by chunk, each into the next free slot
//           (slots-1 receives posted ahead), and place it as soon as it lands;
//   meanwhile: my own block is placed a chunk at a time whenever the next chunk has not landed yet.
// Cost: (p-1) alpha + (p-1)/p n beta, plus the placing pass over n bytes of memory (copy_bytes),
// which overlaps the transfers.
#pragma once

#include <algorithm>
#include <vector>

#include <flexpar/collective/context.hpp>

namespace flexpar {

/// Which way a staged exchange goes: `automatic` takes the shared-memory segment when every rank
/// of the communicator is on one node and mapped it (collective/exchange_shared_memory.hpp), the
/// transport otherwise; the other two force one way (tests; shared_memory fails where it cannot be).
enum class staged_path { automatic, transport, shared_memory };

/// How a streamed collective stages what it packs or unpacks: chunks of `chunk_bytes` through
/// `slots` buffers, small enough to stay in cache. Every rank of a call must pass the same value.
struct staging {
  std::size_t chunk_bytes = std::size_t{256} << 10;  ///< bytes per message and per slot (per round
                                                     ///< and peer through shared memory)
  std::size_t slots = 4;                             ///< transport staging buffers (at least 2 are used)
  staged_path path = staged_path::automatic;         ///< transport or shared-memory rounds
};

/// Cost of the placed pairwise allgather of `bytes` in total over p ranks: p-1 steps of bytes/p on
/// the transport, and the placing pass over all of `bytes` in memory.
constexpr cost allgather_pairwise_placed_cost(int p, double bytes) noexcept {
  return {static_cast<double>(p - 1), (p - 1) * (bytes / p), 0.0, 0.0, bytes};
}

namespace detail {

/// Elements per chunk of a staging (at least 1).
template <class T>
chunking staged_chunks(const staging& s, std::size_t elements) {
  return {elements, std::max<std::size_t>(1, s.chunk_bytes / sizeof(T))};
}

/// The script above. `place(block, offset, piece)` writes elements [offset, offset + piece.size()) of
/// rank `block`'s block (layout.count(block) elements) to their places in the caller's destination;
/// it is called exactly once for every element of every block, my own included (from `mine`).
template <element T, class Place>
void pairwise_allgather_placed(call& c, std::span<const T> mine, const block_layout& layout, const staging& s,
                               Place&& place) {
  const int p = c.size, r = c.rank;
  const chunking own = staged_chunks<T>(s, mine.size());
  std::size_t own_next = 0;
  auto place_own = [&] {  // one chunk of my own block
    place(r, own.offset(own_next), own.of(mine, own_next));
    ++own_next;
  };

  // step 0: my block to every other rank, in the order they receive it (step s goes to r+s)
  std::vector<request> sends;
  for (int step = 1; step < p; ++step)
    for (std::size_t k = 0; k < own.count(); ++k)
      sends.push_back(c.t.isend(modulo(r + step, p), c.tag, bytes_of(own.of(mine, k))));

  // what arrives, in order: (from, offset, size) for steps 1 .. p-1
  struct piece {
    int from;
    std::size_t offset, size;
  };
  std::vector<piece> stream;
  for (int step = 1; step < p; ++step) {
    const int from = modulo(r - step, p);
    const chunking chunks = staged_chunks<T>(s, layout.count(from));
    for (std::size_t k = 0; k < chunks.count(); ++k) stream.push_back({from, chunks.offset(k), chunks.size(k)});
  }
  std::size_t chunk = 0;  // a slot holds the largest piece
  for (const piece& pc : stream) chunk = std::max(chunk, pc.size);
  const std::size_t slots = std::max<std::size_t>(2, s.slots);
  auto staged = scratch<T>(slots * chunk);
  auto slot_of = [&](std::size_t j) { return std::span<T>(staged.get() + (j % slots) * chunk, stream[j].size); };
  std::vector<request> landing(slots);
  std::size_t posted = 0;
  auto post = [&] {  // the next receive, into the slot of a chunk already placed
    landing[posted % slots] = c.irecv(stream[posted].from, writable_bytes_of(slot_of(posted)));
    ++posted;
  };

  // steps 1 .. p-1: receive, place
  while (posted < std::min(slots - 1, stream.size())) post();
  for (std::size_t j = 0; j < stream.size(); ++j) {
    request& arriving = landing[j % slots];
    while (own_next < own.count() && !arriving.test()) place_own();  // my block while the chunk is in flight
    arriving.wait(c.until);
    if (posted < stream.size()) post();  // into the slot of chunk j-1, placed already
    place(stream[j].from, stream[j].offset, std::span<const T>(slot_of(j)));
  }
  while (own_next < own.count()) place_own();
  wait_all(sends, c.until);
}

}  // namespace detail
}  // namespace flexpar
