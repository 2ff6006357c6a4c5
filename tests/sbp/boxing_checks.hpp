// The boxing checks shared by the in-process and the mpiexec tests: box a tensor made from a serial
// logical tensor, gather it with to_full (which does not use boxing) and compare.
#pragma once

#include <gtest/gtest.h>

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
  ASSERT_EQ(o.source_before, o.logical) << "from_full " << o.what;
  EXPECT_EQ(o.local_shape, o.box_extent) << o.what;
  EXPECT_EQ(o.local_size, elements_of(o.local_shape)) << o.what;
  EXPECT_EQ(o.boxed, o.logical) << o.what;
  EXPECT_EQ(o.source_after, o.logical) << "the source of " << o.what << " changed";
}

template <class T, class From, class To, std::size_t N>
void check_pair(const placement<N>& mesh, const shape_t& shape, int salt) {
  boxing_outcome<T> o;
  o.logical = logical<T>(shape, salt);
  auto t = global_tensor<T, From>::from_full(mesh, shape, o.logical);
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
