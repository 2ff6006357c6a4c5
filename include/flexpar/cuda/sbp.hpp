// flexpar/cuda/sbp.hpp — SBP global tensors in device memory: global_tensor<T, Sbp, memory::cuda>,
// boxed by the same overload of to<NewSbp> and the same routes as on the host, each mesh axis's
// collective on that axis's cuda::device_communicator (NCCL, or CUDA IPC among the ranks of one node,
// or staged); placement changes (the pieces through host memory); and matmul (cuBLAS), add, mul,
// relu, gelu, softmax, layer_norm, reduce_sum, embedding, conv2d and its gradients (im2col + cuBLAS)
// and transpose on the shards.
//
// Part of flexpar::cuda.
//
//   sbp::placement<1> ranks(comm, {comm.size()});
//   cuda::device_placement gpu(ranks, /*device=*/0);                 // stream, pool, axis communicators
//   auto w = global_tensor<float, split<1>, memory::cuda>::from_full(gpu, {784, 256}, full_w);
//   cuda::device_span<float> mine = w.to_local();                     // row-major shard on the GPU
//   auto b = to<broadcast>(std::move(w));                             // allgather on the device
//   auto h = to_host(b);                                              // global_tensor<float, broadcast>
//
// Every operation is enqueued on the placement's stream (gpu.stream()); the device collectives order
// themselves after it. A step that needs an uneven exchange (split axes whose extent the mesh axis
// does not divide) pads each rank's block to the largest one: the device collectives take equal
// blocks, and the padding never reaches a result.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <flexpar/core/dtype.hpp>
#include <flexpar/core/memory.hpp>
#include <flexpar/cuda/blas.hpp>
#include <flexpar/cuda/collective.hpp>
#include <flexpar/cuda/kernels.hpp>
#include <flexpar/cuda/nn.hpp>
#include <flexpar/cuda/runtime.hpp>
#include <flexpar/sbp/boxing/placement_change.hpp>
#include <flexpar/sbp/boxing/route.hpp>
#include <flexpar/sbp/boxing/same_placement.hpp>
#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/sbp/global_tensor.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/sbp/ops.hpp>
#include <flexpar/sbp/ops_nn.hpp>
#include <flexpar/sbp/placement.hpp>

namespace flexpar::cuda {

/// Device memory blocks for the shards and staging buffers of one placement's device tensors: a
/// block given back is kept (up to max_bytes in all) and handed out again for a request it fits
/// (at most twice the bytes asked), as sbp::buffer_pool does on the host. Used by one thread.
class device_pool {
 public:
  /// What the pool has done (for tests and the bench: an identity boxing changes none of these).
  struct counters {
    std::size_t allocations = 0;  ///< blocks cudaMalloc'ed
    std::size_t reuses = 0;       ///< requests served from a kept block
    std::size_t kept_bytes = 0;   ///< bytes kept now
  };
  /// A pool keeping at most `max_bytes` of free blocks.
  explicit device_pool(std::size_t max_bytes = std::size_t{1} << 30) : max_bytes_(max_bytes) {}

  /// A block of at least `bytes` (a kept one when one fits, else a new one).
  device_buffer<std::byte> acquire(std::size_t bytes) {
    if (bytes == 0) return {};
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= 2 * bytes) {
      device_buffer<std::byte> b = std::move(it->second);
      c_.kept_bytes -= it->first;
      free_.erase(it);
      ++c_.reuses;
      return b;
    }
    ++c_.allocations;
    return device_buffer<std::byte>(bytes);
  }
  /// Keeps `block` for a later acquire (freed at once when the pool is full).
  void give_back(device_buffer<std::byte>&& block) {
    if (block.size() == 0 || c_.kept_bytes + block.size() > max_bytes_) return;
    c_.kept_bytes += block.size();
    const std::size_t n = block.size();
    free_.emplace(n, std::move(block));
  }
  /// See counters.
  [[nodiscard]] counters stats() const noexcept { return c_; }

 private:
  std::size_t max_bytes_;
  std::multimap<std::size_t, device_buffer<std::byte>> free_;
  counters c_;
};

/// `count` elements of T at the front of a pooled device block: the storage of a device shard.
template <class T>
struct device_shard {
  device_buffer<std::byte> block;  ///< the memory (block.size() >= count * sizeof(T))
  std::size_t count = 0;           ///< elements in use

  /// The elements in use.
  [[nodiscard]] device_span<T> span() const noexcept { return {reinterpret_cast<T*>(block.data()), count}; }
};

/// A placement's device side: this rank's GPU, a stream every device tensor of the placement works
/// on, a device_pool, a cuBLAS handle, and one device_communicator per mesh axis (made at the first
/// boxing along that axis: collective over the axis's group, which every rank of it reaches in the
/// same boxing). Cheap to copy (copies share all of it and compare equal); used by one thread.
template <std::size_t MeshRank>
class device_placement {
 public:
  static constexpr std::size_t mesh_rank = MeshRank;  ///< mesh axes

  /// The device side of `where` on GPU `device`; `options` configure the axis communicators.
  /// @throws transport_error when the device does not exist or the stream cannot be made.
  device_placement(const sbp::placement<MeshRank>& where, int device, device_options options = {})
      : s_(std::make_shared<state>(where, device, std::move(options))) {}

  /// The host placement (mesh, ranks, host pool).
  [[nodiscard]] const sbp::placement<MeshRank>& host() const noexcept { return s_->where; }
  /// This rank's GPU.
  [[nodiscard]] int device() const noexcept { return s_->device; }
  /// The stream the placement's device tensors are computed and boxed on.
  [[nodiscard]] cudaStream_t stream() const noexcept { return s_->s; }
  /// The device blocks of this placement's tensors.
  [[nodiscard]] device_pool& pool() const noexcept { return s_->pool; }
  /// My group along mesh axis `d` on the device (made at its first use, collectively). NCCL (where
  /// options.use_nccl allows it) only when no two ranks of the group share a GPU: NCCL holds one
  /// rank per GPU, and ranks that share one go through CUDA IPC or staging.
  [[nodiscard]] device_communicator& axis(std::size_t d) const {
    auto& c = s_->axes.at(d);
    if (!c) {
      communicator& group = s_->where.axis(d);
      device_options o = s_->options;
      if (o.use_nccl && group.size() > 1) {
        const int mine[2] = {group.topology().my_node(), s_->device};
        std::vector<int> all(2 * static_cast<std::size_t>(group.size()));
        allgather(group, std::span<const int>(mine), std::span<int>(all));
        for (std::size_t q = 0; q + 2 <= all.size(); q += 2)
          for (std::size_t r = q + 2; r + 2 <= all.size(); r += 2)
            if (all[q] == all[r] && all[q + 1] == all[r + 1]) o.use_nccl = false;
      }
      device_guard on(s_->device);
      c = std::make_unique<device_communicator>(group, s_->device, o);
    }
    return *c;
  }
  /// The settings of the axis communicators (their paths' cost models among them).
  [[nodiscard]] const device_options& options() const noexcept { return s_->options; }
  /// The cuBLAS handle of this placement (made at first use).
  [[nodiscard]] blas& linear_algebra() const {
    if (!s_->la) {
      device_guard on(s_->device);
      s_->la = std::make_unique<blas>();
    }
    return *s_->la;
  }
  /// Waits, with the parent communicator's timeout, for the work enqueued on stream().
  void synchronize(std::string_view what) const {
    cuda::synchronize(s_->s, s_->where.parent().settings().timeout, what, s_->where.parent().rank());
  }

