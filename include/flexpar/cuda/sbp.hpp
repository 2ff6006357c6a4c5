// flexpar/cuda/sbp.hpp — the SBP layer in device memory: backend<memory::cuda> (sbp/backend.hpp), so
// that global_tensor<T, Sbp, memory::cuda>, dynamic_tensor<T, N, memory::cuda>, their boxing, placement
// changes and ops are the host layer's own definitions over device shards. What is here is what only
// the device has: its pool's blocks and its placement (this rank's GPU, a stream, a cuBLAS handle, one
// device_communicator per mesh axis: NCCL, CUDA IPC among the ranks of one node, or staged), the view
// the boxing steps take (their collectives of equal blocks: sbp/boxing/equal_blocks.hpp), the CUDA and
// cuBLAS kernels of the ops, and the device's boxing cost.
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
// Every operation is enqueued on the placement's stream (gpu.stream()), with the placement's GPU
// current; the device collectives order themselves after it.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
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
#include <flexpar/sbp/backend.hpp>
#include <flexpar/sbp/boxing.hpp>
#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/sbp/global_tensor.hpp>
#include <flexpar/sbp/host_kernels.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/sbp/ops.hpp>
#include <flexpar/sbp/placement.hpp>

namespace flexpar::sbp {
/// Device blocks in a buffer_pool: bytes of device memory, all of them usable (size = capacity).
template <>
struct pool_block<cuda::device_buffer<std::byte>> {
  using value_type = std::byte;  ///< bytes
  /// Bytes of room.
  static std::size_t capacity(const cuda::device_buffer<std::byte>& b) noexcept { return b.size(); }
  /// Bytes usable: all of them.
  static std::size_t size(const cuda::device_buffer<std::byte>& b) noexcept { return b.size(); }
  /// `bytes` of new device memory (cudaMalloc).
  static cuda::device_buffer<std::byte> make(std::size_t bytes) { return cuda::device_buffer<std::byte>(bytes); }
};
}  // namespace flexpar::sbp

namespace flexpar::cuda {

/// Device blocks for the shards and staging buffers of one placement's device tensors: a device
/// placement's pool is an sbp::buffer_pool (size classes, bound, counters) whose blocks are
/// device_buffer<std::byte>, counted in bytes.
using device_block = device_buffer<std::byte>;

/// A block of room for at least `bytes` bytes from `pool` (a kept one when one fits, else cudaMalloc).
inline device_block acquire_device_block(sbp::buffer_pool& pool, std::size_t bytes) {
  return pool.acquire_block<device_block>(bytes);
}

/// `count` elements of T at the front of a pooled device block: the storage of a device shard.
template <class T>
struct device_shard {
  device_block block;     ///< the memory (block.size() >= count * sizeof(T))
  std::size_t count = 0;  ///< elements in use

  /// The elements in use.
  [[nodiscard]] device_span<T> span() const noexcept { return {reinterpret_cast<T*>(block.data()), count}; }
};

/// A placement's device side: this rank's GPU, a stream every device tensor of the placement works
/// on, a pool of device blocks, a cuBLAS handle, and one device_communicator per mesh axis (made at the first
/// boxing along that axis: collective over the axis's group, which every rank of it reaches in the
/// same boxing). Cheap to copy (copies share all of it and compare equal); used by one thread.
template <std::size_t MeshRank>
class device_placement {
 public:
  static constexpr std::size_t mesh_rank = MeshRank;  ///< mesh axes
  using memory_type = memory::cuda;                   ///< where the shards of its tensors live

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
  /// The device blocks of this placement's tensors (at most 1 GiB kept).
  [[nodiscard]] sbp::buffer_pool& pool() const noexcept { return s_->pool; }
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
    sbp::buffer_pool pool{std::size_t{1} << 30};
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

/// One mesh axis's boxing on the device (the device form of sbp::axis_view, with the same members):
/// the axis's device communicator, the shape its group holds jointly, my shard, the pool and the
/// stream. Its collectives take equal blocks, so the steps that exchange are the scripts of
/// sbp/boxing/equal_blocks.hpp.
template <class T>
struct device_axis_view {
  using value_type = T;                     ///< element type
  using shard = device_shard<T>;            ///< a shard or a temporary
  using span_type = device_span<T>;         ///< elements of a shard
  using const_span = device_span<const T>;  ///< elements read
  device_communicator& comm;                ///< the mesh-axis group on the device
  sbp::shape_t group_shape;                 ///< the tensor the group holds jointly
  device_shard<T> local;                    ///< my shard under the current SBP of this axis
  sbp::buffer_pool& pool;                   ///< where temporaries and results come from
  cudaStream_t stream;                      ///< where everything is enqueued

