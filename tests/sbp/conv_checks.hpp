// Shared by the conv2d tests (threads as ranks and mpiexec): small-integer inputs, a direct serial
// convolution (no im2col) and its two gradients, and one check per signature that runs both the static
// and the run-time form of an op against it.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "boxing_checks.hpp"

namespace flexpar::sbp::testing_support {

inline std::vector<float> values(std::size_t n, int salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(salt) * 3) % 9) - 4);
  return v;
}

/// One convolution problem: x [n, c, h, w], weight [k, c, r, s], stride 1, `pad` zeros each side.
struct problem {
  std::size_t n, c, h, w, k, r, s, pad;
  [[nodiscard]] std::size_t p() const { return h + 2 * pad - r + 1; }
  [[nodiscard]] std::size_t q() const { return w + 2 * pad - s + 1; }
  [[nodiscard]] shape_t x_shape() const { return {n, c, h, w}; }
  [[nodiscard]] shape_t w_shape() const { return {k, c, r, s}; }
  [[nodiscard]] shape_t y_shape() const { return {n, k, p(), q()}; }
};

/// The direct sums (no im2col): y[n,k,p,q] = sum_{c,r,s} x[n,c,p+r-pad,q+s-pad] w[k,c,r,s], and the two
/// gradients from the same index relation.
struct serial {
  std::vector<float> y, dx, dw;
  serial(const problem& pr, const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dy)
      : y(elements_of(pr.y_shape()), 0.0f), dx(x.size(), 0.0f), dw(w.size(), 0.0f) {
    for (std::size_t n = 0; n < pr.n; ++n)
      for (std::size_t k = 0; k < pr.k; ++k)
        for (std::size_t p = 0; p < pr.p(); ++p)
          for (std::size_t q = 0; q < pr.q(); ++q)
            for (std::size_t c = 0; c < pr.c; ++c)
              for (std::size_t r = 0; r < pr.r; ++r)
                for (std::size_t s = 0; s < pr.s; ++s) {
                  const std::size_t hh = p + r, ww = q + s;
                  if (hh < pr.pad || ww < pr.pad || hh - pr.pad >= pr.h || ww - pr.pad >= pr.w) continue;
                  const std::size_t xi = ((n * pr.c + c) * pr.h + hh - pr.pad) * pr.w + ww - pr.pad;
                  const std::size_t wi = ((k * pr.c + c) * pr.r + r) * pr.s + s;
                  const std::size_t yi = ((n * pr.k + k) * pr.p() + p) * pr.q() + q;
                  y[yi] += x[xi] * w[wi];
                  dx[xi] += dy[yi] * w[wi];
                  dw[wi] += dy[yi] * x[xi];
                }
  }
};

inline const problem problems[] = {
    {3, 3, 5, 4, 3, 3, 3, 1},  // "same" padding, 3 channels over 2 and 4 ranks
    {5, 2, 4, 4, 5, 1, 1, 0},  // 1 x 1 kernel, 5 output channels
    {2, 5, 3, 6, 2, 3, 1, 0},  // rectangular kernel, no padding
    {1, 1, 2, 2, 1, 3, 3, 1},  // one sample, one channel
    {0, 2, 3, 3, 2, 3, 3, 1},  // no samples
};

/// Which op a check runs.
enum class conv_op { forward, grad_input, grad_weight };

