// flexpar/sbp/placement.hpp — a mesh of ranks over a communicator.
//
//   flexpar::sbp::placement<2> mesh(comm, {2, 2});          // 4 ranks: data x model
//   mesh.axis(1)   // the ranks of my mesh row along axis 1 (my model-parallel group), a communicator
//
// The mesh rank (number of axes) is part of the type: an nd-SBP with another number of entries does
// not compile against it. The extents are run-time values. The mesh lists ranks of a parent
// communicator in row-major order (all of them by default; a subset for pipeline stages and placement
// changes); ranks outside it construct the placement too (construction is collective over the
// parent) but hold no tensor data. The sub-communicators (one per mesh axis, and one of the whole
// mesh) are created once, at construction, and shared by copies of the placement, as is the
// placement's buffer_pool (the shard buffers its tensors and boxings reuse).
//
// Static extents: static_mesh<2, 2> is a placement<2> whose extents are part of its type; its
// construction checks them against the communicator (a usage_error naming both), and the boxing route
// on it is a compile-time value that sees the real extents (route_on<From, To, static_mesh<2, 2>>, in
// boxing/route.hpp). Boxing on any placement runs the route planned on its real extents.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/core/memory.hpp>
#include <flexpar/sbp/buffer_pool.hpp>
#include <flexpar/sbp/parallel.hpp>

namespace flexpar::sbp {

/// A MeshRank-dimensional mesh of ranks of a parent communicator (header above). Cheap to copy.
template <std::size_t MeshRank>
class placement {
  static_assert(MeshRank >= 1 && MeshRank <= max_mesh_rank, "flexpar::sbp::placement<N>: a mesh has 1 to 4 axes");

 public:
  /// Number of mesh axes.
  static constexpr std::size_t mesh_rank = MeshRank;
  /// Where the shards of its tensors live.
  using memory_type = memory::host;

  /// Collective over `parent` (which must outlive this placement and its copies). `ranks` are the
  /// parent's ranks in the mesh, row-major (default: 0, 1, ..., size-1); their number must be the
  /// product of `shape`. `pool` caches the shard buffers of this placement's tensors and boxings
  /// (default: a pool of its own, buffer_pool::default_max_bytes; pass one pool to share it between
  /// placements, or a pool of 0 bytes to cache nothing). @throws usage_error naming the mismatch.
  placement(communicator& parent, std::array<int, MeshRank> shape, std::vector<int> ranks = {},
            std::shared_ptr<buffer_pool> pool = {})
      : s_(std::make_shared<state>()) {
    s_->parent = &parent;
    s_->pool = pool ? std::move(pool) : std::make_shared<buffer_pool>();
    s_->shape = shape;
    int cells = 1;
    for (int e : shape) {
      if (e < 1)
        throw error_on<usage_error>(parent.rank(), "placement", "mesh extent ", e, " in ", describe(shape),
                                    "; every extent must be >= 1");
      cells *= e;
    }
    if (ranks.empty()) {
      for (int r = 0; r < parent.size(); ++r) ranks.push_back(r);
    }
    if (static_cast<int>(ranks.size()) != cells)
      throw error_on<usage_error>(parent.rank(), "placement", "mesh ", describe(shape), " has ", cells, " cells but ",
                                  ranks.size(), " ranks were given (the parent communicator has ", parent.size(), ")");
    std::vector<bool> seen(static_cast<std::size_t>(parent.size()), false);
    for (int r : ranks) {
      if (r < 0 || r >= parent.size() || seen[static_cast<std::size_t>(r)])
        throw error_on<usage_error>(parent.rank(), "placement", "rank ", r, " is outside the parent communicator of ",
                                    parent.size(), " ranks or listed twice");
      seen[static_cast<std::size_t>(r)] = true;
    }
    s_->ranks = std::move(ranks);
    for (std::size_t i = 0; i < s_->ranks.size(); ++i)
      if (s_->ranks[i] == parent.rank()) s_->my_index = static_cast<int>(i);
    if (s_->my_index >= 0) s_->coords = coords_of(s_->my_index);

    // the whole mesh, then one group per axis: the ranks that agree on every other coordinate
    const bool in = s_->my_index >= 0;
    auto whole = parent.split(in ? 0 : -1, s_->my_index);
    if (whole) s_->group = std::make_unique<communicator>(std::move(*whole));
    for (std::size_t d = 0; d < MeshRank; ++d) {
      int color = -1;
      if (in) {
        color = 0;
        for (std::size_t e = 0; e < MeshRank; ++e)
          if (e != d) color = color * shape[e] + s_->coords[e];
      }
      auto axis_comm = parent.split(color, in ? s_->coords[d] : 0);
      if (axis_comm) s_->axes[d] = std::make_unique<communicator>(std::move(*axis_comm));
    }
  }

