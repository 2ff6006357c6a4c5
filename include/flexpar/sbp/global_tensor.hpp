// flexpar/sbp/global_tensor.hpp — a logical tensor laid out over a placement by a static SBP.
//
//   placement<1> ranks(comm, {comm.size()});
//   auto w = global_tensor<float, split<1>>::from_full(ranks, {784, 256}, full_w);  // my columns
//   std::span<float> mine = w.to_local();                                          // row-major shard
//   auto b = to<broadcast>(w);                                                     // allgather
//
// The local shard is row-major with the shape local_shape(): the logical shape with every split
// axis cut by the balanced rule (layout.hpp), nested in mesh-axis order. Under partial<Op> a rank
// holds a full-shape tensor and the logical tensor is the Op-reduction over that mesh axis.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/core/dtype.hpp>
#include <flexpar/core/memory.hpp>
#include <flexpar/sbp/backend.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/sbp/parallel.hpp>
#include <flexpar/sbp/placement.hpp>

namespace flexpar::sbp {

namespace detail {
/// True when every partial entry of `s` uses the same op (boxing cannot commute sum and max).
constexpr bool partial_ops_agree(const nd_parallel& s) noexcept {
  bool seen = false;
  reduce_op op = reduce_op::sum;
  for (std::size_t d = 0; d < s.rank; ++d) {
    if (!s[d].is_partial()) continue;
    if (seen && s[d].op != op) return false;
    seen = true;
    op = s[d].op;
  }
  return true;
}

/// The value a rank contributes where it holds no part of a partial tensor: the op's identity.
template <class T>
T partial_identity(reduce_op op) {
  if constexpr (std::is_arithmetic_v<T>) {
    return identity_of<T>(op);
  } else {
    return T(identity_of<float>(op));
  }
}

/// A full tensor becoming a shard of a partial<sum> tensor: only coordinate 0 of each partial axis
/// keeps the values (the others' zeros add nothing); max and min are idempotent, every rank keeps them.
template <class T>
void zero_partial_copies(std::span<T> local, const nd_parallel& s, std::span<const int> coords) {
  for (std::size_t d = 0; d < s.rank; ++d)
    if (s[d].is_partial() && s[d].op == reduce_op::sum && coords[d] != 0) {
      std::fill(local.begin(), local.end(), T{});
      return;
    }
}

/// The op of the partial entries of `s` (sum when there are none).
constexpr reduce_op partial_op_of(const nd_parallel& s) noexcept {
  for (std::size_t d = 0; d < s.rank; ++d)
    if (s[d].is_partial()) return s[d].op;
  return reduce_op::sum;
}

/// Throws usage_error on `rank` when the SBP `Sbp` splits a tensor axis that `shape` lacks.
template <sbp_type Sbp>
void check_split_axes(int rank, const shape_t& shape) {
  for (std::size_t d = 0; d < nd_of<Sbp>::mesh_rank; ++d) {
    const parallel& e = nd_of<Sbp>::value[d];
    if (e.is_split() && static_cast<std::size_t>(e.axis) >= shape.size())
      throw error_on<usage_error>(rank, "global_tensor", "SBP ", to_string<Sbp>(), " splits tensor axis ", e.axis,
                                  " but the shape ", to_string(shape), " has ", shape.size(), " axes");
  }
}

/// Throws usage_error on `rank` when `to<To>` of a `From` tensor of `shape` asks for a split axis the
/// shape lacks: the message names to<To>, the source SBP, the shape and the splits the shape allows.
template <sbp_type From, sbp_type To>
void check_target_axes(int rank, const shape_t& shape) {
  for (std::size_t d = 0; d < nd_of<To>::mesh_rank; ++d) {
    const parallel& e = nd_of<To>::value[d];
    if (!e.is_split() || static_cast<std::size_t>(e.axis) < shape.size()) continue;
    const std::string allowed = shape.empty()       ? std::string("B or P only: a scalar has no axis to split")
                                : shape.size() == 1 ? std::string("S(0), B or P")
                                                    : "S(0) ... S(" + std::to_string(shape.size() - 1) + "), B or P";
    throw error_on<usage_error>(rank, "to<" + to_string<To>() + ">", "cannot box the ", to_string<From>(),
                                " tensor of shape ", to_string(shape), " to ", to_string<To>(), ": mesh axis ", d,
                                " would split tensor axis ", e.axis, ", but the tensor has ", shape.size(),
                                " axes; mesh axis ", d, " can take ", allowed);
  }
}

/// Collective over the mesh (nothing outside it): throws mismatch_error on every mesh rank when they
/// were not all given the same logical shape, naming each shape and its ranks. Costs one allreduce of
/// 32 bytes (a digest of the shape); the shapes themselves are gathered only to name them.
template <std::size_t N>
void check_same_shape(const placement<N>& where, const shape_t& shape, std::string_view what) {
  if (!where.contains_me()) return;
  communicator& g = where.group();
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over the axis count and the extents
  auto mix = [&](std::uint64_t v) {
    for (int byte = 0; byte < 8; ++byte) hash = (hash ^ ((v >> (8 * byte)) & 0xffu)) * 1099511628211ull;
  };
  mix(shape.size());
  for (std::size_t e : shape) mix(e);
  const auto axes = static_cast<std::int64_t>(shape.size()), digest = static_cast<std::int64_t>(hash >> 1);
  std::int64_t most[4] = {axes, digest, -axes, -digest};  // max of x and of -x: max and -min
  allreduce(g, std::span<std::int64_t>(most), reduce_op::max);
  if (most[0] == -most[2] && most[1] == -most[3]) return;
  // They differ: every mesh rank learns every shape (padded to the most axes) to name them.
  const std::size_t width = 1 + static_cast<std::size_t>(most[0]);
  std::vector<std::int64_t> mine(width, 0), all(width * static_cast<std::size_t>(g.size()));
  mine[0] = axes;
  for (std::size_t d = 0; d < shape.size(); ++d) mine[1 + d] = static_cast<std::int64_t>(shape[d]);
  allgather(g, std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  std::vector<std::pair<shape_t, std::vector<int>>> groups;
  for (int q = 0; q < g.size(); ++q) {
    const std::int64_t* row = all.data() + width * static_cast<std::size_t>(q);
    shape_t theirs(static_cast<std::size_t>(row[0]));
    for (std::size_t d = 0; d < theirs.size(); ++d) theirs[d] = static_cast<std::size_t>(row[1 + d]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& grp) { return grp.first == theirs; });
    if (it == groups.end())
      groups.push_back({std::move(theirs), {q}});
    else
      it->second.push_back(q);
  }
  std::string text;
  for (std::size_t k = 0; k < groups.size(); ++k) {
    if (k > 0) text += k + 1 == groups.size() ? " but " : ", ";
    text += to_string(groups[k].first) + " on mesh " + rank_set(groups[k].second);
  }
  throw error_on<mismatch_error>(where.parent().rank(), what, "the mesh ranks disagree about the shape: ", text);
}

/// Collective over the mesh: the full logical tensor of shards `local` laid out by `s`, on every mesh
/// rank (empty outside it). Independent of boxing (the oracle of the boxing tests): every shard is
/// gathered with its box, and the ranks that hold a broadcast copy at coordinate 0 contribute,
/// reduced by the partial op where there is one.
template <element T, std::size_t N>
std::vector<T> gather_full(const placement<N>& where, const shape_t& shape, const nd_parallel& s,
                           std::span<const T> local) {
  if (!where.contains_me()) return {};
  communicator& g = where.group();
  const auto p = static_cast<std::size_t>(g.size());
  std::vector<std::size_t> counts(p), displs(p, 0);
  std::vector<box> boxes(p);
  for (std::size_t q = 0; q < p; ++q) {
    boxes[q] = shard_box(shape, s, where.shape(), where.coords_of(static_cast<int>(q)));
    counts[q] = boxes[q].elements();
  }
  std::exclusive_scan(counts.begin(), counts.end(), displs.begin(), std::size_t{0});
  std::vector<T> all(displs.back() + counts.back());
  allgather_v(g, local, std::span<T>(all), std::span<const std::size_t>(counts));

  const reduce_op op = partial_op_of(s);
  std::vector<T> full(elements_of(shape), s.any_partial() ? partial_identity<T>(op) : T{});
  std::vector<T> piece;
  for (std::size_t q = 0; q < p; ++q) {
    const auto c = where.coords_of(static_cast<int>(q));
    bool contributes = true;
    for (std::size_t d = 0; d < s.rank; ++d)
      if (s[d].is_broadcast() && c[d] != 0) contributes = false;
    if (!contributes) continue;
    const box& b = boxes[q];
    const std::span<const T> shard = std::span<const T>(all).subspan(displs[q], counts[q]);
    if (!s.any_partial()) {
      copy_box<T>(shard, b.extent, shape_t(b.extent.size(), 0), full, shape, b.offset, b.extent);
      continue;
    }
    piece.assign(full.size(), partial_identity<T>(op));
    copy_box<T>(shard, b.extent, shape_t(b.extent.size(), 0), piece, shape, b.offset, b.extent);
    reduce_into(std::span<T>(full), std::span<const T>(piece), op);
  }
  return full;
}

}  // namespace detail

/// A logical tensor of T over a placement with the static SBP `Sbp` (a one-axis SBP for a 1-D mesh,
/// or sbp<...> with one entry per mesh axis), its shards in `Memory` (memory::host, or memory::cuda
/// with <flexpar/cuda/sbp.hpp>: backend.hpp). Move-only (copies of tensors are explicit: clone()).
template <element T, sbp_type Sbp, class Memory = host>
class global_tensor {
  static_assert(backend<Memory>::available,
                "flexpar::sbp::global_tensor<T, Sbp, Memory>: Memory is memory::host, or memory::cuda with "
                "<flexpar/cuda/sbp.hpp> included (part of flexpar::cuda): include it");
  static_assert(detail::partial_ops_agree(nd_of<Sbp>::value),
                "flexpar::sbp::global_tensor: an nd-SBP may hold partial values of one op only (P(sum) and P(max) "
                "on two mesh axes do not commute)");
  using mem = backend<Memory>;

