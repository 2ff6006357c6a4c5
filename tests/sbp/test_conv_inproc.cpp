// conv2d on global tensors: every signature of conv2d, conv2d_grad_input and conv2d_grad_weight (static
// and run-time forms) against a direct serial convolution, threads as ranks on 1-4 ranks with uneven
// splits (3 channels over 2 ranks, 5 over 4, ...) and on a 2 x 2 mesh. Inputs are small integers, so
// the im2col GEMMs are exact and compared with ==.
#include <gtest/gtest.h>

#include <array>
#include <string>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "conv_checks.hpp"
#include "support/test_config.hpp"

namespace flexpar::sbp {
namespace {

using namespace testing_support;

class conv_1d : public ::testing::TestWithParam<int> {};

TEST_P(conv_1d, every_signature_matches_the_serial_convolution) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        testing_support::check_every_conv_signature(mesh);
        // the deduced output types
        using xs = global_tensor<float, split<0>>;
        using xb = global_tensor<float, broadcast>;
        using x1 = global_tensor<float, split<1>>;
        static_assert(std::is_same_v<decltype(conv2d(std::declval<xs&>(), std::declval<xb&>(), 0)), xs>);
        static_assert(std::is_same_v<decltype(conv2d(std::declval<xb&>(), std::declval<xs&>(), 0)), x1>);
        static_assert(std::is_same_v<decltype(conv2d(std::declval<x1&>(), std::declval<x1&>(), 0)),
                                     global_tensor<float, partial_sum>>);
      },
      flexpar::testing_support::with_timeout());
}

TEST_P(conv_1d, the_run_time_form_boxes_operands_without_a_signature) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        const problem pr{3, 3, 4, 4, 3, 3, 3, 1};
        const auto x = values(elements_of(pr.x_shape()), 1), w = values(elements_of(pr.w_shape()), 2);
        const serial want(pr, x, w, std::vector<float>(elements_of(pr.y_shape()), 0.0f));
        // (S(0), S(0)) and (S(2), S(1)) have no signature: boxed to the cheapest one first
        for (const auto& [lx, lw] : {std::pair{nd_parallel{parallel::S(0)}, nd_parallel{parallel::S(0)}},
                                     std::pair{nd_parallel{parallel::S(2)}, nd_parallel{parallel::S(1)}}}) {
          auto dx = dynamic_tensor<float, 1>::from_full(mesh, pr.x_shape(), lx, x);
          auto dw = dynamic_tensor<float, 1>::from_full(mesh, pr.w_shape(), lw, w);
          const chosen_signature sig = conv2d_signature(lx, pr.x_shape(), lw, pr.w_shape(), mesh.shape(), 4);
          EXPECT_TRUE(nd_signature(detail::conv2d_rule{}, sig.left, sig.right).ok) << to_string(sig.left);
          auto y = conv2d(dx, dw, pr.pad);
          EXPECT_EQ(y.layout(), sig.out);
          EXPECT_EQ(y.to_full(), want.y) << to_string(lx) << ", " << to_string(lw);
        }
      },
      flexpar::testing_support::with_timeout());
}

INSTANTIATE_TEST_SUITE_P(worlds, conv_1d, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::string("p").append(std::to_string(info.param)); });

TEST(conv_2d, nd_signatures_compose_per_mesh_axis) {
  run_in_process(
      4,
      [](communicator& comm) {
        placement<2> mesh(comm, {2, 2});
        int salt = 0;
        for (const problem& pr : {problem{3, 3, 4, 5, 5, 3, 3, 1}, problem{4, 5, 3, 3, 3, 1, 1, 0}}) {
          check_forward<sbp<split<0>, broadcast>, sbp<broadcast, split<0>>>(mesh, pr, ++salt);  // (S0, S1)
          check_forward<sbp<split<0>, split<1>>, sbp<broadcast, split<1>>>(mesh, pr, ++salt);   // (S0, P)
          check_forward<sbp<split<1>, broadcast>, sbp<split<1>, split<0>>>(mesh, pr, ++salt);   // (P, S1)
          check_grad_input<sbp<split<0>, split<1>>, sbp<broadcast, split<0>>>(mesh, pr, ++salt);
          check_grad_weight<sbp<split<0>, broadcast>, sbp<split<0>, split<1>>>(mesh, pr, ++salt);
        }
        using out = decltype(conv2d(std::declval<global_tensor<float, sbp<split<0>, split<1>>>&>(),
                                    std::declval<global_tensor<float, sbp<broadcast, split<1>>>&>(), 1));
        static_assert(std::is_same_v<out::sbp_type, sbp<split<0>, partial_sum>>);
      },
      flexpar::testing_support::with_timeout());
}

TEST(conv_tables, rows_agree_with_the_signature_functions) {
  for (const signature_row& r : table::matmul) {
    EXPECT_TRUE(signature::matmul(r.left, r.right).ok) << to_string(r.left) << ", " << to_string(r.right);
    EXPECT_EQ(signature::matmul(r.left, r.right).out, r.out) << to_string(r.left) << ", " << to_string(r.right);
  }
  // every one-axis pair not in a conv table has no signature (nothing is accepted by accident)
  const parallel all[] = {parallel::S(0),
                          parallel::S(1),
                          parallel::S(2),
                          parallel::S(3),
                          parallel::B(),
                          parallel::P(),
                          parallel::P(reduce_op::max)};
  std::size_t accepted = 0;
  for (const parallel& a : all)
    for (const parallel& b : all)
      accepted +=
          signature::conv2d(a, b).ok + signature::conv2d_grad_input(a, b).ok + signature::conv2d_grad_weight(a, b).ok;
  EXPECT_EQ(accepted, 18u);
  EXPECT_FALSE(signature::conv2d(parallel::S(2), parallel::B()).ok) << "a split of H needs halos";
  EXPECT_FALSE(signature::conv2d(parallel::P(reduce_op::max), parallel::B()).ok);
}

TEST(conv_errors, name_the_rank_op_and_both_shapes) {
  run_in_process(
      2,
      [](communicator& comm) {
        placement<1> mesh(comm, {2});
        auto x = global_tensor<float, split<0>>::from_full(mesh, {2, 3, 4, 4}, values(96, 1));
        auto w = global_tensor<float, broadcast>::from_full(mesh, {2, 4, 3, 3}, values(72, 2));
        try {
          (void)conv2d(x, w, 1);
          ADD_FAILURE() << "no usage_error";
        } catch (const usage_error& e) {
          const std::string text = e.what();
          EXPECT_NE(text.find("conv2d"), std::string::npos) << text;
          EXPECT_NE(text.find(std::string("[rank ").append(std::to_string(comm.rank())).append("]")), std::string::npos)
              << text;
          EXPECT_NE(text.find("input [2, 3, 4, 4] and weight [2, 4, 3, 3]: input channels differ"), std::string::npos)
              << text;
        }
        auto big = global_tensor<float, broadcast>::from_full(mesh, {1, 3, 7, 7}, values(147, 2));
        EXPECT_THROW((void)conv2d(x, big, 1), usage_error);  // kernel 7 on a padded 6 x 6 input
        auto flat = dynamic_tensor<float, 1>::from_full(mesh, {2, 48}, nd_parallel{parallel::S(0)}, values(96, 1));
        auto dw = dynamic_tensor<float, 1>::from_full(mesh, {2, 3, 3, 3}, nd_parallel{parallel::B()}, values(54, 1));
        EXPECT_THROW((void)conv2d(flat, dw, 1), usage_error);  // a 2-axis input
      },
      flexpar::testing_support::with_timeout());
}

}  // namespace
}  // namespace flexpar::sbp