  [[nodiscard]] int rank() const noexcept { return comm.rank(); }  ///< see sbp::axis_view
  [[nodiscard]] int size() const noexcept { return comm.size(); }  ///< see sbp::axis_view
  [[nodiscard]] shard acquire(std::size_t count) {
    return {acquire_device_block(pool, count * sizeof(T)), count};
  }  ///< see sbp::axis_view
  /// See sbp::axis_view.
  void replace(shard&& next) {
    pool.give_back(std::move(local.block));
    local = std::move(next);
  }
  void recycle(shard&& spare) { pool.give_back(std::move(spare.block)); }          ///< see sbp::axis_view
  static span_type elements(shard& s) noexcept { return s.span(); }                ///< see sbp::axis_view
  static void truncate(shard& s, std::size_t count) noexcept { s.count = count; }  ///< see sbp::axis_view
  /// Keeps elements [from, from + count) in place when they are the front (else false: the caller copies).
  bool keep_range(std::size_t from, std::size_t count) noexcept {
    if (from != 0) return false;
    local.count = count;
    return true;
  }
  /// See sbp::axis_view.
  void copy_box(const_span src, const sbp::shape_t& src_shape, const sbp::shape_t& src_at, span_type dst,
                const sbp::shape_t& dst_shape, const sbp::shape_t& dst_at, const sbp::shape_t& extent) {
    cuda::copy_box<T>(src, src_shape, src_at, dst, dst_shape, dst_at, extent, stream);
  }
  void fill(span_type s, const T& value) { cuda::fill(s, value, stream); }            ///< see sbp::axis_view
  void copy(span_type dst, const_span src) { copy_async(dst, src, stream); }          ///< see sbp::axis_view
  void allreduce(span_type data, reduce_op op) { comm.allreduce(data, op, stream); }  ///< see sbp::axis_view
  /// See sbp::axis_view.
  void reduce_scatter(const_span in, span_type out, reduce_op op) { comm.reduce_scatter(in, out, op, stream); }
  void allgather(const_span in, span_type out) { comm.allgather(in, out, stream); }  ///< see sbp::axis_view
  void alltoall(const_span in, span_type out) { comm.alltoall(in, out, stream); }    ///< see sbp::axis_view
};

}  // namespace flexpar::cuda

namespace flexpar::sbp {

namespace diagnostic {
/// Instantiated for a device matmul of an element type cuBLAS is not called with here.
template <class T>
struct device_matmul_needs_f32_or_bf16 {
  static_assert(detail::dependent_false<T>,
                "flexpar::sbp::matmul on device tensors runs cublasGemmEx in f32 or bf16 (f32 accumulation): "
                "its element type must be float or flexpar::bfloat16.");
};
/// Instantiated for a device convolution in another element type than f32.
template <class T>
struct device_conv2d_needs_f32 {
  static_assert(detail::dependent_false<T>,
                "flexpar::sbp::conv2d on device tensors runs im2col + cublasGemmEx in f32: its element type must "
                "be float.");
};
/// Instantiated for a device kernel that is written for f32 only (gelu, softmax, layer_norm, reduce_sum).
template <class T>
struct device_kernel_needs_f32 {
  static_assert(detail::dependent_false<T>,
                "flexpar::sbp: this op's device kernel (gelu, softmax, layer_norm, reduce_sum) computes in f32: the "
                "device tensor's element type must be float.");
};
}  // namespace diagnostic

/// Device memory (sbp/backend.hpp): shards from the device placement's pool, every call enqueued on its
/// stream with its GPU current, the kernels CUDA (lib/cuda/sbp_kernels.cu) and cuBLAS.
template <>
struct backend<memory::cuda> {
  static constexpr bool available = true;     ///< see backend
  static constexpr bool host_memory = false;  ///< shards are device memory
  template <std::size_t N>
  using placement_type = cuda::device_placement<N>;  ///< the placement of a mesh of N axes
  template <class T>
  using shard = cuda::device_shard<T>;  ///< a shard
  template <class T>
  using span = cuda::device_span<T>;  ///< a shard's elements
  template <class T>
  using view = cuda::device_axis_view<T>;  ///< one mesh axis's boxing

