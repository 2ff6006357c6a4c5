// The transformer ops and the backward passes (ops_nn.hpp), two oracles:
//   - every backward against central finite differences of its forward op, in double on one rank
//     (the forward ops themselves are checked against serial math in test_ops_inproc.cpp; attention
//     and cross-entropy against the serial loops below);
//   - every signature of every op on 1-4 ranks and on 2 x 2 meshes against the same op with all
//     operands broadcast (the whole computation on each rank): bit for bit where each element is
//     computed alike in both (splits), to rounding where partial operands add in another order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "support/test_config.hpp"

#include "boxing_checks.hpp"

namespace flexpar::sbp {
namespace {

std::vector<double> random_values(std::size_t n, unsigned seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

template <class T>
std::vector<T> integers(std::size_t n, int salt) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<T>(static_cast<int>((i * 5 + static_cast<std::size_t>(salt) * 3) % 7) - 3);
  return v;
}

/// d/dx_i of sum(dy * f(x)) by central differences, for every i.
std::vector<double> numeric_grad(const std::function<std::vector<double>(const std::vector<double>&)>& f,
                                 std::vector<double> x, const std::vector<double>& dy) {
  std::vector<double> g(x.size());
  const double h = 1e-6;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const std::vector<double> up = f(x);
    x[i] = keep - h;
    const std::vector<double> down = f(x);
    x[i] = keep;
    double s = 0;
    for (std::size_t j = 0; j < up.size(); ++j) s += dy[j] * (up[j] - down[j]);
    g[i] = s / (2 * h);
  }
  return g;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i]))) << what << " element " << i;
}

using whole = global_tensor<double, broadcast>;

TEST(ops_nn_grad, every_backward_matches_finite_differences) {
  run_in_process(
      1,
      [](communicator& comm) {
        placement<1> mesh(comm, {1});
        auto full = [&](const shape_t& s, const std::vector<double>& v) { return whole::from_full(mesh, s, v); };
        const shape_t s{4, 5};
        const auto x = random_values(20, 1, 2.0), dy = random_values(20, 2);

        auto gelu_f = [&](const std::vector<double>& a) { return gelu(full(s, a)).to_full(); };
        expect_close(gelu_grad(full(s, x), full(s, dy)).to_full(), numeric_grad(gelu_f, x, dy), 1e-6, "gelu_grad");

        auto ln1 = [&](const std::vector<double>& a) { return layer_norm<1>(full(s, a)).to_full(); };
        auto ln0 = [&](const std::vector<double>& a) { return layer_norm<0>(full(s, a)).to_full(); };
        expect_close(layer_norm_grad<1>(full(s, x), full(s, dy)).to_full(), numeric_grad(ln1, x, dy), 1e-6,
                     "layer_norm_grad<1>");
        expect_close(layer_norm_grad<0>(full(s, x), full(s, dy)).to_full(), numeric_grad(ln0, x, dy), 1e-6,
                     "layer_norm_grad<0>");

        auto sm1 = [&](const std::vector<double>& a) { return softmax<1>(full(s, a)).to_full(); };
        expect_close(softmax_grad<1>(softmax<1>(full(s, x)), full(s, dy)).to_full(), numeric_grad(sm1, x, dy), 1e-6,
                     "softmax_grad<1>");

        // matmul's backward from the new transpose: dA = dC Bᵀ, dB = Aᵀ dC
        const auto b = random_values(15, 3), dc = random_values(12, 4);
        const shape_t sa{4, 5}, sb{5, 3}, sc{4, 3};
        auto mm_a = [&](const std::vector<double>& a) { return matmul(full(sa, a), full(sb, b)).to_full(); };
        auto mm_b = [&](const std::vector<double>& bb) { return matmul(full(sa, x), full(sb, bb)).to_full(); };
        expect_close(matmul(full(sc, dc), transpose(full(sb, b))).to_full(), numeric_grad(mm_a, x, dc), 1e-6,
                     "matmul dA");
        expect_close(matmul(transpose(full(sa, x)), full(sc, dc)).to_full(), numeric_grad(mm_b, b, dc), 1e-6,
                     "matmul dB");

        // attention: 2 sequences of 3 positions, 2 heads of width 2
        const shape_t qs{6, 4};
        const auto q = random_values(24, 5), k = random_values(24, 6), v = random_values(24, 7),
                   dout = random_values(24, 8);
        auto att = [&](const std::vector<double>& qq, const std::vector<double>& kk, const std::vector<double>& vv) {
          return causal_attention(full(qs, qq), full(qs, kk), full(qs, vv), 2, 3).to_full();
        };
        auto grads = causal_attention_grad(full(qs, q), full(qs, k), full(qs, v), full(qs, dout), 2, 3);
        expect_close(grads.dq.to_full(), numeric_grad([&](const auto& a) { return att(a, k, v); }, q, dout), 1e-6,
                     "attention dq");
        expect_close(grads.dk.to_full(), numeric_grad([&](const auto& a) { return att(q, a, v); }, k, dout), 1e-6,
                     "attention dk");
        expect_close(grads.dv.to_full(), numeric_grad([&](const auto& a) { return att(q, k, a); }, v, dout), 1e-6,
                     "attention dv");

        // cross-entropy: the gradient of scale * sum of the losses
        const std::vector<std::int64_t> labels{4, 0, 2, 2};
        auto ids = global_tensor<std::int64_t, broadcast>::from_full(mesh, {4}, labels);
        auto ce = [&](const std::vector<double>& z) { return cross_entropy(full(s, z), ids).to_full(); };
        expect_close(cross_entropy_grad(full(s, x), ids, 0.25).to_full(),
                     numeric_grad(ce, x, std::vector<double>(4, 0.25)), 1e-6, "cross_entropy_grad");

        // embedding: the weight's gradient (ids repeat)
        const std::vector<std::int64_t> tokens{3, 1, 3, 0, 4};
        auto tok = global_tensor<std::int64_t, broadcast>::from_full(mesh, {5}, tokens);
        const auto w = random_values(15, 9), de = random_values(15, 10);
        auto emb = [&](const std::vector<double>& ww) { return embedding(full({5, 3}, ww), tok).to_full(); };
        expect_close(embedding_grad(full({5, 3}, w), tok, full({5, 3}, de)).to_full(), numeric_grad(emb, w, de), 1e-6,
                     "embedding_grad");
      },
      flexpar::testing_support::with_timeout());
}

