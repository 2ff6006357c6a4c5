// flexpar/collective/exchange_shared_memory.hpp — a data exchange among the ranks of one node in
// rounds through the communicator's shared-memory segment, each round read while it is in cache.
//
// Why: some exchanges move data that is strided on one side (S(i) -> B places every received block
// as strided rows; S(i) -> S(j) sends column blocks of a row-split shard). Through the transport such
// data is packed into, or received into, a staging buffer: one more pass over it, and the transport
// itself copies each chunk from the sender's memory (UCX cma) or twice through its own buffers. Here
// the sender packs a chunk straight into its round buffer, where it stays in cache, and the receiver
// places it from there: what is read from memory is the sender's data, once; what is written to
// memory is the receiver's result, once (streaming stores for large results) — the memory traffic
// of a single copy, with the packing and placing done in cache.
//
// Script (the same flags and round buffers as the shared-memory allreduce; round g on rank r):
//   step 1 (reuse): wait until every peer has consumed round g - depth (my round buffer is free)
//   step 2 (fill):  fill(g, my round buffer); published = g+1
//   step 3 (drain): for q = r+1, r+2, ... (mod p): wait for q's publish of g; drain(q, g, q's buffer)
//   step 4 (free):  consumed = reduced = g+1
// Cost per round: 2 flag hand-offs; the bytes filled are written to cache and read there by peers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <flexpar/collective/allgather_pairwise_placed.hpp>
#include <flexpar/collective/allreduce_shared_memory.hpp>
#include <flexpar/core/streaming_copy.hpp>

namespace flexpar {

namespace detail {
/// Bytes of one destination's section of an alltoall round buffer: p per buffer, 64-byte aligned.
constexpr std::size_t alltoall_section_bytes(int p) noexcept {
  return shm_round_bytes / static_cast<std::size_t>(p) / 64 * 64;
}
}  // namespace detail

/// allgather of `bytes` in total over p ranks of one node through the segment: two flag hand-offs
/// per round (a chunk of the largest block, staging's default), my block copied into my round
/// buffer, every other block copied out of its owner's.
constexpr cost allgather_shared_memory_cost(int p, double bytes) noexcept {
  if (p <= 1) return {};
  const double rounds = detail::ceil_div(bytes / p, static_cast<double>(staging{}.chunk_bytes));
  return {.shm_steps = 2 * (rounds < 1 ? 1 : rounds), .copy_bytes = bytes};
}

/// alltoall of a `bytes` buffer per rank over p ranks of one node through the segment: two flag
/// hand-offs per round, the whole buffer packed into my round buffer and the whole result placed.
constexpr cost alltoall_shared_memory_cost(int p, double bytes) noexcept {
  if (p <= 1) return {};
  const double section = static_cast<double>(std::min(staging{}.chunk_bytes, detail::alltoall_section_bytes(p)));
  const double rounds = detail::ceil_div(bytes / p, section);
  return {.shm_steps = 2 * (rounds < 1 ? 1 : rounds), .copy_bytes = 2 * bytes};
}

/// reduce_scatter of a `bytes` buffer per rank over p ranks of one node through the segment: two
/// flag hand-offs per round; (p-1)/p of the buffer packed into my round buffer (in cache) and reduced
/// out of the peers' ((p-1) sections of my block's chunk), my block read once and my result written once.
constexpr cost reduce_scatter_shared_memory_cost(int p, double bytes) noexcept {
  if (p <= 1) return {};
  const double section = static_cast<double>(std::min(staging{}.chunk_bytes, detail::alltoall_section_bytes(p)));
  const double rounds = detail::ceil_div(bytes / p, section);
  const double share = (p - 1) * bytes / p;
  return {.reduce_bytes = share, .shm_steps = 2 * (rounds < 1 ? 1 : rounds), .copy_bytes = share};
}

}  // namespace flexpar

