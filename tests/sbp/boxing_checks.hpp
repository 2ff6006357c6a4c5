// The boxing checks shared by the in-process and the mpiexec tests: box a tensor made from a serial
// logical tensor (its partial values different on every rank), gather it with to_full (which does not
// use boxing) and compare.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include <flexpar/sbp/sbp.hpp>

namespace flexpar::sbp::testing_support {

template <class T>
std::vector<T> logical(const shape_t& shape, int salt) {
  std::vector<T> v(elements_of(shape));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<T>(static_cast<int>((i * 7 + static_cast<std::size_t>(salt)) % 23) - 11);
  return v;
}

/// This rank's shard of `logical` laid out by `s` on `where`, with partial values that differ from
/// rank to rank and whose reduction over the mesh is `logical`, known serially (small integers:
/// exact in every element type here). Rank k of the K ranks that differ in their partial
/// coordinates holds, under sum, a summand in [-5, 5] (k < K - 1) or logical minus the others'
/// summands (the last); under max (min) a value below (above) logical, except on the one rank
/// chosen per element that holds logical itself. So a boxing that took one rank's values for the
/// result (coordinate 0's, as from_full's shards would let it) or skipped the reduction fails.
/// Ranks that differ only in split or broadcast coordinates hold the same values (broadcast copies
/// are equal); without a partial axis this is the shard from_full keeps.
template <class T, std::size_t N>
std::vector<T> distinct_partials(const placement<N>& where, const shape_t& shape, const nd_parallel& s,
                                 const std::vector<T>& logical, int salt) {
  if (!where.contains_me()) return {};
  std::size_t k = 0, parts = 1;
  reduce_op op = reduce_op::sum;
  for (std::size_t d = 0; d < s.rank; ++d)
    if (s[d].is_partial()) {
      const auto extent = static_cast<std::size_t>(where.shape()[d]);
      k = k * extent + static_cast<std::size_t>(where.coords()[d]);
      parts *= extent;
      op = s[d].op;
    }
  const auto salted = static_cast<std::size_t>(salt);
  auto summand = [salted](std::size_t i, std::size_t j) {  // rank j's summand of element i (j < parts - 1)
    const int magnitude = 1 + static_cast<int>((i * 5 + j * 3 + salted) % 5);
    return (i + j) % 2 == 0 ? magnitude : -magnitude;
  };
  std::vector<T> mine(logical.size());
  for (std::size_t i = 0; i < logical.size(); ++i) {
    if (op == reduce_op::sum) {
      if (k + 1 < parts) {
        mine[i] = static_cast<T>(summand(i, k));
      } else {
        T rest = logical[i];
        for (std::size_t j = 0; j + 1 < parts; ++j) rest = static_cast<T>(rest - static_cast<T>(summand(i, j)));
        mine[i] = rest;
      }
    } else {
      const bool holds_it = (i * 3 + salted) % parts == k;
      const T below = static_cast<T>(1 + (i + k) % 3);
      mine[i] = holds_it ? logical[i] : static_cast<T>(op == reduce_op::max ? logical[i] - below : logical[i] + below);
    }
  }
  const box b = shard_box(shape, s, where.shape(), where.coords());
  std::vector<T> local(b.elements());
  copy_box<T>(mine, shape, b.offset, local, b.extent, shape_t(b.extent.size(), 0), b.extent);
  return local;
}

/// A global tensor of `logical` whose partial axes hold distinct_partials (from_local).
template <class T, class S, std::size_t N>
global_tensor<T, S> distinct_source(const placement<N>& where, const shape_t& shape, const std::vector<T>& logical,
                                    int salt) {
  return global_tensor<T, S>::from_local(where, shape,
                                         distinct_partials<T>(where, shape, nd_of<S>::value, logical, salt));
}

template <class... S>
struct list {};

using one_axis = list<split<0>, split<1>, split<2>, broadcast, partial_sum, partial<reduce_op::max>>;
using two_axes =
    list<sbp<split<0>, split<1>>, sbp<split<0>, split<0>>, sbp<split<1>, broadcast>, sbp<broadcast, split<2>>,
         sbp<partial_sum, split<0>>, sbp<split<2>, partial_sum>, sbp<broadcast, broadcast>,
         sbp<partial_sum, partial_sum>, sbp<partial_sum, broadcast>, sbp<split<1>, split<1>>>;

template <class... A, class F>
void for_each_pair(list<A...>, F&& f) {
  auto row = [&]<class From>(From) { (f(From{}, A{}), ...); };
  (row(A{}), ...);
}

inline const std::vector<shape_t>& shapes() {
  static const std::vector<shape_t> s{{5, 3, 4}, {3, 7, 2}, {1, 2, 9}, {0, 3, 2}, {4, 4, 1}};
  return s;
}

/// What one boxing produced, compared by one non-template-per-pair function (keeps the many
/// instantiations of check_pair light to compile).
template <class T>
struct boxing_outcome {
  std::string what;
  std::vector<T> logical, source_before, source_after, boxed;
  shape_t local_shape, box_extent;
  std::size_t local_size = 0;
};

template <class T>
void expect_boxing_kept_the_tensor(const boxing_outcome<T>& o) {
  ASSERT_EQ(o.source_before, o.logical) << "the source (distinct_partials) of " << o.what;
  EXPECT_EQ(o.local_shape, o.box_extent) << o.what;
  EXPECT_EQ(o.local_size, elements_of(o.local_shape)) << o.what;
  EXPECT_EQ(o.boxed, o.logical) << o.what;
  EXPECT_EQ(o.source_after, o.logical) << "the source of " << o.what << " changed";
}

template <class T, class From, class To, std::size_t N>
void check_pair(const placement<N>& mesh, const shape_t& shape, int salt) {
  boxing_outcome<T> o;
  o.logical = logical<T>(shape, salt);
  auto t = distinct_source<T, From>(mesh, shape, o.logical, salt);
  o.source_before = t.to_full();
  auto&& boxed = to<To>(t);  // t stays as it was (X -> X: boxed is t itself)
  o.what = to_string<From>() + " -> " + to_string<To>() + " " + to_string(shape) + " on rank " +
           std::to_string(mesh.parent().rank());
  o.local_shape = boxed.local_shape();
  o.box_extent = boxed.my_box().extent;
  o.local_size = boxed.to_local().size();
  o.boxed = boxed.to_full();
  o.source_after = t.to_full();
  expect_boxing_kept_the_tensor(o);
}

}  // namespace flexpar::sbp::testing_support
