// flexpar/checkpoint/state.hpp — what a checkpoint holds: named global tensors, host tensors and
// integers, each kept by reference.
//
//   flexpar::checkpoint::state s;
//   s.add("fc1.weight", w);               // a global_tensor<T, Sbp> on any placement, 1-D or nd
//   s.add_replicated("adam.beta", beta);  // a host tensor, the same on every rank: written once
//   s.add_per_rank("rng", words);         // a host tensor of each rank's own: every rank writes its own
//   s.add_integer("step", step);          // a std::int64_t
//
// save() reads what the references point to when it runs, and load() writes into them: the target
// tensor's own placement, SBP and shape say which elements each rank reads. That is how a checkpoint
// is resharded: build the tensors on the new ranks with the new SBP, add them, load.
//
// The references must stay valid while a save or load that uses the state runs (an async save only
// until its call returns: it snapshots). A global tensor saved under partial<Op> is reduced first
// (one boxing to S(0) per partial mesh axis, B for a scalar): the files hold the logical tensor,
// never summands (doc/checkpoint.md says why).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <flexpar/core/dtype.hpp>
#include <flexpar/sbp/boxing.hpp>
#include <flexpar/sbp/global_tensor.hpp>
#include <flexpar/sbp/layout.hpp>
#include <flexpar/sbp/parallel.hpp>

namespace flexpar::checkpoint {

/// How the ranks hold a named tensor.
enum class holding : std::uint8_t {
  global,      ///< a global_tensor: shards over a placement, laid out by its SBP
  replicated,  ///< a host tensor every rank holds whole and equal; rank 0 writes it
  per_rank,    ///< a host tensor each rank holds its own of; every rank writes its own
};

/// "global", "replicated", "per_rank": as in errors and in the metadata file.
constexpr std::string_view name_of(holding h) noexcept {
  switch (h) {
    case holding::global: return "global";
    case holding::replicated: return "replicated";
    case holding::per_rank: return "per_rank";
  }
  return "?";
}

namespace detail {

/// Why an entry is asked for its part: to save it (may box: collective over its mesh) or to load it.
enum class purpose : std::uint8_t { save, load };

/// One entry's part on this rank, type-erased: what the compiled layer (lib/checkpoint) needs.
struct part {
  sbp::shape_t shape;           ///< the logical shape (a host tensor's own shape)
  sbp::nd_parallel sbp;         ///< global: the layout of `bytes` (after the reduction of a save)
  std::string sbp_text;         ///< global: the SBP of the tensor's type, "(P(sum), S(1))"
  std::vector<int> mesh_shape;  ///< global: the mesh extents
  std::vector<int> coords;      ///< global: my mesh coordinates (empty outside the mesh)
  int mesh_index = -1;          ///< global: my row-major mesh index (-1 outside the mesh)
  std::span<std::byte> bytes;   ///< my shard (global) or the host tensor, row-major
  std::shared_ptr<void> keep;   ///< owns the reduced copy `bytes` points into, when one was made
};

/// One named entry: its part is produced when a save or load runs, not when it is added.
struct entry {
  std::string name;                  ///< the name in the checkpoint
  holding kind = holding::global;    ///< how the ranks hold it
  dtype type = dtype::f32;           ///< element type
  std::function<part(purpose)> get;  ///< this rank's part now
};

/// A named integer (the training step, a data loader's position).
struct integer_entry {
  std::string name;               ///< the name in the checkpoint
  std::int64_t* value = nullptr;  ///< saved from rank 0; loaded on every rank
};

/// partial<Op> -> R; every other one-axis SBP unchanged.
template <class P, class R>
struct replace_partial {
  using type = P;
};
template <reduce_op Op, class R>
struct replace_partial<sbp::partial<Op>, R> {
  using type = R;
};
template <class Nd, class R>
struct without_partial;
template <class... P, class R>
struct without_partial<sbp::sbp<P...>, R> {
  using type = sbp::sbp<typename replace_partial<P, R>::type...>;
};

/// `t` boxed to `To` (collective over t's mesh; t stays as it was), as the bytes a save writes.
template <sbp::sbp_type To, element T, sbp::sbp_type S>
part reduced_part(const sbp::global_tensor<T, S>& t, part p) {
  auto r = std::make_shared<sbp::global_tensor<T, To>>(sbp::to<To>(t));
  p.sbp = sbp::nd_of<To>::value;
  p.bytes = std::as_writable_bytes(r->to_local());
  p.keep = std::move(r);
  return p;
}

/// The part of a global tensor. Saving a partial tensor boxes a copy of it to S(0) on its partial
/// mesh axes (B for a scalar, which has no axis to split): collective over its mesh.
template <element T, sbp::sbp_type S>
part part_of(sbp::global_tensor<T, S>& t, purpose why) {
  using nd = sbp::nd_of<S>;
  part p;
  p.shape = t.shape();
  p.sbp = nd::value;
  p.sbp_text = sbp::to_string<S>();
  const auto& where = t.where();
  p.mesh_shape.assign(where.shape().begin(), where.shape().end());
  p.mesh_index = where.my_index();
  if (where.contains_me()) p.coords.assign(where.coords().begin(), where.coords().end());
  if constexpr (nd::value.any_partial()) {
    if (why == purpose::save) {
      if (t.shape().empty()) return reduced_part<typename without_partial<nd, sbp::broadcast>::type>(t, std::move(p));
      return reduced_part<typename without_partial<nd, sbp::split<0>>::type>(t, std::move(p));
    }
  }
  p.bytes = std::as_writable_bytes(t.to_local());
  return p;
}

/// The part of a host tensor of `shape` over `data`.
template <element T>
part host_part(std::span<T> data, const sbp::shape_t& shape) {
  part p;
  p.shape = shape;
  p.bytes = std::as_writable_bytes(data);
  return p;
}

}  // namespace detail

/// The named entries a checkpoint saves or loads, by reference (file header). Cheap to build: make
/// one per save or load, or keep one whose references stay valid.
class state {
 public:
  /// A global tensor, saved as the logical tensor with its SBP and mesh noted; loaded into `t` as
  /// `t`'s placement, SBP and shape say (any mesh, any SBP: resharding). Under partial<sum>, a load
  /// puts the values on mesh coordinate 0 of each partial axis and zeros elsewhere (as from_full).
  template <element T, sbp::sbp_type S>
  state& add(std::string name, sbp::global_tensor<T, S>& t) {
    entries_.push_back(
        {std::move(name), holding::global, dtype_of<T>, [&t](detail::purpose why) { return detail::part_of(t, why); }});
    return *this;
  }

