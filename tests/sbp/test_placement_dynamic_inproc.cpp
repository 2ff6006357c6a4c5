// Placement changes (n -> m ranks, 1 -> n, n -> 1, 1-D <-> 2-D meshes) and the run-time SBP form
// (boxing to run-time targets, matmul choosing its signature by boxing cost), threads as ranks.
#include <gtest/gtest.h>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "support/test_config.hpp"

#include "boxing_checks.hpp"

namespace flexpar::sbp {
namespace {

std::vector<int> values(std::size_t n, int salt) {
  std::vector<int> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<int>((i * 3 + static_cast<std::size_t>(salt)) % 13) - 6;
  return v;
}

template <class From, class To, std::size_t N1, std::size_t N2>
void check_move(const placement<N1>& a, const placement<N2>& b, const shape_t& shape, int salt) {
  const std::vector<int> full = values(elements_of(shape), salt);
  auto t = testing_support::distinct_source<int, From>(a, shape, full, salt);  // P: rank-distinct summands
  auto moved = to<To>(t, b);
  static_assert(std::is_same_v<decltype(moved), global_tensor<int, To>>);
  if (b.contains_me())
    EXPECT_EQ(moved.to_full(), full) << to_string<From>() << " on " << a.describe() << " -> " << to_string<To>()
                                     << " on " << b.describe() << " " << to_string(shape);
  else
    EXPECT_TRUE(moved.to_local().empty());
}

TEST(placement_change, n_to_m_ranks_keeps_the_logical_tensor) {
  run_in_process(
      4,
      [](communicator& comm) {
        placement<1> all(comm, {4}), first3(comm, {3}, {0, 1, 2}), last(comm, {1}, {3}), one(comm, {1}, {0}),
            middle(comm, {2}, {2, 1});
        placement<2> grid(comm, {2, 2});
        int salt = 0;
        for (const shape_t& shape : {shape_t{5, 3}, shape_t{7, 2}, shape_t{0, 4}}) {
          check_move<split<0>, broadcast>(first3, last, shape, ++salt);                 // 3 -> 1
          check_move<broadcast, split<1>>(one, all, shape, ++salt);                     // 1 -> 4
          check_move<split<1>, split<0>>(first3, middle, shape, ++salt);                // 3 -> 2 (reordered ranks)
          check_move<partial_sum, split<0>>(all, first3, shape, ++salt);                // P source
          check_move<split<0>, partial_sum>(middle, all, shape, ++salt);                // P target
          check_move<sbp<split<0>, split<1>>, split<0>>(grid, first3, shape, ++salt);   // 2-D -> 1-D
          check_move<split<1>, sbp<broadcast, split<0>>>(middle, grid, shape, ++salt);  // 1-D -> 2-D
          check_move<sbp<partial_sum, split<0>>, sbp<split<1>, partial_sum>>(grid, grid, shape, ++salt);
        }
      },
      flexpar::testing_support::with_timeout());
}

TEST(dynamic_form, boxes_to_run_time_targets) {
  run_in_process(
      4,
      [](communicator& comm) {
        placement<2> grid(comm, {2, 2});
        const shape_t shape{5, 6};
        const std::vector<int> full = values(30, 3);
        const parallel choices[] = {parallel::S(0), parallel::S(1), parallel::B(), parallel::P()};
        for (const parallel& a0 : choices)
          for (const parallel& a1 : choices)
            for (const parallel& b0 : choices)
              for (const parallel& b1 : choices) {
                nd_parallel from{{a0, a1}, 2}, target{{b0, b1}, 2};
                auto t = dynamic_tensor<int, 2>::from_local(
                    grid, shape, from, testing_support::distinct_partials(grid, shape, from, full, 3));
                auto u = to(std::move(t), target);
                EXPECT_EQ(u.layout(), target);
                EXPECT_EQ(u.to_full(), full) << to_string(from) << " -> " << to_string(target);
              }
        auto t = dynamic_tensor<int, 2>::from_full(grid, shape, nd_parallel{{parallel::S(1), parallel::B()}, 2}, full);
        auto typed = std::move(t).as<sbp<split<1>, broadcast>>();
        EXPECT_EQ(typed.to_full(), full);
        auto back = dynamic_tensor<int, 2>::from(std::move(typed));
        using wrong = sbp<split<0>, broadcast>;
        EXPECT_THROW((void)std::move(back).as<wrong>(), usage_error);
        const nd_parallel one_axis{{parallel::S(0)}, 1};
        using grid_tensor = dynamic_tensor<int, 2>;
        EXPECT_THROW((void)grid_tensor::from_full(grid, shape, one_axis, full), usage_error);
      },
      flexpar::testing_support::with_timeout());
}

TEST(dynamic_form, release_hands_over_the_shard_itself) {
  run_in_process(
      2,
      [](communicator& comm) {
        placement<1> line(comm, {2});
        const std::vector<int> full = values(12, 5);
        auto t = dynamic_tensor<int, 1>::from_full(line, {4, 3}, nd_parallel{{parallel::S(0)}, 1}, full);
        const std::vector<int> mine(t.to_local().begin(), t.to_local().end());
        const int* at = t.to_local().data();
        flexpar::aligned_vector<int> shard = std::move(t).release();
        EXPECT_EQ(shard.data(), at);  // the buffer itself: no copy
        EXPECT_EQ(std::vector<int>(shard.begin(), shard.end()), mine);
        EXPECT_TRUE(t.to_local().empty());  // NOLINT(bugprone-use-after-move): left empty, by contract
        // adopted again under another shape that keeps axis 0 (the executor's flatten): no copy
        auto flat =
            dynamic_tensor<int, 1>::from_local(line, {4, 3, 1}, nd_parallel{{parallel::S(0)}, 1}, std::move(shard));
        EXPECT_EQ(flat.to_local().data(), at);
        EXPECT_EQ(flat.to_full(), full);
      },
      flexpar::testing_support::with_timeout());
}

TEST(dynamic_form, matmul_picks_the_cheapest_signature) {
  run_in_process(
      2,
      [](communicator& comm) {
        placement<1> mesh(comm, {2});
        const std::size_t m = 64, k = 8, n = 4;
        std::vector<float> a(m * k), b(k * n), c(m * n, 0.0f);
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(int(i % 7) - 3);
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = float(int(i % 5) - 2);
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t p = 0; p < k; ++p)
            for (std::size_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + p] * b[p * n + j];
        const nd_parallel S0{{parallel::S(0)}, 1}, B{{parallel::B()}, 1}, S1{{parallel::S(1)}, 1};
        // a is split by rows and b is whole: (S(0), B) needs no boxing at all
        auto x = dynamic_tensor<float, 1>::from_full(mesh, {m, k}, S0, a);
        auto y = dynamic_tensor<float, 1>::from_full(mesh, {k, n}, B, b);
        auto z = matmul(x, y);
        EXPECT_EQ(z.layout(), S0);
        EXPECT_EQ(z.to_full(), c);
        // a split by columns, b by columns: the big a stays, the small b is gathered -> (S(1), S(0))? no:
        // (S(1), S(0)) needs b: S(1) -> S(0) (an alltoall of the small b); that beats gathering a.
        auto x1 = dynamic_tensor<float, 1>::from_full(mesh, {m, k}, S1, a);
        auto y1 = dynamic_tensor<float, 1>::from_full(mesh, {k, n}, S1, b);
        const chosen_signature sig = cheapest_matmul_signature(S1, {m, k}, S1, {k, n}, mesh.shape(), sizeof(float));
        EXPECT_EQ(sig.left, S1);
        EXPECT_EQ(sig.right, S0);
        auto z1 = matmul(x1, y1);
        EXPECT_EQ(z1.layout(), (nd_parallel{{parallel::P()}, 1}));
        EXPECT_EQ(z1.to_full(), c);
      },
      flexpar::testing_support::with_timeout());
}

}  // namespace
}  // namespace flexpar::sbp