  /// `n` elements from the placement's device pool (contents unspecified).
  template <class T, class Where>
  static shard<T> acquire(const Where& where, std::size_t n) {
    cuda::device_guard on(where.device());
    return {cuda::acquire_device_block(where.pool(), n * sizeof(T)), n};
  }
  /// `s` back to the placement's device pool.
  template <class T, class Where>
  static void give_back(const Where& where, shard<T>&& s) noexcept {
    where.pool().give_back(std::move(s.block));
  }
  /// The elements of `s`.
  template <class T>
  static cuda::device_span<T> elements(shard<T>& s) noexcept {
    return s.span();
  }
  /// The elements of `s`.
  template <class T>
  static cuda::device_span<const T> elements(const shard<T>& s) noexcept {
    return s.span();
  }
  /// dst = src on the placement's stream.
  template <class T, class Where>
  static void copy(const Where& where, cuda::device_span<T> dst, cuda::device_span<const T> src) {
    cuda::device_guard on(where.device());
    cuda::copy_async(dst, src, where.stream());
  }
  /// Every element of `s` set to `value`, on the placement's stream.
  template <class T, class Where>
  static void fill(const Where& where, cuda::device_span<T> s, const T& value) {
    cuda::device_guard on(where.device());
    cuda::fill(s, value, where.stream());
  }
  /// The host placement of the same mesh.
  template <class Where>
  static const auto& host_placement(const Where& where) noexcept {
    return where.host();
  }
  /// `s` downloaded (waits for the placement's stream).
  template <class T, class Where>
  static std::vector<std::remove_const_t<T>> readable(const Where& where, cuda::device_span<T> s) {
    cuda::device_guard on(where.device());
    std::vector<std::remove_const_t<T>> out(s.size());
    cuda::copy_async(std::span<std::remove_const_t<T>>(out), s, where.stream());
    where.synchronize("download of a device shard");
    return out;
  }
  /// A shard holding `values`, uploaded and waited for (the host values may go once this returns).
  template <class T, class Where>
  static shard<T> from_host(const Where& where, std::span<const T> values) {
    shard<T> s = acquire<T>(where, values.size());
    cuda::device_guard on(where.device());
    cuda::copy_async(s.span(), values, where.stream());
    where.synchronize("to_device");
    return s;
  }
  /// Element `i` of `s` (waits for the placement's stream).
  template <class T, class Where>
  static T read(const Where& where, cuda::device_span<const T> s, std::size_t i) {
    return readable(where, s.subspan(i, 1)).front();
  }
  /// The view of mesh axis `d` around my shard `local`.
  template <class T, class Where>
  static cuda::device_axis_view<T> axis(const Where& where, std::size_t d, shape_t group_shape, shard<T>&& local) {
    return {where.axis(d), std::move(group_shape), std::move(local), where.pool(), where.stream()};
  }

