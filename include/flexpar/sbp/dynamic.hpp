// flexpar/sbp/dynamic.hpp — the run-time SBP form: the same boxing overloads and signature tables,
// with the SBP a value chosen while the program runs (by the strategy search, or a config file).
//
//   dynamic_tensor<float, 1> x = dynamic_tensor<float, 1>::from_full(mesh, {m, k}, nd_parallel{...}, data);
//   auto y = to(std::move(x), target);               // plan() on the mesh, each step visits the overloads
//   auto z = matmul(a, b);                           // picks the signature with the cheapest boxing
//   auto c = conv2d(x, w, pad);                      // the operands' own signature, else the cheapest
//
// A run-time SBP is visited into the static tag types (split<0..3>, broadcast, partial<sum|max|min>),
// so each step still runs one box_axis overload; split axes above 3 are a usage_error in this form.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <flexpar/collective/cost.hpp>
#include <flexpar/sbp/boxing.hpp>
#include <flexpar/sbp/global_tensor.hpp>
#include <flexpar/sbp/local_math.hpp>
#include <flexpar/sbp/ops.hpp>

namespace flexpar::sbp {

/// Calls f with the static tag of `p` (split<0..3>, broadcast, partial<sum|max|min>).
/// @throws usage_error for a split axis above 3 or a partial op other than sum, max and min.
template <class F>
decltype(auto) visit(const parallel& p, F&& f) {
  switch (p.what) {
    case kind::split:
      switch (p.axis) {
        case 0: return f(split<0>{});
        case 1: return f(split<1>{});
        case 2: return f(split<2>{});
        case 3: return f(split<3>{});
        default: break;
      }
      throw error_on<usage_error>(no_rank, "sbp::visit", "the run-time SBP form splits tensor axes 0 to 3; ",
                                  to_string(p), " needs the static form");
    case kind::broadcast: return f(broadcast{});
    case kind::partial:
      switch (p.op) {
        case reduce_op::sum: return f(partial<reduce_op::sum>{});
        case reduce_op::max: return f(partial<reduce_op::max>{});
        case reduce_op::min: return f(partial<reduce_op::min>{});
        default: break;
      }
      break;
  }
  throw error_on<usage_error>(no_rank, "sbp::visit", to_string(p),
                              " is not an SBP flexpar boxes (partial ops: sum, max, min)");
}

namespace detail {
/// @throws usage_error (on `rank`) unless `s` has one entry per mesh axis and splits axes of `shape`.
inline void check_dynamic_layout(int rank, const shape_t& shape, const nd_parallel& s, std::size_t mesh_rank) {
  if (s.rank != mesh_rank)
    throw error_on<usage_error>(rank, "dynamic_tensor", "SBP ", to_string(s), " has ", s.rank,
                                " entries; the placement mesh has ", mesh_rank, " axes");
  for (std::size_t d = 0; d < s.rank; ++d)
    if (s[d].is_split() && static_cast<std::size_t>(s[d].axis) >= shape.size())
      throw error_on<usage_error>(rank, "dynamic_tensor", "SBP ", to_string(s), " splits tensor axis ", s[d].axis,
                                  " but the shape ", to_string(shape), " has ", shape.size(), " axes");
}

/// The route of a run-time boxing from `from` to `target` on a mesh of `mesh_shape` (plan() on its
/// extents). @throws usage_error (on `rank`) when `from` or `target` does not fit the mesh, or `target`
/// mixes partial ops.
inline route dynamic_route(int rank, const nd_parallel& from, const nd_parallel& target,
                           std::span<const int> mesh_shape) {
  for (const nd_parallel* s : {&from, &target})
    if (s->rank != mesh_shape.size())
      throw error_on<usage_error>(rank, "sbp::to", s == &from ? "source " : "target ", to_string(*s), " has ", s->rank,
                                  " entries; the placement mesh has ", mesh_shape.size(), " axes");
  if (!partial_ops_agree(target))
    throw error_on<usage_error>(rank, "sbp::to", "target ", to_string(target), " mixes partial ops");
  return plan(from, target, extents_of(mesh_shape));
}

/// f(from_tag, to_tag, k) for each step k of `r`, its SBPs visited into their static tags: the run-time
/// boxing's loop (to(t, target) calls the box_axis overloads of the tensor's memory from f).
template <class F>
void for_each_step(const route& r, F&& f) {
  for (std::size_t k = 0; k < r.count; ++k)
    visit(r.steps[k].from, [&](auto from) { visit(r.steps[k].to, [&](auto to_tag) { f(from, to_tag, k); }); });
}
}  // namespace detail

/// A global tensor whose nd-SBP is a run-time value (header above), its shards in `Memory` (as
/// global_tensor: backend.hpp). Move-only; it takes its shard buffers from its placement's pool and
/// gives them back when it dies.
template <element T, std::size_t MeshRank, class Memory = host>
class dynamic_tensor {
  static_assert(backend<Memory>::available,
                "flexpar::sbp::dynamic_tensor<T, MeshRank, Memory>: Memory is memory::host, or memory::cuda with "
                "<flexpar/cuda/sbp.hpp> included (part of flexpar::cuda): include it");
  using mem = backend<Memory>;