 public:
  using value_type = T;                                                     ///< element type
  using sbp_type = Sbp;                                                     ///< the SBP as written
  using nd_sbp = nd_of<Sbp>;                                                ///< the SBP as sbp<...>
  using memory_type = Memory;                                               ///< where the shards live
  static constexpr std::size_t mesh_rank = nd_sbp::mesh_rank;               ///< mesh axes
  using placement_type = typename mem::template placement_type<mesh_rank>;  ///< the placement it lives on
  using shard_type = typename mem::template shard<T>;                       ///< the storage of a shard
  using span_type = typename mem::template span<T>;                         ///< my shard's elements
  using const_span_type = typename mem::template span<const T>;             ///< my shard's elements, read
  using host_tensor = global_tensor<T, Sbp, host>;                          ///< the same in host memory

  /// Moves the shard; `other` is left empty (on the same placement).
  global_tensor(global_tensor&& other) noexcept
      : placement_(other.placement_), shape_(std::move(other.shape_)), local_(std::move(other.local_)) {
    other.local_ = shard_type{};
  }
  /// Moves the shard; the buffer this tensor held goes back to its placement's pool.
  global_tensor& operator=(global_tensor&& other) noexcept {
    if (this == &other) return *this;
    mem::give_back(placement_, std::move(local_));
    placement_ = other.placement_;
    shape_ = std::move(other.shape_);
    local_ = std::move(other.local_);
    other.local_ = shard_type{};
    return *this;
  }
  global_tensor(const global_tensor&) = delete;             ///< copies are explicit: clone()
  global_tensor& operator=(const global_tensor&) = delete;  ///< copies are explicit: clone()
  /// Returns the shard's buffer to the placement's pool (where the next boxing or tensor reuses it).
  ~global_tensor() { mem::give_back(placement_, std::move(local_)); }

