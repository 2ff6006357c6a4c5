// flexpar/sbp/boxing.hpp — changing a tensor's SBP: to<NewSbp>(t).
//
// One mesh axis: each pair (From, To) is one overload of box_axis, a script of named steps:
//
//   | from \ to | B                     | S(j)                          | P(op)                    |
//   |-----------|-----------------------|-------------------------------|--------------------------|
//   | B         | free                  | slice my rows (local)         | keep at coord 0, zeros   |
//   |           |                       |                               | elsewhere (sum); keep    |
//   |           |                       |                               | everywhere (max, min)    |
//   | S(i)      | allgather_v (inner i: | i == j: free; else            | pad with the op's        |
//   |           | placed, unpacked      | pairwise alltoall, packing    | identity (local)         |
//   |           | through cache slots)  | folded into its steps         |                          |
//   | P(op)     | allreduce(op)         | pack -> reduce_scatter_v(op,  | same op: free; else via B|
//   |           |                       | result at the front)          |                          |
//
// Costs (ring collectives, n = bytes the mesh-axis group holds jointly, p = its ranks):
//   allreduce 2(p-1)/p n, reduce_scatter and allgather (p-1)/p n, alltoall (p-1)/p n / p; the local
//   transforms move no bytes on the wire (boxing_cost counts what they copy as copy_bytes).
//
// nd-SBP: one mesh axis at a time, through that axis's sub-communicator (placement::axis(d)).
// Changing axis d is sound when no mesh axis after d splits a tensor axis that d's old or new SBP
// splits (those inner pieces would not be contiguous in d's group). The candidate routes are every
// sound order of the axes that differ and the route through B (inner axes to B first, then outer axes
// to their targets); plan() takes the one that moves the fewest wire bytes on the mesh's extents. For
// static SBPs every candidate is a compile-time route: to<To>(t) instantiates them and runs the one
// plan() takes on the tensor's mesh; on a static_mesh<E...> that choice is a compile-time value too
// (route_on).
// X -> X is free: to<X>(t) returns t itself (no allocation, no copy).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/collective/cost.hpp>
#include <flexpar/collective/shared_memory_rounds.hpp>
#include <flexpar/core/streaming_copy.hpp>
#include <flexpar/sbp/buffer_pool.hpp>
#include <flexpar/sbp/global_tensor.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/sbp/parallel.hpp>