  /// Mesh extents, membership, coordinates and the parent: those of host().
  [[nodiscard]] const std::array<int, MeshRank>& shape() const noexcept { return s_->where.shape(); }
  [[nodiscard]] bool contains_me() const noexcept { return s_->where.contains_me(); }                    ///< see host()
  [[nodiscard]] const std::array<int, MeshRank>& coords() const noexcept { return s_->where.coords(); }  ///< see host()
  [[nodiscard]] communicator& parent() const noexcept { return s_->where.parent(); }                     ///< see host()
  /// "[2] over ranks 0 1 on GPU 0".
  [[nodiscard]] std::string describe() const { return s_->where.describe() + " on GPU " + std::to_string(s_->device); }
  /// Copies of one device placement compare equal; two constructions do not.
  friend bool operator==(const device_placement& a, const device_placement& b) noexcept { return a.s_ == b.s_; }

 private:
  struct state {
    state(const sbp::placement<MeshRank>& w, int d, device_options o)
        : where(w), device(d), options(std::move(o)), s(stream_on(d)) {}
    static cuda::stream stream_on(int d) {
      device_guard on(d);
      return cuda::stream();
    }
    sbp::placement<MeshRank> where;
    int device;
    device_options options;
    cuda::stream s;
    device_pool pool;
    std::array<std::unique_ptr<device_communicator>, MeshRank> axes{};
    std::unique_ptr<blas> la;
  };
  std::shared_ptr<state> s_;
};

template <std::size_t N>
device_placement(const sbp::placement<N>&, int, device_options = {}) -> device_placement<N>;

namespace detail {
/// The box `extent` at `src_at` of the row-major `src_shape` tensor at `src` copied to `dst_at` of
/// `dst_shape` at `dst`, elements of `element_bytes` bytes, on `s` (one cudaMemcpyAsync when the box
/// is one run, else a kernel that copies it in the widest chunks the layout allows). lib/cuda/sbp_kernels.cu.
void copy_box_bytes(std::size_t element_bytes, const void* src, const sbp::shape_t& src_shape,
                    const sbp::shape_t& src_at, void* dst, const sbp::shape_t& dst_shape, const sbp::shape_t& dst_at,
                    const sbp::shape_t& extent, cudaStream_t s);

/// The float kernels of the device ops along one tensor axis, on a shard seen as [outer, rows, inner]
/// (lib/cuda/sbp_kernels.cu; in double, rounded once, as the host ops).
void softmax_lines(float* data, std::size_t outer, std::size_t rows, std::size_t inner, cudaStream_t s);
/// See softmax_lines: (x - mean) / sqrt(var + eps) along each line.
void layer_norm_lines(float* data, std::size_t outer, std::size_t rows, std::size_t inner, double eps, cudaStream_t s);
/// See softmax_lines: out[o, i] = the sum of line (o, i) in row order (float, as the host).
void sum_lines(const float* x, float* out, std::size_t outer, std::size_t rows, std::size_t inner, cudaStream_t s);
/// x Φ(x) element-wise, in place.
void gelu_in_place(float* x, std::size_t n, cudaStream_t s);
/// The lookup of embedding: out[i, :] = the row ids[i] - lo of `w` ([rows, cols], elements of
/// `element_bytes` bytes) when lo <= ids[i] < lo + rows, else zeros, for i < n; `first_bad` (one
/// value, set to ~0 here) takes the least i whose id is outside [0, vocab).
void embedding_rows(std::size_t element_bytes, const void* w, const std::int64_t* ids, void* out, std::size_t n,
                    std::size_t cols, std::int64_t lo, std::int64_t rows, std::int64_t vocab,
                    unsigned long long* first_bad, cudaStream_t s);
/// out [cols, rows] = in [rows, cols] transposed, elements of `element_bytes` (1, 2, 4 or 8) bytes:
/// 32 x 32 tiles through shared memory.
void transpose_2d(std::size_t element_bytes, const void* in, void* out, std::size_t rows, std::size_t cols,
                  cudaStream_t s);
/// im2col of one sample x [C, H, W] (geometry g, batch ignored): col [C R S, P Q], zeros where a
/// window reaches into the padding.
void im2col(const sbp::local::conv2d_geometry& g, const float* x, float* col, cudaStream_t s);
/// col2im of one sample, gathering: dx[c, h, w] = the sum over (r, s) of dcol[(c R + r) S + s, p Q + q]
/// at p = h + pad_h - r, q = w + pad_w - s inside [0, P) x [0, Q), in (r, s) order. dx is overwritten.
void col2im(const sbp::local::conv2d_geometry& g, const float* dcol, float* dx, cudaStream_t s);
}  // namespace detail

/// copy_box (sbp/layout.hpp) on device memory: the box `extent` at `src_at` of `src` (shape
/// `src_shape`) to `dst_at` of `dst` (shape `dst_shape`), enqueued on `s`.
template <class T>
void copy_box(device_span<const T> src, const sbp::shape_t& src_shape, const sbp::shape_t& src_at, device_span<T> dst,
              const sbp::shape_t& dst_shape, const sbp::shape_t& dst_at, const sbp::shape_t& extent, cudaStream_t s) {
  detail::copy_box_bytes(sizeof(T), src.data(), src_shape, src_at, dst.data(), dst_shape, dst_at, extent, s);
}

}  // namespace flexpar::cuda

namespace flexpar::sbp {

/// A logical tensor of T over a placement with the static SBP `Sbp`, its shards in device memory
/// (the host form's interface, with a device_placement for the placement and a cuda::device_span for
/// the shard). Move-only (copies are explicit: clone()).
template <element T, sbp_type Sbp>
class global_tensor<T, Sbp, memory::cuda> {
  static_assert(detail::partial_ops_agree(nd_of<Sbp>::value),
                "flexpar::sbp::global_tensor: an nd-SBP may hold partial values of one op only (P(sum) and P(max) "
                "on two mesh axes do not commute)");

 public:
  using value_type = T;                                        ///< element type
  using sbp_type = Sbp;                                        ///< the SBP as written
  using nd_sbp = nd_of<Sbp>;                                   ///< the SBP as sbp<...>
  using memory_type = memory::cuda;                            ///< where the shards live
  static constexpr std::size_t mesh_rank = nd_sbp::mesh_rank;  ///< mesh axes
  using placement_type = cuda::device_placement<mesh_rank>;    ///< the placement it lives on
  using shard_type = cuda::device_shard<T>;                    ///< the storage of a shard

  /// Moves the shard; `other` is left empty.
  global_tensor(global_tensor&& other) noexcept
      : placement_(other.placement_), shape_(std::move(other.shape_)), local_(std::move(other.local_)) {
    other.local_.count = 0;
  }
  /// Moves the shard; the block this tensor held goes back to the placement's device pool.
  global_tensor& operator=(global_tensor&& other) noexcept {
    if (this == &other) return *this;
    placement_.pool().give_back(std::move(local_.block));
    placement_ = other.placement_;
    shape_ = std::move(other.shape_);
    local_ = std::move(other.local_);
    other.local_.count = 0;
    return *this;
  }
  global_tensor(const global_tensor&) = delete;             ///< copies are explicit: clone()
  global_tensor& operator=(const global_tensor&) = delete;  ///< copies are explicit: clone()
  /// Returns the shard's block to the placement's device pool.
  ~global_tensor() { placement_.pool().give_back(std::move(local_.block)); }

