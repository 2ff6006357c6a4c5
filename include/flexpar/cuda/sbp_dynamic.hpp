// flexpar/cuda/sbp_dynamic.hpp — the run-time SBP form in device memory: dynamic_tensor<T, N,
// memory::cuda>, boxed by the host form's plan() with one device box_axis overload per step (each on
// its mesh axis's cuda::device_communicator), and matmul (cuBLAS) and the convolutions (im2col +
// cuBLAS) on run-time SBPs: what the strategy search's executor runs on a GPU (flexpar/cuda/search.hpp).
//
// Part of flexpar::cuda.
//
//   cuda::device_placement gpu(mesh, 0);
//   auto x = dynamic_tensor<float, 1, memory::cuda>::from_full(gpu, {m, k}, nd_parallel{parallel::S(0)}, data);
//   auto y = to(std::move(x), nd_parallel{parallel::B()});    // the device allgather
//   auto z = matmul(y, w);                                     // the cheapest signature, then one cuBLAS GEMM
//   std::vector<float> all = z.to_full();                      // gathered on the host (the tests' oracle)
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <flexpar/cuda/sbp.hpp>
#include <flexpar/sbp/dynamic.hpp>

namespace flexpar::sbp {

/// A global tensor whose nd-SBP is a run-time value, its shards in device memory (the host form's
/// interface, with a device_placement and a cuda::device_span for the shard). Move-only.
template <element T, std::size_t MeshRank>
class dynamic_tensor<T, MeshRank, memory::cuda> {
 public:
  using value_type = T;                                     ///< element type
  using memory_type = memory::cuda;                         ///< where the shards live
  using placement_type = cuda::device_placement<MeshRank>;  ///< the placement it lives on
  using shard_type = cuda::device_shard<T>;                 ///< the storage of a shard

  /// Moves the shard; `other` is left empty.
  dynamic_tensor(dynamic_tensor&& other) noexcept
      : where_(other.where_), shape_(std::move(other.shape_)), sbp_(other.sbp_), local_(std::move(other.local_)) {
    other.local_.count = 0;
  }
  /// Moves the shard; the block this tensor held goes back to the placement's device pool.
  dynamic_tensor& operator=(dynamic_tensor&& other) noexcept {
    if (this == &other) return *this;
    where_.pool().give_back(std::move(local_.block));
    where_ = other.where_;
    shape_ = std::move(other.shape_);
    sbp_ = other.sbp_;
    local_ = std::move(other.local_);
    other.local_.count = 0;
    return *this;
  }
  dynamic_tensor(const dynamic_tensor&) = delete;             ///< copies are explicit: clone()
  dynamic_tensor& operator=(const dynamic_tensor&) = delete;  ///< copies are explicit: clone()
  /// Returns the shard's block to the placement's device pool.
  ~dynamic_tensor() { where_.pool().give_back(std::move(local_.block)); }

  /// Collective over the mesh: every mesh rank passes the full logical tensor (host memory) and keeps
  /// its shard, copied to the device (the host form's from_full, then one upload).
  static dynamic_tensor from_full(const placement_type& where, shape_t shape, const nd_parallel& s,
                                  std::span<const T> full) {
    return upload(where, dynamic_tensor<T, MeshRank>::from_full(where.host(), std::move(shape), s, full));
  }
  /// Collective over the mesh (the shape check): a copy of `local`, device memory holding this rank's
  /// shard row-major. @throws usage_error when its size is not the shard's.
  static dynamic_tensor from_local(const placement_type& where, shape_t shape, const nd_parallel& s,
                                   cuda::device_span<const T> local) {
    detail::check_same_shape(where.host(), shape, "dynamic_tensor::from_local");
    shard_type mine = acquire(where, local.size());
    cuda::copy_async(mine.span(), local, where.stream());
    return adopt(where, std::move(shape), s, std::move(mine));
  }
  /// For ops and the executor: my shard of a tensor computed from tensors whose shapes agree already
  /// (no communication; its size is checked).
  static dynamic_tensor adopt(const placement_type& where, shape_t shape, const nd_parallel& s, shard_type local) {
    dynamic_tensor t(where, std::move(shape), s);
    const std::size_t want = where.contains_me() ? t.my_box().elements() : 0;
    if (local.count != want) {
      const std::size_t given = local.count;
      where.pool().give_back(std::move(local.block));
      throw error_on<usage_error>(where.parent().rank(), "dynamic_tensor::from_local", "tensor ", to_string(t.shape_),
                                  " ", to_string(s), " (device) has a shard of ", want, " elements on this rank, but ",
                                  given, " were given");
    }
    t.local_ = std::move(local);
    return t;
  }
  /// The shard of a host tensor on where.host() copied to the device (one upload, waited for).
  /// @throws usage_error when `h` lives on another placement.
  static dynamic_tensor upload(const placement_type& where, const dynamic_tensor<T, MeshRank>& h) {
    if (!(h.where() == where.host()))
      throw error_on<usage_error>(where.parent().rank(), "to_device", "the host tensor lives on ", h.where().describe(),
                                  ", not on the device placement's mesh ", where.describe());
    shard_type mine = acquire(where, h.to_local().size());
    cuda::copy_async(mine.span(), h.to_local(), where.stream());
    where.synchronize("to_device");  // the host shard may go once this returns
    return adopt(where, h.shape(), h.layout(), std::move(mine));
  }
  /// The run-time form of a static device tensor (no copy).
  template <sbp_type S>
  static dynamic_tensor from(global_tensor<T, S, memory::cuda>&& t) {
    const placement_type where = t.where();
    shape_t shape = t.shape();
    return adopt(where, std::move(shape), nd_of<S>::value, std::move(t).release());
  }
  /// Back to a static type. @throws usage_error when the run-time SBP is not S.
  template <sbp_type S>
  global_tensor<T, S, memory::cuda> as() && {
    if (!(nd_of<S>::value == sbp_))
      throw error_on<usage_error>(where_.parent().rank(), "dynamic_tensor::as", "the tensor is ", to_string(sbp_),
                                  ", not ", to_string<S>());
    shard_type mine = std::move(local_);
    local_.count = 0;
    return global_tensor<T, S, memory::cuda>::adopt(where_, shape_, std::move(mine));
  }