/// One signature of one op: the operands (L, R) laid out as their SBPs, the op in the static form and
/// in the run-time form (which must keep the operands' signature: same output SBP), both against the
/// direct serial sums.
template <conv_op Op, class L, class R, std::size_t N>
void check_conv(const placement<N>& mesh, const problem& pr, int salt) {
  const auto x = values(elements_of(pr.x_shape()), salt), w = values(elements_of(pr.w_shape()), salt + 1);
  const auto dy = values(elements_of(pr.y_shape()), salt + 2);
  const serial sums(pr, x, w, dy);
  // operands and result per op: forward (x, w) -> y, grad_input (dy, w) -> dx, grad_weight (x, dy) -> dw
  const bool dy_left = Op == conv_op::grad_input, dy_right = Op == conv_op::grad_weight;
  const shape_t left_shape = dy_left ? pr.y_shape() : pr.x_shape(),
                right_shape = dy_right ? pr.y_shape() : pr.w_shape();
  const std::vector<float>& left = dy_left ? dy : x;
  const std::vector<float>& right = dy_right ? dy : w;
  const std::vector<float>& want = Op == conv_op::forward ? sums.y : (Op == conv_op::grad_input ? sums.dx : sums.dw);
  const char* name =
      Op == conv_op::forward ? "conv2d" : (Op == conv_op::grad_input ? "conv2d_grad_input" : "conv2d_grad_weight");
  auto run = [&](const auto& a, const auto& b) {
    if constexpr (Op == conv_op::forward)
      return conv2d(a, b, pr.pad);
    else if constexpr (Op == conv_op::grad_input)
      return conv2d_grad_input(a, b, pr.pad);
    else
      return conv2d_grad_weight(a, b, pr.pad);
  };
  // partial operands hold different summands on every rank (boxing_checks.hpp)
  auto out = run(distinct_source<float, L>(mesh, left_shape, left, salt),
                 distinct_source<float, R>(mesh, right_shape, right, salt + 1));
  using out_sbp = typename decltype(out)::sbp_type;
  EXPECT_EQ(out.to_full(), want) << name << " " << to_string<L>() << ", " << to_string<R>() << " -> "
                                 << to_string<out_sbp>() << " on " << to_string(pr.x_shape());
  auto dyn =
      run(dynamic_tensor<float, N>::from_local(mesh, left_shape, nd_of<L>::value,
                                               distinct_partials(mesh, left_shape, nd_of<L>::value, left, salt)),
          dynamic_tensor<float, N>::from_local(mesh, right_shape, nd_of<R>::value,
                                               distinct_partials(mesh, right_shape, nd_of<R>::value, right, salt + 1)));
  EXPECT_EQ(dyn.layout(), nd_of<out_sbp>::value) << "dynamic " << name;
  EXPECT_EQ(dyn.to_full(), want) << "dynamic " << name << " " << to_string<L>() << ", " << to_string<R>();
}

template <class X, class W, std::size_t N>
void check_forward(const placement<N>& mesh, const problem& pr, int salt) {
  check_conv<conv_op::forward, X, W>(mesh, pr, salt);
}
template <class D, class W, std::size_t N>
void check_grad_input(const placement<N>& mesh, const problem& pr, int salt) {
  check_conv<conv_op::grad_input, D, W>(mesh, pr, salt);
}
template <class X, class D, std::size_t N>
void check_grad_weight(const placement<N>& mesh, const problem& pr, int salt) {
  check_conv<conv_op::grad_weight, X, D>(mesh, pr, salt);
}

/// Every 1-axis signature of conv2d, conv2d_grad_input and conv2d_grad_weight on `mesh`, for every problem.
inline void check_every_conv_signature(const placement<1>& mesh) {
  int salt = 0;
  for (const problem& pr : problems) {
    check_forward<split<0>, broadcast>(mesh, pr, ++salt);     // sample parallel
    check_forward<broadcast, split<0>>(mesh, pr, ++salt);     // output channels
    check_forward<split<1>, split<1>>(mesh, pr, ++salt);      // input channels -> P(sum)
    check_forward<partial_sum, broadcast>(mesh, pr, ++salt);  // linear in x
    check_forward<broadcast, partial_sum>(mesh, pr, ++salt);  // linear in w
    check_forward<broadcast, broadcast>(mesh, pr, ++salt);    // replicated
    check_grad_input<split<0>, broadcast>(mesh, pr, ++salt);  // data parallel
    check_grad_input<split<1>, split<0>>(mesh, pr, ++salt);   // output channels -> P(sum)
    check_grad_input<broadcast, split<1>>(mesh, pr, ++salt);  // input channels
    check_grad_input<partial_sum, broadcast>(mesh, pr, ++salt);
    check_grad_input<broadcast, partial_sum>(mesh, pr, ++salt);
    check_grad_input<broadcast, broadcast>(mesh, pr, ++salt);
    check_grad_weight<split<0>, split<0>>(mesh, pr, ++salt);   // data parallel -> P(sum)
    check_grad_weight<broadcast, split<1>>(mesh, pr, ++salt);  // output channels
    check_grad_weight<split<1>, broadcast>(mesh, pr, ++salt);  // input channels
    check_grad_weight<partial_sum, broadcast>(mesh, pr, ++salt);
    check_grad_weight<broadcast, partial_sum>(mesh, pr, ++salt);
    check_grad_weight<broadcast, broadcast>(mesh, pr, ++salt);
  }
}

}  // namespace flexpar::sbp::testing_support