  /// Mesh extents.
  [[nodiscard]] const std::array<int, MeshRank>& shape() const noexcept { return s_->shape; }
  /// Ranks in the mesh.
  [[nodiscard]] int size() const noexcept { return static_cast<int>(s_->ranks.size()); }
  /// True when this rank is in the mesh.
  [[nodiscard]] bool contains_me() const noexcept { return s_->my_index >= 0; }
  /// My row-major index in the mesh (-1 outside it).
  [[nodiscard]] int my_index() const noexcept { return s_->my_index; }
  /// My mesh coordinates. @pre contains_me()
  [[nodiscard]] const std::array<int, MeshRank>& coords() const noexcept { return s_->coords; }
  /// The mesh coordinates of mesh index `index`.
  [[nodiscard]] std::array<int, MeshRank> coords_of(int index) const noexcept {
    std::array<int, MeshRank> c{};
    for (std::size_t d = MeshRank; d-- > 0;) {
      c[d] = index % s_->shape[d];
      index /= s_->shape[d];
    }
    return c;
  }
  /// The parent's rank at mesh index `index`.
  [[nodiscard]] int parent_rank(int index) const { return s_->ranks.at(static_cast<std::size_t>(index)); }
  /// The parent's ranks in mesh order.
  [[nodiscard]] std::span<const int> ranks() const noexcept { return s_->ranks; }
  /// The communicator the placement was built over.
  [[nodiscard]] communicator& parent() const noexcept { return *s_->parent; }
  /// All ranks of the mesh, ordered by mesh index. @throws usage_error outside the mesh.
  [[nodiscard]] communicator& group() const {
    if (!s_->group) throw outside("group()");
    return *s_->group;
  }
  /// My group along mesh axis `d` (its rank is my coordinate d). @throws usage_error outside the mesh.
  [[nodiscard]] communicator& axis(std::size_t d) const {
    if (!s_->axes.at(d)) throw outside("axis()");
    return *s_->axes[d];
  }
  /// The buffer cache of this placement's tensors (shared by its copies).
  [[nodiscard]] buffer_pool& pool() const noexcept { return *s_->pool; }
  /// Same mesh object (copies of one placement compare equal; two constructions do not).
  friend bool operator==(const placement& a, const placement& b) noexcept { return a.s_ == b.s_; }
  /// "[2, 2] over ranks 0 1 2 3".
  [[nodiscard]] std::string describe() const {
    std::string s = describe(s_->shape);
    s.append(" over ranks");
    for (int r : s_->ranks) s.append(" ").append(std::to_string(r));
    return s;
  }

 private:
  struct state {
    communicator* parent = nullptr;
    std::array<int, MeshRank> shape{};
    std::vector<int> ranks;
    int my_index = -1;
    std::array<int, MeshRank> coords{};
    std::unique_ptr<communicator> group;
    std::array<std::unique_ptr<communicator>, MeshRank> axes;
    std::shared_ptr<buffer_pool> pool;
  };
  static std::string describe(const std::array<int, MeshRank>& shape) {
    std::string s = "[";
    for (std::size_t d = 0; d < MeshRank; ++d) {
      if (d) s.append(", ");
      s.append(std::to_string(shape[d]));
    }
    return s.append("]");
  }
  [[nodiscard]] usage_error outside(const char* what) const {
    return error_on<usage_error>(s_->parent->rank(), std::string("placement::").append(what),
                                 "this rank is not in the mesh ", describe());
  }
  std::shared_ptr<state> s_;
};

/// A placement whose mesh extents are part of its type: static_mesh<2, 2> is a 2 x 2 placement<2>.
/// Everything that takes a placement<2> takes it (tensors, boxing with compile-time routes, costs);
/// what the type adds is that the extents are compile-time constants (`extents`, `cells`) and that
/// a mesh of the wrong size cannot be built: construction checks the communicator (or the given
/// ranks) against the extents and throws a usage_error naming both.
template <int... Extents>
class static_mesh : public placement<sizeof...(Extents)> {
  static_assert(sizeof...(Extents) >= 1 && sizeof...(Extents) <= max_mesh_rank,
                "flexpar::sbp::static_mesh<E...>: a mesh has 1 to 4 axes");
  static_assert(((Extents >= 1) && ...), "flexpar::sbp::static_mesh<E...>: every mesh extent must be at least 1");

 public:
  /// The placement it is.
  using placement_type = placement<sizeof...(Extents)>;
  /// Mesh extents, a compile-time value.
  static constexpr std::array<int, sizeof...(Extents)> extents{Extents...};
  /// Ranks in the mesh, a compile-time value.
  static constexpr int cells = (Extents * ...);

  /// Collective over `parent`, like placement's constructor. With no `ranks`, the parent must have
  /// exactly `cells` ranks; otherwise `ranks` must list `cells` of them.
  /// @throws usage_error naming the static extents and the communicator size or rank count.
  explicit static_mesh(communicator& parent, std::vector<int> ranks = {}, std::shared_ptr<buffer_pool> pool = {})
      : placement_type(parent, extents, checked(parent, std::move(ranks)), std::move(pool)) {}

  /// "static_mesh<2, 2>".
  static std::string name() {
    std::string s = "static_mesh<";
    for (std::size_t d = 0; d < extents.size(); ++d) {
      if (d) s.append(", ");
      s.append(std::to_string(extents[d]));
    }
    return s.append(">");
  }

 private:
  static std::vector<int> checked(communicator& parent, std::vector<int> ranks) {
    const int given = ranks.empty() ? parent.size() : static_cast<int>(ranks.size());
    if (given != cells) {
      std::string text = on_rank(parent.rank(), name());
      text.append("the mesh has ")
          .append(std::to_string(cells))
          .append(" cells but ")
          .append(ranks.empty() ? "the communicator has " : "the rank list has ")
          .append(std::to_string(given))
          .append(" ranks");
      if (ranks.empty()) text.append(" (pass the ranks of a sub-mesh, or change the extents)");
      throw usage_error(text);
    }
    return ranks;
  }
};

}  // namespace flexpar::sbp