  /// Collective over the mesh: every mesh rank passes the same full logical tensor (host memory) and
  /// keeps its shard; the only communication is the check that every mesh rank passed the same shape
  /// (detail::check_same_shape: mismatch_error naming the shapes and ranks otherwise). Under
  /// partial<sum> the mesh coordinate 0 keeps the values and the others hold zeros; under
  /// partial<max/min> every rank keeps them (max(x, x) = x). Another memory than the host's: the host
  /// tensor's shard, then one upload.
  static global_tensor from_full(const placement_type& where, shape_t shape, std::span<const T> full) {
    if constexpr (!mem::host_memory) {
      return upload(where, host_tensor::from_full(mem::host_placement(where), std::move(shape), full));
    } else {
      detail::check_same_shape(where, shape, "global_tensor::from_full");
      check_full(where, shape, full.size(), "from_full");
      global_tensor t(where, std::move(shape));
      if (!where.contains_me()) return t;
      const box mine = t.my_box();
      t.local_ = mem::template acquire<T>(where, mine.elements());
      copy_box<T>(full, t.shape_, mine.offset, t.local_, mine.extent, shape_t(mine.extent.size(), 0), mine.extent);
      detail::zero_partial_copies<T>(t.local_, nd_sbp::value, where.coords());
      return t;
    }
  }

