// flexpar/collective/shared_memory_rounds.hpp — the round exchange through the communicator's
// shared-memory segment, public: for layers above the collectives (the SBP boxings) whose data is
// strided on one side of an exchange, and which pack and place it themselves.
//
// Why: through the transport, strided data is packed into (or received into) a staging buffer: one
// more pass over it, and the transport itself copies each chunk from the sender's memory or twice
// through its own buffers. Here the sender packs a chunk straight into its round buffer, where it
// stays in cache, and the receiver places (or reduces) it from there: what is read from memory is
// the sender's data, once; what is written to memory is the receiver's result, once — the memory
// traffic of a single copy, with the packing and placing done in cache.
//
// Script (the same flags and round buffers as the shared-memory allreduce; round g on rank r):
//   step 1 (reuse): wait until every peer has consumed round g - shm_depth (my round buffer is free)
//   step 2 (fill):  fill(g, my round buffer); published = g+1
//   step 3 (drain): for q = r+1, r+2, ... (mod p): wait for q's publish of g; drain(q, g, q's buffer)
//   step 4 (free):  consumed = reduced = g+1
// Each round's publish carries the rank's description of the call, and round 0 compares them: ranks
// that disagree throw one mismatch_error (collective/allreduce_shared_memory.hpp, "Agreement"). A
// call of 0 rounds takes one anyway, without fill or drain, to say so.
// Cost per round: 2 flag hand-offs; the bytes filled are written to cache and read there by peers
// (allgather_shared_memory_cost, alltoall_shared_memory_cost, reduce_scatter_shared_memory_cost in
// collective/exchange_shared_memory.hpp, which builds the plain collectives on these).
//
// Contract of every function here: collective over `comm` (every rank calls it, in the same order
// as its other collectives on `comm`, with the same `rounds` and the same piece geometry); `comm`'s
// ranks share one node and mapped its segment (uses_shared_memory(comm, ...) said so: usage_error
// otherwise); every wait ends at comm.default_deadline() with a timeout_error naming `op`, the peer
// and the round. The callbacks must not call into `comm`; the spans they are given are valid only
// during the call.
//
//   shared_memory_rounds                the script itself, over raw round buffers
//   shared_memory_alltoall_placed       an alltoall: the caller packs sections and places pieces
//   shared_memory_reduce_scatter_packed a reduce-scatter: the caller packs, the peers' sections reduce
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <flexpar/collective/allgather_pairwise_placed.hpp>
#include <flexpar/collective/allreduce_shared_memory.hpp>
#include <flexpar/collective/reduce_kernel.hpp>