  /// The nd-SBP now.
  [[nodiscard]] const nd_parallel& layout() const noexcept { return sbp_; }
  /// The logical shape.
  [[nodiscard]] const shape_t& shape() const noexcept { return shape_; }
  /// The device placement.
  [[nodiscard]] const placement_type& where() const noexcept { return where_; }
  /// My shard, row-major, in device memory.
  [[nodiscard]] cuda::device_span<T> to_local() noexcept { return local_.span(); }
  /// My shard, row-major, in device memory.
  [[nodiscard]] cuda::device_span<const T> to_local() const noexcept { return local_.span(); }
  /// The box my shard covers.
  [[nodiscard]] box my_box() const { return shard_box(shape_, sbp_, where_.shape(), where_.coords()); }
  /// My shard copied to the host (waits for the placement's stream).
  [[nodiscard]] std::vector<T> download() const {
    std::vector<T> out(local_.count);
    cuda::copy_async(std::span<T>(out), to_local(), where_.stream());
    where_.synchronize("dynamic_tensor::download");
    return out;
  }
  /// Collective over the mesh: the full logical tensor on the host of every mesh rank (the shards
  /// downloaded and gathered by the host's detail::gather_full, which does not box).
  [[nodiscard]] std::vector<T> to_full() const {
    const std::vector<T> mine = download();
    return detail::gather_full<T>(where_.host(), shape_, sbp_, std::span<const T>(mine));
  }
  /// An explicit deep copy (one device-to-device copy on the placement's stream).
  [[nodiscard]] dynamic_tensor clone() const {
    dynamic_tensor t(where_, shape_, sbp_);
    t.local_ = acquire(where_, local_.count);
    cuda::copy_async(t.local_.span(), to_local(), where_.stream());
    return t;
  }
  /// Takes my shard out (the tensor is left empty): a reshape of the same shard adopts it without a copy.
  [[nodiscard]] shard_type release() && noexcept {
    shard_type out = std::move(local_);
    local_.count = 0;
    return out;
  }
  /// A shard of `count` elements from the placement's device pool (its contents undefined).
  static shard_type acquire(const placement_type& where, std::size_t count) {
    return shard_type{where.pool().acquire(count * sizeof(T)), count};
  }

  /// Boxing to a run-time target: the host form's plan() on this mesh's extents, then one device
  /// box_axis overload per step on its mesh axis's device communicator. Collective over the mesh.
  friend dynamic_tensor to(dynamic_tensor&& t, const nd_parallel& target) {
    const route r = detail::dynamic_route(t.where_.parent().rank(), t.sbp_, target, t.where_.shape());
    if (t.where_.contains_me())
      detail::for_each_step(r, [&]<class From, class To>(From, To, std::size_t k) {
        detail::run_axis_device<T, MeshRank, From, To>(t.where_, t.shape_, r.before[k], r.steps[k].axis, t.local_);
      });
    t.sbp_ = target;
    return std::move(t);
  }