namespace flexpar::sbp {

// ---- one mesh axis -----------------------------------------------------------------------------

/// What one mesh-axis transform works on: the group of that axis, the shape the group holds jointly,
/// and my shard (replaced by the transform).
template <element T>
struct axis_view {
  communicator& comm;       ///< the mesh-axis group
  shape_t group_shape;      ///< the tensor the group holds jointly (other axes' splits applied)
  aligned_vector<T> local;  ///< my shard under the current SBP of this axis
  buffer_pool& pool;        ///< where temporaries and results come from and go back to
  /// How S(i) -> B with i an inner axis streams through cache-sized slots; the same on every rank of
  /// the group. Tests pass small chunks to reach the multi-chunk paths on small tensors.
  staging stage{};
};

namespace detail {

/// [outer, n_axis, inner] view of a shape around `axis`.
struct around {
  std::size_t outer = 1, rows = 1, inner = 1;
  around(const shape_t& s, std::size_t axis) {
    for (std::size_t i = 0; i < axis; ++i) outer *= s[i];
    rows = s[axis];
    for (std::size_t i = axis + 1; i < s.size(); ++i) inner *= s[i];
  }
};

inline std::vector<part> parts_of(std::size_t n, int p) {
  std::vector<part> out(static_cast<std::size_t>(p));
  for (int i = 0; i < p; ++i) out[static_cast<std::size_t>(i)] = balanced_part(n, p, i);
  return out;
}

/// R of the shared-memory rounds that go by whole outer indices: the most outer indices whose runs
/// of the widest block (rows[q].count * inner elements each) fit `budget` elements; 0 when not even
/// one does, or when every block is empty (the callers then take element chunks).
inline std::size_t outer_indices_per_round(const std::vector<part>& rows, std::size_t inner, std::size_t budget) {
  std::size_t widest = 0;
  for (const part& r : rows) widest = std::max(widest, r.count * inner);
  return widest == 0 ? 0 : budget / widest;
}

/// Packs `data` (shape [outer, rows, inner]) into `out`: p contiguous blocks, block j = rows of part
/// j (one strided pass, straight into the buffer the collective sends from). Returns the counts.
template <class T>
std::vector<std::size_t> pack_rows(std::span<const T> data, const around& v, const std::vector<part>& parts,
                                   std::span<T> out) {
  std::vector<std::size_t> counts(parts.size());
  std::size_t at = 0;
  for (std::size_t j = 0; j < parts.size(); ++j) {
    const shape_t extent{v.outer, parts[j].count, v.inner};
    counts[j] = elements_of(extent);
    copy_box<T>(data, {v.outer, v.rows, v.inner}, {0, parts[j].offset, 0}, out.subspan(at), extent, {0, 0, 0}, extent);
    at += counts[j];
  }
  return counts;
}

/// Walks the runs of rows `rows` of a tensor viewed as [outer, rows, inner], in the row block's own
/// row-major order, from element `from` of the block on: advance(count, run) calls run(at, done, m)
/// for the next `count` elements, element `done` of them and the m after it lying at `at` and on in
/// the tensor (one outer index: at most rows.count * inner elements per run). One division, where
/// the cursor starts.
struct run_cursor {
  std::size_t length, stride, at = 0, within = 0;
  run_cursor(const around& v, const part& rows, std::size_t from)
      : length(rows.count * v.inner), stride(v.rows * v.inner) {
    if (length == 0) return;
    at = from / length * stride + rows.offset * v.inner;
    within = from % length;
  }
  template <class Run>
  void advance(std::size_t count, Run&& run) {
    for (std::size_t done = 0; done < count;) {
      const std::size_t m = std::min(count - done, length - within);
      run(at + within, done, m);
      done += m;
      within += m;
      if (within == length) {
        within = 0;
        at += stride;
      }
    }
  }
};

/// Calls run(at, done, m) for the runs of elements [from, from + count) of rows `rows` of a tensor
/// viewed as [outer, rows, inner] (run_cursor).
template <class Run>
void for_each_run(const around& v, const part& rows, std::size_t from, std::size_t count, Run&& run) {
  if (count == 0) return;
  run_cursor(v, rows, from).advance(count, run);
}

/// Unpacks a piece of a row block: `piece` holds elements [from, from + piece.size()) of rows `rows`
/// of `data` (viewed as [outer, rows, inner]) in the block's own row-major order. Copied as runs that
/// are contiguous in both; into a `data` in memory (in_memory with the communicator's threshold,
/// `streaming_min_bytes`) with streaming stores (core/streaming_copy.hpp: short runs never get them
/// from memcpy, and read-for-ownership made the placing pass cost twice a memcpy).
template <class T>
void unpack_piece(std::span<const T> piece, const around& v, const part& rows, std::size_t from, std::span<T> data,
                  std::size_t streaming_min_bytes) {
  const bool streaming = in_memory(data.size_bytes(), streaming_min_bytes);
  for_each_run(v, rows, from, piece.size(), [&](std::size_t at, std::size_t done, std::size_t m) {
    if (streaming)
      copy_streaming_unfenced(reinterpret_cast<std::byte*>(data.data() + at),
                              reinterpret_cast<const std::byte*>(piece.data() + done), m * sizeof(T));
    else
      std::copy_n(piece.data() + done, m, data.data() + at);
  });
  if (streaming) store_fence();
}

/// The communicator's threshold for sources in memory (config::source_in_memory_min_bytes: resolved
/// when the communicator was made; streaming_min_bytes for a config that never was).
inline std::size_t source_in_memory_min_bytes(const communicator& comm) noexcept {
  return comm.settings().source_in_memory_min_bytes.value_or(comm.settings().streaming_min_bytes);
}

/// Copies the `n` elements of one run of a pack: for a source in memory (in_memory, read
/// from memory, where a library call per short run costs as much as its copy) inline, otherwise
/// with memcpy (in cache, where its wider stores win).
template <class T>
void copy_packed_run(const T* from, T* to, std::size_t n, bool from_memory) {
  if (from_memory)
    copy_run(reinterpret_cast<std::byte*>(to), reinterpret_cast<const std::byte*>(from), n * sizeof(T));
  else
    std::copy_n(from, n, to);
}

/// Reads one byte of every cache line that elements [p, p + n) touch, and nothing else: a pass of a
/// fill over runs it does not copy (P -> S(i)'s own runs of a summand in memory), which keeps the
/// summand's read one stream, front to back, and leaves the runs in cache for the drain. Loads, not
/// prefetch hints: `prefetcht0` per line left P -> S(1) at 1.14-1.16x of the bare at 64 MiB
/// (doc/sbp-measured.md, 2026-11-22), and a hint may be dropped when many misses are in flight.
template <class T>
void read_lines(const T* p, std::size_t n) noexcept {
  const auto* bytes = reinterpret_cast<const volatile unsigned char*>(p);
  const std::size_t size = n * sizeof(T);
  for (std::size_t at = 0; at < size; at += 64) (void)bytes[at];
  if (size % 64 != 0) (void)bytes[size - 1];  // a last line the steps of 64 from p did not reach
}

/// The inverse: packs elements [from, from + piece.size()) of rows `rows` of `data` into `piece`
/// (a staging slot, which stays in cache: plain stores); from a `data` in memory (in_memory with the
/// threshold for sources, `source_min_bytes`) with copy_packed_run's inline copy.
template <class T>
void pack_piece(std::span<const T> data, const around& v, const part& rows, std::size_t from, std::span<T> piece,
                std::size_t source_min_bytes) {
  const bool from_memory = in_memory(data.size_bytes(), source_min_bytes);
  for_each_run(v, rows, from, piece.size(), [&](std::size_t at, std::size_t done, std::size_t m) {
    copy_packed_run(data.data() + at, piece.data() + done, m, from_memory);
  });
}

/// Keeps elements [from, from + n) of `v` as all of `v`, in its own buffer (no new allocation).
template <class T>
void keep_range(aligned_vector<T>& v, std::size_t from, std::size_t n) {
  if (from != 0)
    std::copy(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(from + n),
              v.begin());  // forward: dest first
  v.resize(n);
}

}  // namespace detail

/// X -> X: nothing moves.
template <element T, one_axis_sbp X>
void box_axis(axis_view<T>&, X, X) {}

/// P(op) -> B: allreduce(op) of my full-shape summand, in place in the tensor's own buffer.
template <element T, reduce_op Op>
void box_axis(axis_view<T>& v, partial<Op>, broadcast) {
  allreduce(v.comm, std::span<T>(v.local), Op);
}

namespace detail {

/// P(op) -> S(i) with i not the outermost axis, among the ranks of one node: a reduce-scatter through
/// the shared-memory segment (shared_memory_reduce_scatter_packed) that reads the destinations' rows
/// where they lie in my summand ([outer, rows, inner]: block q = rows[q] of every outer index, one
/// run of length_q = rows[q].count * inner elements per outer index) and leaves my block at the
/// front of the buffer.
///   rounds: R outer indices each (R runs of the widest block fit a chunk: v.stage.chunk_bytes, at
///           most a section); round k packs outer indices [kR, kR + R) in memory order, each one's
///           run for every rank in turn (from a summand in memory with copy_packed_run's inline
///           copy: with a memcpy call per 512-byte run P -> S(1) of 64 MiB took 1.18x of the
///           bare reduce-scatter, with the inline copy 1.09x; five runs each, medians);
///   mine:   my runs stay where they lie and the drain reduces them there, forward, run by run. For
///           a summand in memory (in_memory with the communicator's threshold) the fill reads one
///           byte of each of their lines as it passes them (read_lines), so that the summand is read
///           once, front to back, as the bare reduce-scatter reads its input, and the drain finds
///           them in cache. Skipping them in the fill left every row half read, and the drain read
///           my halves from memory: 1.7-2x of the bare at 16-64 MiB. Copying them into my own
///           section, as until 2026-11-25, costs a pass in cache: P -> S(1) 1.33-1.35x of the bare
///           at 16 MiB and 1.18-1.28x at 64 MiB against 1.14-1.24x and 1.17-1.22x reading the
///           lines, four alternating runs each (doc/sbp-measured.md);
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

/// P(op) -> S(i): reduce_scatter_v(op) in place with the result at the front of the buffer (its last
/// reduction writes my block there: the ring's last step, or each shared-memory round's first
/// reduction on one node), then the buffer is cut down to my block: nothing moves beyond the bare
/// reduce-scatter. When axis i is not the outermost, the destinations' rows are strided in my
/// summand: on one node the shared-memory rounds pack them straight from where they lie
/// (detail::reduce_scatter_strided_rows); across nodes (or with v.stage.path transport) the rows of
/// each destination are first packed into one contiguous block (one pass into a pooled buffer,
/// which the ring then works in).
template <element T, reduce_op Op, int I>
void box_axis(axis_view<T>& v, partial<Op>, split<I>) {
  const detail::around a(v.group_shape, I);
  const auto parts = detail::parts_of(a.rows, v.comm.size());
  std::vector<std::size_t> counts(parts.size());
  for (std::size_t j = 0; j < parts.size(); ++j) counts[j] = a.outer * parts[j].count * a.inner;
  if (a.outer != 1 && uses_shared_memory(v.comm, v.stage, "boxing P -> S(i)")) {
    detail::reduce_scatter_strided_rows<T>(v, a, parts, counts, Op);
    v.local.resize(counts[static_cast<std::size_t>(v.comm.rank())]);  // my block is the front
    return;
  }
  if (a.outer != 1 && v.comm.size() > 1) {  // one rank: my block is all of it, in its order already
    aligned_vector<T> packed = v.pool.template acquire<T>(v.local.size());
    counts = detail::pack_rows<T>(v.local, a, parts, packed);
    v.pool.give_back(std::move(v.local));
    v.local = std::move(packed);
  }
  const std::span<T> mine =
      reduce_scatter_v(v.comm, std::span<T>(v.local), std::span<const std::size_t>(counts), Op, result_at::front);
  v.local.resize(mine.size());  // my block is the front: shrinking keeps the buffer
}

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
/// placing works in runs of length_q. S(1) -> B of an f32 [n, 256] tensor on 2 ranks, medians over
/// five repeats of the whole table, four runs of each build (doc/sbp-measured.md, 2026-11-23):
/// 1.03-1.13x of the bare allgather at 1 MiB against 1.07-1.18x when each block's runs were placed
/// as they landed, 0.97-1.00x at 64 MiB against 1.00-1.05x. Returns false, moving nothing, when not
/// even one outer index of the widest block fits a chunk (the caller then places element chunks).
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

/// S(i) -> B: allgather_v of every shard into a pooled buffer, the result. When axis i is not the
/// outermost, a shard's rows are strided in the result: on one node the shared-memory rounds write
/// the result row by row (detail::allgather_rows_shared_memory); otherwise the placed allgather
/// streams each chunk through a cache-sized slot and unpacks it into the result at once (v.stage),
/// instead of gathering into a full-size staging buffer and unpacking all n bytes after.
template <element T, int I>
void box_axis(axis_view<T>& v, split<I>, broadcast) {
  const detail::around a(v.group_shape, I);
  const auto parts = detail::parts_of(a.rows, v.comm.size());
  std::vector<std::size_t> counts(parts.size());
  for (std::size_t j = 0; j < parts.size(); ++j) counts[j] = a.outer * parts[j].count * a.inner;
  aligned_vector<T> gathered = v.pool.template acquire<T>(elements_of(v.group_shape));
  if (a.outer == 1 && v.stage.path == staged_path::automatic) {  // the bare allgather_v, by its own choice
    allgather_v(v.comm, std::span<const T>(v.local), std::span<T>(gathered), std::span<const std::size_t>(counts));
  } else if (v.comm.size() > 1 && uses_shared_memory(v.comm, v.stage, "boxing S(i) -> B") &&
             detail::allgather_rows_shared_memory<T>(v, a, parts, std::span<T>(gathered))) {
    // written row by row through the segment
  } else {
    const std::span<T> out(gathered);
    allgather_v_placed<T>(
        v.comm, std::span<const T>(v.local), std::span<const std::size_t>(counts),
        [&](int block, std::size_t offset, std::span<const T> piece) {
          detail::unpack_piece<T>(piece, a, parts[static_cast<std::size_t>(block)], offset, out,
                                  v.comm.settings().streaming_min_bytes);
        },
        v.stage);
  }
  v.pool.give_back(std::move(v.local));
  v.local = std::move(gathered);
}

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
/// turn: one block after another instead read every run with a gap the size of the other blocks'
/// runs, which took twice the time of a contiguous copy here (32 MiB shard, runs of 512 bytes).
/// R is the most outer indices whose runs for the widest block fit a chunk (v.stage.chunk_bytes, at
/// most a section); when not even one fits (huge runs: nothing is strided at that scale), the blocks
/// go in element chunks. In the rounds of outer indices my own block skips the segment: the pack
/// copies each of its runs from my shard to its place in the result as it passes it (run_cursor),
/// once, where the bare alltoall packs its own block into its section and places it from there
/// (2x n/p^2 bytes copied; S(0) -> S(1) of [n, 256] f32 on 2 ranks went from 1.10-1.14x of the bare
/// to 0.89-0.97x at 16 MiB).
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

/// S(i) -> S(j), i != j: a pairwise alltoall (the script of flexpar's alltoall_v, with the packing
/// folded into its steps). Block k of mine is my rows of i and rank k's rows of j; I receive rank
/// k's rows of i and my rows of j.
///   step 0: my own block goes straight from my shard to its place in the result (one strided copy,
///           where the bare alltoall copies it too);
///   step s: to rank me+s, from rank me-s: pack the block for the peer (unless it is contiguous in
///           my shard: then send it from there), receive the peer's block straight into the result
///           (unless it is strided there: then into a staging block, unpacked at once).
/// So each element is copied at most once beyond what the bare alltoall moves, and only where the
/// layout is strided. Every wait has the communicator's deadline.
template <element T, int I, int J>
requires(I != J) void box_axis(axis_view<T>& v, split<I>, split<J>) {
  const int p = v.comm.size(), me = v.comm.rank();
  const auto um = static_cast<std::size_t>(me);
  const auto rows_i = detail::parts_of(v.group_shape[I], p), rows_j = detail::parts_of(v.group_shape[J], p);
  const shape_t mine_now = with_extent(v.group_shape, I, rows_i[um].count);
  const shape_t mine_next = with_extent(v.group_shape, J, rows_j[um].count);
  const detail::around send_view(mine_now, J), receive_view(mine_next, I);
  const bool pack = send_view.outer != 1, unpack = receive_view.outer != 1;
  const shape_t zero(v.group_shape.size(), 0);
  auto block_of_mine = [&](std::size_t k) {  // my rows of i, rank k's rows of j, in my shard
    shape_t at = zero;
    at[J] = rows_j[k].offset;
    return box{at, with_extent(mine_now, J, rows_j[k].count)};
  };
  auto block_of_next = [&](std::size_t k) {  // rank k's rows of i, my rows of j, in the result
    shape_t at = zero;
    at[I] = rows_i[k].offset;
    return box{at, with_extent(mine_next, I, rows_i[k].count)};
  };
  auto flat = [](const box& b, const shape_t& whole) {  // element offset of a contiguous block
    const shape_t st = strides_of(whole);
    std::size_t at = 0;
    for (std::size_t i = 0; i < st.size(); ++i) at += b.offset[i] * st[i];
    return elements_of(b.extent) == 0 ? 0 : at;
  };

  aligned_vector<T> next = v.pool.template acquire<T>(elements_of(mine_next));
  if (uses_shared_memory(v.comm, v.stage, "boxing S(i) -> S(j)")) {
    detail::alltoall_in_rounds<T>(v, std::size_t{I}, rows_i, std::size_t{J}, rows_j, send_view, receive_view, next);
    v.pool.give_back(std::move(v.local));
    v.local = std::move(next);
    return;
  }
  aligned_vector<T> out_stage = pack ? v.pool.template acquire<T>(v.local.size()) : aligned_vector<T>{};
  aligned_vector<T> in_stage = unpack ? v.pool.template acquire<T>(next.size()) : aligned_vector<T>{};
  // step 0
  const box own = block_of_mine(um);
  copy_box<T>(v.local, mine_now, own.offset, next, mine_next, block_of_next(um).offset, own.extent);
  // steps 1 .. p-1: the block for rank me+s packed unless it is contiguous in my shard; rank me-s's
  // block received straight into the result unless it is strided there
  alltoall_v_placed<T>(
      v.comm,
      [&](int to) {
        const box out_block = block_of_mine(static_cast<std::size_t>(to));
        const std::size_t out_n = out_block.elements();
        if (!pack) return std::span<const T>(v.local).subspan(flat(out_block, mine_now), out_n);
        const std::span<T> staged = std::span<T>(out_stage).first(out_n);
        copy_box<T>(v.local, mine_now, out_block.offset, staged, out_block.extent, zero, out_block.extent);
        return std::span<const T>(staged);
      },
      [&](int from) {
        const box in_block = block_of_next(static_cast<std::size_t>(from));
        const std::size_t in_n = in_block.elements();
        return unpack ? std::span<T>(in_stage).first(in_n)
                      : std::span<T>(next).subspan(flat(in_block, mine_next), in_n);
      },
      [&](int from, std::span<const T> landed) {
        if (!unpack) return;
        const box in_block = block_of_next(static_cast<std::size_t>(from));
        copy_box<T>(landed, in_block.extent, zero, next, mine_next, in_block.offset, in_block.extent);
      });
  v.pool.give_back(std::move(out_stage));
  v.pool.give_back(std::move(in_stage));
  v.pool.give_back(std::move(v.local));
  v.local = std::move(next);
}

/// B -> S(i): keep my rows (local); in the same buffer when axis i is the outermost.
template <element T, int I>
void box_axis(axis_view<T>& v, broadcast, split<I>) {
  const part mine = balanced_part(v.group_shape[I], v.comm.size(), v.comm.rank());
  const detail::around a(v.group_shape, I);
  if (a.outer == 1) {
    detail::keep_range(v.local, mine.offset * a.inner, mine.count * a.inner);
    return;
  }
  const shape_t extent = with_extent(v.group_shape, I, mine.count);
  shape_t from(v.group_shape.size(), 0);
  from[I] = mine.offset;
  aligned_vector<T> out = v.pool.template acquire<T>(elements_of(extent));
  copy_box<T>(v.local, v.group_shape, from, out, extent, shape_t(extent.size(), 0), extent);
  v.pool.give_back(std::move(v.local));
  v.local = std::move(out);
}

/// B -> P(op): sum keeps the values at coordinate 0 and zeros elsewhere; max and min keep them
/// everywhere (idempotent). Local, in place.
template <element T, reduce_op Op>
void box_axis(axis_view<T>& v, broadcast, partial<Op>) {
  if (Op == reduce_op::sum && v.comm.rank() != 0) std::fill(v.local.begin(), v.local.end(), T{});
}

/// S(i) -> P(op): my rows in a full-shape tensor of the op's identity (local).
template <element T, int I, reduce_op Op>
void box_axis(axis_view<T>& v, split<I>, partial<Op>) {
  const part mine = balanced_part(v.group_shape[I], v.comm.size(), v.comm.rank());
  const shape_t extent = with_extent(v.group_shape, I, mine.count);
  shape_t to(v.group_shape.size(), 0);
  to[I] = mine.offset;
  aligned_vector<T> out = v.pool.template acquire<T>(elements_of(v.group_shape), detail::partial_identity<T>(Op));
  copy_box<T>(v.local, extent, shape_t(extent.size(), 0), out, v.group_shape, to, extent);
  v.pool.give_back(std::move(v.local));
  v.local = std::move(out);
}

/// P(a) -> P(b), a != b: no one-step transform; routes go through B (this overload is reached only by
/// a hand-made dynamic route).
template <element T, reduce_op A, reduce_op B>
requires(A != B) void box_axis(axis_view<T>& v, partial<A>, partial<B>) {
  throw usage_error(detail::on_rank(v.comm.rank(), "box_axis") + "P(" + std::string(name_of(A)) + ") -> P(" +
                    std::string(name_of(B)) + ") has no one-step transform; box through B");
}

// ---- routes ------------------------------------------------------------------------------------

/// One step of a route: mesh axis `axis` goes from `from` to `to`.
struct route_step {
  std::size_t axis = 0;  ///< the mesh axis
  parallel from{};       ///< its SBP before
  parallel to{};         ///< its SBP after
};

/// A boxing route: steps in order, and the nd-SBP before each step.
struct route {
  static constexpr std::size_t max_steps = 3 * max_mesh_rank;  ///< to B and back, plus P(a)->B->P(b)
  std::array<route_step, max_steps> steps{};                   ///< [0, count) are used
  std::array<nd_parallel, max_steps> before{};                 ///< the nd-SBP before each step
  std::size_t count = 0;                                       ///< steps
  bool through_broadcast = false;                              ///< the route through B (candidates())
  double nominal_cost = 0;                                     ///< the planner's score (see plan())
};

/// Mesh extents as the route planner reads them: one per mesh axis (entries past the mesh rank unused).
using mesh_extents = std::array<int, max_mesh_rank>;

/// The nominal mesh, 2 ranks on every axis: what route_of plans on when the extents are not known.
inline constexpr mesh_extents nominal_mesh{2, 2, 2, 2};

/// The extents of a run-time mesh shape (a placement's shape()), for plan().
/// @pre mesh.size() <= max_mesh_rank
constexpr mesh_extents extents_of(std::span<const int> mesh) noexcept {
  mesh_extents m = nominal_mesh;
  for (std::size_t d = 0; d < mesh.size() && d < max_mesh_rank; ++d) m[d] = mesh[d];
  return m;
}

namespace detail {

/// Changing mesh axis d of `cur` to `to` is sound (header comment).
constexpr bool step_sound(const nd_parallel& cur, std::size_t d, const parallel& to) noexcept {
  for (std::size_t e = d + 1; e < cur.rank; ++e) {
    if (!cur[e].is_split()) continue;
    if (cur[d].is_split() && cur[d].axis == cur[e].axis) return false;
    if (to.is_split() && to.axis == cur[e].axis) return false;
  }
  return true;
}

/// Wire bytes of one step as a fraction of the logical tensor, on a mesh of extents `m`: the group of
/// axis d (p = m[d] ranks) holds 1 / (extents of the other split axes) of the tensor, and the ring
/// collectives move 2 (p-1)/p (allreduce), (p-1)/p (reduce-scatter, allgather) or (p-1)/p^2
/// (alltoall) of that; local steps move nothing.
constexpr double step_cost(const nd_parallel& cur, std::size_t d, const parallel& to, const mesh_extents& m) noexcept {
  const parallel& from = cur[d];
  if (from == to) return 0;
  double held = 1.0;  // what d's group holds jointly
  for (std::size_t e = 0; e < cur.rank; ++e)
    if (e != d && cur[e].is_split()) held /= m[e];
  const double p = m[d], moved = (p - 1) / p * held;
  if (from.is_partial() && to.is_broadcast()) return 2 * moved;  // allreduce
  if (from.is_partial() && to.is_split()) return moved;          // reduce-scatter
  if (from.is_split() && to.is_broadcast()) return moved;        // allgather
  if (from.is_split() && to.is_split()) return moved / p;        // alltoall
  return 0;                                                      // local
}

/// Appends the step (d: cur[d] -> to) to r, as two steps through B for P(a) -> P(b).
constexpr bool append_step(route& r, nd_parallel& cur, std::size_t d, const parallel& to) noexcept {
  if (cur[d] == to) return true;
  if (cur[d].is_partial() && to.is_partial()) {
    if (!append_step(r, cur, d, parallel::B())) return false;
    return append_step(r, cur, d, to);
  }
  if (!step_sound(cur, d, to) || r.count == route::max_steps) return false;
  r.nominal_cost += step_cost(cur, d, to, nominal_mesh);
  r.before[r.count] = cur;
  r.steps[r.count++] = {d, cur[d], to};
  cur[d] = to;
  return true;
}

/// The same steps in the same order.
constexpr bool same_steps(const route& a, const route& b) noexcept {
  if (a.count != b.count) return false;
  for (std::size_t k = 0; k < a.count; ++k)
    if (a.steps[k].axis != b.steps[k].axis || !(a.steps[k].from == b.steps[k].from) ||
        !(a.steps[k].to == b.steps[k].to))
      return false;
  return true;
}

}  // namespace detail

/// The score of route `r` on a mesh of extents `m`: its wire bytes as a fraction of the logical tensor.
constexpr double route_score(const route& r, const mesh_extents& m) noexcept {
  double total = 0;
  for (std::size_t k = 0; k < r.count; ++k) total += detail::step_cost(r.before[k], r.steps[k].axis, r.steps[k].to, m);
  return total;
}

/// Every route the planner weighs for from -> to: each sound order of the mesh axes that differ (in
/// lexicographic order of the axes), then the route through B. At most 4! + 1 for a 4-axis mesh.
struct route_candidates {
  static constexpr std::size_t max_count = 24 + 1;  ///< 4! orders + through B
  std::array<route, max_count> routes{};            ///< [0, count) are used
  std::size_t count = 0;                            ///< candidates
};

/// The candidates for from -> to (same mesh rank); see route_candidates.
constexpr route_candidates candidates(const nd_parallel& from, const nd_parallel& to) noexcept {
  route_candidates out{};
  std::array<std::size_t, max_mesh_rank> order{};
  std::size_t n = 0;
  for (std::size_t d = 0; d < from.rank; ++d)
    if (!(from[d] == to[d])) order[n++] = d;
  if (n == 0) {
    out.count = 1;  // the empty route
    return out;
  }
  do {  // every permutation of the differing axes (sorted to start)
    route r{};
    nd_parallel cur = from;
    bool ok = true;
    for (std::size_t k = 0; k < n && ok; ++k) ok = detail::append_step(r, cur, order[k], to[order[k]]);
    if (ok) out.routes[out.count++] = r;
  } while (std::next_permutation(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n)));
  // through B: inner axes to B first, then outer axes to their targets
  route via{};
  via.through_broadcast = true;
  nd_parallel cur = from;
  bool ok = true;
  for (std::size_t d = from.rank; d-- > 0 && ok;) ok = detail::append_step(via, cur, d, parallel::B());
  for (std::size_t d = 0; d < from.rank && ok; ++d) ok = detail::append_step(via, cur, d, to[d]);
  bool known = false;  // with one differing axis, through B can be a step list we already have
  for (std::size_t i = 0; i < out.count && ok; ++i) known = known || detail::same_steps(out.routes[i], via);
  if (ok && !known) out.routes[out.count++] = via;
  return out;
}

/// Which of `c` the planner takes on a mesh of extents `m`: the lowest score, ties to the first.
constexpr std::size_t cheapest(const route_candidates& c, const mesh_extents& m) noexcept {
  std::size_t best = 0;
  for (std::size_t i = 1; i < c.count; ++i)
    if (route_score(c.routes[i], m) < route_score(c.routes[best], m)) best = i;
  return best;
}

/// The route from `from` to `to` (same mesh rank) on a mesh of extents `m` (the nominal 2-per-axis
/// mesh by default): the cheapest of candidates(from, to) by route_score.
constexpr route plan(const nd_parallel& from, const nd_parallel& to, const mesh_extents& m = nominal_mesh) noexcept {
  const route_candidates c = candidates(from, to);
  return c.routes[cheapest(c, m)];
}

namespace detail {

template <parallel V>
using type_of = std::conditional_t<V.what == kind::split, split<V.axis>,
                                   std::conditional_t<V.what == kind::broadcast, broadcast, partial<V.op>>>;

template <nd_parallel V, std::size_t D>
struct axis_type_of {
  static constexpr parallel value = V.axes[D];
  using type = type_of<value>;
};
template <nd_parallel V, class Seq>
struct nd_type_of_impl;
template <nd_parallel V, std::size_t... D>
struct nd_type_of_impl<V, std::index_sequence<D...>> {
  using type = sbp<typename axis_type_of<V, D>::type...>;
};
template <nd_parallel V, bool OneAxis>
struct sbp_type_of_impl {
  using type = typename nd_type_of_impl<V, std::make_index_sequence<V.rank>>::type;
};
template <nd_parallel V>
struct sbp_type_of_impl<V, true> {
  using type = typename axis_type_of<V, 0>::type;
};

/// The static SBP type of a value: a one-axis type when `OneAxis`, else sbp<...>.
template <nd_parallel V, bool OneAxis>
using sbp_type_of = typename sbp_type_of_impl<V, OneAxis>::type;

/// Runs mesh axis d of one route step on my shard (`local`, the shard under `before`).
template <element T, std::size_t MeshRank, one_axis_sbp From, one_axis_sbp To>
void run_axis(const placement<MeshRank>& where, const shape_t& shape, const nd_parallel& before, std::size_t d,
              aligned_vector<T>& local) {
  axis_view<T> v{where.axis(d), shard_box(shape, before, where.shape(), where.coords(), d).extent, std::move(local),
                 where.pool()};
  box_axis(v, From{}, To{});
  local = std::move(v.local);
}

/// Runs the static route R on my shard, one box_axis overload per step.
template <element T, std::size_t MeshRank, route R>
void run_route(const placement<MeshRank>& where, const shape_t& shape, aligned_vector<T>& local) {
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (run_axis<T, MeshRank, type_of<R.steps[K].from>, type_of<R.steps[K].to>>(where, shape, R.before[K], R.steps[K].axis,
                                                                             local),
     ...);
  }
  (std::make_index_sequence<R.count>{});
}

}  // namespace detail