 public:
  using value_type = T;                                                    ///< element type
  using memory_type = Memory;                                              ///< where the shards live
  using placement_type = typename mem::template placement_type<MeshRank>;  ///< the placement it lives on
  using shard_type = typename mem::template shard<T>;                      ///< the storage of a shard
  using span_type = typename mem::template span<T>;                        ///< my shard's elements
  using const_span_type = typename mem::template span<const T>;            ///< my shard's elements, read

  /// Moves the shard; `other` is left empty (on the same placement).
  dynamic_tensor(dynamic_tensor&& other) noexcept
      : where_(other.where_), shape_(std::move(other.shape_)), sbp_(other.sbp_), local_(std::move(other.local_)) {
    other.local_ = shard_type{};
  }
  /// Moves the shard; the buffer this tensor held goes back to its placement's pool.
  dynamic_tensor& operator=(dynamic_tensor&& other) noexcept {
    if (this == &other) return *this;
    mem::give_back(where_, std::move(local_));
    where_ = other.where_;
    shape_ = std::move(other.shape_);
    sbp_ = other.sbp_;
    local_ = std::move(other.local_);
    other.local_ = shard_type{};
    return *this;
  }
  dynamic_tensor(const dynamic_tensor&) = delete;             ///< copies are explicit: clone()
  dynamic_tensor& operator=(const dynamic_tensor&) = delete;  ///< copies are explicit: clone()
  /// Returns the shard's buffer to the placement's pool (where the next boxing or tensor reuses it).
  ~dynamic_tensor() { mem::give_back(where_, std::move(local_)); }