// Serial attention and cross-entropy, the oracle of the forward ops.
std::vector<double> serial_attention(const std::vector<double>& q, const std::vector<double>& k,
                                     const std::vector<double>& v, std::size_t rows, std::size_t cols,
                                     std::size_t heads, std::size_t seq) {
  std::vector<double> out(rows * cols, 0.0);
  const std::size_t d = cols / heads;
  for (std::size_t s0 = 0; s0 < rows; s0 += seq)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < seq; ++i) {
        std::vector<double> p(i + 1);
        double hi = -INFINITY, sum = 0;
        for (std::size_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::size_t c = 0; c < d; ++c) dot += q[(s0 + i) * cols + h * d + c] * k[(s0 + j) * cols + h * d + c];
          p[j] = dot / std::sqrt(double(d));
          hi = std::max(hi, p[j]);
        }
        for (double& x : p) sum += (x = std::exp(x - hi));
        for (std::size_t j = 0; j <= i; ++j)
          for (std::size_t c = 0; c < d; ++c)
            out[(s0 + i) * cols + h * d + c] += p[j] / sum * v[(s0 + j) * cols + h * d + c];
      }
  return out;
}

TEST(ops_nn_forward, attention_and_cross_entropy_match_serial_loops) {
  run_in_process(
      1,
      [](communicator& comm) {
        placement<1> mesh(comm, {1});
        const auto q = random_values(48, 11), k = random_values(48, 12), v = random_values(48, 13);
        auto t = [&](const std::vector<double>& a) { return whole::from_full(mesh, {12, 4}, a); };
        expect_close(causal_attention(t(q), t(k), t(v), 2, 4).to_full(), serial_attention(q, k, v, 12, 4, 2, 4), 1e-12,
                     "causal_attention");
        // the first position of every sequence attends to itself only: out = v
        const auto out = causal_attention(t(q), t(k), t(v), 2, 4).to_full();
        for (std::size_t s0 : {0, 4, 8})
          for (std::size_t c = 0; c < 4; ++c) EXPECT_DOUBLE_EQ(out[s0 * 4 + c], v[s0 * 4 + c]);

        const std::vector<double> z{1, 2, 3, 0, 0, 0};
        auto labels = global_tensor<std::int64_t, broadcast>::from_full(mesh, {2}, std::vector<std::int64_t>{2, 1});
        const auto loss = cross_entropy(whole::from_full(mesh, {2, 3}, z), labels).to_full();
        EXPECT_NEAR(loss[0], std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0, 1e-12);
        EXPECT_NEAR(loss[1], std::log(3.0), 1e-12);
        auto bad = global_tensor<std::int64_t, broadcast>::from_full(mesh, {2}, std::vector<std::int64_t>{2, 3});
        EXPECT_THROW((void)cross_entropy(whole::from_full(mesh, {2, 3}, z), bad), usage_error);
      },
      flexpar::testing_support::with_timeout());
}