/// Every route a boxing From -> To may take (a compile-time value): to<To>(t) instantiates each and
/// runs the one plan() takes on the tensor's mesh.
template <sbp_type From, sbp_type To>
inline constexpr route_candidates candidates_of = candidates(nd_of<From>::value, nd_of<To>::value);

/// The static route of a boxing From -> To on the nominal 2-per-axis mesh (a compile-time value).
template <sbp_type From, sbp_type To>
inline constexpr route route_of = plan(nd_of<From>::value, nd_of<To>::value);

/// The static route of a boxing From -> To on a mesh whose extents are in its type, e.g.
/// route_on<From, To, static_mesh<2, 8>> (a compile-time value; what to<To>(t) runs on that mesh).
template <sbp_type From, sbp_type To, class StaticMesh>
inline constexpr route route_on = plan(nd_of<From>::value, nd_of<To>::value, extents_of(StaticMesh::extents));

/// Same layout: boxing is free.
template <sbp_type A, sbp_type B>
inline constexpr bool same_layout = nd_of<A>::mesh_rank == nd_of<B>::mesh_rank&& nd_of<A>::value == nd_of<B>::value;

namespace detail {
template <sbp_type From, sbp_type To>
constexpr void check_mesh_rank() {
  static_assert(nd_of<From>::mesh_rank == nd_of<To>::mesh_rank,
                "flexpar::sbp::to<Sbp>: the target SBP has another number of entries than the tensor's placement "
                "mesh has axes; an nd-SBP needs one entry per mesh axis (use placement changes to move between "
                "meshes)");
}
}  // namespace detail