  /// Collective over the mesh: every mesh rank passes the full logical tensor (host memory) and keeps
  /// its shard (as global_tensor::from_full, whose shape check it shares; another memory: then one upload).
  static dynamic_tensor from_full(const placement_type& where, shape_t shape, const nd_parallel& s,
                                  std::span<const T> full) {
    if constexpr (!mem::host_memory) {
      return upload(where,
                    dynamic_tensor<T, MeshRank>::from_full(mem::host_placement(where), std::move(shape), s, full));
    } else {
      detail::check_same_shape(where, shape, "dynamic_tensor::from_full");
      dynamic_tensor t(where, std::move(shape), s);
      if (full.size() != elements_of(t.shape_))
        throw error_on<usage_error>(where.parent().rank(), "dynamic_tensor::from_full", "shape ", to_string(t.shape_),
                                    " has ", elements_of(t.shape_), " elements but ", full.size(), " were given");
      if (!where.contains_me()) return t;
      const box mine = t.my_box();
      t.local_ = where.pool().template acquire<T>(mine.elements());
      copy_box<T>(full, t.shape_, mine.offset, t.local_, mine.extent, shape_t(mine.extent.size(), 0), mine.extent);
      detail::zero_partial_copies<T>(t.local_, s, where.coords());
      return t;
    }
  }
  /// Collective over the mesh: adopts `local` as my shard (its size is checked, and that every mesh
  /// rank passed the same shape, as global_tensor::from_local).
  static dynamic_tensor from_local(const placement_type& where, shape_t shape, const nd_parallel& s, shard_type local) {
    detail::check_same_shape(mem::host_placement(where), shape, "dynamic_tensor::from_local");
    return adopt(where, std::move(shape), s, std::move(local));
  }
  /// The same from another vector (a std::vector<T>): its elements are copied into a buffer of the
  /// placement's pool. Host memory.
  template <class Allocator>
  requires(mem::host_memory && !std::is_same_v<Allocator, cache_line_allocator<T>>) static dynamic_tensor
      from_local(const placement_type& where, shape_t shape, const nd_parallel& s,
                 const std::vector<T, Allocator>& local) {
    return from_local(where, std::move(shape), s, where.pool().acquire_copy(std::span<const T>(local)));
  }
  /// The same from elements in the tensor's memory that it does not own (a device buffer of the
  /// caller's): copied into a shard of the placement's pool, ordered after the work on its stream.
  static dynamic_tensor from_local(const placement_type& where, shape_t shape, const nd_parallel& s,
                                   const_span_type local) requires(!mem::host_memory) {
    detail::check_same_shape(mem::host_placement(where), shape, "dynamic_tensor::from_local");
    shard_type mine = acquire(where, local.size());
    mem::copy(where, mem::elements(mine), local);
    return adopt(where, std::move(shape), s, std::move(mine));
  }
  /// For ops and the executor: my shard of a tensor computed from tensors whose shapes agree already
  /// (no communication; its size is checked).
  static dynamic_tensor adopt(const placement_type& where, shape_t shape, const nd_parallel& s, shard_type local) {
    dynamic_tensor t(where, std::move(shape), s);
    const std::size_t want = where.contains_me() ? t.my_box().elements() : 0;
    const std::size_t given = mem::elements(local).size();
    if (given != want) {
      mem::give_back(where, std::move(local));
      throw error_on<usage_error>(where.parent().rank(), "dynamic_tensor::from_local", "tensor ", to_string(t.shape_),
                                  " ", to_string(s), " has a shard of ", want, " elements on this rank, but ", given,
                                  " were given");
    }
    t.local_ = std::move(local);
    return t;
  }
  /// The shard of a host tensor on the same mesh copied to this memory (one upload, waited for).
  /// @throws usage_error when `h` lives on another placement.
  static dynamic_tensor upload(const placement_type& where,
                               const dynamic_tensor<T, MeshRank>& h) requires(!mem::host_memory) {
    if (!(h.where() == mem::host_placement(where)))
      throw error_on<usage_error>(where.parent().rank(), "to_device", "the host tensor lives on ", h.where().describe(),
                                  ", not on the device placement's mesh ", where.describe());
    return adopt(where, h.shape(), h.layout(), mem::from_host(where, h.to_local()));
  }
  /// The run-time form of a static tensor (no copy).
  template <sbp_type S>
  static dynamic_tensor from(global_tensor<T, S, Memory>&& t) {
    const placement_type where = t.where();
    shape_t shape = t.shape();
    return adopt(where, std::move(shape), nd_of<S>::value, std::move(t).release());
  }
  /// Back to a static type. @throws usage_error when the run-time SBP is not S.
  template <sbp_type S>
  global_tensor<T, S, Memory> as() && {
    if (!(nd_of<S>::value == sbp_))
      throw error_on<usage_error>(where_.parent().rank(), "dynamic_tensor::as", "the tensor is ", to_string(sbp_),
                                  ", not ", to_string<S>());
    return global_tensor<T, S, Memory>::adopt(where_, shape_, std::move(*this).release());
  }