  /// Collective over the mesh: every mesh rank passes the same full logical tensor (host memory) and
  /// keeps its shard, copied to the device (the host form's from_full, then one upload).
  static global_tensor from_full(const placement_type& where, shape_t shape, std::span<const T> full) {
    return upload(where, global_tensor<T, Sbp, host>::from_full(where.host(), std::move(shape), full));
  }

  /// Collective over the mesh (the shape check): a copy of `local`, device memory holding this rank's
  /// shard row-major, as the shard. @throws usage_error when its size is not the shard's.
  static global_tensor from_local(const placement_type& where, shape_t shape, cuda::device_span<const T> local) {
    detail::check_same_shape(where.host(), shape, "global_tensor::from_local");
    shard_type s = acquire(where, local.size());
    cuda::copy_async(s.span(), local, where.stream());
    return adopt(where, std::move(shape), std::move(s));
  }

  /// For ops and boxing: a tensor of this type from a shard computed from tensors whose shapes agree
  /// already (no communication; checks the shard's size only).
  static global_tensor adopt(const placement_type& where, shape_t shape, shard_type local) {
    global_tensor t(where, std::move(shape));
    const std::size_t want = where.contains_me() ? t.my_box().elements() : 0;
    if (local.count != want) {
      const std::size_t given = local.count;
      where.pool().give_back(std::move(local.block));
      throw error_on<usage_error>(where.parent().rank(), "global_tensor::from_local", "tensor ", to_string(t.shape_),
                                  " ", to_string<Sbp>(), " (device) has a shard of ", want,
                                  " elements on this rank, but ", given, " were given");
    }
    t.local_ = std::move(local);
    return t;
  }

  /// The shard of a host tensor on the same mesh copied to the device (one upload, waited for).
  /// @throws usage_error when `h` does not live on where.host().
  static global_tensor upload(const placement_type& where, const global_tensor<T, Sbp, host>& h) {
    if (!(h.where() == where.host()))
      throw error_on<usage_error>(where.parent().rank(), "to_device", "the host tensor lives on ", h.where().describe(),
                                  ", not on the device placement's mesh ", where.describe());
    shard_type s = acquire(where, h.to_local().size());
    cuda::copy_async(s.span(), h.to_local(), where.stream());
    where.synchronize("to_device");  // the host shard may go once this returns
    return adopt(where, h.shape(), std::move(s));
  }

  /// The logical shape.
  [[nodiscard]] const shape_t& shape() const noexcept { return shape_; }
  /// The shape of my shard (all zeros outside the mesh).
  [[nodiscard]] shape_t local_shape() const {
    return placement_.contains_me() ? my_box().extent : shape_t(shape_.size(), 0);
  }
  /// My shard, row-major, in device memory.
  [[nodiscard]] cuda::device_span<T> to_local() noexcept { return local_.span(); }
  /// My shard, row-major, in device memory.
  [[nodiscard]] cuda::device_span<const T> to_local() const noexcept { return local_.span(); }
  /// The device placement.
  [[nodiscard]] const placement_type& where() const noexcept { return placement_; }
  /// The box of the logical tensor my shard covers (partial shards cover the whole tensor).
  [[nodiscard]] box my_box() const {
    return shard_box(shape_, nd_sbp::value, placement_.host().shape(), placement_.coords());
  }
  /// An explicit deep copy (one device-to-device copy on the placement's stream).
  [[nodiscard]] global_tensor clone() const {
    global_tensor t(placement_, shape_);
    t.local_ = acquire(placement_, local_.count);
    cuda::copy_async(t.local_.span(), to_local(), placement_.stream());
    return t;
  }
  /// Takes the storage out (the tensor is left empty); boxing uses it to box in place.
  [[nodiscard]] shard_type release() && noexcept {
    shard_type out = std::move(local_);
    local_.count = 0;
    return out;
  }
  /// My shard copied to the host (waits for the placement's stream).
  [[nodiscard]] std::vector<T> download() const {
    std::vector<T> out(local_.count);
    cuda::copy_async(std::span<T>(out), to_local(), placement_.stream());
    placement_.synchronize("global_tensor::download");
    return out;
  }
  /// Collective over the mesh: the full logical tensor on the host of every mesh rank (empty outside
  /// it): the shards downloaded and gathered by the host's detail::gather_full, the boxing tests' oracle.
  [[nodiscard]] std::vector<T> to_full() const {
    const std::vector<T> mine = download();
    return detail::gather_full<T>(placement_.host(), shape_, nd_sbp::value, std::span<const T>(mine));
  }

  /// The op of the partial entries (sum when there are none).
  static constexpr reduce_op partial_op() noexcept { return detail::partial_op_of(nd_sbp::value); }

  /// A shard of `count` elements from the placement's device pool (its contents undefined).
  static shard_type acquire(const placement_type& where, std::size_t count) {
    return shard_type{where.pool().acquire(count * sizeof(T)), count};
  }

 private:
  global_tensor(const placement_type& where, shape_t shape) : placement_(where), shape_(std::move(shape)) {
    detail::check_split_axes<Sbp>(where.parent().rank(), shape_);
  }

  placement_type placement_;
  shape_t shape_;
  shard_type local_;
};

/// A host tensor's copy on the device placement `gpu` (whose host() must be t's placement).
template <element T, sbp_type S, std::size_t N>
global_tensor<T, S, memory::cuda> to_device(const global_tensor<T, S, host>& t, const cuda::device_placement<N>& gpu) {
  return global_tensor<T, S, memory::cuda>::upload(gpu, t);
}

/// A device tensor's copy in host memory, on its placement's host() (no communication).
template <element T, sbp_type S>
global_tensor<T, S, host> to_host(const global_tensor<T, S, memory::cuda>& t) {
  const auto& where = t.where().host();
  return global_tensor<T, S, host>::adopt(where, t.shape(),
                                          where.pool().acquire_copy(std::span<const T>(t.download())));
}

// ---- boxing on the device ------------------------------------------------------------------------

namespace detail {

/// One mesh axis's boxing on the device: the axis's device communicator, the shape its group holds
/// jointly, my shard, the pool and the stream (the device form of axis_view).
template <class T>
struct device_axis_view {
  cuda::device_communicator& comm;
  shape_t group_shape;
  cuda::device_shard<T> local;
  cuda::device_pool& pool;
  cudaStream_t stream;