  /// A host tensor of `shape` (default: one axis of data.size()) that every rank holds equal: rank
  /// 0 writes it, every rank loads it. A checkpoint's global and replicated tensors load into
  /// either kind of target (a model saved sharded loads whole into one process's buffers).
  template <element T>
  state& add_replicated(std::string name, std::span<T> data) {
    return add_replicated(std::move(name), data, {data.size()});
  }
  /// The same with an explicit row-major shape (its elements must be data.size()).
  template <element T>
  state& add_replicated(std::string name, std::span<T> data, sbp::shape_t shape) {
    return add_host(std::move(name), holding::replicated, data, std::move(shape));
  }

  /// A host tensor of each rank's own (its shape may differ between ranks): every rank writes its
  /// own, and rank r loads what rank r saved, so the loading world must have the saving world's size.
  template <element T>
  state& add_per_rank(std::string name, std::span<T> data) {
    return add_per_rank(std::move(name), data, {data.size()});
  }
  /// The same with an explicit row-major shape (its elements must be data.size()).
  template <element T>
  state& add_per_rank(std::string name, std::span<T> data, sbp::shape_t shape) {
    return add_host(std::move(name), holding::per_rank, data, std::move(shape));
  }

  /// A named integer: saved from rank 0, loaded on every rank (the training step).
  state& add_integer(std::string name, std::int64_t& value) {
    integers_.push_back({std::move(name), &value});
    return *this;
  }

  /// The tensors, in the order they were added (the order of the data files).
  [[nodiscard]] const std::vector<detail::entry>& entries() const noexcept { return entries_; }
  /// The integers, in the order they were added.
  [[nodiscard]] const std::vector<detail::integer_entry>& integers() const noexcept { return integers_; }

 private:
  template <element T>
  state& add_host(std::string name, holding kind, std::span<T> data, sbp::shape_t shape) {
    entries_.push_back({std::move(name), kind, dtype_of<T>,
                        [data, shape = std::move(shape)](detail::purpose) { return detail::host_part(data, shape); }});
    return *this;
  }

  std::vector<detail::entry> entries_;
  std::vector<detail::integer_entry> integers_;
};

}  // namespace flexpar::checkpoint