template <class S, class T, std::size_t N>
global_tensor<T, S> source(const placement<N>& mesh, const shape_t& shape, const std::vector<T>& v, int salt) {
  return testing_support::distinct_source<T, S>(mesh, shape, v, salt);
}

class ops_nn_1d : public ::testing::TestWithParam<int> {};

TEST_P(ops_nn_1d, every_signature_matches_the_whole_computation) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        const int p = comm.size();
        placement<1> mesh(comm, {p});
        const shape_t s{6, 5};
        // floats from small integers: the split forms compute every element as the whole one does
        const auto x = integers<float>(30, 1), dy = integers<float>(30, 2);
        auto B = [&](const std::vector<float>& v, const shape_t& sh = {6, 5}) {
          return global_tensor<float, broadcast>::from_full(mesh, sh, v);
        };

        // transpose
        const auto xt = transpose(B(x)).to_full();
        EXPECT_EQ(transpose(source<split<0>>(mesh, s, x, 1)).to_full(), xt);
        EXPECT_EQ(transpose(source<split<1>>(mesh, s, x, 1)).to_full(), xt);
        EXPECT_EQ(transpose(source<partial_sum>(mesh, s, x, 1)).to_full(), xt);
        static_assert(std::is_same_v<decltype(transpose(std::declval<global_tensor<float, split<0>>&>())),
                                     global_tensor<float, split<1>>>);

        // element-wise and along-axis gradients: splits exact, (B, P) to rounding
        auto check_pair = [&]<bool RowsWhole, bool ColsWhole>(auto op, const char* what) {
          const auto want = op(B(x), B(dy)).to_full();
          if constexpr (RowsWhole) {
            EXPECT_EQ(op(source<split<0>>(mesh, s, x, 1), source<split<0>>(mesh, s, dy, 2)).to_full(), want) << what;
          }
          if constexpr (ColsWhole) {
            EXPECT_EQ(op(source<split<1>>(mesh, s, x, 1), source<split<1>>(mesh, s, dy, 2)).to_full(), want) << what;
          }
          auto partial = op(B(x), source<partial_sum>(mesh, s, dy, 2));
          static_assert(std::is_same_v<typename decltype(partial)::sbp_type, partial_sum>);
          const auto got = partial.to_full();
          for (std::size_t i = 0; i < want.size(); ++i)
            EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i]))) << what;
        };
        check_pair.operator()<true, true>([](auto&& a, auto&& b) { return gelu_grad(a, b); }, "gelu_grad");
        check_pair.operator()<true, false>([](auto&& a, auto&& b) { return layer_norm_grad<1>(a, b); },
                                           "layer_norm_grad<1>");
        check_pair.operator()<false, true>([](auto&& a, auto&& b) { return layer_norm_grad<0>(a, b); },
                                           "layer_norm_grad<0>");
        check_pair.operator()<true, false>([](auto&& a, auto&& b) { return softmax_grad<1>(a, b); }, "softmax_grad<1>");

        // attention: 12 sequences of 3 positions, 12 heads of width 2 (whole on every world of 1-4)
        const shape_t as{36, 24};
        const auto q = integers<float>(864, 3), k = integers<float>(864, 4), v = integers<float>(864, 5),
                   g = integers<float>(864, 6);
        auto BA = [&](const std::vector<float>& a) { return B(a, as); };
        const auto att = causal_attention(BA(q), BA(k), BA(v), 12, 3).to_full();
        const auto grads = causal_attention_grad(BA(q), BA(k), BA(v), BA(g), 12, 3);
        auto check_attention = [&]<class S>(S) {
          auto sq = source<S>(mesh, as, q, 0), sk = source<S>(mesh, as, k, 0), sv = source<S>(mesh, as, v, 0),
               sg = source<S>(mesh, as, g, 0);
          EXPECT_EQ(causal_attention(sq, sk, sv, 12, 3).to_full(), att) << to_string<S>();
          auto d = causal_attention_grad(sq, sk, sv, sg, 12, 3);
          EXPECT_EQ(d.dq.to_full(), grads.dq.to_full()) << to_string<S>();
          EXPECT_EQ(d.dk.to_full(), grads.dk.to_full()) << to_string<S>();
          EXPECT_EQ(d.dv.to_full(), grads.dv.to_full()) << to_string<S>();
        };
        check_attention(split<0>{});
        check_attention(split<1>{});
        if (p == 2 || p == 4) {  // 3 heads of width 2 over 2 or 4 ranks: a shard cuts a head
          auto cut = source<split<1>>(mesh, {3, 6}, integers<float>(18, 1), 0);
          EXPECT_THROW((void)causal_attention(cut, cut, cut, 3, 3), usage_error);
          try {
            (void)causal_attention(cut, cut, cut, 3, 3);
          } catch (const usage_error& e) {  // every rank names the first shard that cuts, as doc/sbp.md shows
            if (p == 2) {
              EXPECT_NE(std::string(e.what()).find("causal_attention: mesh rank 0 would hold columns [0, 3), which cut "
                                                   "a head of width 2: split whole heads (3 heads"),
                        std::string::npos)
                  << e.what();
            }
          }
        }
        auto odd = B(integers<float>(14, 1), {7, 2});  // 7 rows are no whole number of sequences of 3
        EXPECT_THROW((void)causal_attention(odd, odd, odd, 1, 3), usage_error);
        if (p == 2 || p == 4) {  // 3 sequences of 3 over 2 or 4 ranks: a shard cuts a sequence
          auto rows = source<split<0>>(mesh, {9, 2}, integers<float>(18, 1), 0);
          EXPECT_THROW((void)causal_attention(rows, rows, rows, 1, 3), usage_error);
        }

        // cross-entropy: rows split or whole
        const std::vector<std::int64_t> labels{4, 0, 2, 2, 1, 3};
        auto Bl = global_tensor<std::int64_t, broadcast>::from_full(mesh, {6}, labels);
        auto Sl = global_tensor<std::int64_t, split<0>>::from_full(mesh, {6}, labels);
        const auto loss = cross_entropy(B(x), Bl).to_full();
        const auto dz = cross_entropy_grad(B(x), Bl, 1.0 / 6).to_full();
        auto sx = source<split<0>>(mesh, s, x, 1);
        static_assert(std::is_same_v<typename decltype(cross_entropy(sx, Sl))::sbp_type, split<0>>);
        EXPECT_EQ(cross_entropy(sx, Sl).to_full(), loss);
        EXPECT_EQ(cross_entropy_grad(sx, Sl, 1.0 / 6).to_full(), dz);

        // embedding_grad: every row of its table (integers: the partial sums are exact)
        const std::vector<std::int64_t> tokens{3, 1, 3, 0, 4, 1};
        const shape_t ws{5, 5};
        const auto w = integers<float>(25, 7);
        auto Bt = global_tensor<std::int64_t, broadcast>::from_full(mesh, {6}, tokens);
        auto St = global_tensor<std::int64_t, split<0>>::from_full(mesh, {6}, tokens);
        const auto want = embedding_grad(B(w, ws), Bt, B(dy)).to_full();
        auto rows_split = embedding_grad(source<split<0>>(mesh, ws, w, 0), Bt, B(dy));
        static_assert(std::is_same_v<typename decltype(rows_split)::sbp_type, split<0>>);
        EXPECT_EQ(rows_split.to_full(), want);
        EXPECT_EQ(embedding_grad(source<split<1>>(mesh, ws, w, 0), Bt, source<split<1>>(mesh, s, dy, 0)).to_full(),
                  want);
        auto data_parallel = embedding_grad(B(w, ws), St, source<split<0>>(mesh, s, dy, 0));
        static_assert(std::is_same_v<typename decltype(data_parallel)::sbp_type, partial_sum>);
        EXPECT_EQ(data_parallel.to_full(), want);
        EXPECT_EQ(embedding_grad(B(w, ws), Bt, source<partial_sum>(mesh, s, dy, 3)).to_full(), want);
      },
      flexpar::testing_support::with_timeout());
}