  // ---- the kernels (host_kernels.hpp names each; the same arguments) ----

  /// c = a b by cuBLAS (f32, or bf16 accumulating in f32); zeros for k = 0.
  template <class T, class Where>
  static void gemm(const Where& where, std::size_t m, std::size_t n, std::size_t k, cuda::device_span<const T> a,
                   cuda::device_span<const T> b, cuda::device_span<T> c) {
    if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, bfloat16>) {
      (void)sizeof(diagnostic::device_matmul_needs_f32_or_bf16<T>);
    } else {
      if (c.size() == 0) return;
      if (k == 0) return fill(where, c, T{});  // an empty sum
      cuda::device_guard on(where.device());
      where.linear_algebra().gemm(cuda::transpose::no, cuda::transpose::no, m, n, k, 1.0f, a, b, 0.0f, c,
                                  where.stream());
    }
  }
  /// out = x + y (cuda::reduce_into).
  template <class T, class Where>
  static void add(const Where& where, cuda::device_span<const T> x, cuda::device_span<const T> y,
                  cuda::device_span<T> out) {
    cuda::device_guard on(where.device());
    cuda::reduce_into(out, x, y, reduce_op::sum, where.stream());
  }
  /// out = x * y (cuda::reduce_into).
  template <class T, class Where>
  static void mul(const Where& where, cuda::device_span<const T> x, cuda::device_span<const T> y,
                  cuda::device_span<T> out) {
    cuda::device_guard on(where.device());
    cuda::reduce_into(out, x, y, reduce_op::prod, where.stream());
  }
  /// out = max(x, 0) (f32).
  template <class T, class Where>
  static void relu(const Where& where, cuda::device_span<const T> x, cuda::device_span<T> out) {
    if (!f32<T>()) return;
    copy(where, out, x);
    cuda::relu(out, where.stream());
  }
  /// out = x Φ(x) (f32, in double rounded once).
  template <class T, class Where>
  static void gelu(const Where& where, cuda::device_span<const T> x, cuda::device_span<T> out) {
    if (!f32<T>()) return;
    copy(where, out, x);
    cuda::detail::gelu_in_place(out.data(), out.size(), where.stream());
  }
  /// The softmax of every line (f32).
  template <class T, class Where>
  static void softmax(const Where& where, cuda::device_span<const T> x, cuda::device_span<T> out,
                      const detail::around& v) {
    if (!f32<T>()) return;
    copy(where, out, x);
    cuda::detail::softmax_lines(out.data(), v.outer, v.rows, v.inner, where.stream());
  }
  /// Layer normalization of every line (f32).
  template <class T, class Where>
  static void layer_norm(const Where& where, cuda::device_span<const T> x, cuda::device_span<T> out,
                         const detail::around& v, double eps) {
    if (!f32<T>()) return;
    copy(where, out, x);
    cuda::detail::layer_norm_lines(out.data(), v.outer, v.rows, v.inner, eps, where.stream());
  }
  /// The sum of every line (f32).
  template <class T, class Where>
  static void sum_lines(const Where& where, cuda::device_span<const T> x, cuda::device_span<T> out,
                        const detail::around& v) {
    if (!f32<T>()) return;
    cuda::device_guard on(where.device());
    cuda::detail::sum_lines(x.data(), out.data(), v.outer, v.rows, v.inner, where.stream());
  }
  /// The lookup; waits for its id check and returns the first bad position, or none.
  template <class T, class Where>
  static std::optional<std::size_t> embedding(const Where& where, cuda::device_span<const T> w,
                                              cuda::device_span<const std::int64_t> ids, cuda::device_span<T> out,
                                              std::size_t cols, std::int64_t lo, std::int64_t rows,
                                              std::int64_t vocab) {
    shard<unsigned long long> bad = acquire<unsigned long long>(where, 1);
    cuda::device_guard on(where.device());
    cuda::detail::embedding_rows(sizeof(T), w.data(), ids.data(), out.data(), ids.size(), cols, lo, rows, vocab,
                                 bad.span().data(), where.stream());
    const unsigned long long first = read(where, elements(std::as_const(bad)), 0);
    give_back(where, std::move(bad));
    if (first == ~0ULL) return std::nullopt;
    return static_cast<std::size_t>(first);
  }
  /// out [cols, rows] = in [rows, cols] transposed (tiles through shared memory).
  template <class T, class Where>
  static void transpose(const Where& where, cuda::device_span<const T> in, cuda::device_span<T> out, std::size_t rows,
                        std::size_t cols) {
    cuda::device_guard on(where.device());
    cuda::detail::transpose_2d(sizeof(T), in.data(), out.data(), rows, cols, where.stream());
  }
  /// One convolution pass (f32): per sample an im2col or col2im kernel and one cuBLAS GEMM; the weight
  /// gradient accumulates the samples' GEMMs in sample order (beta = 1 after the first), as the host.
  template <class T, class Where>
  static void conv(const Where& where, detail::conv_pass pass, const local::conv2d_geometry& g,
                   cuda::device_span<const T> a, cuda::device_span<const T> b, cuda::device_span<T> c) {
    if constexpr (!std::is_same_v<T, float>) {
      (void)sizeof(diagnostic::device_conv2d_needs_f32<T>);
    } else {
      if (c.size() == 0) return;
      const std::size_t crs = g.in_channels * g.kernel_h * g.kernel_w, pq = g.out_height() * g.out_width();
      const std::size_t chw = g.in_channels * g.height * g.width, k = g.out_channels;
      if (crs == 0 || pq == 0 || (pass != detail::conv_pass::grad_weight && k == 0) ||
          (pass == detail::conv_pass::grad_weight && g.batch == 0))
        return fill(where, c, 0.0f);  // an empty sum
      const cudaStream_t s = where.stream();
      cuda::blas& la = where.linear_algebra();
      shard<float> col = acquire<float>(where, crs * pq);
      cuda::device_guard on(where.device());
      for (std::size_t n = 0; n < g.batch; ++n) {
        if (pass == detail::conv_pass::forward) {  // y_n [K, PQ] = w [K, CRS] col [CRS, PQ]
          cuda::detail::im2col(g, a.data() + n * chw, col.span().data(), s);
          la.gemm(cuda::transpose::no, cuda::transpose::no, k, pq, crs, 1.0f, b,
                  cuda::device_span<const float>(col.span()), 0.0f, c.subspan(n * k * pq, k * pq), s);
        } else if (pass == detail::conv_pass::grad_input) {  // dcol [CRS, PQ] = w^T dy_n; dx_n = col2im(dcol)
          la.gemm(cuda::transpose::yes, cuda::transpose::no, crs, pq, k, 1.0f, b, a.subspan(n * k * pq, k * pq), 0.0f,
                  col.span(), s);
          cuda::detail::col2im(g, col.span().data(), c.data() + n * chw, s);
        } else {  // dw [K, CRS] (+)= dy_n [K, PQ] col_n^T
          cuda::detail::im2col(g, a.data() + n * chw, col.span().data(), s);
          la.gemm(cuda::transpose::no, cuda::transpose::yes, k, crs, pq, 1.0f, b.subspan(n * k * pq, k * pq),
                  cuda::device_span<const float>(col.span()), n == 0 ? 0.0f : 1.0f, c, s);
        }
      }
      give_back(where, std::move(col));
    }
  }

 private:
  /// True for float; else the diagnostic (a compile error).
  template <class T>
  static constexpr bool f32() {
    if constexpr (!std::is_same_v<T, float>) (void)sizeof(diagnostic::device_kernel_needs_f32<T>);
    return std::is_same_v<T, float>;
  }
};

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

}  // namespace flexpar::sbp