/// The route to<To>(t) runs for a tensor From on `where`: the candidate plan() takes on its extents.
template <sbp_type From, sbp_type To, std::size_t MeshRank>
const route& route_for(const placement<MeshRank>& where) noexcept {
  return candidates_of<From, To>.routes[cheapest(candidates_of<From, To>, extents_of(where.shape()))];
}

/// Boxing, consuming `t`: its buffer is reused where the transform allows (P -> B allreduces in
/// place). Collective over t's mesh (every mesh rank calls it; ranks outside pass their empty tensor).
/// Returns a global_tensor<T, To, M>.
template <sbp_type To, element T, sbp_type From, class M>
requires(!same_layout<From, To>) auto to(global_tensor<T, From, M>&& t) {
  if constexpr (nd_of<From>::mesh_rank != nd_of<To>::mesh_rank) {
    detail::check_mesh_rank<From, To>();
  } else {
    const auto where = t.where();
    const shape_t shape = t.shape();
    aligned_vector<T> local = std::move(t).release();
    if (where.contains_me()) {
      const std::size_t chosen = cheapest(candidates_of<From, To>, extents_of(where.shape()));  // plan() here
      [&]<std::size_t... C>(std::index_sequence<C...>) {
        ((chosen == C
              ? detail::run_route<T, nd_of<From>::mesh_rank, candidates_of<From, To>.routes[C]>(where, shape, local)
              : void()),
         ...);
      }
      (std::make_index_sequence<candidates_of<From, To>.count>{});
    }
    return global_tensor<T, To, M>::adopt(where, shape, std::move(local));
  }
}