  [[nodiscard]] int rank() const noexcept { return comm.rank(); }
  [[nodiscard]] int size() const noexcept { return comm.size(); }
  cuda::device_shard<T> acquire(std::size_t count) { return {pool.acquire(count * sizeof(T)), count}; }
  void replace(cuda::device_shard<T>&& next) {
    pool.give_back(std::move(local.block));
    local = std::move(next);
  }
  void recycle(cuda::device_shard<T>&& spare) { pool.give_back(std::move(spare.block)); }
};

/// The box of block `k` along `axis` of `shape` cut by `parts` (offset and extent).
inline box axis_block(const shape_t& shape, std::size_t axis, const part& k) {
  shape_t at(shape.size(), 0);
  at[axis] = k.offset;
  return box{at, with_extent(shape, axis, k.count)};
}

/// The largest block when `shape`'s axis is cut by `parts` (every rank's padded block size).
inline std::size_t largest_block(const shape_t& shape, std::size_t axis, const std::vector<part>& parts) {
  std::size_t most = 0;
  for (const part& k : parts) most = std::max(most, k.count);
  return elements_of(with_extent(shape, axis, most));
}

/// True when the blocks along `axis` are equal and lie one after another in row-major order.
inline bool contiguous_equal_blocks(const shape_t& shape, std::size_t axis, const std::vector<part>& parts) {
  const around a(shape, axis);
  for (const part& k : parts)
    if (k.count != parts.front().count) return false;
  return a.outer == 1;
}

template <class T, one_axis_sbp X>
void box_axis_device(device_axis_view<T>&, X, X) {}

/// P(op) -> B: the device allreduce, in place.
template <class T, reduce_op Op>
void box_axis_device(device_axis_view<T>& v, partial<Op>, broadcast) {
  v.comm.allreduce(v.local.span(), Op, v.stream);
}

/// P(op) -> S(i): the destinations' blocks packed one after another (each padded to the largest;
/// nothing to pack when they already lie so), one device reduce_scatter, my block is the result.
template <class T, reduce_op Op, int I>
void box_axis_device(device_axis_view<T>& v, partial<Op>, split<I>) {
  const int p = v.size();
  if (p == 1) return;
  const auto parts = parts_of(v.group_shape[I], p);
  const std::size_t block = largest_block(v.group_shape, I, parts);
  const shape_t zero(v.group_shape.size(), 0);
  cuda::device_shard<T> packed;
  if (!contiguous_equal_blocks(v.group_shape, I, parts)) {
    packed = v.acquire(block * static_cast<std::size_t>(p));
    for (std::size_t k = 0; k < parts.size(); ++k) {
      const box b = axis_block(v.group_shape, I, parts[k]);
      cuda::copy_box<T>(v.local.span(), v.group_shape, b.offset, packed.span().subspan(k * block, b.elements()),
                        b.extent, zero, b.extent, v.stream);
    }
  }
  const cuda::device_span<const T> send = packed.count ? packed.span() : v.local.span();
  cuda::device_shard<T> mine = v.acquire(block);
  v.comm.reduce_scatter(send, mine.span(), Op, v.stream);
  mine.count = axis_block(v.group_shape, I, parts[static_cast<std::size_t>(v.rank())]).elements();
  v.recycle(std::move(packed));
  v.replace(std::move(mine));
}

/// S(i) -> B: one device allgather of every shard (padded to the largest), then each block copied to
/// its place in the result (nothing to place when the blocks are equal and outermost).
template <class T, int I>
void box_axis_device(device_axis_view<T>& v, split<I>, broadcast) {
  const int p = v.size();
  const auto parts = parts_of(v.group_shape[I], p);
  const std::size_t block = largest_block(v.group_shape, I, parts);
  cuda::device_shard<T> send;
  if (v.local.count != block) {  // padded to the common block size
    send = v.acquire(block);
    cuda::copy_async(send.span().first(v.local.count), cuda::device_span<const T>(v.local.span()), v.stream);
  }
  const bool in_place = contiguous_equal_blocks(v.group_shape, I, parts);
  cuda::device_shard<T> gathered = v.acquire(block * static_cast<std::size_t>(p));
  v.comm.allgather(cuda::device_span<const T>(send.count ? send.span() : v.local.span()), gathered.span(), v.stream);
  v.recycle(std::move(send));
  if (in_place) {
    v.replace(std::move(gathered));
    return;
  }
  cuda::device_shard<T> out = v.acquire(elements_of(v.group_shape));
  const shape_t zero(v.group_shape.size(), 0);
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const box b = axis_block(v.group_shape, I, parts[k]);
    cuda::copy_box<T>(gathered.span().subspan(k * block, b.elements()), b.extent, zero, out.span(), v.group_shape,
                      b.offset, b.extent, v.stream);
  }
  v.recycle(std::move(gathered));
  v.replace(std::move(out));
}

/// S(i) -> S(j), i != j: block k of mine (my rows of i, rank k's rows of j) packed at k x block
/// (padded to the largest), one device alltoall, rank k's block placed at its rows of i in the result.
template <class T, int I, int J>
requires(I != J) void box_axis_device(device_axis_view<T>& v, split<I>, split<J>) {
  const int p = v.size();
  const auto me = static_cast<std::size_t>(v.rank());
  const auto rows_i = parts_of(v.group_shape[I], p), rows_j = parts_of(v.group_shape[J], p);
  const shape_t mine_now = with_extent(v.group_shape, I, rows_i[me].count);
  const shape_t mine_next = with_extent(v.group_shape, J, rows_j[me].count);
  std::size_t most_i = 0, most_j = 0;
  for (const part& k : rows_i) most_i = std::max(most_i, k.count);
  for (const part& k : rows_j) most_j = std::max(most_j, k.count);
  const std::size_t block = elements_of(with_extent(with_extent(v.group_shape, I, most_i), J, most_j));
  const shape_t zero(v.group_shape.size(), 0);
  cuda::device_shard<T> send = v.acquire(block * static_cast<std::size_t>(p));
  for (std::size_t k = 0; k < rows_j.size(); ++k) {
    const box b = axis_block(mine_now, J, rows_j[k]);
    cuda::copy_box<T>(v.local.span(), mine_now, b.offset, send.span().subspan(k * block, b.elements()), b.extent, zero,
                      b.extent, v.stream);
  }
  cuda::device_shard<T> received = v.acquire(block * static_cast<std::size_t>(p));
  v.comm.alltoall(cuda::device_span<const T>(send.span()), received.span(), v.stream);
  v.recycle(std::move(send));
  cuda::device_shard<T> next = v.acquire(elements_of(mine_next));
  for (std::size_t k = 0; k < rows_i.size(); ++k) {
    const box b = axis_block(mine_next, I, rows_i[k]);
    cuda::copy_box<T>(received.span().subspan(k * block, b.elements()), b.extent, zero, next.span(), mine_next,
                      b.offset, b.extent, v.stream);
  }
  v.recycle(std::move(received));
  v.replace(std::move(next));
}

/// B -> S(i): keep my rows (local): the same block, shortened, when they are its front; else one copy.
template <class T, int I>
void box_axis_device(device_axis_view<T>& v, broadcast, split<I>) {
  const part mine = balanced_part(v.group_shape[I], v.size(), v.rank());
  const box b = axis_block(v.group_shape, I, mine);
  if (around(v.group_shape, I).outer == 1 && mine.offset == 0) {
    v.local.count = b.elements();
    return;
  }
  cuda::device_shard<T> out = v.acquire(b.elements());
  cuda::copy_box<T>(v.local.span(), v.group_shape, b.offset, out.span(), b.extent, shape_t(b.extent.size(), 0),
                    b.extent, v.stream);
  v.replace(std::move(out));
}

/// B -> P(op): sum keeps the values at coordinate 0 and zeros elsewhere; max and min keep them.
template <class T, reduce_op Op>
void box_axis_device(device_axis_view<T>& v, broadcast, partial<Op>) {
  if (Op == reduce_op::sum && v.rank() != 0) cuda::fill(v.local.span(), T{}, v.stream);
}

/// S(i) -> P(op): my rows in a full-shape tensor of the op's identity (local).
template <class T, int I, reduce_op Op>
void box_axis_device(device_axis_view<T>& v, split<I>, partial<Op>) {
  const box b = axis_block(v.group_shape, I, balanced_part(v.group_shape[I], v.size(), v.rank()));
  cuda::device_shard<T> out = v.acquire(elements_of(v.group_shape));
  cuda::fill(out.span(), partial_identity<T>(Op), v.stream);
  cuda::copy_box<T>(v.local.span(), b.extent, shape_t(b.extent.size(), 0), out.span(), v.group_shape, b.offset,
                    b.extent, v.stream);
  v.replace(std::move(out));
}

/// P(a) -> P(b), a != b: routes go through B (reached only by a hand-made route).
template <class T, reduce_op A, reduce_op B>
requires(A != B) void box_axis_device(device_axis_view<T>& v, partial<A>, partial<B>) {
  throw error_on<usage_error>(v.rank(), "box_axis", "P(", name_of(A), ") -> P(", name_of(B),
                              ") has no one-step transform; box through B");
}

/// Runs mesh axis d of one route step on my device shard (`local`, the shard under `before`) on the
/// axis's device communicator (the device form of run_axis).
template <class T, std::size_t MeshRank, one_axis_sbp From, one_axis_sbp To>
void run_axis_device(const cuda::device_placement<MeshRank>& where, const shape_t& shape, const nd_parallel& before,
                     std::size_t d, cuda::device_shard<T>& local) {
  device_axis_view<T> v{where.axis(d), shard_box(shape, before, where.shape(), where.coords(), d).extent,
                        std::move(local), where.pool(), where.stream()};
  box_axis_device(v, From{}, To{});
  local = std::move(v.local);
}

/// Runs the static route R on my device shard, one box_axis_device overload per step.
template <class T, std::size_t MeshRank, route R>
void run_route_device(const cuda::device_placement<MeshRank>& where, const shape_t& shape,
                      cuda::device_shard<T>& local) {
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (run_axis_device<T, MeshRank, type_of<R.steps[K].from>, type_of<R.steps[K].to>>(where, shape, R.before[K],
                                                                                    R.steps[K].axis, local),
     ...);
  }
  (std::make_index_sequence<R.count>{});
}

}  // namespace detail

