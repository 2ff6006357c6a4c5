// flexpar/sbp/boxing/strided_rounds.hpp — the mesh-axis transforms whose blocks are strided in a
// shard (the tensor axis is not the outermost), among the ranks of one node: each packs and places
// its runs itself inside the public round exchange through the communicator's shared-memory segment
// (collective/shared_memory_rounds.hpp), so that a strided shard is read from memory once and the
// result written once, the packing and placing done in cache:
//   P -> S(i)   reduce_scatter_strided_rows    shared_memory_reduce_scatter_packed
//   S(i) -> B   allgather_rows_shared_memory   shared_memory_rounds
//   S(i) -> S(j) alltoall_in_rounds            shared_memory_alltoall_placed
// Across nodes the transforms in boxing/axis.hpp take the transport's collectives instead.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <flexpar/collective/reduce_kernel.hpp>
#include <flexpar/collective/shared_memory_rounds.hpp>
#include <flexpar/core/streaming_copy.hpp>
#include <flexpar/sbp/boxing/strided_copy.hpp>

namespace flexpar::sbp {

namespace detail {

/// P(op) -> S(i) with i not the outermost axis, among the ranks of one node: a reduce-scatter through
/// the shared-memory segment (shared_memory_reduce_scatter_packed) that reads the destinations' rows
/// where they lie in my summand ([outer, rows, inner]: block q = rows[q] of every outer index, one
/// run of length_q = rows[q].count * inner elements per outer index) and leaves my block at the
/// front of the buffer.
///   rounds: R outer indices each (R runs of the widest block fit a chunk: v.stage.chunk_bytes, at
///           most a section); round k packs outer indices [kR, kR + R) in memory order, each one's
///           run for every rank in turn (from a summand in memory with copy_packed_run's inline
///           copy: a memcpy call per run of a few hundred bytes costs as much as the run);
///   mine:   my runs stay where they lie and the drain reduces them there, forward, run by run. For
///           a summand in memory (in_memory with the communicator's threshold) the fill reads one
///           byte of each of their lines as it passes them (read_lines), so that the summand is read
///           once, front to back, as the bare reduce-scatter reads its input, and the drain finds
///           them in cache. Skipping them in the fill leaves every row half read, and the drain
///           reads my halves from memory again; copying them into my own section costs a pass in
///           cache. Both measured slower than reading the lines (CHANGELOG.md);
///   drain:  my chunk k (op) the peers' sections -> the front.
/// Round k writes elements of outer indices below (k+1)R only (my block's index o * length_me + w
/// lies at o * rows * inner + ... >= it), all of them packed by then. When not even one outer index
/// fits a chunk (huge runs), the rounds take element chunks of each block instead, packed block by
/// block: element j of a block lies at or after position j, so chunk k again writes only what chunks
/// k and earlier have packed.
template <class T>
void reduce_scatter_strided_rows(axis_view<T>& v, const around& a, const std::vector<part>& parts,
                                 const std::vector<std::size_t>& counts, reduce_op op) {
  const int p = v.comm.size(), me = v.comm.rank();
  const auto up = static_cast<std::size_t>(p);
  const std::span<T> data(v.local);
  const std::span<T> out = data.first(counts[static_cast<std::size_t>(me)]);
  const char* name = "boxing P -> S(i) (shared_memory)";
  // my runs are reduced where they lie; a summand in memory is read front to back by the fill, which
  // reads my runs' lines (into cache, for the drain) as it passes them
  const std::size_t source_min_bytes = source_in_memory_min_bytes(v.comm);
  const bool from_memory = in_memory(data.size_bytes(), source_min_bytes);
  const auto um = static_cast<std::size_t>(me);
  auto reduce_mine = [&](std::uint64_t, std::span<T> result, std::span<const T> theirs) {
    const std::size_t from = static_cast<std::size_t>(result.data() - out.data());
    with_reduce_kernel<T>(op, [&](auto reduce) {  // the op once, not per run (runs of a few hundred bytes)
      for_each_run(a, parts[um], from, result.size(), [&](std::size_t at, std::size_t done, std::size_t m) {
        reduce(result.data() + done, data.data() + at, theirs.data() + done, m);
      });
    });
  };
  const std::size_t per_round = outer_indices_per_round(  // R
      parts, a.inner, std::min(v.stage.chunk_bytes, shared_memory_section_bytes(p)) / sizeof(T));
  if (per_round > 0) {
    const std::size_t stride = a.rows * a.inner;
    auto piece = [&, per_round](int q, std::uint64_t k) {
      const std::size_t first = k * per_round, run = parts[static_cast<std::size_t>(q)].count * a.inner;
      return round_piece{first * run, first < a.outer ? std::min(per_round, a.outer - first) * run : 0};
    };
    shared_memory_reduce_scatter_packed<T>(
        v.comm, (a.outer + per_round - 1) / per_round, piece,
        [&](std::uint64_t k, std::span<const std::span<T>> sections) {
          const std::size_t first = k * per_round, last = std::min(first + per_round, a.outer);
          for (std::size_t o = first; o < last; ++o)
            for (std::size_t q = 0; q < up; ++q) {
              const std::size_t run = parts[q].count * a.inner;
              const T* from = data.data() + o * stride + parts[q].offset * a.inner;
              if (q != um)
                copy_packed_run(from, sections[q].data() + (o - first) * run, run, from_memory);
              else if (from_memory)
                read_lines(from, run);
            }
        },
        reduce_mine, out, op, name);
    return;
  }
  const round_chunks chunks = alltoall_round_chunks<T>(v.stage, p);
  std::size_t rounds = 0;
  for (const std::size_t n : counts) rounds = std::max(rounds, chunks.rounds(n));
  auto piece = element_pieces(chunks, [&](int q, int) { return counts[static_cast<std::size_t>(q)]; });
  shared_memory_reduce_scatter_packed<T>(
      v.comm, rounds, [&](int q, std::uint64_t k) { return piece(q, q, k); },
      [&](std::uint64_t k, std::span<const std::span<T>> sections) {
        for (std::size_t q = 0; q < up; ++q)
          if (sections[q].empty())
            continue;
          else if (q != um)
            pack_piece<T>(std::span<const T>(data), a, parts[q], k * chunks.chunk, sections[q], source_min_bytes);
          else if (from_memory)
            for_each_run(a, parts[q], k * chunks.chunk, sections[q].size(),
                         [&](std::size_t at, std::size_t, std::size_t m) { read_lines(data.data() + at, m); });
      },
      reduce_mine, out, op, name);
}

}  // namespace detail

namespace detail {

/// S(i) -> B with i not the outermost axis, among the ranks of one node: an allgather through the
/// shared-memory segment in rounds of whole outer indices, the result written row by row. Block q
/// is rows[q] of every outer index ([outer, rows, inner]): in my shard its runs (length_q =
/// rows[q].count * inner elements, one per outer index) lie one after the other; in the result
/// they are strided.
///   rounds: R outer indices each (R runs of the widest block fit a chunk: v.stage.chunk_bytes, at
///           most a round buffer);
///   fill:   round k's runs of my shard, outer indices [kR, kR + R), are contiguous there: one
///           memcpy into my round buffer, as the bare allgather copies its chunk;
///   drain:  nothing until the last peer has published round k (every peer's round buffer stays
///           readable until I mark round k consumed); then each result row of the round is written
///           whole, every block's run in turn (mine from my shard, the peers' from their round
///           buffers): one pass of sequential writes (streaming stores into a result in memory:
///           in_memory), where placing each block's runs as it lands wrote half of
///           every row in each of p passes.
/// Cost: the bare allgather's (two flag hand-offs per round, my chunk copied in, n placed); the
/// placing works in runs of length_q. Returns false, moving nothing, when not even one outer index
/// of the widest block fits a chunk (the caller then places element chunks).
template <class T>
bool allgather_rows_shared_memory(axis_view<T>& v, const around& a, const std::vector<part>& parts, std::span<T> out) {
  const int p = v.comm.size(), me = v.comm.rank();
  const std::size_t per_round =  // R
      outer_indices_per_round(parts, a.inner, std::min(v.stage.chunk_bytes, shm_round_bytes) / sizeof(T));
  if (per_round == 0) return false;
  const std::size_t stride = a.rows * a.inner, rounds = (a.outer + per_round - 1) / per_round;
  const bool streaming = in_memory(out.size_bytes(), v.comm.settings().streaming_min_bytes);
  const auto um = static_cast<std::size_t>(me);
  const std::size_t my_length = parts[um].count * a.inner;
  const int last_peer = (me + p - 1) % p;
  std::vector<const T*> runs_of(static_cast<std::size_t>(p));  // round k's first run of each block
  shared_memory_rounds(
      v.comm, rounds, "boxing S(i) -> B (shared_memory)",
      [&](std::uint64_t k, std::span<std::byte> buffer) {
        const std::size_t first = k * per_round, end = std::min(first + per_round, a.outer);
        if (my_length != 0)
          std::memcpy(buffer.data(), v.local.data() + first * my_length, (end - first) * my_length * sizeof(T));
      },
      [&](int q, std::uint64_t k, std::span<const std::byte> buffer) {
        runs_of[static_cast<std::size_t>(q)] = reinterpret_cast<const T*>(buffer.data());
        if (q != last_peer) return;
        const std::size_t first = k * per_round, end = std::min(first + per_round, a.outer);
        runs_of[um] = v.local.data() + first * my_length;
        for (std::size_t o = first; o < end; ++o)
          for (std::size_t b = 0; b < parts.size(); ++b) {
            const std::size_t length = parts[b].count * a.inner;
            if (length == 0) continue;
            auto* to = reinterpret_cast<std::byte*>(out.data() + o * stride + parts[b].offset * a.inner);
            const auto* from = reinterpret_cast<const std::byte*>(runs_of[b] + (o - first) * length);
            if (streaming)
              copy_streaming_unfenced(to, from, length * sizeof(T));
            else
              std::memcpy(to, from, length * sizeof(T));
          }
        if (streaming) store_fence();
      });
  return true;
}

}  // namespace detail

namespace detail {

/// S(i) -> S(j) among the ranks of one node, through the communicator's shared-memory segment
/// (shared_memory_alltoall_placed): in each round the chunk of every block I send is packed from my
/// shard straight into my round buffer (in cache), and every chunk I receive is placed into my
/// result straight from the sender's round buffer. My shard is read from memory once and my result
/// written once (streaming stores when large): the memory traffic of the bare alltoall's single
/// copy, with the packing and placing done in cache.
///
/// When my blocks are strided in my shard (j is not the outermost axis: [outer, rows of j, inner],
/// block q = rows_j[q] of each outer index), round k covers the same outer indices [kR, kR + R) of
/// every block, and the pack reads them in memory order, each outer index's runs for all ranks in
/// turn: one block after another instead reads every run with a gap the size of the other blocks'
/// runs, which measured about twice as slow as a contiguous copy of the same bytes.
/// R is the most outer indices whose runs for the widest block fit a chunk (v.stage.chunk_bytes, at
/// most a section); when not even one fits (huge runs: nothing is strided at that scale), the blocks
/// go in element chunks. In the rounds of outer indices my own block skips the segment: the pack
/// copies each of its runs from my shard to its place in the result as it passes it (run_cursor),
/// once, where the bare alltoall packs its own block into its section and places it from there
/// (n/p^2 bytes copied twice).
template <class T>
void alltoall_in_rounds(axis_view<T>& v, std::size_t i, const std::vector<part>& rows_i, std::size_t j,
                        const std::vector<part>& rows_j, const around& send_view, const around& receive_view,
                        std::span<T> next) {
  const int p = v.comm.size();
  const auto up = static_cast<std::size_t>(p);
  // computed once, since the pieces are asked for in every round: elements `from` sends `to`; outer
  // indices and inner extent of `from`'s shard around j (axis i is among the outer axes when i < j,
  // among the inner ones when i > j)
  std::vector<std::size_t> counts(up * up), outers(up), inners(up);
  for (std::size_t from = 0; from < up; ++from) {
    const shape_t shard = with_extent(v.group_shape, i, rows_i[from].count);
    const around view(shard, j);
    outers[from] = view.outer;
    inners[from] = view.inner;
    for (std::size_t to = 0; to < up; ++to)
      counts[from * up + to] = elements_of(with_extent(shard, j, rows_j[to].count));
  }
  auto block = [&](int from, int to) {
    return counts[static_cast<std::size_t>(from) * up + static_cast<std::size_t>(to)];
  };
  const std::size_t streaming_min_bytes = v.comm.settings().streaming_min_bytes,
                    source_min_bytes = source_in_memory_min_bytes(v.comm);
  auto place = [&](int q, std::size_t offset, std::span<const T> piece) {
    unpack_piece<T>(piece, receive_view, rows_i[static_cast<std::size_t>(q)], offset, next, streaming_min_bytes);
  };
  const char* op = "boxing S(i) -> S(j) (shared_memory)";
  // by outer index: rank `from`'s run for rank `to` is rows_j[to] * inners[from] elements
  const std::size_t per_round = outer_indices_per_round(  // R
      rows_j, *std::max_element(inners.begin(), inners.end()),
      std::min(v.stage.chunk_bytes, shared_memory_section_bytes(p)) / sizeof(T));
  if (send_view.outer > 1 && per_round > 0) {
    std::size_t rounds = 0;
    for (const std::size_t outer : outers) rounds = std::max(rounds, (outer + per_round - 1) / per_round);
    auto piece = [&, per_round](int from, int to, std::uint64_t k) {
      if (from == to) return round_piece{};  // my own block skips the segment (below)
      const std::size_t outer = outers[static_cast<std::size_t>(from)], first = k * per_round;
      const std::size_t run = rows_j[static_cast<std::size_t>(to)].count * inners[static_cast<std::size_t>(from)];
      return round_piece{first * run, first < outer ? std::min(per_round, outer - first) * run : 0};
    };
    const std::size_t stride = send_view.rows * send_view.inner;
    const bool from_memory = in_memory(v.local.size() * sizeof(T), source_min_bytes);
    const bool streaming = in_memory(next.size_bytes(), streaming_min_bytes);
    const std::size_t um = static_cast<std::size_t>(v.comm.rank()), my_run = rows_j[um].count * send_view.inner;
    shared_memory_alltoall_placed<T>(
        v.comm, rounds, piece,
        [&](std::uint64_t k, std::span<const std::span<T>> sections) {
          const std::size_t first = k * per_round, last = std::min(first + per_round, send_view.outer);
          // my own block goes from my shard to its place in the result in the same pass (copied once,
          // where a round-trip through my section copied it twice)
          run_cursor own(receive_view, rows_i[um], first * my_run);
          for (std::size_t o = first; o < last; ++o)
            for (std::size_t q = 0; q < up; ++q) {
              const std::size_t run = rows_j[q].count * send_view.inner;
              const T* from = v.local.data() + o * stride + rows_j[q].offset * send_view.inner;
              if (q != um) {
                copy_packed_run(from, sections[q].data() + (o - first) * run, run, from_memory);
                continue;
              }
              own.advance(run, [&](std::size_t at, std::size_t done, std::size_t m) {
                if (streaming)
                  copy_streaming_unfenced(reinterpret_cast<std::byte*>(next.data() + at),
                                          reinterpret_cast<const std::byte*>(from + done), m * sizeof(T));
                else
                  copy_packed_run(from + done, next.data() + at, m, from_memory);
              });
            }
          if (streaming) store_fence();
        },
        place, op);
    return;
  }
  const round_chunks chunks = alltoall_round_chunks<T>(v.stage, p);
  std::size_t rounds = 0;  // the same on every rank: the most chunks of any block
  for (int from = 0; from < p; ++from)
    for (int to = 0; to < p; ++to) rounds = std::max(rounds, chunks.rounds(block(from, to)));
  shared_memory_alltoall_placed<T>(
      v.comm, rounds, element_pieces(chunks, block),
      [&](std::uint64_t k, std::span<const std::span<T>> sections) {
        for (std::size_t q = 0; q < up; ++q)
          if (!sections[q].empty())
            pack_piece<T>(v.local, send_view, rows_j[q], k * chunks.chunk, sections[q], source_min_bytes);
      },
      place, op);
}

}  // namespace detail

}  // namespace flexpar::sbp