/// Boxing of a tensor that stays usable: boxes a copy.
template <sbp_type To, element T, sbp_type From, class M>
requires(!same_layout<From, To>) auto to(const global_tensor<T, From, M>& t) { return to<To>(t.clone()); }

/// X -> X: the tensor itself (no allocation, no copy). Bind the result with auto&&.
template <sbp_type To, element T, sbp_type From, class M>
requires(same_layout<From, To>) const global_tensor<T, From, M>& to(const global_tensor<T, From, M>& t) noexcept {
  detail::check_mesh_rank<From, To>();
  return t;
}

/// X -> X on an rvalue: the tensor itself, moved through.
template <sbp_type To, element T, sbp_type From, class M>
requires(same_layout<From, To>) global_tensor<T, From, M> && to(global_tensor<T, From, M>&& t)
noexcept {
  detail::check_mesh_rank<From, To>();
  return std::move(t);
}

// ---- placement change --------------------------------------------------------------------------

namespace detail {
/// `s` with every partial entry replaced by B.
constexpr nd_parallel without_partial(nd_parallel s) noexcept {
  for (std::size_t d = 0; d < s.rank; ++d)
    if (s[d].is_partial()) s[d] = parallel::B();
  return s;
}

/// The intersection of two boxes (empty extent where they do not meet).
inline box intersect(const box& a, const box& b) {
  box r{shape_t(a.offset.size(), 0), shape_t(a.offset.size(), 0)};
  for (std::size_t i = 0; i < a.offset.size(); ++i) {
    const std::size_t lo = std::max(a.offset[i], b.offset[i]);
    const std::size_t hi = std::min(a.offset[i] + a.extent[i], b.offset[i] + b.extent[i]);
    r.offset[i] = lo;
    r.extent[i] = hi > lo ? hi - lo : 0;
  }
  return r;
}

inline shape_t relative(const shape_t& at, const shape_t& origin) {
  shape_t r(at.size());
  for (std::size_t i = 0; i < at.size(); ++i) r[i] = at[i] - origin[i];
  return r;
}
}  // namespace detail