/// Boxing of a device tensor, consuming it: the route to<To>(t) takes on the host (route_for), each
/// mesh axis's step on that axis's device communicator. Collective over t's mesh.
template <sbp_type To, element T, sbp_type From>
requires(!same_layout<From, To>) auto to(global_tensor<T, From, memory::cuda>&& t) {
  if constexpr (nd_of<From>::mesh_rank != nd_of<To>::mesh_rank) {
    detail::check_mesh_rank<From, To>();
  } else {
    constexpr std::size_t N = nd_of<From>::mesh_rank;
    const cuda::device_placement<N> where = t.where();
    const shape_t shape = t.shape();
    cuda::device_shard<T> local = std::move(t).release();
    if (where.contains_me()) {
      const std::size_t chosen = cheapest(candidates_of<From, To>, extents_of(where.shape()));
      [&]<std::size_t... C>(std::index_sequence<C...>) {
        ((chosen == C ? detail::run_route_device<T, N, candidates_of<From, To>.routes[C]>(where, shape, local)
                      : void()),
         ...);
      }
      (std::make_index_sequence<candidates_of<From, To>.count>{});
    }
    return global_tensor<T, To, memory::cuda>::adopt(where, shape, std::move(local));
  }
}

/// The predicted seconds of boxing a device tensor of `shape` (elements of `element_bytes` bytes) from
/// `from` to `to` on `gpu`: the route plan() takes, each step priced on its mesh axis's device
/// communicator — the collective at the path that communicator's choose() picks (NCCL, CUDA IPC or
/// staged, by their cost models on the device links; gpu.options() sets them) — plus the packs, places,
/// slices and fills of the step through device memory (options().device_gamma per byte read or
/// written). Identity is 0. Collective over the mesh where an axis's communicator is made (its first use).
template <std::size_t N>
double boxing_seconds(const shape_t& shape, const nd_parallel& from, const nd_parallel& to,
                      const cuda::device_placement<N>& gpu, std::size_t element_bytes = 4) {
  const route r = detail::dynamic_route(gpu.parent().rank(), from, to, gpu.shape());
  const std::array<int, N> origin{};
  const double gamma = gpu.options().device_gamma, per_copied_byte = 2 * gamma;
  double seconds = 0;
  for (std::size_t k = 0; k < r.count; ++k) {
    const route_step& step = r.steps[k];
    const int p = gpu.shape()[step.axis];
    if (step.from == step.to || p == 1) continue;
    const box held = shard_box(shape, r.before[k], gpu.shape(), origin, step.axis);
    const double bytes = static_cast<double>(held.elements() * element_bytes), mine = bytes / p;
    const parallel& split_side = step.from.is_split() ? step.from : step.to;  // the split of a split step
    const bool outer =
        split_side.is_split() && detail::around(held.extent, static_cast<std::size_t>(split_side.axis)).outer == 1;
    auto collective = [&](const char* op, double b) {  // the path choose() picks, at its predicted seconds
      const cuda::device_communicator::choice c = gpu.axis(step.axis).choose(op, static_cast<std::size_t>(b));
      return std::min({c.nccl_seconds, c.ring_seconds, c.staged_seconds, c.ipc_seconds});
    };
    if (step.from.is_partial() && step.to.is_broadcast()) {
      seconds += collective("allreduce", bytes);
    } else if (step.from.is_partial() && step.to.is_split()) {
      seconds += collective("reduce_scatter", bytes) + (outer ? 0 : bytes * per_copied_byte);  // the pack
    } else if (step.from.is_split() && step.to.is_broadcast()) {
      seconds += collective("allgather", bytes) + (outer ? 0 : bytes * per_copied_byte);  // the places
    } else if (step.from.is_split() && step.to.is_split()) {
      seconds += collective("alltoall", mine) + 2 * mine * per_copied_byte;  // pack and place
    } else if (step.to.is_split()) {
      seconds += outer ? 0 : mine * per_copied_byte;  // B -> S: my rows, a copy unless they are the front
    } else if (step.from.is_split()) {
      seconds += bytes * gamma + mine * per_copied_byte;  // S -> P: a fill of the op's identity, then my rows
    } else if (step.to.op == reduce_op::sum) {
      seconds += bytes * gamma;  // B -> P(sum): zeros off coordinate 0 (max and min keep the values)
    }
  }
  return seconds;
}

/// boxing_seconds of the static SBPs From and To (what boxing_cost is on the host, priced on the device).
template <sbp_type From, sbp_type To, std::size_t N>
double boxing_seconds(const shape_t& shape, const cuda::device_placement<N>& gpu, std::size_t element_bytes = 4) {
  detail::check_mesh_rank<From, To>();
  return boxing_seconds(shape, nd_of<From>::value, nd_of<To>::value, gpu, element_bytes);
}

/// Boxing of a device tensor that stays usable: boxes a copy.
template <sbp_type To, element T, sbp_type From>
requires(!same_layout<From, To>) auto to(const global_tensor<T, From, memory::cuda>& t) { return to<To>(t.clone()); }

