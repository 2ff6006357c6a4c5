// flexpar/sbp/boxing/strided_copy.hpp — what one mesh-axis transform works on (axis_view), and the
// local copies between a shard's layouts when a tensor is split on an axis that is not the
// outermost: then a rank's rows are runs at a stride, and the transforms pack them into contiguous
// blocks, or place contiguous pieces back as runs.
//
// A shape is viewed around one tensor axis as [outer, rows, inner]; a row block (a part of the rows)
// is then `outer` runs of rows.count * inner elements, one per outer index, `rows * inner` apart.
// Copies read a source in memory with the inline run copy and write a destination in memory with
// streaming stores (core/streaming_copy.hpp; the thresholds are the communicator's settings).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/collective/allgather_pairwise_placed.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/aligned_vector.hpp>
#include <flexpar/core/streaming_copy.hpp>
#include <flexpar/sbp/buffer_pool.hpp>
#include <flexpar/sbp/layout.hpp>

namespace flexpar::sbp {

/// What one mesh-axis transform works on: the group of that axis, the shape the group holds jointly,
/// and my shard (replaced by the transform). The host form of the view every box_axis overload takes;
/// its members are what the memory-generic steps call (the device form, cuda::device_axis_view in
/// flexpar/cuda/sbp.hpp, has the same ones): shards from the pool, copies, fills, and the collectives
/// of equal blocks that boxing/equal_blocks.hpp scripts.
template <element T>
struct axis_view {
  using value_type = T;                   ///< element type
  using shard = aligned_vector<T>;        ///< a shard or a temporary
  using span_type = std::span<T>;         ///< elements of a shard
  using const_span = std::span<const T>;  ///< elements read
  communicator& comm;                     ///< the mesh-axis group
  shape_t group_shape;                    ///< the tensor the group holds jointly (other axes' splits applied)
  aligned_vector<T> local;                ///< my shard under the current SBP of this axis
  buffer_pool& pool;                      ///< where temporaries and results come from and go back to
  /// How S(i) -> B with i an inner axis streams through cache-sized slots; the same on every rank of
  /// the group. Tests pass small chunks to reach the multi-chunk paths on small tensors.
  staging stage{};

  [[nodiscard]] int rank() const noexcept { return comm.rank(); }  ///< my coordinate on the axis
  [[nodiscard]] int size() const noexcept { return comm.size(); }  ///< ranks on the axis
  /// `count` elements from the pool (contents unspecified).
  [[nodiscard]] shard acquire(std::size_t count) { return pool.template acquire<T>(count); }
  /// `next` becomes my shard; the old one goes back to the pool.
  void replace(shard&& next) {
    pool.give_back(std::move(local));
    local = std::move(next);
  }
  /// A temporary back to the pool.
  void recycle(shard&& spare) { pool.give_back(std::move(spare)); }
  /// The elements of `s`.
  static span_type elements(shard& s) noexcept { return s; }
  /// Shortens `s` to its first `count` elements (the buffer stays).
  static void truncate(shard& s, std::size_t count) { s.resize(count); }
  /// Keeps elements [from, from + count) of my shard as my shard, in its own buffer. True (the host
  /// moves them to the front).
  bool keep_range(std::size_t from, std::size_t count) {
    if (from != 0)
      std::copy(local.begin() + static_cast<std::ptrdiff_t>(from),
                local.begin() + static_cast<std::ptrdiff_t>(from + count), local.begin());  // forward: dest first
    local.resize(count);
    return true;
  }
  /// copy_box (layout.hpp).
  void copy_box(const_span src, const shape_t& src_shape, const shape_t& src_at, span_type dst,
                const shape_t& dst_shape, const shape_t& dst_at, const shape_t& extent) {
    flexpar::sbp::copy_box<T>(src, src_shape, src_at, dst, dst_shape, dst_at, extent);
  }
  /// Every element of `s` set to `value`.
  void fill(span_type s, const T& value) { std::fill(s.begin(), s.end(), value); }
  /// dst = src (same size).
  void copy(span_type dst, const_span src) { std::copy(src.begin(), src.end(), dst.begin()); }
  /// allreduce(op) of `data` in place over the axis.
  void allreduce(span_type data, reduce_op op) { flexpar::allreduce(comm, data, op); }
  /// reduce_scatter of equal blocks: `out` is my block of the op-reduction of every rank's `in`.
  void reduce_scatter(const_span in, span_type out, reduce_op op) { flexpar::reduce_scatter(comm, in, out, op); }
  /// allgather of equal blocks.
  void allgather(const_span in, span_type out) { flexpar::allgather(comm, in, out); }
  /// alltoall of equal blocks.
  void alltoall(const_span in, span_type out) { flexpar::alltoall(comm, in, out); }
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
/// prefetch hints: a hint may be dropped when many misses are in flight (a prefetch per line
/// measured slower).
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

}  // namespace detail

}  // namespace flexpar::sbp