  /// Collective over the mesh: mesh index `root` passes the full tensor (others pass an empty span)
  /// and every rank receives its shard (one alltoall_v: root sends each shard once; another memory
  /// than the host's: then one upload).
  static global_tensor scatter(const placement_type& where, shape_t shape, std::span<const T> full, int root = 0) {
    if constexpr (!mem::host_memory) {
      return upload(where, host_tensor::scatter(mem::host_placement(where), std::move(shape), full, root));
    } else {
      detail::check_same_shape(where, shape, "global_tensor::scatter");
      global_tensor t(where, std::move(shape));
      if (!where.contains_me()) return t;
      communicator& g = where.group();
      if (g.rank() == root) check_full(where, t.shape_, full.size(), "scatter");
      const auto p = static_cast<std::size_t>(g.size());
      std::vector<std::size_t> sends(p, 0), receives(p, 0);
      aligned_vector<T> packed;
      if (g.rank() == root) {
        std::size_t total = 0;
        for (int q = 0; q < g.size(); ++q)
          total += shard_box(t.shape_, nd_sbp::value, where.shape(), where.coords_of(q)).elements();
        packed = where.pool().template acquire<T>(total);
        std::size_t at = 0;
        for (int q = 0; q < g.size(); ++q) {
          const box b = shard_box(t.shape_, nd_sbp::value, where.shape(), where.coords_of(q));
          sends[static_cast<std::size_t>(q)] = b.elements();
          copy_box<T>(full, t.shape_, b.offset, std::span<T>(packed).subspan(at), b.extent, shape_t(b.extent.size(), 0),
                      b.extent);
          at += b.elements();
        }
      }
      t.local_ = where.pool().template acquire<T>(t.my_box().elements());
      receives[static_cast<std::size_t>(root)] = t.local_.size();
      alltoall_v(g, std::span<const T>(packed), std::span<const std::size_t>(sends), std::span<T>(t.local_),
                 std::span<const std::size_t>(receives));
      where.pool().give_back(std::move(packed));
      detail::zero_partial_copies<T>(t.local_, nd_sbp::value, where.coords());
      return t;
    }
  }

  /// Collective over the mesh: adopts `local` as this rank's shard (its size must be the shard size of
  /// `shape`); no copy. Checks that every mesh rank passed the same shape (as from_full).
  static global_tensor from_local(const placement_type& where, shape_t shape, shard_type local) {
    detail::check_same_shape(mem::host_placement(where), shape, "global_tensor::from_local");
    return adopt(where, std::move(shape), std::move(local));
  }
  /// The same from another vector (a std::vector<T>, whose buffer need not lie on a cache line): its
  /// elements are copied into a buffer of the placement's pool, one pass over the shard. Host memory.
  template <class Allocator>
  requires(mem::host_memory && !std::is_same_v<Allocator, cache_line_allocator<T>>) static global_tensor
      from_local(const placement_type& where, shape_t shape, const std::vector<T, Allocator>& local) {
    return from_local(where, std::move(shape), where.pool().acquire_copy(std::span<const T>(local)));
  }
  /// The same from elements in the tensor's memory that it does not own (a device buffer of the
  /// caller's): copied into a shard of the placement's pool, ordered after the work on its stream.
  static global_tensor from_local(const placement_type& where, shape_t shape,
                                  const_span_type local) requires(!mem::host_memory) {
    detail::check_same_shape(mem::host_placement(where), shape, "global_tensor::from_local");
    shard_type s = acquire(where, local.size());
    mem::copy(where, mem::elements(s), local);
    return adopt(where, std::move(shape), std::move(s));
  }

  /// For ops and boxing: a tensor of this type from a shard computed from tensors whose shapes agree
  /// already (no communication; checks the shard's size only).
  static global_tensor adopt(const placement_type& where, shape_t shape, shard_type local) {
    global_tensor t(where, std::move(shape));
    const std::size_t given = mem::elements(local).size();
    const std::size_t want = where.contains_me() ? t.my_box().elements() : 0;
    if (given != want) {
      mem::give_back(where, std::move(local));
      if (!where.contains_me())
        throw error_on<usage_error>(where.parent().rank(), "global_tensor::from_local",
                                    "this rank is outside the mesh ", where.describe(), " but passed ", given,
                                    " elements");
      throw error_on<usage_error>(where.parent().rank(), "global_tensor::from_local", "tensor ", to_string(t.shape_),
                                  " ", to_string<Sbp>(), " has a shard of ", want, " elements ",
                                  to_string(t.local_shape()), " on this rank, but ", given, " were given");
    }
    t.local_ = std::move(local);
    return t;
  }