/// Placement change of a device tensor: it moves to `dest` (another mesh of ranks of the same parent
/// communicator: n -> m ranks, 1 -> n, n -> 1, another mesh shape) and takes the SBP To there, as the
/// host's to<To>(t, placement). Partial entries are summed on the source mesh by its device
/// communicators; the pieces then go through host memory (a download, the host placement change's
/// one alltoall_v over the parent, an upload: the device communicators are per mesh axis, none spans
/// both meshes); B -> P where To is partial is local on the destination. Collective over the parent.
template <sbp_type To, element T, sbp_type From, std::size_t N2>
auto to(const global_tensor<T, From, memory::cuda>& t, const cuda::device_placement<N2>& dest) {
  static_assert(nd_of<To>::mesh_rank == N2,
                "flexpar::sbp::to<Sbp>(t, device_placement): the target SBP needs one entry per axis of the "
                "destination placement's mesh");
  using Src = detail::sbp_type_of<detail::without_partial(nd_of<From>::value), false>;
  using Dst = detail::sbp_type_of<detail::without_partial(nd_of<To>::value), false>;
  auto&& summed = to<Src>(t);  // the source's partial entries summed on the device
  const global_tensor<T, Dst> moved = to<Dst>(to_host(summed), dest.host());
  const shape_t shape = t.shape();
  auto boxed = to<nd_of<To>>(global_tensor<T, Dst, memory::cuda>::upload(dest, moved));  // B -> P: local
  return global_tensor<T, To, memory::cuda>::adopt(dest, shape, std::move(boxed).release());
}

// ---- ops on the device ---------------------------------------------------------------------------

namespace diagnostic {
/// Instantiated when an op is given one host and one device tensor.
template <class Left, class Right>
struct operands_in_different_memory {
  static_assert(detail::dependent_false<Left>,
                "flexpar::sbp: one operand lives in host memory and the other in device memory (memory::cuda). "
                "Bring them together first: to_device(host_tensor, device_placement) copies a host tensor to "
                "the GPU, to_host(device_tensor) copies a device tensor back.");
};
/// Instantiated for a device matmul of an element type cuBLAS is not called with here.
template <class T>
struct device_matmul_needs_f32_or_bf16 {
  static_assert(detail::dependent_false<T>,
                "flexpar::sbp::matmul on device tensors runs cublasGemmEx in f32 or bf16 (f32 accumulation): "
                "its element type must be float or flexpar::bfloat16.");
};
}  // namespace diagnostic

namespace detail {
template <class MA, class MB>
constexpr bool different_memory = !std::is_same_v<MA, MB>;

template <class TA, class TB>
void require_same_device_placement(const TA& a, const TB& b, const char* op) {
  if (!(a.where() == b.where()))
    throw error_on<usage_error>(a.where().parent().rank(), op, "the operands live on different placements (",
                                a.where().describe(), " and ", b.where().describe(),
                                "); box one with a placement change");
}
}  // namespace detail

/// Matrix product of device tensors: the host signatures, the local product by cuBLAS on the
/// placement's stream (f32, or bf16 with f32 accumulation).
template <element T, sbp_type A, sbp_type B>
auto matmul(const global_tensor<T, A, memory::cuda>& a, const global_tensor<T, B, memory::cuda>& b) {
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, bfloat16>) {
    (void)sizeof(diagnostic::device_matmul_needs_f32_or_bf16<T>);
    return;
  } else if constexpr (!detail::same_mesh_rank<A, B>()) {
    return;
  } else {
    constexpr nd_signature_result sig = nd_signature(detail::matmul_rule{}, nd_of<A>::value, nd_of<B>::value);
    if constexpr (!sig.ok) {
      (void)sizeof(diagnostic::matmul_has_no_signature<A, B, detail::fix_type<detail::matmul_rule, A, B>>);
      return;
    } else {
      using Out = detail::sbp_type_of<sig.out, detail::both_one_axis<A, B>>;
      using result = global_tensor<T, Out, memory::cuda>;
      detail::require_same_device_placement(a, b, "matmul");
      if (a.shape().size() != 2 || b.shape().size() != 2 || a.shape()[1] != b.shape()[0])
        throw error_on<usage_error>(a.where().parent().rank(), "matmul", "shapes ", to_string(a.shape()), " x ",
                                    to_string(b.shape()), " do not multiply ([m, k] x [k, n])");
      const shape_t out_shape{a.shape()[0], b.shape()[1]};
      if (!a.where().contains_me()) return result::adopt(a.where(), out_shape, {});
      const shape_t la = a.local_shape(), lb = b.local_shape();
      if (la[1] != lb[0])
        throw error_on<usage_error>(a.where().parent().rank(), "matmul", "local shards ", to_string(la), " x ",
                                    to_string(lb), " do not multiply");
      cuda::device_shard<T> c = result::acquire(a.where(), la[0] * lb[1]);  // beta = 0: every element written
      if (c.count > 0) {
        if (la[1] == 0)
          cuda::fill(c.span(), T{}, a.where().stream());
        else
          a.where().linear_algebra().gemm(cuda::transpose::no, cuda::transpose::no, la[0], lb[1], la[1], 1.0f,
                                          a.to_local(), b.to_local(), 0.0f, c.span(), a.where().stream());
      }
      return result::adopt(a.where(), out_shape, std::move(c));
    }
  }
}

/// Element-wise sum of device tensors (the host signatures), one pass of cuda::reduce_into.
template <element T, sbp_type A, sbp_type B>
auto add(const global_tensor<T, A, memory::cuda>& a, const global_tensor<T, B, memory::cuda>& b) {
  if constexpr (!detail::same_mesh_rank<A, B>()) {
    return;
  } else {
    constexpr nd_signature_result sig = nd_signature(detail::add_rule{}, nd_of<A>::value, nd_of<B>::value);
    if constexpr (!sig.ok) {
      (void)sizeof(diagnostic::add_has_no_signature<A, B, detail::fix_type<detail::add_rule, A, B>>);
      return;
    } else {
      using result = global_tensor<T, A, memory::cuda>;
      detail::require_same_device_placement(a, b, "add");
      detail::require_same_shape(a, b, "add");
      cuda::device_shard<T> out = result::acquire(a.where(), a.to_local().size());
      cuda::reduce_into(out.span(), a.to_local(), b.to_local(), reduce_op::sum, a.where().stream());
      return result::adopt(a.where(), a.shape(), std::move(out));
    }
  }
}

/// Element-wise product of device tensors (the host signatures), one pass of cuda::reduce_into (prod).
template <element T, sbp_type A, sbp_type B>
auto mul(const global_tensor<T, A, memory::cuda>& a, const global_tensor<T, B, memory::cuda>& b) {
  if constexpr (!detail::same_mesh_rank<A, B>()) {
    return;
  } else {
    constexpr nd_signature_result sig = nd_signature(detail::mul_rule{}, nd_of<A>::value, nd_of<B>::value);
    if constexpr (!sig.ok) {
      (void)sizeof(diagnostic::mul_has_no_signature<A, B, detail::fix_type<detail::mul_rule, A, B>>);
      return;
    } else {
      using result = global_tensor<T, detail::sbp_type_of<sig.out, detail::both_one_axis<A, B>>, memory::cuda>;
      detail::require_same_device_placement(a, b, "mul");
      detail::require_same_shape(a, b, "mul");
      cuda::device_shard<T> out = result::acquire(a.where(), a.to_local().size());
      cuda::reduce_into(out.span(), a.to_local(), b.to_local(), reduce_op::prod, a.where().stream());
      return result::adopt(a.where(), a.shape(), std::move(out));
    }
  }
}