 private:
  dynamic_tensor(const placement_type& where, shape_t shape, const nd_parallel& s)
      : where_(where), shape_(std::move(shape)), sbp_(s) {
    detail::check_dynamic_layout(where.parent().rank(), shape_, s, MeshRank);
  }
  placement_type where_;
  shape_t shape_;
  nd_parallel sbp_;
  shard_type local_;
};

/// A host run-time tensor's copy on the device placement `gpu` (whose host() must be t's placement).
template <element T, std::size_t N>
dynamic_tensor<T, N, memory::cuda> to_device(const dynamic_tensor<T, N>& t, const cuda::device_placement<N>& gpu) {
  return dynamic_tensor<T, N, memory::cuda>::upload(gpu, t);
}

/// A device run-time tensor's copy in host memory, on its placement's host() (no communication).
template <element T, std::size_t N>
dynamic_tensor<T, N> to_host(const dynamic_tensor<T, N, memory::cuda>& t) {
  const auto& where = t.where().host();
  return dynamic_tensor<T, N>::adopt(where, t.shape(), t.layout(),
                                     where.pool().acquire_copy(std::span<const T>(t.download())));
}

/// matmul on run-time SBPs in device memory: the operands boxed to the cheapest signature (as the host
/// form), then one cuBLAS GEMM on the placement's stream (f32, or bf16 with f32 accumulation).
template <element T, std::size_t N>
dynamic_tensor<T, N, memory::cuda> matmul(const dynamic_tensor<T, N, memory::cuda>& a,
                                          const dynamic_tensor<T, N, memory::cuda>& b,
                                          const cost_params& machine = {}) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16>,
                "flexpar::sbp::matmul on device tensors runs cublasGemmEx in f32 or bf16 (f32 accumulation): its "
                "element type must be float or flexpar::bfloat16.");
  using tensor = dynamic_tensor<T, N, memory::cuda>;
  const chosen_signature sig = detail::dynamic_matmul_signature(a, b, machine);
  const tensor x = to(a.clone(), sig.left), y = to(b.clone(), sig.right);
  const shape_t out_shape{a.shape()[0], b.shape()[1]};
  if (!a.where().contains_me()) return tensor::adopt(a.where(), out_shape, sig.out, {});
  const box bx = x.my_box(), by = y.my_box();
  cuda::device_shard<T> c = tensor::acquire(a.where(), bx.extent[0] * by.extent[1]);  // beta = 0 writes every element
  if (c.count > 0) {
    if (bx.extent[1] == 0)
      cuda::fill(c.span(), T{}, a.where().stream());  // an empty sum
    else
      a.where().linear_algebra().gemm(cuda::transpose::no, cuda::transpose::no, bx.extent[0], by.extent[1],
                                      bx.extent[1], 1.0f, x.to_local(), y.to_local(), 0.0f, c.span(),
                                      a.where().stream());
  }
  return tensor::adopt(a.where(), out_shape, sig.out, std::move(c));
}

/// conv2d on run-time SBPs in device memory (f32; shapes, padding and signatures as the host form),
/// im2col + cuBLAS per sample.
template <std::size_t N>
dynamic_tensor<float, N, memory::cuda> conv2d(const dynamic_tensor<float, N, memory::cuda>& x,
                                              const dynamic_tensor<float, N, memory::cuda>& w, std::size_t pad,
                                              const cost_params& machine = {}) {
  return detail::conv_dynamic<detail::conv_pass::forward>(x, w, pad, machine);
}

/// conv2d_grad_input on run-time SBPs in device memory (f32; as the host form).
template <std::size_t N>
dynamic_tensor<float, N, memory::cuda> conv2d_grad_input(const dynamic_tensor<float, N, memory::cuda>& dy,
                                                         const dynamic_tensor<float, N, memory::cuda>& w,
                                                         std::size_t pad, const cost_params& machine = {}) {
  return detail::conv_dynamic<detail::conv_pass::grad_input>(dy, w, pad, machine);
}

/// conv2d_grad_weight on run-time SBPs in device memory (f32; as the host form).
template <std::size_t N>
dynamic_tensor<float, N, memory::cuda> conv2d_grad_weight(const dynamic_tensor<float, N, memory::cuda>& x,
                                                          const dynamic_tensor<float, N, memory::cuda>& dy,
                                                          std::size_t pad, const cost_params& machine = {}) {
  return detail::conv_dynamic<detail::conv_pass::grad_weight>(x, dy, pad, machine);
}

}  // namespace flexpar::sbp