  /// The nd-SBP now.
  [[nodiscard]] const nd_parallel& layout() const noexcept { return sbp_; }
  /// The logical shape.
  [[nodiscard]] const shape_t& shape() const noexcept { return shape_; }
  /// The placement.
  [[nodiscard]] const placement_type& where() const noexcept { return where_; }
  /// My shard, row-major, in the tensor's memory.
  [[nodiscard]] span_type to_local() noexcept { return mem::elements(local_); }
  /// My shard, row-major, in the tensor's memory.
  [[nodiscard]] const_span_type to_local() const noexcept { return mem::elements(local_); }
  /// The box my shard covers.
  [[nodiscard]] box my_box() const { return shard_box(shape_, sbp_, where_.shape(), where_.coords()); }
  /// My shard copied to a host vector (waits for the placement's stream where it has one).
  [[nodiscard]] std::vector<T> download() const {
    auto mine = mem::readable(where_, to_local());
    if constexpr (std::is_same_v<decltype(mine), std::vector<T>>)
      return mine;  // a download already
    else
      return std::vector<T>(mine.begin(), mine.end());
  }
  /// Collective over the mesh: the full logical tensor on the host of every mesh rank.
  [[nodiscard]] std::vector<T> to_full() const {
    const auto mine = mem::readable(where_, to_local());
    return detail::gather_full<T>(mem::host_placement(where_), shape_, sbp_, std::span<const T>(mine));
  }
  /// An explicit deep copy.
  [[nodiscard]] dynamic_tensor clone() const {
    dynamic_tensor t(where_, shape_, sbp_);
    t.local_ = acquire(where_, to_local().size());
    mem::copy(where_, mem::elements(t.local_), to_local());
    return t;
  }
  /// Takes my shard out (the tensor is left empty), as global_tensor::release(): a reshape of the
  /// same shard adopts it without a copy.
  [[nodiscard]] shard_type release() && noexcept {
    shard_type out = std::move(local_);
    local_ = shard_type{};
    return out;
  }
  /// A shard of `count` elements from the placement's pool (its contents undefined).
  static shard_type acquire(const placement_type& where, std::size_t count) {
    return mem::template acquire<T>(where, count);
  }