namespace flexpar {

/// Bytes of one destination's section of an alltoall's (or reduce-scatter's) round buffer: p per
/// round buffer, 64-byte aligned.
constexpr std::size_t shared_memory_section_bytes(int p) noexcept {
  return shm_round_bytes / static_cast<std::size_t>(p) / 64 * 64;
}

/// What an exchange through the segment states about itself, for the ranks' agreement on the call
/// (beside its name and rounds): its elements, dtype and reduce op where it has them.
struct call_facts {
  std::uint64_t count = 0;      ///< elements of the whole exchange (0: not stated)
  std::optional<dtype> type;    ///< element type (nullopt: not stated)
  std::optional<reduce_op> op;  ///< reduce op (nullopt: not stated, or none)
  std::optional<int> root;      ///< root rank (nullopt: none)
  std::uint32_t layout = 0;     ///< digest of uneven block counts (block_layout_digest; 0: not stated)
  bool count_differs = false;   ///< the count differs between ranks by design (alltoall_v): not compared
};

/// The facts of an exchange of `count` elements of T, with its reduce op, root and layout digest
/// where it has them.
template <element T>
call_facts facts_of(std::uint64_t count, std::optional<reduce_op> op = std::nullopt,
                    std::optional<int> root = std::nullopt, std::uint32_t layout = 0) {
  call_facts f;
  f.count = count;
  f.type = dtype_of<T>;
  f.op = op;
  f.root = root;
  f.layout = layout;
  return f;
}

/// Chunks of a block of `count` elements: chunk k is [k * chunk, k * chunk + size(count, k)).
struct round_chunks {
  std::size_t chunk;  ///< elements per chunk (at least 1)
  /// Chunks of a block of `count` elements.
  [[nodiscard]] std::size_t rounds(std::size_t count) const noexcept { return (count + chunk - 1) / chunk; }
  /// Elements of chunk k of a block of `count` (0 past its end).
  [[nodiscard]] std::size_t size(std::size_t count, std::uint64_t k) const noexcept {
    return k * chunk < count ? std::min(chunk, count - k * chunk) : 0;
  }
};

/// Chunks for an allgather of T: one chunk per round buffer, min(s.chunk_bytes, shm_round_bytes).
template <class T>
round_chunks allgather_round_chunks(const staging& s) {
  return {std::max<std::size_t>(1, std::min(s.chunk_bytes, shm_round_bytes) / sizeof(T))};
}

/// Chunks for an alltoall or reduce-scatter of T over p ranks: a chunk fills at most one section
/// (shared_memory_section_bytes).
template <class T>
round_chunks alltoall_round_chunks(const staging& s, int p) {
  return {std::max<std::size_t>(1, std::min(s.chunk_bytes, shared_memory_section_bytes(p)) / sizeof(T))};
}

/// Where round k's chunk of a block lies in that block: elements [offset, offset + count); count 0
/// when the block has no chunk in round k.
struct round_piece {
  std::size_t offset = 0;  ///< first element of the chunk in its block
  std::size_t count = 0;   ///< elements of the chunk
};

/// Element chunks of `chunks.chunk`: the piece geometry piece(from, to, k) of an alltoall whose
/// blocks hold count(from, to) elements.
template <class Count>
auto element_pieces(const round_chunks& chunks, Count&& count) {
  return [chunks, count](int from, int to, std::uint64_t k) {
    return round_piece{k * chunks.chunk, chunks.size(count(from, to), k)};
  };
}

namespace detail {

/// The communicator's segment when it has at least two ranks, all of them on my node, and every rank
/// mapped it; nullptr otherwise (the same answer on every rank). Collective on its first call.
inline shared_memory_segment* one_node_segment(communicator& comm) {
  if (comm.size() < 2 || comm.topology().node_count() != 1) return nullptr;
  return shared_memory_of(comm);
}

}  // namespace detail

/// Whether an exchange staged by `s` goes through the segment: false for staged_path::transport;
/// for automatic, whether `comm` has two ranks or more, all on one node, that mapped the segment; for
/// shared_memory the same, and a usage_error naming `op` where it cannot (p == 1 answers false).
/// Collective on its first call (the segment is created then); the same answer on every rank.
inline bool uses_shared_memory(communicator& comm, const staging& s, const char* op) {
  if (s.path == staged_path::transport) return false;
  if (detail::one_node_segment(comm)) return true;
  if (s.path == staged_path::shared_memory && comm.size() > 1)
    throw error_on<usage_error>(comm.rank(), op, "staging::path is shared_memory, but the communicator spans ",
                                comm.topology().node_count(),
                                " nodes or a rank could not map the segment; use automatic or transport");
  return false;
}

/// Runs `rounds` rounds of the script at the top of this file. fill(k, buffer) writes round k of
/// this call (k = 0 .. rounds-1) into my round buffer (shm_round_bytes, 64-byte aligned);
/// drain(q, k, buffer) reads rank q's round k from q's, for every peer q in the order r+1, r+2, ...
/// A peer's round buffer stays readable until this rank's drain of the last peer of round k returns.
/// @pre uses_shared_memory(comm, ...) (usage_error otherwise).
/// @throws mismatch_error on every rank when the ranks passed other `rounds`, `op` or `facts`, or
///         are not all in their same call through the segment (the communicator is unusable then).
template <class Fill, class Drain>
void shared_memory_rounds(communicator& comm, std::uint64_t rounds, const char* op, Fill&& fill, Drain&& drain,
                          const call_facts& facts = {}) {
  const int p = comm.size(), me = comm.rank();
  shared_memory_segment* segment = detail::shared_memory_of(comm);
  if (segment == nullptr)
    throw error_on<usage_error>(me, op,
                                "the communicator has no shared-memory segment (a rank could not map it); check "
                                "uses_shared_memory first");
  detail::collective_context& ctx = detail::context_of(comm);
  const detail::shm_geometry shm{segment->data(), p};
  const deadline until = comm.default_deadline();
  const detail::shm_call call = detail::begin_shm_call(
      ctx, op, rounds, facts.count, facts.type ? static_cast<std::uint8_t>(*facts.type) : std::uint8_t{0xff},
      facts.op ? static_cast<std::uint8_t>(*facts.op) : std::uint8_t{0xff}, facts.root.value_or(-1), facts.layout);
  const std::uint64_t taken = std::max<std::uint64_t>(rounds, 1);
  for (std::uint64_t k = 0; k < taken; ++k) {
    const std::uint64_t g = ctx.shm_rounds + k;
    // step 1 (reuse)
    if (g >= shm_depth)
      detail::wait_for_peers(
          comm, [&](int q) { return shm.consumed(q); }, g - shm_depth + 1, op, "consuming", until);
    // step 2 (fill)
    if (k < rounds) fill(k, std::span<std::byte>(shm.round_buffer(me, g), shm_round_bytes));
    detail::post_shm_call(shm, me, g, call);
    shm.published(me).publish(g + 1);
    // step 3 (drain); round 0 first waits for every peer and compares the calls
    auto wait_for = [&](int q) {
      shm.published(q).wait_until_reached(
          g + 1, until, [&] { return error_text(me, op, "rank ", q, " publishing round ", k, " of ", rounds); },
          comm.transport().liveness());
    };
    if (k == 0) {
      for (int step = 1; step < p; ++step) wait_for(detail::modulo(me + step, p));
      detail::check_shm_call(comm, ctx, shm, g, call, op);
    }
    for (int step = 1; step < p && k < rounds; ++step) {
      const int q = detail::modulo(me + step, p);
      wait_for(q);
      drain(q, k, std::span<const std::byte>(shm.round_buffer(q, g), shm_round_bytes));
    }
    // step 4 (free)
    shm.reduced(me).publish(g + 1);
    shm.consumed(me).publish(g + 1);
  }
  ctx.shm_rounds += taken;
}

/// An alltoall through the segment, packed and placed by the caller: my round buffer has one
/// section per rank (shared_memory_section_bytes); in round k
///   fill:  pack(k, sections) writes round k's chunk of my block for each rank q into sections[q]
///          (in cache; sections[q].size() = piece(me, q, k).count), in whatever order reads my
///          data best; my own section is handed to place(me, offset, ...) at once;
///   drain: place(q, offset, section `me` of q's round buffer) for every peer q.
/// piece(from, to, k) -> round_piece must be the same function on every rank, each piece at most a
/// section. A block the caller moves itself (my own, say) may have pieces of count 0. In place is
/// safe when the block I receive from q occupies the place of the block I send to q: round k packs
/// its chunk of every block before it places any.
/// Cost: alltoall_shared_memory_cost.
template <element T, class Piece, class Pack, class Place>
void shared_memory_alltoall_placed(communicator& comm, std::size_t rounds, Piece&& piece, Pack&& pack, Place&& place,
                                   const char* op, std::uint64_t count = 0) {
  const int p = comm.size(), me = comm.rank();
  const std::size_t section = shared_memory_section_bytes(p);
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
      },
      facts_of<T>(count));
}

/// A reduce-scatter through the segment, packed by the caller, in rounds of the alltoall's sections.
/// piece(q, k) -> round_piece is where round k's chunk of block q lies in that block (the same
/// function on every rank, each piece at most a section). Round k on rank r:
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
/// ahead of overwriting (reduce_into_forward, with_reduce_kernel). Every rank reduces its block in
/// the same peer order (r+1, r+2, ...), so the result does not depend on timing.
/// Cost: reduce_scatter_shared_memory_cost.
template <element T, class Piece, class Pack, class First>
void shared_memory_reduce_scatter_packed(communicator& comm, std::size_t rounds, Piece&& piece, Pack&& pack,
                                         First&& first, std::span<T> out, reduce_op op, const char* op_name,
                                         std::uint64_t count = 0) {
  const int p = comm.size(), me = comm.rank();
  const std::size_t section = shared_memory_section_bytes(p);
  const int first_peer = detail::modulo(me + 1, p);
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
      },
      facts_of<T>(count, op));
}

}  // namespace flexpar