  /// The shard of a host tensor on the same mesh copied to this memory (one upload, waited for: the
  /// host tensor may go once this returns). @throws usage_error when `h` does not live on the mesh of
  /// `where`.
  static global_tensor upload(const placement_type& where, const host_tensor& h) requires(!mem::host_memory) {
    if (!(h.where() == mem::host_placement(where)))
      throw error_on<usage_error>(where.parent().rank(), "to_device", "the host tensor lives on ", h.where().describe(),
                                  ", not on the device placement's mesh ", where.describe());
    return adopt(where, h.shape(), mem::from_host(where, h.to_local()));
  }

  /// The logical shape.
  [[nodiscard]] const shape_t& shape() const noexcept { return shape_; }
  /// The shape of my shard (all zeros outside the mesh).
  [[nodiscard]] shape_t local_shape() const {
    return placement_.contains_me() ? my_box().extent : shape_t(shape_.size(), 0);
  }
  /// My shard, row-major, in the tensor's memory.
  [[nodiscard]] span_type to_local() noexcept { return mem::elements(local_); }
  /// My shard, row-major, in the tensor's memory.
  [[nodiscard]] const_span_type to_local() const noexcept { return mem::elements(local_); }
  /// The placement.
  [[nodiscard]] const placement_type& where() const noexcept { return placement_; }
  /// The box of the logical tensor my shard covers (partial shards cover the whole tensor).
  [[nodiscard]] box my_box() const { return shard_box(shape_, nd_sbp::value, placement_.shape(), placement_.coords()); }
  /// An explicit deep copy.
  [[nodiscard]] global_tensor clone() const {
    global_tensor t(placement_, shape_);
    t.local_ = acquire(placement_, to_local().size());
    mem::copy(placement_, mem::elements(t.local_), to_local());
    return t;
  }
  /// Takes the storage out (the tensor is left empty); the buffer then leaves the placement's pool
  /// (boxing uses it to box in place).
  [[nodiscard]] shard_type release() && noexcept {
    shard_type out = std::move(local_);
    local_ = shard_type{};
    return out;
  }
  /// My shard copied to a host vector (waits for the placement's stream where it has one).
  [[nodiscard]] std::vector<T> download() const {
    auto mine = mem::readable(placement_, to_local());
    if constexpr (std::is_same_v<decltype(mine), std::vector<T>>)
      return mine;  // a download already
    else
      return std::vector<T>(mine.begin(), mine.end());
  }

  /// Collective over the mesh: the full logical tensor on the host of every mesh rank (empty outside
  /// it); independent of boxing (detail::gather_full), the oracle of the boxing tests.
  [[nodiscard]] std::vector<T> to_full() const {
    const auto mine = mem::readable(placement_, to_local());
    return detail::gather_full<T>(mem::host_placement(placement_), shape_, nd_sbp::value, std::span<const T>(mine));
  }

  /// The op of the partial entries (sum when there are none).
  static constexpr reduce_op partial_op() noexcept { return detail::partial_op_of(nd_sbp::value); }

  /// A shard of `count` elements from the placement's pool (its contents undefined).
  static shard_type acquire(const placement_type& where, std::size_t count) {
    return mem::template acquire<T>(where, count);
  }

 private:
  global_tensor(const placement_type& where, shape_t shape) : placement_(where), shape_(std::move(shape)) {
    detail::check_split_axes<Sbp>(where.parent().rank(), shape_);
  }
  static void check_full(const placement_type& where, const shape_t& shape, std::size_t given, const char* what) {
    if (given != elements_of(shape))
      throw error_on<usage_error>(where.parent().rank(), std::string("global_tensor::") + what, "shape ",
                                  to_string(shape), " has ", elements_of(shape), " elements but ", given,
                                  " were given");
  }

  placement_type placement_;
  shape_t shape_;
  shard_type local_;
};

/// A host tensor's copy in the memory of placement `to` (a cuda::device_placement: to_device), whose
/// host placement must be t's.
template <element T, sbp_type S, class Where>
requires(!backend<memory_of<Where>>::host_memory) auto to_device(const global_tensor<T, S, host>& t, const Where& to) {
  return global_tensor<T, S, memory_of<Where>>::upload(to, t);
}

/// A tensor's copy in host memory, on its placement's host placement (no communication).
template <element T, sbp_type S, class M>
requires(!backend<M>::host_memory) global_tensor<T, S, host> to_host(const global_tensor<T, S, M>& t) {
  const auto& where = backend<M>::host_placement(t.where());
  return global_tensor<T, S, host>::adopt(where, t.shape(),
                                          where.pool().acquire_copy(std::span<const T>(t.download())));
}

}  // namespace flexpar::sbp