INSTANTIATE_TEST_SUITE_P(worlds, ops_nn_1d, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::string("p").append(std::to_string(info.param)); });

// The Megatron block's backward on a (data, tensor) mesh: the gradients come out with the SBPs a
// data x tensor parallel trainer boxes (the input gradient P over tensor, weights' P over data).
TEST(ops_nn_2d, megatron_backward_types_and_values) {
  run_in_process(
      4,
      [](communicator& comm) {
        placement<2> mesh(comm, {2, 2});
        const auto x = integers<float>(6 * 4, 1), w1 = integers<float>(4 * 8, 2), dy = integers<float>(6 * 8, 3);
        using rows = sbp<split<0>, broadcast>;
        using cols = sbp<broadcast, split<1>>;
        auto X = global_tensor<float, rows>::from_full(mesh, {6, 4}, x);
        auto W = global_tensor<float, cols>::from_full(mesh, {4, 8}, w1);
        auto H = matmul(X, W);  // (S0, S1)
        auto dH = global_tensor<float, sbp<split<0>, split<1>>>::from_full(mesh, {6, 8}, dy);
        auto dX = matmul(dH, transpose(W));  // (S0, P): the tensor axis's allreduce is owed
        auto dW = matmul(transpose(X), dH);  // (P, S1): the data axis's allreduce is owed
        static_assert(std::is_same_v<decltype(dX)::sbp_type, sbp<split<0>, partial_sum>>);
        static_assert(std::is_same_v<decltype(dW)::sbp_type, sbp<partial_sum, split<1>>>);
        placement<1> one(comm, {1}, std::vector<int>{0});
        if (comm.rank() == 0) {
          auto full = [&](const shape_t& s, const std::vector<float>& v) {
            return global_tensor<float, broadcast>::from_full(one, s, v);
          };
          EXPECT_EQ(dX.to_full(), matmul(full({6, 8}, dy), transpose(full({4, 8}, w1))).to_full());
          EXPECT_EQ(dW.to_full(), matmul(transpose(full({6, 4}, x)), full({6, 8}, dy)).to_full());
        } else {
          (void)dX.to_full(), (void)dW.to_full();
        }
        (void)H;
        // attention with sequences over the data axis and heads over the tensor axis
        const auto q = integers<float>(12 * 8, 4);
        auto Q = global_tensor<float, sbp<split<0>, split<1>>>::from_full(mesh, {12, 8}, q);
        auto A = causal_attention(Q, Q, Q, 4, 3);
        auto QB = global_tensor<float, sbp<broadcast, broadcast>>::from_full(mesh, {12, 8}, q);
        EXPECT_EQ(A.to_full(), causal_attention(QB, QB, QB, 4, 3).to_full());
      },
      flexpar::testing_support::with_timeout());
}

}  // namespace
}  // namespace flexpar::sbp