/// Placement change: the tensor moves from its mesh to `dest` (another set of ranks of the same parent
/// communicator, another mesh shape or rank: n -> m ranks, 1 -> n, n -> 1) and takes the SBP To there.
/// Collective over the parent communicator (every parent rank calls it, also ranks in neither mesh).
/// Script: partial entries -> B on the source mesh (allreduce); one alltoall_v over the parent in
/// which each source shard that is not a broadcast copy sends each destination rank the intersection
/// of their boxes; then B -> P on the destination where To is partial (local).
template <sbp_type To, element T, sbp_type From, class M, std::size_t N2>
auto to(const global_tensor<T, From, M>& t, const placement<N2>& dest) {
  static_assert(nd_of<To>::mesh_rank == N2,
                "flexpar::sbp::to<Sbp>(t, placement): the target SBP needs one entry per axis of the destination "
                "placement's mesh");
  constexpr std::size_t N1 = nd_of<From>::mesh_rank;
  constexpr nd_parallel src_sbp = detail::without_partial(nd_of<From>::value);
  constexpr nd_parallel dst_sbp = detail::without_partial(nd_of<To>::value);
  using Src = detail::sbp_type_of<src_sbp, false>;
  using Dst = detail::sbp_type_of<dst_sbp, false>;
  communicator& parent = t.where().parent();
  if (&parent != &dest.parent())
    throw usage_error(detail::on_rank(parent.rank(), "sbp::to(placement)") + "the source mesh " + t.where().describe() +
                      " and the destination mesh " + dest.describe() + " are built over different communicators");
  auto&& src = to<Src>(t);
  const shape_t& shape = t.shape();
  const placement<N1>& from = t.where();
  const auto P = static_cast<std::size_t>(parent.size());

  // who sends what: the box of each parent rank in each mesh (source: only shards that are not copies)
  std::vector<std::optional<box>> src_box(P), dst_box(P);
  for (int i = 0; i < from.size(); ++i) {
    const auto c = from.coords_of(i);
    bool owner = true;
    for (std::size_t d = 0; d < N1; ++d)
      if (src_sbp[d].is_broadcast() && c[d] != 0) owner = false;
    if (owner) src_box[static_cast<std::size_t>(from.parent_rank(i))] = shard_box(shape, src_sbp, from.shape(), c);
  }
  for (int j = 0; j < dest.size(); ++j)
    dst_box[static_cast<std::size_t>(dest.parent_rank(j))] = shard_box(shape, dst_sbp, dest.shape(), dest.coords_of(j));

  const auto me = static_cast<std::size_t>(parent.rank());
  std::vector<std::size_t> sends(P, 0), receives(P, 0);
  buffer_pool& pool = dest.pool();
  aligned_vector<T> packed;
  if (src_box[me]) {
    const std::span<const T> mine = src.to_local();
    for (std::size_t q = 0; q < P; ++q)
      if (dst_box[q]) sends[q] = detail::intersect(*src_box[me], *dst_box[q]).elements();
    packed = pool.template acquire<T>(std::accumulate(sends.begin(), sends.end(), std::size_t{0}));
    std::size_t at = 0;
    for (std::size_t q = 0; q < P; ++q) {
      if (!dst_box[q]) continue;
      const box piece = detail::intersect(*src_box[me], *dst_box[q]);
      copy_box<T>(mine, src_box[me]->extent, detail::relative(piece.offset, src_box[me]->offset),
                  std::span<T>(packed).subspan(at), piece.extent, shape_t(shape.size(), 0), piece.extent);
      at += sends[q];
    }
  }
  if (dst_box[me])
    for (std::size_t q = 0; q < P; ++q)
      if (src_box[q]) receives[q] = detail::intersect(*src_box[q], *dst_box[me]).elements();
  aligned_vector<T> incoming =
      pool.template acquire<T>(std::accumulate(receives.begin(), receives.end(), std::size_t{0}));
  alltoall_v(parent, std::span<const T>(packed), std::span<const std::size_t>(sends), std::span<T>(incoming),
             std::span<const std::size_t>(receives));
  pool.give_back(std::move(packed));

  aligned_vector<T> local;
  if (dst_box[me]) {
    local = pool.template acquire<T>(dst_box[me]->elements());
    std::size_t at = 0;
    for (std::size_t q = 0; q < P; ++q) {
      if (!src_box[q]) continue;
      const box piece = detail::intersect(*src_box[q], *dst_box[me]);
      copy_box<T>(std::span<const T>(incoming).subspan(at), piece.extent, shape_t(shape.size(), 0), local,
                  dst_box[me]->extent, detail::relative(piece.offset, dst_box[me]->offset), piece.extent);
      at += piece.elements();
    }
  }
  pool.give_back(std::move(incoming));
  auto landed = global_tensor<T, Dst, M>::adopt(dest, shape, std::move(local));
  auto boxed = to<nd_of<To>>(std::move(landed));  // B -> P where To is partial (local)
  return global_tensor<T, To, M>::adopt(dest, shape, std::move(boxed).release());
}