namespace flexpar::detail {

/// The communicator's segment when it has at least two ranks, all of them on my node, and every rank
/// mapped it; nullptr otherwise (the same answer on every rank). Collective on its first call.
inline shared_memory_segment* one_node_segment(communicator& comm) {
  if (comm.size() < 2 || comm.topology().node_count() != 1) return nullptr;
  return shared_memory_of(comm);
}

/// For an explicit algorithm::shared_memory: usage_error unless one_node_segment(comm) (p == 1 passes).
inline void require_one_node_segment(communicator& comm, std::string_view op) {
  if (comm.size() == 1 || one_node_segment(comm)) return;
  throw usage_error("[rank " + std::to_string(comm.rank()) + "] " + std::string(op) +
                    "(shared_memory): the communicator spans " + std::to_string(comm.topology().node_count()) +
                    " nodes, or a rank could not map the shared-memory segment (is /dev/shm available to every "
                    "rank?); use automatic");
}

/// Whether an exchange staged by `s` goes through the segment (shared_memory: it must exist).
inline bool through_shared_memory(communicator& comm, const staging& s, const char* op) {
  if (s.path == staged_path::transport) return false;
  if (one_node_segment(comm)) return true;
  if (s.path == staged_path::shared_memory && comm.size() > 1)
    throw usage_error("[rank " + std::to_string(comm.rank()) + "] " + op +
                      ": staging::path is shared_memory, but the communicator spans " +
                      std::to_string(comm.topology().node_count()) +
                      " nodes or a rank could not map the segment; use automatic or transport");
  return false;
}

/// Runs `rounds` rounds of the script above. fill(k, buffer) writes round k of this call (k = 0 ..
/// rounds-1; g counts on from the segment's earlier rounds) into my round buffer (shm_round_bytes,
/// 64-byte aligned); drain(q, k, buffer) reads rank q's round k from q's. Every rank passes the
/// same `rounds`; every wait ends at the communicator's deadline with a timeout_error naming `op`,
/// the peer and the round.
template <class Fill, class Drain>
void shared_memory_rounds(communicator& comm, std::uint64_t rounds, const char* op, Fill&& fill, Drain&& drain) {
  const int p = comm.size(), me = comm.rank();
  shared_memory_segment* segment = shared_memory_of(comm);
  collective_context& ctx = context_of(comm);
  const shm_geometry shm{segment->data(), p};
  const deadline until = comm.default_deadline();
  for (std::uint64_t k = 0; k < rounds; ++k) {
    const std::uint64_t g = ctx.shm_rounds + k;
    if (g >= shm_depth)
      wait_for_peers(
          comm, [&](int q) { return shm.consumed(q); }, g - shm_depth + 1, op, "consuming", until);
    fill(k, std::span<std::byte>(shm.round_buffer(me, g), shm_round_bytes));
    shm.published(me).publish(g + 1);
    for (int step = 1; step < p; ++step) {
      const int q = modulo(me + step, p);
      shm.published(q).wait_until_reached(g + 1, until, [&] {
        return "[rank " + std::to_string(me) + "] " + op + ": rank " + std::to_string(q) + " publishing round " +
               std::to_string(k) + " of " + std::to_string(rounds);
      });
      drain(q, k, std::span<const std::byte>(shm.round_buffer(q, g), shm_round_bytes));
    }
    shm.reduced(me).publish(g + 1);
    shm.consumed(me).publish(g + 1);
  }
  ctx.shm_rounds += rounds;
}

/// Chunks of a block of `count` elements: chunk k is [k * chunk, k * chunk + size(count, k)).
struct round_chunks {
  std::size_t chunk;
  [[nodiscard]] std::size_t rounds(std::size_t count) const noexcept { return (count + chunk - 1) / chunk; }
  [[nodiscard]] std::size_t size(std::size_t count, std::uint64_t k) const noexcept {
    return k * chunk < count ? std::min(chunk, count - k * chunk) : 0;
  }
};

/// Chunks for an allgather: one block per round buffer, min(s.chunk_bytes, shm_round_bytes).
template <class T>
round_chunks allgather_round_chunks(const staging& s) {
  return {std::max<std::size_t>(1, std::min(s.chunk_bytes, shm_round_bytes) / sizeof(T))};
}

/// Chunks for an alltoall: a chunk fills at most one section (alltoall_section_bytes).
template <class T>
round_chunks alltoall_round_chunks(const staging& s, int p) {
  return {std::max<std::size_t>(1, std::min(s.chunk_bytes, alltoall_section_bytes(p)) / sizeof(T))};
}

/// allgather_v_placed through the segment: in round k every rank copies chunk k of its block into
/// its round buffer and places it from there; then it places chunk k of every peer's block from the
/// peer's round buffer. As many rounds as the largest block has chunks.
template <element T, class Place>
void shared_memory_allgather_placed(communicator& comm, std::span<const T> mine, const block_layout& layout,
                                    const staging& s, Place&& place) {
  const int p = comm.size(), me = comm.rank();
  const round_chunks chunks = allgather_round_chunks<T>(s);
  std::size_t rounds = 0;
  for (int q = 0; q < p; ++q) rounds = std::max(rounds, chunks.rounds(layout.count(q)));
  shared_memory_rounds(
      comm, rounds, "allgather(shared_memory)",
      [&](std::uint64_t k, std::span<std::byte> buffer) {
        const std::size_t m = chunks.size(mine.size(), k);
        if (m == 0) return;
        T* slot = reinterpret_cast<T*>(buffer.data());
        std::memcpy(slot, mine.data() + k * chunks.chunk, m * sizeof(T));
        place(me, k * chunks.chunk, std::span<const T>(slot, m));
      },
      [&](int q, std::uint64_t k, std::span<const std::byte> buffer) {
        const std::size_t m = chunks.size(layout.count(q), k);
        if (m != 0) place(q, k * chunks.chunk, std::span<const T>(reinterpret_cast<const T*>(buffer.data()), m));
      });
}

/// A contiguous copy for the placing of a plain collective on `comm`: streaming stores into a
/// destination in memory (in_memory: it leaves the cache before anyone reads it), memcpy otherwise.
template <class T>
void place_contiguous(const communicator& comm, T* to, const T* from, std::size_t n, std::size_t destination_bytes) {
  if (in_memory(destination_bytes, comm.settings().streaming_min_bytes))
    copy_streaming(reinterpret_cast<std::byte*>(to), reinterpret_cast<const std::byte*>(from), n * sizeof(T));
  else if (n != 0)
    std::memcpy(to, from, n * sizeof(T));
}

/// allgather in place through the segment (my block is at its place in `data` already).
template <element T>
void shared_memory_allgather(communicator& comm, std::span<T> data, const block_layout& layout) {
  const int me = comm.rank();
  shared_memory_allgather_placed<T>(comm, std::span<const T>(layout.of(data, me)), layout, staging{},
                                    [&](int block, std::size_t offset, std::span<const T> piece) {
                                      if (block == me) return;  // in place already
                                      place_contiguous(comm, layout.of(data, block).data() + offset, piece.data(),
                                                       piece.size(), data.size_bytes());
                                    });
}

/// Where round k's chunk of the block from rank `from` to rank `to` lies in that block: elements
/// [offset, offset + count); count 0 when the block has no chunk in round k.
struct round_piece {
  std::size_t offset = 0, count = 0;
};

/// Element chunks of `chunks.chunk`: the geometry of an alltoall whose blocks hold count(from, to)
/// elements.
template <class Count>
auto element_pieces(const round_chunks& chunks, Count&& count) {
  return [chunks, count](int from, int to, std::uint64_t k) {
    return round_piece{k * chunks.chunk, chunks.size(count(from, to), k)};
  };
}

/// An alltoall through the segment, packed and placed by the caller: my round buffer has one
/// section per rank (alltoall_section_bytes); in round k
///   fill:  pack(k, sections) writes round k's chunk of my block for each rank q into sections[q]
///          (in cache; sections[q].size() = piece(me, q, k).count), in whatever order reads my
///          data best; my own section is handed to place(me, offset, ...) at once;
///   drain: place(q, offset, section `me` of q's round buffer) for every peer q.
/// piece(from, to, k) must be the same function on every rank, each piece at most a section, and
/// `rounds` the same on every rank. In place is safe when the block I receive from q occupies the
/// place of the block I send to q: round k packs its chunk of every block before it places any.
template <element T, class Piece, class Pack, class Place>
void shared_memory_alltoall_placed(communicator& comm, std::size_t rounds, Piece&& piece, Pack&& pack, Place&& place,
                                   const char* op) {
  const int p = comm.size(), me = comm.rank();
  const std::size_t section = alltoall_section_bytes(p);
  std::vector<std::span<T>> sections(static_cast<std::size_t>(p));
  shared_memory_rounds(
      comm, rounds, op,
      [&](std::uint64_t k, std::span<std::byte> buffer) {
        for (int q = 0; q < p; ++q)
          sections[static_cast<std::size_t>(q)] = std::span<T>(
              reinterpret_cast<T*>(buffer.data() + static_cast<std::size_t>(q) * section), piece(me, q, k).count);
        pack(k, std::span<const std::span<T>>(sections));
        const round_piece own = piece(me, me, k);
        if (own.count != 0) place(me, own.offset, std::span<const T>(sections[static_cast<std::size_t>(me)]));
      },
      [&](int q, std::uint64_t k, std::span<const std::byte> buffer) {
        const round_piece from_q = piece(q, me, k);
        if (from_q.count != 0)
          place(q, from_q.offset,
                std::span<const T>(reinterpret_cast<const T*>(buffer.data() + static_cast<std::size_t>(me) * section),
                                   from_q.count));
      });
}

/// alltoall of p blocks of `count` elements through the segment; `in` may be `out` (see above).
template <element T>
void shared_memory_alltoall(communicator& comm, std::span<const T> in, std::span<T> out, std::size_t count) {
  if (comm.size() == 1) {
    if (out.data() != in.data()) std::memcpy(out.data(), in.data(), count * sizeof(T));
    return;
  }
  const round_chunks chunks = alltoall_round_chunks<T>(staging{}, comm.size());
  shared_memory_alltoall_placed<T>(
      comm, chunks.rounds(count), element_pieces(chunks, [count](int, int) { return count; }),
      [&](std::uint64_t k, std::span<const std::span<T>> sections) {
        for (std::size_t q = 0; q < sections.size(); ++q)
          if (!sections[q].empty())
            std::memcpy(sections[q].data(), in.data() + q * count + k * chunks.chunk, sections[q].size_bytes());
      },
      [&](int q, std::size_t offset, std::span<const T> piece) {
        place_contiguous(comm, out.data() + static_cast<std::size_t>(q) * count + offset, piece.data(), piece.size(),
                         out.size_bytes());
      },
      "alltoall(shared_memory)");
}

/// dst = a (f) b for n elements, where `dst` lies at or before `a` (a - dst = gap >= 0) or apart
/// from it: in pieces no longer than the gap, so that no piece overwrites an element of `a` that it
/// has yet to read (a gap of 0 is in place). The kernel call of reduce_into_forward, for callers
/// that visit the op once for many short runs.
template <element T, class Op>
void reduce_elements_forward(T* dst, const T* a, const T* b, std::size_t n, Op f) noexcept {
  if (dst + n <= a || a + n <= dst || dst == a) {
    reduce_elements(dst, a, b, n, f);
    return;
  }
  const auto gap = static_cast<std::size_t>(a - dst);
  for (std::size_t at = 0; at < n; at += gap) reduce_elements(dst + at, a + at, b + at, std::min(gap, n - at), f);
}

/// out = a (op) b, element by element, where `out` lies at or before `a` or apart from it
/// (reduce_elements_forward).
template <element T>
void reduce_into_forward(std::span<T> out, std::span<const T> a, std::span<const T> b, reduce_op op) {
  check_same_length("reduce_into_forward", out.size(), a.size());
  check_same_length("reduce_into_forward", out.size(), b.size());
  visit_op(op, [&](auto f) { reduce_elements_forward(out.data(), a.data(), b.data(), out.size(), f); });
}

/// reduce_scatter through the segment, packed by the caller, in rounds of the alltoall's sections.
/// piece(q, k) is where round k's chunk of block q lies in that block (the same function on every
/// rank, each piece at most a section; `rounds` the same on every rank). Round k on rank r:
///   fill:  pack(k, sections) writes chunk k of every peer q's block into sections[q] of my round
///          buffer (sections[q].size() = piece(q, k).count), in whatever order reads my data best
///          (sections[r], my own, is not read: my chunk stays in my data);
///   drain: for q = r+1, r+2, ...: my chunk of `out` (piece(r, k)) (op)= section r of q's buffer;
///          for the first peer, first(k, chunk of `out`, theirs) writes it as my chunk k, read from
///          my data, (op) theirs.
/// `out` (the length of my block) is apart from my data, or my block itself, or lies before it at
/// the front of the buffer the blocks lie in (result_at::front): then round k may overwrite only
/// elements that rounds k and earlier have packed (every layout here keeps each element at or after
/// its index in its block), and a `first` that reads my data in place reduces forward in pieces
/// ahead of overwriting (reduce_into_forward). Every rank reduces its block in the same peer order
/// (r+1, r+2, ...), so the result does not depend on timing.
template <element T, class Piece, class Pack, class First>
void shared_memory_reduce_scatter_packed(communicator& comm, std::size_t rounds, Piece&& piece, Pack&& pack,
                                         First&& first, std::span<T> out, reduce_op op, const char* op_name) {
  const int p = comm.size(), me = comm.rank();
  const std::size_t section = alltoall_section_bytes(p);
  const int first_peer = modulo(me + 1, p);
  std::vector<std::span<T>> sections(static_cast<std::size_t>(p));
  shared_memory_rounds(
      comm, rounds, op_name,
      [&](std::uint64_t k, std::span<std::byte> buffer) {
        for (int q = 0; q < p; ++q)
          sections[static_cast<std::size_t>(q)] = std::span<T>(
              reinterpret_cast<T*>(buffer.data() + static_cast<std::size_t>(q) * section), piece(q, k).count);
        pack(k, std::span<const std::span<T>>(sections));
      },
      [&](int q, std::uint64_t k, std::span<const std::byte> buffer) {
        const round_piece own = piece(me, k);
        if (own.count == 0) return;
        const std::span<const T> theirs(
            reinterpret_cast<const T*>(buffer.data() + static_cast<std::size_t>(me) * section), own.count);
        const std::span<T> result = out.subspan(own.offset, own.count);
        if (q == first_peer)
          first(k, result, theirs);
        else
          reduce_into(result, theirs, op);
      });
}

/// reduce_scatter of the contiguous blocks of `in` (layout) through the segment, in element chunks
/// of the alltoall's sections: round k copies chunk k of every peer's block into its section and
/// reduces my chunk k from `in` itself. `out` is apart from `in`, or my block of it (in place), or
/// its front (result_at::front: every element lies at or after its index in its block).
template <element T>
void shared_memory_reduce_scatter(communicator& comm, std::span<const T> in, const block_layout& layout,
                                  std::span<T> out, reduce_op op) {
  const int p = comm.size(), me = comm.rank();
  const round_chunks chunks = alltoall_round_chunks<T>(staging{}, p);
  std::size_t rounds = 0;
  for (int q = 0; q < p; ++q) rounds = std::max(rounds, chunks.rounds(layout.count(q)));
  const std::span<const T> mine = layout.of(in, me);
  auto piece = element_pieces(chunks, [&](int q, int) { return layout.count(q); });
  shared_memory_reduce_scatter_packed<T>(
      comm, rounds, [&](int q, std::uint64_t k) { return piece(q, q, k); },
      [&](std::uint64_t k, std::span<const std::span<T>> sections) {
        for (int q = 0; q < p; ++q) {
          const std::span<T> to = sections[static_cast<std::size_t>(q)];
          if (q != me && !to.empty())
            std::memcpy(to.data(), layout.of(in, q).data() + k * chunks.chunk, to.size_bytes());
        }
      },
      [&](std::uint64_t k, std::span<T> result, std::span<const T> theirs) {
        reduce_into_forward(result, mine.subspan(k * chunks.chunk, result.size()), theirs, op);
      },
      out, op, "reduce_scatter(shared_memory)");
}

}  // namespace flexpar::detail
