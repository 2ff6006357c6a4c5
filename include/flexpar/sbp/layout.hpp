// flexpar/sbp/layout.hpp — which part of a logical tensor a rank holds under an nd-SBP, and the
// strided copies that move boxes of row-major tensors.
//
// Balanced split (OneFlow's rule): n rows over p parts, part i has n / p rows plus one if i < n % p,
// and starts at i * (n / p) + min(i, n % p). nd-SBP splits nest in mesh-axis order: mesh axis 0 cuts
// the tensor first, mesh axis 1 cuts each of those pieces, and so on.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <flexpar/sbp/parallel.hpp>

namespace flexpar::sbp {

/// A logical or local tensor shape (row-major; rank 0 is a scalar).
using shape_t = std::vector<std::size_t>;

/// Elements of a tensor of shape `s`.
inline std::size_t elements_of(const shape_t& s) noexcept {
  return std::accumulate(s.begin(), s.end(), std::size_t{1}, std::multiplies<>());
}

/// "[4, 3]".
inline std::string to_string(const shape_t& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out.append(", ");
    out.append(std::to_string(s[i]));
  }
  return out.append("]");
}

/// Rows [offset, offset + count) of a balanced split.
struct part {
  std::size_t offset = 0;  ///< first row
  std::size_t count = 0;   ///< rows
};

/// Part `index` of `n` rows split over `parts` (balanced: the first n % parts get one more).
constexpr part balanced_part(std::size_t n, int parts, int index) noexcept {
  const auto p = static_cast<std::size_t>(parts), i = static_cast<std::size_t>(index);
  const std::size_t base = n / p, extra = n % p;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

/// A box of a tensor: per tensor axis, where it starts and how far it extends.
struct box {
  shape_t offset;  ///< first index per axis
  shape_t extent;  ///< length per axis
  /// Elements of the box.
  [[nodiscard]] std::size_t elements() const noexcept { return elements_of(extent); }
};

/// The coordinates of mesh index `index` (row-major: the last axis varies fastest) on a mesh of
/// `extents`.
inline std::vector<int> mesh_coords(std::size_t index, std::span<const int> extents) {
  std::vector<int> c(extents.size());
  for (std::size_t d = extents.size(); d-- > 0;) {
    c[d] = static_cast<int>(index % static_cast<std::size_t>(extents[d]));
    index /= static_cast<std::size_t>(extents[d]);
  }
  return c;
}

/// The box that mesh coordinates `coords` hold of a logical tensor `shape` under `s`, applying the
/// mesh axes in `order` (all of them, in mesh order, by default; boxing applies all but one).
inline box shard_box(const shape_t& shape, const nd_parallel& s, std::span<const int> mesh_shape,
                     std::span<const int> coords, std::size_t skip_axis = max_mesh_rank) {
  box b{shape_t(shape.size(), 0), shape};
  for (std::size_t d = 0; d < s.rank; ++d) {
    if (d == skip_axis || !s[d].is_split()) continue;
    const auto axis = static_cast<std::size_t>(s[d].axis);
    const part pt = balanced_part(b.extent[axis], mesh_shape[d], coords[d]);
    b.offset[axis] += pt.offset;
    b.extent[axis] = pt.count;
  }
  return b;
}

/// The common box of `a` and `b` (extent 0 on the axes where they do not meet: elements() == 0).
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

/// `at` as an offset from `origin` (every entry of `at` >= origin's): where a box inside another
/// starts in the other's local coordinates.
inline shape_t relative(const shape_t& at, const shape_t& origin) {
  shape_t r(at.size());
  for (std::size_t i = 0; i < at.size(); ++i) r[i] = at[i] - origin[i];
  return r;
}

/// Row-major strides of `shape` (elements).
inline shape_t strides_of(const shape_t& shape) {
  shape_t st(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) st[i - 1] = st[i] * shape[i];
  return st;
}

namespace detail {
template <class T>
void copy_box_axis(const T* src, const shape_t& src_strides, T* dst, const shape_t& dst_strides, const shape_t& extent,
                   std::size_t axis) {
  if (axis + 1 == extent.size()) {
    std::copy_n(src, extent[axis], dst);
    return;
  }
  for (std::size_t i = 0; i < extent[axis]; ++i)
    copy_box_axis(src + i * src_strides[axis], src_strides, dst + i * dst_strides[axis], dst_strides, extent, axis + 1);
}
}  // namespace detail

/// A box of two row-major tensors (the same extents at an offset in each) described with fewer axes:
/// see merge_whole_inner_axes.
struct box_pair {
  shape_t src_shape;   ///< the first tensor's shape
  shape_t src_offset;  ///< the box's offset in the first tensor
  shape_t dst_shape;   ///< the second tensor's shape
  shape_t dst_offset;  ///< the box's offset in the second tensor
  shape_t extent;      ///< the box's extents
};

/// The same elements as `b`, with every inner axis that the box covers whole in both tensors merged
/// into the axis before it (never the outermost one away): the box's contiguous runs are then its
/// innermost rows, as long as the two layouts allow (a box of whole rows is one run).
inline box_pair merge_whole_inner_axes(box_pair b) {
  while (b.extent.size() > 1) {
    const std::size_t k = b.extent.size() - 1;
    if (b.extent[k] != b.src_shape[k] || b.extent[k] != b.dst_shape[k]) break;
    b.extent[k - 1] *= b.extent[k];
    b.src_offset[k - 1] = b.src_offset[k - 1] * b.src_shape[k] + b.src_offset[k];
    b.dst_offset[k - 1] = b.dst_offset[k - 1] * b.dst_shape[k] + b.dst_offset[k];
    b.src_shape[k - 1] *= b.src_shape[k];
    b.dst_shape[k - 1] *= b.dst_shape[k];
    for (shape_t* v : {&b.extent, &b.src_shape, &b.dst_shape, &b.src_offset, &b.dst_offset}) v->pop_back();
  }
  return b;
}

/// Copies the box (`src_offset`, `extent`) of a row-major tensor `src` of shape `src_shape` to the box
/// (`dst_offset`, `extent`) of `dst` of shape `dst_shape`. Inner axes that the box covers whole in
/// both tensors are merged first, so the innermost copy is as long as the layouts allow (a box of
/// whole rows is one memcpy).
template <class T>
void copy_box(std::span<const T> src, const shape_t& src_shape, const shape_t& src_offset, std::span<T> dst,
              const shape_t& dst_shape, const shape_t& dst_offset, const shape_t& extent) {
  if (elements_of(extent) == 0) return;
  if (extent.empty()) {  // scalars
    dst[0] = src[0];
    return;
  }
  const box_pair m = merge_whole_inner_axes({src_shape, src_offset, dst_shape, dst_offset, extent});
  const shape_t sst = strides_of(m.src_shape), dst_strides = strides_of(m.dst_shape);
  std::size_t s0 = 0, d0 = 0;
  for (std::size_t i = 0; i < m.extent.size(); ++i) {
    s0 += m.src_offset[i] * sst[i];
    d0 += m.dst_offset[i] * dst_strides[i];
  }
  detail::copy_box_axis(src.data() + s0, sst, dst.data() + d0, dst_strides, m.extent, 0);
}

/// `shape` with axis `axis` replaced by `n`.
inline shape_t with_extent(shape_t shape, std::size_t axis, std::size_t n) {
  shape[axis] = n;
  return shape;
}

}  // namespace flexpar::sbp