// ---- cost --------------------------------------------------------------------------------------

/// The cost of one mesh-axis step on a group of p ranks holding `bytes` jointly (ring collectives).
inline cost axis_step_cost(const parallel& from, const parallel& to, int p, double bytes) noexcept {
  if (from == to) return {};
  if (from.is_partial() && to.is_broadcast()) return allreduce_ring_cost(p, bytes);
  if (from.is_partial() && to.is_split()) return reduce_scatter_ring_cost(p, bytes);
  if (from.is_split() && to.is_broadcast()) return allgather_ring_cost(p, bytes);
  if (from.is_split() && to.is_split()) return alltoall_pairwise_cost(p, bytes / p);
  cost local;  // slices, zero fills, pads: memory only
  local.copy_bytes = to.is_split() ? bytes / p : bytes;
  return local;
}

/// The cost of the route `r` for a logical `shape` of `element_bytes`-byte elements on a mesh.
inline cost route_cost(const route& r, const shape_t& shape, std::span<const int> mesh_shape,
                       std::size_t element_bytes) {
  cost total;
  const std::vector<int> origin(mesh_shape.size(), 0);
  for (std::size_t k = 0; k < r.count; ++k) {
    const route_step& s = r.steps[k];
    const box held = shard_box(shape, r.before[k], mesh_shape, origin, s.axis);
    total =
        total + axis_step_cost(s.from, s.to, mesh_shape[s.axis], static_cast<double>(held.elements() * element_bytes));
  }
  return total;
}

/// The cost of boxing a tensor of `shape` (elements of `element_bytes`) from From to To on
/// `where`, from the collectives' cost functions (what the strategy search adds up).
template <sbp_type From, sbp_type To, std::size_t MeshRank>
cost boxing_cost(const shape_t& shape, const placement<MeshRank>& where, std::size_t element_bytes = 4) {
  detail::check_mesh_rank<From, To>();
  return route_cost(plan(nd_of<From>::value, nd_of<To>::value, extents_of(where.shape())), shape, where.shape(),
                    element_bytes);
}

}  // namespace flexpar::sbp
