// flexpar/collective/exchange_shared_memory.hpp — the plain allgather, alltoall and reduce_scatter
// among the ranks of one node, built on the public round exchange through the communicator's
// shared-memory segment (collective/shared_memory_rounds.hpp: the script, its contract and why), and
// their cost functions.
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
#include <flexpar/collective/shared_memory_rounds.hpp>
#include <flexpar/core/streaming_copy.hpp>

namespace flexpar {

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
  const double section = static_cast<double>(std::min(staging{}.chunk_bytes, shared_memory_section_bytes(p)));
  const double rounds = detail::ceil_div(bytes / p, section);
  return {.shm_steps = 2 * (rounds < 1 ? 1 : rounds), .copy_bytes = 2 * bytes};
}

/// reduce_scatter of a `bytes` buffer per rank over p ranks of one node through the segment: two
/// flag hand-offs per round; (p-1)/p of the buffer packed into my round buffer (in cache) and reduced
/// out of the peers' ((p-1) sections of my block's chunk), my block read once and my result written once.
constexpr cost reduce_scatter_shared_memory_cost(int p, double bytes) noexcept {
  if (p <= 1) return {};
  const double section = static_cast<double>(std::min(staging{}.chunk_bytes, shared_memory_section_bytes(p)));
  const double rounds = detail::ceil_div(bytes / p, section);
  const double share = (p - 1) * bytes / p;
  return {.reduce_bytes = share, .shm_steps = 2 * (rounds < 1 ? 1 : rounds), .copy_bytes = share};
}

}  // namespace flexpar

namespace flexpar::detail {

/// For an explicit algorithm::shared_memory: usage_error unless one_node_segment(comm) (p == 1 passes).
inline void require_one_node_segment(communicator& comm, std::string_view op) {
  if (comm.size() == 1 || one_node_segment(comm)) return;
  throw error_on<usage_error>(comm.rank(), "", op, "(shared_memory): the communicator spans ",
                              comm.topology().node_count(),
                              " nodes, or a rank could not map the shared-memory segment (is /dev/shm available to "
                              "every rank?); use automatic");
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
      },
      facts_of<T>(layout.total));
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

/// alltoall of p blocks of `count` elements through the segment; `in` may be `out` (as for the _placed form).
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
      "alltoall(shared_memory)", count * static_cast<std::size_t>(comm.size()));
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
      out, op, "reduce_scatter(shared_memory)", layout.total);
}

}  // namespace flexpar::detail