/// max(x, 0) of a float device tensor (the host signatures: any SBP but P).
template <sbp_type A>
auto relu(const global_tensor<float, A, memory::cuda>& t) {
  if constexpr (nd_of<A>::value.any_partial()) {
    (void)sizeof(diagnostic::relu_has_no_signature_for_partial<A>);
    return;
  } else {
    global_tensor<float, A, memory::cuda> out = t.clone();
    cuda::relu(out.to_local(), t.where().stream());
    return out;
  }
}

namespace detail {
/// The shard of `t` as [outer, rows, inner] around tensor axis `axis`. @throws usage_error naming `op`
/// when `axis` is not an axis of the tensor.
template <sbp_type A>
around device_lines(const global_tensor<float, A, memory::cuda>& t, int axis, const char* op) {
  if (static_cast<std::size_t>(axis) >= t.shape().size())
    throw error_on<usage_error>(t.where().parent().rank(), op, "axis ", axis, " of a tensor of shape ",
                                to_string(t.shape()));
  return around(t.local_shape(), static_cast<std::size_t>(axis));
}
}  // namespace detail

/// The GELU of a float device tensor (the host signatures: S and B, not P), in double rounded once.
template <sbp_type A>
auto gelu(const global_tensor<float, A, memory::cuda>& t) {
  constexpr nd_signature_result sig = nd_signature(signature::gelu, nd_of<A>::value);
  if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::gelu_has_no_signature_for_partial<A>);
    return;
  } else {
    global_tensor<float, A, memory::cuda> out = t.clone();
    cuda::detail::gelu_in_place(out.to_local().data(), out.to_local().size(), t.where().stream());
    return out;
  }
}

/// Softmax over tensor axis Axis of a float device tensor (the axis whole on every rank, as on the host).
template <int Axis, sbp_type A>
auto softmax(const global_tensor<float, A, memory::cuda>& t) {
  constexpr nd_signature_result sig =
      nd_signature([](const parallel& p) { return signature::softmax(p, Axis); }, nd_of<A>::value);
  if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::softmax_has_no_signature<A, Axis>);
    return;
  } else {
    const detail::around v = detail::device_lines(t, Axis, "softmax");
    global_tensor<float, A, memory::cuda> out = t.clone();
    cuda::detail::softmax_lines(out.to_local().data(), v.outer, v.rows, v.inner, t.where().stream());
    return out;
  }
}

/// Layer normalization over tensor axis Axis of a float device tensor (as the host's layer_norm).
template <int Axis, sbp_type A>
auto layer_norm(const global_tensor<float, A, memory::cuda>& t, double eps = 1e-5) {
  constexpr nd_signature_result sig =
      nd_signature([](const parallel& p) { return signature::layer_norm(p, Axis); }, nd_of<A>::value);
  if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::layer_norm_has_no_signature<A, Axis>);
    return;
  } else {
    const detail::around v = detail::device_lines(t, Axis, "layer_norm");
    global_tensor<float, A, memory::cuda> out = t.clone();
    cuda::detail::layer_norm_lines(out.to_local().data(), v.outer, v.rows, v.inner, eps, t.where().stream());
    return out;
  }
}

/// Sum over tensor axis Axis of a float device tensor, which is removed; over a split axis the result
/// is P(sum) (the host signatures).
template <int Axis, sbp_type A>
auto reduce_sum(const global_tensor<float, A, memory::cuda>& t) {
  constexpr nd_signature_result sig =
      nd_signature([](const parallel& p) { return signature::reduce_sum(p, Axis); }, nd_of<A>::value);
  if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::reduce_sum_has_no_signature<A, Axis>);
    return;
  } else {
    using result = global_tensor<float, detail::sbp_type_of<sig.out, one_axis_sbp<A>>, memory::cuda>;
    const detail::around v = detail::device_lines(t, Axis, "reduce_sum");
    shape_t out_shape = t.shape();
    out_shape.erase(out_shape.begin() + Axis);
    if (!t.where().contains_me()) return result::adopt(t.where(), out_shape, {});
    cuda::device_shard<float> out = result::acquire(t.where(), v.outer * v.inner);
    cuda::detail::sum_lines(t.to_local().data(), out.span().data(), v.outer, v.rows, v.inner, t.where().stream());
    return result::adopt(t.where(), out_shape, std::move(out));
  }
}

/// The rows of `weight` [V, D] that `ids` [N] name, on the device (the host signatures: (S(0), B) ->
/// P(sum), (S(1), B) -> S(1), (B, S(0)) -> S(0), (B, B) -> B). Every id is checked against V: the call
/// waits for the lookup and throws usage_error naming the first id outside [0, V) and its position.
template <element T, sbp_type W, sbp_type I>
auto embedding(const global_tensor<T, W, memory::cuda>& weight,
               const global_tensor<std::int64_t, I, memory::cuda>& ids) {
  if constexpr (!detail::same_mesh_rank<W, I>()) {
    return;
  } else {
    constexpr nd_signature_result sig = nd_signature(detail::embedding_rule{}, nd_of<W>::value, nd_of<I>::value);
    if constexpr (!sig.ok) {
      (void)sizeof(diagnostic::embedding_has_no_signature<W, I, detail::fix_type<detail::embedding_rule, W, I>>);
      return;
    } else {
      using result = global_tensor<T, detail::sbp_type_of<sig.out, detail::both_one_axis<W, I>>, memory::cuda>;
      detail::require_same_device_placement(weight, ids, "embedding");
      const int rank = weight.where().parent().rank();
      if (weight.shape().size() != 2 || ids.shape().size() != 1)
        throw error_on<usage_error>(rank, "embedding", "weight ", to_string(weight.shape()), " and ids ",
                                    to_string(ids.shape()), ": it needs weight [V, D] and ids [N]");
      const shape_t out_shape{ids.shape()[0], weight.shape()[1]};
      if (!weight.where().contains_me()) return result::adopt(weight.where(), out_shape, {});
      const box rows = weight.my_box();
      const std::size_t n = ids.to_local().size(), cols = rows.extent[1];
      cuda::device_shard<T> out = result::acquire(weight.where(), n * cols);
      if (n > 0) {
        cuda::device_shard<unsigned long long> bad{weight.where().pool().acquire(sizeof(unsigned long long)), 1};
        const cudaStream_t s = weight.where().stream();
        cuda::detail::embedding_rows(sizeof(T), weight.to_local().data(), ids.to_local().data(), out.span().data(), n,
                                     cols, static_cast<std::int64_t>(rows.offset[0]),
                                     static_cast<std::int64_t>(rows.extent[0]),
                                     static_cast<std::int64_t>(weight.shape()[0]), bad.span().data(), s);
        const unsigned long long first =
            cuda::to_host(cuda::device_span<const unsigned long long>(bad.span()), s,
                          weight.where().parent().settings().timeout, "flexpar::sbp::embedding (device): the id check")
                .front();
        weight.where().pool().give_back(std::move(bad.block));
        if (first != ~0ULL) {
          const std::size_t at = static_cast<std::size_t>(first);
          const std::int64_t id =
              cuda::to_host(ids.to_local().subspan(at, 1), s, weight.where().parent().settings().timeout,
                            "flexpar::sbp::embedding (device): the bad id")
                  .front();
          throw error_on<usage_error>(rank, "embedding", "id ", id, " (position ", at,
                                      " of my ids) is outside the vocabulary of ", weight.shape()[0], " rows");
        }
      }
      return result::adopt(weight.where(), out_shape, std::move(out));
    }
  }
}