  /// Boxing to a run-time target: plan() on this mesh's extents now, then one box_axis overload per step
  /// (the view of each mesh axis from the backend). Collective over the mesh.
  friend dynamic_tensor to(dynamic_tensor&& t, const nd_parallel& target) {
    const route r = detail::dynamic_route(t.where_.parent().rank(), t.sbp_, target, t.where_.shape());
    if (t.where_.contains_me())
      detail::for_each_step(r, [&]<class From, class To>(From, To, std::size_t k) {
        detail::run_axis<T, Memory, From, To>(t.where_, t.shape_, r.before[k], r.steps[k].axis, t.local_);
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

/// A host run-time tensor's copy in the memory of placement `to` (a cuda::device_placement), whose
/// host placement must be t's.
template <element T, std::size_t N, class Where>
requires(!backend<memory_of<Where>>::host_memory) auto to_device(const dynamic_tensor<T, N>& t, const Where& to) {
  return dynamic_tensor<T, N, memory_of<Where>>::upload(to, t);
}

/// A run-time tensor's copy in host memory, on its placement's host placement (no communication).
template <element T, std::size_t N, class M>
requires(!backend<M>::host_memory) dynamic_tensor<T, N> to_host(const dynamic_tensor<T, N, M>& t) {
  const auto& where = backend<M>::host_placement(t.where());
  return dynamic_tensor<T, N>::adopt(where, t.shape(), t.layout(),
                                     where.pool().acquire_copy(std::span<const T>(t.download())));
}

/// A chosen signature of a binary op: what each operand is boxed to, the output, and the cost.
struct chosen_signature {
  nd_parallel left;    ///< the left operand's SBP for the op
  nd_parallel right;   ///< the right operand's SBP for the op
  nd_parallel out;     ///< the output's SBP
  cost boxing;         ///< the cost of boxing both operands there
  double seconds = 0;  ///< boxing.seconds(machine)
};

namespace detail {
/// The signature from `rows` (per mesh axis, one op's table of ops.hpp) whose boxing of the operands costs
/// least on `machine`. Ties go to the first in table order.
template <class Rule, std::size_t Rows>
chosen_signature cheapest_signature(Rule rule, const signature_row (&rows)[Rows], const nd_parallel& a,
                                    const shape_t& a_shape, const nd_parallel& b, const shape_t& b_shape,
                                    std::span<const int> mesh_shape, std::size_t element_bytes,
                                    const cost_params& machine) {
  std::size_t combos = 1;
  for (std::size_t d = 0; d < a.rank; ++d) combos *= Rows;
  chosen_signature best{};
  bool found = false;
  for (std::size_t c = 0; c < combos; ++c) {
    nd_parallel l = a, r = b;
    std::size_t code = c;
    for (std::size_t d = 0; d < a.rank; ++d, code /= Rows) {
      l[d] = rows[code % Rows].left;
      r[d] = rows[code % Rows].right;
    }
    if (!partial_ops_agree(l) || !partial_ops_agree(r)) continue;
    const mesh_extents m = extents_of(mesh_shape);
    const cost k = route_cost(plan(a, l, m), a_shape, mesh_shape, element_bytes) +
                   route_cost(plan(b, r, m), b_shape, mesh_shape, element_bytes);
    const double s = k.seconds(machine);
    if (!found || s < best.seconds) {
      best = {l, r, nd_signature(rule, l, r).out, k, s};
      found = true;
    }
  }
  return best;
}
}  // namespace detail

/// The matmul signature (per mesh axis, from the table of ops.hpp) whose boxing of the operands costs
/// least on `machine`: the hook the strategy search uses. Ties go to the first in table order.
inline chosen_signature cheapest_matmul_signature(const nd_parallel& a, const shape_t& a_shape, const nd_parallel& b,
                                                  const shape_t& b_shape, std::span<const int> mesh_shape,
                                                  std::size_t element_bytes, const cost_params& machine = {}) {
  return detail::cheapest_signature(detail::matmul_rule{}, table::matmul, a, a_shape, b, b_shape, mesh_shape,
                                    element_bytes, machine);
}

/// The conv2d signature for operands laid out as `x` and `w`: theirs when they already have one (nothing
/// moves), else the one of the table in ops.hpp whose boxing costs least on `machine`.
inline chosen_signature conv2d_signature(const nd_parallel& x, const shape_t& x_shape, const nd_parallel& w,
                                         const shape_t& w_shape, std::span<const int> mesh_shape,
                                         std::size_t element_bytes, const cost_params& machine = {}) {
  if (const nd_signature_result as_is = nd_signature(detail::conv2d_rule{}, x, w); as_is.ok)
    return {x, w, as_is.out, {}, 0};
  return detail::cheapest_signature(detail::conv2d_rule{}, table::conv2d, x, x_shape, w, w_shape, mesh_shape,
                                    element_bytes, machine);
}

namespace detail {
/// The signature matmul on run-time SBPs boxes `a` and `b` to (either memory's dynamic_tensor).
/// @throws usage_error when they live on different placements or their shapes do not multiply.
template <class Tensor>
chosen_signature dynamic_matmul_signature(const Tensor& a, const Tensor& b, const cost_params& machine) {
  if (!(a.where() == b.where()))
    throw error_on<usage_error>(a.where().parent().rank(), "matmul", "the operands live on different placements (",
                                a.where().describe(), " and ", b.where().describe(), ")");
  if (a.shape().size() != 2 || b.shape().size() != 2 || a.shape()[1] != b.shape()[0])
    throw error_on<usage_error>(a.where().parent().rank(), "matmul", "shapes ", to_string(a.shape()), " x ",
                                to_string(b.shape()), " do not multiply ([m, k] x [k, n])");
  return cheapest_matmul_signature(a.layout(), a.shape(), b.layout(), b.shape(), a.where().shape(),
                                   sizeof(typename Tensor::value_type), machine);
}
}  // namespace detail

/// matmul on run-time SBPs: boxes the operands to the cheapest signature, then one local GEMM (the
/// backend's: the BLAS, or cuBLAS in f32 or bf16 on a GPU).
template <element T, std::size_t N, class M>
dynamic_tensor<T, N, M> matmul(const dynamic_tensor<T, N, M>& a, const dynamic_tensor<T, N, M>& b,
                               const cost_params& machine = {}) {
  using tensor = dynamic_tensor<T, N, M>;
  const chosen_signature sig = detail::dynamic_matmul_signature(a, b, machine);
  const tensor x = to(a.clone(), sig.left), y = to(b.clone(), sig.right);
  const shape_t out_shape{a.shape()[0], b.shape()[1]};
  if (!a.where().contains_me()) return tensor::adopt(a.where(), out_shape, sig.out, {});
  const box bx = x.my_box(), by = y.my_box();
  return tensor::adopt(
      a.where(), out_shape, sig.out,
      detail::local_matmul<M, T>(a.where(), bx.extent[0], by.extent[1], bx.extent[1], x.to_local(), y.to_local()));
}

namespace detail {
/// The signature of one convolution pass for operands laid out as `a` and `b`: theirs when they have
/// one, else the cheapest of the pass's table (the host and the device form share it).
template <conv_pass Pass>
chosen_signature conv_signature(const nd_parallel& a, const shape_t& a_shape, const nd_parallel& b,
                                const shape_t& b_shape, std::span<const int> mesh, std::size_t element_bytes,
                                const cost_params& machine) {
  if constexpr (Pass == conv_pass::forward) {
    return conv2d_signature(a, a_shape, b, b_shape, mesh, element_bytes, machine);
  } else {
    using Rule = std::conditional_t<Pass == conv_pass::grad_input, conv2d_grad_input_rule, conv2d_grad_weight_rule>;
    if (const nd_signature_result as_is = nd_signature(Rule{}, a, b); as_is.ok) return {a, b, as_is.out, {}, 0};
    if constexpr (Pass == conv_pass::grad_input)
      return cheapest_signature(Rule{}, table::conv2d_grad_input, a, a_shape, b, b_shape, mesh, element_bytes, machine);
    else
      return cheapest_signature(Rule{}, table::conv2d_grad_weight, a, a_shape, b, b_shape, mesh, element_bytes,
                                machine);
  }
}

/// One convolution pass on run-time SBPs, any memory: the operands boxed to conv_signature (when theirs
/// is not one), then conv_shard on my shards (the backend's kernel).
template <conv_pass Pass, class Tensor>
Tensor conv_dynamic(const Tensor& a, const Tensor& b, std::size_t pad, const cost_params& machine) {
  using T = typename Tensor::value_type;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "flexpar::sbp::conv2d runs im2col + the BLAS GEMM: its element type must be float or double.");
  const int rank = a.where().parent().rank();
  if (!(a.where() == b.where()))
    throw error_on<usage_error>(rank, name_of(Pass), "the operands live on different placements (",
                                a.where().describe(), " and ", b.where().describe(), ")");
  const shape_t out_shape = conv_out_shape(rank, Pass, a.shape(), b.shape(), pad);
  const std::span<const int> mesh = a.where().shape();
  const chosen_signature sig =
      conv_signature<Pass>(a.layout(), a.shape(), b.layout(), b.shape(), mesh, sizeof(T), machine);
  const bool moves = !(sig.left == a.layout()) || !(sig.right == b.layout());
  std::optional<Tensor> boxed_a, boxed_b;
  if (moves) {
    boxed_a = to(a.clone(), sig.left);
    boxed_b = to(b.clone(), sig.right);
  }
  const Tensor& x = moves ? *boxed_a : a;
  const Tensor& y = moves ? *boxed_b : b;
  if (!a.where().contains_me()) return Tensor::adopt(a.where(), out_shape, sig.out, {});
  const shape_t out_local = shard_box(out_shape, sig.out, mesh, a.where().coords()).extent;
  return Tensor::adopt(
      a.where(), out_shape, sig.out,
      conv_shard<typename Tensor::memory_type, T>(a.where(), rank, Pass, x.my_box().extent, x.to_local(),
                                                  y.my_box().extent, y.to_local(), out_local, pad));
}
}  // namespace detail

/// conv2d on run-time SBPs (shapes and padding as the static conv2d of ops.hpp): the operands' own
/// signature when they have one, else boxed to the cheapest (conv2d_signature); then im2col + GEMM.
template <element T, std::size_t N, class M>
dynamic_tensor<T, N, M> conv2d(const dynamic_tensor<T, N, M>& x, const dynamic_tensor<T, N, M>& w, std::size_t pad,
                               const cost_params& machine = {}) {
  return detail::conv_dynamic<detail::conv_pass::forward>(x, w, pad, machine);
}

/// conv2d_grad_input on run-time SBPs (the table of ops.hpp; boxing as conv2d).
template <element T, std::size_t N, class M>
dynamic_tensor<T, N, M> conv2d_grad_input(const dynamic_tensor<T, N, M>& dy, const dynamic_tensor<T, N, M>& w,
                                          std::size_t pad, const cost_params& machine = {}) {
  return detail::conv_dynamic<detail::conv_pass::grad_input>(dy, w, pad, machine);
}

/// conv2d_grad_weight on run-time SBPs (the table of ops.hpp; boxing as conv2d).
template <element T, std::size_t N, class M>
dynamic_tensor<T, N, M> conv2d_grad_weight(const dynamic_tensor<T, N, M>& x, const dynamic_tensor<T, N, M>& dy,
                                           std::size_t pad, const cost_params& machine = {}) {
  return detail::conv_dynamic<detail::conv_pass::grad_weight>(x, dy, pad, machine);
}

}  // namespace flexpar::sbp