/// Transpose of a 2-D device tensor (the host signatures: a split moves to the other axis, B and P
/// stay): the shard transposed by one tiled kernel.
template <element T, sbp_type A>
auto transpose(const global_tensor<T, A, memory::cuda>& t) {
  constexpr nd_signature_result sig = nd_signature(signature::transpose, nd_of<A>::value);
  if constexpr (!sig.ok) {
    (void)sizeof(diagnostic::transpose_has_no_signature<A>);
    return;
  } else {
    using result = global_tensor<T, detail::sbp_type_of<sig.out, one_axis_sbp<A>>, memory::cuda>;
    if (t.shape().size() != 2)
      throw error_on<usage_error>(t.where().parent().rank(), "transpose", "a tensor of shape ", to_string(t.shape()),
                                  " is not 2-D");
    const shape_t ls = t.local_shape();
    cuda::device_shard<T> out = result::acquire(t.where(), t.to_local().size());
    cuda::detail::transpose_2d(sizeof(T), t.to_local().data(), out.span().data(), ls[0], ls[1], t.where().stream());
    return result::adopt(t.where(), shape_t{t.shape()[1], t.shape()[0]}, std::move(out));
  }
}

namespace diagnostic {
/// Instantiated for a device convolution in another element type than f32.
template <class T>
struct device_conv2d_needs_f32 {
  static_assert(detail::dependent_false<T>,
                "flexpar::sbp::conv2d on device tensors runs im2col + cublasGemmEx in f32: its element type must "
                "be float.");
};
}  // namespace diagnostic

namespace detail {
/// conv_static's local pass on device shards (conv2d, conv2d_grad_input, conv2d_grad_weight on device
/// tensors: the host ops' signatures, shapes and errors): per sample, an im2col or col2im kernel and
/// one cuBLAS GEMM on the placement's stream; grad_weight accumulates the samples' GEMMs in sample
/// order (beta = 1 after the first), as the host does.
template <class T, std::size_t N>
cuda::device_shard<T> conv_shard(const cuda::device_placement<N>& where, int rank, conv_pass pass, const shape_t& la,
                                 cuda::device_span<const T> a, const shape_t& lb, cuda::device_span<const T> b,
                                 const shape_t& out, std::size_t pad) {
  if constexpr (!std::is_same_v<T, float>) {
    (void)sizeof(diagnostic::device_conv2d_needs_f32<T>);
    return {};
  } else {
    const local::conv2d_geometry g = conv_geometry_of(rank, pass, la, lb, out, pad);
    cuda::device_shard<float> c{where.pool().acquire(elements_of(out) * sizeof(float)), elements_of(out)};
    if (c.count == 0) return c;
    const cudaStream_t s = where.stream();
    const std::size_t crs = g.in_channels * g.kernel_h * g.kernel_w, pq = g.out_height() * g.out_width();
    const std::size_t chw = g.in_channels * g.height * g.width, k = g.out_channels;
    cuda::blas& la_ = where.linear_algebra();
    if (crs == 0 || pq == 0 || (pass != conv_pass::grad_weight && k == 0) ||
        (pass == conv_pass::grad_weight && g.batch == 0)) {
      cuda::fill(c.span(), 0.0f, s);  // an empty sum
      return c;
    }
    cuda::device_shard<float> col{where.pool().acquire(crs * pq * sizeof(float)), crs * pq};
    for (std::size_t n = 0; n < g.batch; ++n) {
      if (pass == conv_pass::forward) {  // y_n [K, PQ] = w [K, CRS] col [CRS, PQ]
        cuda::detail::im2col(g, a.data() + n * chw, col.span().data(), s);
        la_.gemm(cuda::transpose::no, cuda::transpose::no, k, pq, crs, 1.0f, b,
                 cuda::device_span<const float>(col.span()), 0.0f, c.span().subspan(n * k * pq, k * pq), s);
      } else if (pass == conv_pass::grad_input) {  // dcol [CRS, PQ] = w^T dy_n; dx_n = col2im(dcol)
        la_.gemm(cuda::transpose::yes, cuda::transpose::no, crs, pq, k, 1.0f, b, a.subspan(n * k * pq, k * pq), 0.0f,
                 col.span(), s);
        cuda::detail::col2im(g, col.span().data(), c.span().data() + n * chw, s);
      } else {  // dw [K, CRS] (+)= dy_n [K, PQ] col_n^T
        cuda::detail::im2col(g, a.data() + n * chw, col.span().data(), s);
        la_.gemm(cuda::transpose::no, cuda::transpose::yes, k, crs, pq, 1.0f, b.subspan(n * k * pq, k * pq),
                 cuda::device_span<const float>(col.span()), n == 0 ? 0.0f : 1.0f, c.span(), s);
      }
    }
    where.pool().give_back(std::move(col.block));
    return c;
  }
}
}  // namespace detail

/// An op given a host and a device tensor: a compile error naming to_device / to_host.
template <element T, sbp_type A, sbp_type B, class MA, class MB>
requires(detail::different_memory<MA, MB>) void matmul(const global_tensor<T, A, MA>&, const global_tensor<T, B, MB>&) {
  (void)sizeof(diagnostic::operands_in_different_memory<global_tensor<T, A, MA>, global_tensor<T, B, MB>>);
}
/// An op given a host and a device tensor: a compile error naming to_device / to_host.
template <element T, sbp_type A, sbp_type B, class MA, class MB>
requires(detail::different_memory<MA, MB>) void add(const global_tensor<T, A, MA>&, const global_tensor<T, B, MB>&) {
  (void)sizeof(diagnostic::operands_in_different_memory<global_tensor<T, A, MA>, global_tensor<T, B, MB>>);
}
/// An op given a host and a device tensor: a compile error naming to_device / to_host.
template <element T, sbp_type A, sbp_type B, class MA, class MB>
requires(detail::different_memory<MA, MB>) void mul(const global_tensor<T, A, MA>&, const global_tensor<T, B, MB>&) {
  (void)sizeof(diagnostic::operands_in_different_memory<global_tensor<T, A, MA>, global_tensor<T, B, MB>>);
}

/// An op given a host and a device tensor: a compile error naming to_device / to_host.
template <element T, sbp_type W, sbp_type I, class MW, class MI>
requires(detail::different_memory<MW, MI>) void embedding(const global_tensor<T, W, MW>&,
                                                          const global_tensor<std::int64_t, I, MI>&) {
  (void)sizeof(diagnostic::operands_in_different_memory<global_tensor<T, W, MW>, global_tensor<std::int64_t, I, MI>>);
}

/// An op given a host and a device tensor: a compile error naming to_device / to_host.
template <element T, sbp_type A, sbp_type B, class MA, class MB>
requires(detail::different_memory<MA, MB>) void conv2d(const global_tensor<T, A, MA>&, const global_tensor<T, B, MB>&,
                                                       std::size_t) {
  (void)sizeof(diagnostic::operands_in_different_memory<global_tensor<T, A, MA>, global_tensor<T, B, MB>>);
}

}  // namespace flexpar::sbp
