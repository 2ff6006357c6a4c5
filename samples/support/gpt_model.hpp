// samples/support/gpt_model.hpp — the GPT of samples/gpt_text.cpp, written once in SBP ops: its
// layouts, blocks (forward and backward), stages, Adam, batches from a text, and the training runs
// (one mesh, or pipeline stages on meshes). Shared by the sample and bench/flexpar_gpt_search.cpp.
//
// The model: token and position embeddings, pre-norm blocks (layer norm, causal multi-head
// attention, layer norm, GELU MLP of 4 x width, residuals; no biases, no norm gains), a final layer
// norm and the output layer tied to the token embedding; Adam. Every tensor's layout is its type:
// activations (S(0), B) — rows by the data axis, whole over the tensor axis; q, k, v and the MLP's
// hidden (S(0), S(1)); W_q, W_k, W_v, W_1 column-parallel (B, S(1)), W_o, W_2 and the embedding
// row-parallel (B, S(0)). The ops deduce the rest, and every communication is a boxing the types
// ask for: the P(sum) -> B allreduces of Megatron's row-parallel layers and of the input gradients,
// and the weight gradients, which come out P(sum) over the data axis, boxed to B (the data-parallel
// gradient allreduce). A layout that does not fit an op does not compile.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <flexpar/actor/pipeline_sbp.hpp>
#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/sbp/sbp.hpp>
#include <flexpar/search/pipeline.hpp>

namespace gpt {

namespace fs = flexpar::sbp;

// [snippet:gpt_layouts]
using act_t = fs::sbp<fs::split<0>, fs::broadcast>;   // [tokens, width]: rows by data, whole over tensor
using head_t = fs::sbp<fs::split<0>, fs::split<1>>;   // q, k, v, the MLP's hidden: columns by tensor too
using col_t = fs::sbp<fs::broadcast, fs::split<1>>;   // column-parallel weight (W_q, W_k, W_v, W_1)
using row_t = fs::sbp<fs::broadcast, fs::split<0>>;   // row-parallel weight (W_o, W_2); the vocabulary split
using rep_t = fs::sbp<fs::broadcast, fs::broadcast>;  // replicated (position embedding, the loss)
// [/snippet:gpt_layouts]
template <class S>
using tensor = fs::global_tensor<float, S>;
using ids_t = fs::global_tensor<std::int64_t, act_t>;

/// A run's layout: stages (blocks per stage), each a data x tensor mesh; micro-batches; schedule.
using layout = flexpar::search::pipeline_strategy;

struct config {
  std::size_t vocab = 256, seq = 32, width = 64, heads = 4, layers = 2, batch = 16;
};

struct block {
  tensor<col_t> wq, wk, wv, w1;
  tensor<row_t> wo, w2;
};

/// Full weights in one fixed order (embedding, positions, then per block q, k, v, o, 1, 2).
struct full_weights {
  std::vector<std::vector<float>> w;
};

/// The initial weights: the same on every rank and in both runs.
inline full_weights initial_weights(const config& c, std::uint64_t seed) {
  full_weights init;
  auto& w = init.w;
  std::mt19937_64 rng(seed);
  auto normal = [&](std::size_t n, double sd) {
    std::normal_distribution<float> d(0.0f, static_cast<float>(sd));
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
  };
  const double in = 1.0 / std::sqrt(double(c.width)), out = in / std::sqrt(2.0 * double(c.layers));
  w.push_back(normal(c.vocab * c.width, 0.1));
  w.push_back(normal(c.seq * c.width, 0.1));
  for (std::size_t l = 0; l < c.layers; ++l) {
    for (int k = 0; k < 3; ++k) w.push_back(normal(c.width * c.width, in));  // q, k, v
    w.push_back(normal(c.width * c.width, out));                             // o
    w.push_back(normal(c.width * 4 * c.width, in));                          // 1
    w.push_back(normal(4 * c.width * c.width, out / 2));                     // 2
  }
  return init;
}

/// What a block's backward needs of its forward.
struct block_cache {
  tensor<act_t> x, h1, x2, h2;
  tensor<head_t> q, k, v, a, u, g;
};

/// A block's output and what its backward needs.
struct block_forward_result {
  tensor<act_t> y;
  block_cache cache;
};

// [snippet:gpt_block_forward]
/// x -> x + attention(norm(x)) -> that + mlp(norm(that)).
inline block_forward_result block_forward(const block& b, tensor<act_t> x, const config& c) {
  auto h1 = fs::layer_norm<1>(x);
  auto q = fs::matmul(h1, b.wq), k = fs::matmul(h1, b.wk), v = fs::matmul(h1, b.wv);  // (S0, S1): heads split
  auto a = fs::causal_attention(q, k, v, c.heads, c.seq);
  auto x2 = fs::add(x, fs::to<act_t>(fs::matmul(a, b.wo)));  // (S0, P) -> (S0, B): the block's first allreduce
  auto h2 = fs::layer_norm<1>(x2);
  auto u = fs::matmul(h2, b.w1);
  auto g = fs::gelu(u);
  auto y = fs::add(x2, fs::to<act_t>(fs::matmul(g, b.w2)));  // the second
  return {std::move(y),
          {std::move(x), std::move(h1), std::move(x2), std::move(h2), std::move(q), std::move(k), std::move(v),
           std::move(a), std::move(u), std::move(g)}};
}
// [/snippet:gpt_block_forward]

/// The optimizer on the shards (every data rank holds the same shard of a weight and of its gradient):
/// Adam, or plain SGD (w -= lr g). Adam normalizes each weight's step by its gradient's running scale, so
/// a gradient off by a constant factor (a mean where a sum belongs) moves the weights as the right one
/// does; under SGD it moves them by that factor, which the weight comparison of gpt_text then sees.
struct optimizer {
  enum class rule { adam, sgd };
  rule kind = rule::adam;
  float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  int t = 0;
  std::vector<std::vector<float>> m, v;
  std::size_t slot = 0;

  void begin() {
    ++t;
    slot = 0;
  }
  template <class S>
  void update(tensor<S>& w, const tensor<S>& g) {
    const auto ws = w.to_local();
    const auto gs = g.to_local();
    if (kind == rule::sgd) {
      for (std::size_t i = 0; i < ws.size(); ++i) ws[i] -= lr * gs[i];
      return;
    }
    if (slot == m.size()) {
      m.emplace_back(w.to_local().size(), 0.0f);
      v.emplace_back(w.to_local().size(), 0.0f);
    }
    std::vector<float>&ms = m[slot], &vs = v[slot];
    ++slot;
    const float c1 = 1.0f - std::pow(beta1, static_cast<float>(t)), c2 = 1.0f - std::pow(beta2, static_cast<float>(t));
    for (std::size_t i = 0; i < ws.size(); ++i) {
      ms[i] = beta1 * ms[i] + (1.0f - beta1) * gs[i];
      vs[i] = beta2 * vs[i] + (1.0f - beta2) * gs[i] * gs[i];
      ws[i] -= lr * (ms[i] / c1) / (std::sqrt(vs[i] / c2) + eps);
    }
  }
};

/// One batch: `rows` = batch x seq byte ids, the next bytes as targets, and the positions.
struct batch_ids {
  std::vector<std::int64_t> tokens, targets, positions;
};

inline batch_ids make_batch(const std::string& text, const config& c, int step, std::uint64_t seed) {
  batch_ids b;
  std::mt19937_64 rng(seed * 1000003ULL + static_cast<std::uint64_t>(step));
  std::uniform_int_distribution<std::size_t> start(0, text.size() - c.seq - 1);
  for (std::size_t s = 0; s < c.batch; ++s) {
    const std::size_t at = start(rng);
    for (std::size_t i = 0; i < c.seq; ++i) {
      b.tokens.push_back(static_cast<unsigned char>(text[at + i]));
      b.targets.push_back(static_cast<unsigned char>(text[at + i + 1]));
      b.positions.push_back(static_cast<std::int64_t>(i));
    }
  }
  return b;
}

using col_grad_t = fs::sbp<fs::partial_sum, fs::split<1>>;   // a column-parallel weight's gradient before boxing
using row_grad_t = fs::sbp<fs::partial_sum, fs::split<0>>;   // a row-parallel weight's (and the embedding's)
using rep_grad_t = fs::sbp<fs::partial_sum, fs::broadcast>;  // the position embedding's

/// The gradients of one block's weights, partial over the data axis (each data rank has its rows'
/// share: data parallelism's allreduce is the boxing to the weight's layout, once per step).
struct block_grads {
  tensor<col_grad_t> wq, wk, wv, w1;
  tensor<row_grad_t> wo, w2;
};

/// block_grads and the gradient of the block's input.
struct block_backward_result {
  block_grads w;
  tensor<act_t> dx;
};

// [snippet:gpt_block_backward]
/// dy -> dx and the weights' gradients, which come out P(sum) over the data axis.
inline block_backward_result block_backward(const block& b, const block_cache& f, const tensor<act_t>& dy,
                                            const config& c) {
  auto dg = fs::matmul(dy, fs::transpose(b.w2));                  // (S0, B) x (B, S1) -> (S0, S1)
  auto dw2 = fs::matmul(fs::transpose(f.g), dy);                  // (S1, S0) x (S0, B) -> (P, S0)
  auto du = fs::gelu_grad(f.u, dg);                               // (S0, S1)
  auto dw1 = fs::matmul(fs::transpose(f.h2), du);                 // (S1, B) x (S0, S1) -> (P, S1)
  auto dh2 = fs::to<act_t>(fs::matmul(du, fs::transpose(b.w1)));  // (S0, P) -> (S0, B): an allreduce
  auto dx2 = fs::add(dy, fs::layer_norm_grad<1>(f.x2, dh2));      // the residual
  auto da = fs::matmul(dx2, fs::transpose(b.wo));                 // (S0, S1)
  auto dwo = fs::matmul(fs::transpose(f.a), dx2);                 // (P, S0)
  auto d = fs::causal_attention_grad(f.q, f.k, f.v, da, c.heads, c.seq);
  auto dh1 =
      fs::to<act_t>(fs::add(fs::add(fs::matmul(d.dq, fs::transpose(b.wq)), fs::matmul(d.dk, fs::transpose(b.wk))),
                            fs::matmul(d.dv, fs::transpose(b.wv))));  // three partial sums, one allreduce
  auto h1t = fs::transpose(f.h1);
  return {{fs::matmul(h1t, d.dq), fs::matmul(h1t, d.dk), fs::matmul(h1t, d.dv), std::move(dw1), std::move(dwo),
           std::move(dw2)},
          fs::add(dx2, fs::layer_norm_grad<1>(f.x, dh1))};
}
// [/snippet:gpt_block_backward]

/// Adds `g` into `acc` (micro-batches accumulate; partial + partial stays partial).
template <class S>
void accumulate(std::optional<tensor<S>>& acc, tensor<S> g) {
  acc = acc ? fs::add(*acc, g) : std::move(g);
}

/// The layers of one pipeline stage on its mesh: the first holds the embeddings, the last the final
/// norm and the output layer (the token embedding again: tied, its gradients summed across the two).
struct stage_model {
  bool first = false, last = false;
  std::optional<tensor<row_t>> embed;
  std::optional<tensor<rep_t>> position;
  std::vector<block> blocks;
};

inline stage_model make_stage(const fs::placement<2>& mesh, const config& c, const full_weights& init,
                              std::size_t layer0, std::size_t layers, bool first, bool last) {
  const std::size_t d = c.width, h = 4 * c.width;
  stage_model s;
  s.first = first;
  s.last = last;
  if (first || last) s.embed.emplace(tensor<row_t>::from_full(mesh, {c.vocab, d}, init.w[0]));
  if (first) s.position.emplace(tensor<rep_t>::from_full(mesh, {c.seq, d}, init.w[1]));
  for (std::size_t l = layer0; l < layer0 + layers; ++l) {
    const std::vector<float>* w = &init.w[2 + 6 * l];
    auto wq = tensor<col_t>::from_full(mesh, {d, d}, w[0]);
    auto wk = tensor<col_t>::from_full(mesh, {d, d}, w[1]);
    auto wv = tensor<col_t>::from_full(mesh, {d, d}, w[2]);
    auto wo = tensor<row_t>::from_full(mesh, {d, d}, w[3]);
    auto w1 = tensor<col_t>::from_full(mesh, {d, h}, w[4]);
    auto w2 = tensor<row_t>::from_full(mesh, {h, d}, w[5]);
    s.blocks.push_back({std::move(wq), std::move(wk), std::move(wv), std::move(w1), std::move(wo), std::move(w2)});
  }
  return s;
}

/// The gradients a stage accumulates over a step's micro-batches.
struct stage_grads {
  std::optional<tensor<row_grad_t>> embed;
  std::optional<tensor<rep_grad_t>> position;
  std::vector<std::optional<tensor<col_grad_t>>> wq, wk, wv, w1;
  std::vector<std::optional<tensor<row_grad_t>>> wo, w2;
  explicit stage_grads(std::size_t blocks) : wq(blocks), wk(blocks), wv(blocks), w1(blocks), wo(blocks), w2(blocks) {}
};

/// What a stage's backward needs of its forward.
struct stage_trace {
  std::vector<block_cache> blocks;
  std::optional<tensor<act_t>> x_last;  // the last stage: the input of the final norm
};

/// The first stage's input: token embedding (vocabulary split: (S0, P), then its allreduce) plus
/// position embedding.
inline tensor<act_t> embed_forward(const stage_model& s, const ids_t& tokens, const ids_t& positions) {
  return fs::add(fs::to<act_t>(fs::embedding(*s.embed, tokens)), fs::embedding(*s.position, positions));
}

/// The stage's blocks (and on the last stage the final norm): x -> output.
inline tensor<act_t> stage_forward(const stage_model& s, const config& c, tensor<act_t> x, stage_trace* keep) {
  for (const block& b : s.blocks) {
    block_forward_result r = block_forward(b, std::move(x), c);
    if (keep != nullptr) keep->blocks.push_back(std::move(r.cache));
    x = std::move(r.y);
  }
  if (!s.last) return x;
  auto hf = fs::layer_norm<1>(x);
  if (keep != nullptr) keep->x_last.emplace(std::move(x));
  return hf;
}

/// d(output) -> d(input), accumulating the weights' gradients.
inline tensor<act_t> stage_backward(const stage_model& s, const config& c, const stage_trace& f, tensor<act_t> dy,
                                    stage_grads& acc) {
  if (s.last) dy = fs::layer_norm_grad<1>(*f.x_last, dy);
  for (std::size_t l = s.blocks.size(); l-- > 0;) {
    block_backward_result r = block_backward(s.blocks[l], f.blocks[l], dy, c);
    accumulate(acc.wq[l], std::move(r.w.wq));
    accumulate(acc.wk[l], std::move(r.w.wk));
    accumulate(acc.wv[l], std::move(r.w.wv));
    accumulate(acc.w1[l], std::move(r.w.w1));
    accumulate(acc.wo[l], std::move(r.w.wo));
    accumulate(acc.w2[l], std::move(r.w.w2));
    dy = std::move(r.dx);
  }
  return dy;
}

/// The embeddings' gradients from the first stage's input gradient.
inline void embed_backward(const stage_model& s, const ids_t& tokens, const ids_t& positions, const tensor<act_t>& dx,
                           stage_grads& acc) {
  accumulate(acc.embed, fs::embedding_grad(*s.embed, tokens, dx));           // (P, S0)
  accumulate(acc.position, fs::embedding_grad(*s.position, positions, dx));  // (P, B)
}

/// The last stage's head: logits through the tied embedding, the cross-entropy summed over the rows
/// times `scale`, and the gradient of the final norm's output; accumulates the embedding's gradient.
/// Collective over the stage's mesh; every rank of it returns the same loss.
inline float head(const stage_model& s, const tensor<act_t>& hf, const ids_t& targets, double scale, stage_grads& acc,
                  std::optional<tensor<act_t>>& dhf) {
  // [snippet:gpt_head]
  auto logits = fs::to<act_t>(fs::matmul(hf, fs::transpose(*s.embed)));  // (S0, S1) -> (S0, B): an allgather
  auto loss = fs::to<rep_t>(fs::reduce_sum<0>(fs::cross_entropy(logits, targets)));  // (P, B) -> B
  auto dlogits = fs::to<head_t>(fs::cross_entropy_grad(logits, targets, scale));     // B -> S(1): a slice
  accumulate(acc.embed, fs::matmul(fs::transpose(dlogits), hf));                     // (P, S0)
  dhf.emplace(fs::to<act_t>(fs::matmul(dlogits, *s.embed)));                         // (S0, P) -> (S0, B)
  // [/snippet:gpt_head]
  return static_cast<float>(double(loss.to_local()[0]) * scale);
}

/// Boxes the accumulated gradients to the weights' layouts (the data axis's allreduces), sums the tied
/// embedding's two copies over `tied` (the first and last stages' ranks, when they differ), and
/// steps the optimizer.
inline void apply(stage_model& s, stage_grads& acc, optimizer& opt, std::optional<flexpar::communicator>& tied) {
  opt.begin();
  if (s.embed) {
    auto g = fs::to<row_t>(std::move(*acc.embed));
    if (tied) flexpar::allreduce(*tied, g.to_local(), flexpar::reduce_op::sum);
    opt.update(*s.embed, g);
  }
  if (s.position) opt.update(*s.position, fs::to<rep_t>(std::move(*acc.position)));
  for (std::size_t l = 0; l < s.blocks.size(); ++l) {
    block& b = s.blocks[l];
    opt.update(b.wq, fs::to<col_t>(std::move(*acc.wq[l])));
    opt.update(b.wk, fs::to<col_t>(std::move(*acc.wk[l])));
    opt.update(b.wv, fs::to<col_t>(std::move(*acc.wv[l])));
    opt.update(b.wo, fs::to<row_t>(std::move(*acc.wo[l])));
    opt.update(b.w1, fs::to<col_t>(std::move(*acc.w1[l])));
    opt.update(b.w2, fs::to<row_t>(std::move(*acc.w2[l])));
  }
}

/// One training step of the whole model on `mesh` (no pipeline): one stage that is first and last.
inline float train_step(stage_model& m, optimizer& opt, const config& c, const fs::placement<2>& mesh,
                        const batch_ids& batch) {
  const std::size_t rows = c.batch * c.seq;
  auto tokens = ids_t::from_full(mesh, {rows}, batch.tokens);
  auto targets = ids_t::from_full(mesh, {rows}, batch.targets);
  auto positions = ids_t::from_full(mesh, {rows}, batch.positions);
  stage_trace f;
  stage_grads acc(m.blocks.size());
  auto hf = stage_forward(m, c, embed_forward(m, tokens, positions), &f);
  std::optional<tensor<act_t>> dhf;
  const float loss = head(m, hf, targets, 1.0 / double(rows), acc, dhf);
  embed_backward(m, tokens, positions, stage_backward(m, c, f, std::move(*dhf), acc), acc);
  std::optional<flexpar::communicator> untied;
  apply(m, acc, opt, untied);
  return loss;
}

/// The model's weights gathered whole (collective over each stage's mesh; every rank passes its
/// stage), in initial_weights' order; on ranks of other stages their entries stay empty.
inline full_weights gather(const stage_model& s, const config& c, std::size_t layer0) {
  full_weights all;
  all.w.resize(2 + 6 * c.layers);
  if (s.embed) all.w[0] = s.embed->to_full();
  if (s.position) all.w[1] = s.position->to_full();
  for (std::size_t l = 0; l < s.blocks.size(); ++l) {
    const block& b = s.blocks[l];
    std::vector<float>* w = &all.w[2 + 6 * (layer0 + l)];
    w[0] = b.wq.to_full();
    w[1] = b.wk.to_full();
    w[2] = b.wv.to_full();
    w[3] = b.wo.to_full();
    w[4] = b.w1.to_full();
    w[5] = b.w2.to_full();
  }
  return all;
}

/// Text sampled from `m` (on a 1 x 1 mesh) after `prompt`, `count` bytes at temperature 0.8.
inline std::string generate(const stage_model& m, const config& c, const fs::placement<2>& one, std::string prompt,
                            std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  config g = c;
  g.batch = 1;
  std::string out;
  std::vector<std::int64_t> positions(c.seq);
  for (std::size_t i = 0; i < c.seq; ++i) positions[i] = static_cast<std::int64_t>(i);
  auto pos = ids_t::from_full(one, {c.seq}, positions);
  for (std::size_t n = 0; n < count; ++n) {
    std::vector<std::int64_t> ids(c.seq);
    for (std::size_t i = 0; i < c.seq; ++i) ids[i] = static_cast<unsigned char>(prompt[prompt.size() - c.seq + i]);
    const auto hf = stage_forward(m, g, embed_forward(m, ids_t::from_full(one, {c.seq}, ids), pos), nullptr);
    const auto logits = fs::matmul(hf, fs::transpose(*m.embed));
    const float* last = logits.to_local().data() + (c.seq - 1) * c.vocab;
    std::vector<double> p(c.vocab);
    const double hi = *std::max_element(last, last + c.vocab);
    for (std::size_t v = 0; v < c.vocab; ++v) p[v] = std::exp((double(last[v]) - hi) / 0.8);
    std::discrete_distribution<std::size_t> pick(p.begin(), p.end());
    const char next = static_cast<char>(pick(rng));
    prompt.push_back(next);
    out.push_back(next);
  }
  return out;
}

/// What a run measured: per step the loss (on rank 0) and the seconds (on every rank); on rank 0, the
/// number of weight elements whose bits differ between data-parallel replicas (0 when they agree).
struct run_result {
  std::vector<float> losses;
  std::vector<double> step_seconds;
  std::size_t replica_disagreements = 0;
};

/// The weight elements of this rank's stage whose bits differ across the data-parallel replicas (the
/// weights are B over the data axis: every replica must hold the same bits after a step), summed on
/// rank 0 of `comm`. Collective over `comm`: every rank passes its stage and mesh.
inline std::size_t replica_disagreements(flexpar::communicator& comm, const stage_model& s,
                                         const fs::placement<2>& mesh) {
  std::vector<std::uint32_t> bits;  // the local pieces in one fixed order, as raw bits
  auto add = [&](const auto& w) {
    for (float x : w.to_local()) bits.push_back(std::bit_cast<std::uint32_t>(x));
  };
  if (s.embed) add(*s.embed);
  if (s.position) add(*s.position);
  for (const block& b : s.blocks) {
    add(b.wq), add(b.wk), add(b.wv), add(b.wo), add(b.w1), add(b.w2);
  }
  std::vector<std::uint32_t> lo(bits.size()), hi(bits.size());
  const int n = static_cast<int>(bits.size());
  MPI_Allreduce(bits.data(), lo.data(), n, MPI_UINT32_T, MPI_MIN, mesh.axis(0).mpi_comm());
  MPI_Allreduce(bits.data(), hi.data(), n, MPI_UINT32_T, MPI_MAX, mesh.axis(0).mpi_comm());
  unsigned long long mine = 0, total = 0;
  if (mesh.coords()[0] == 0)  // count each disagreement once: on the replica of data coordinate 0
    for (std::size_t i = 0; i < bits.size(); ++i) mine += lo[i] != hi[i] ? 1 : 0;
  MPI_Reduce(&mine, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, comm.mpi_comm());
  return static_cast<std::size_t>(total);
}

/// The parallel run without a pipeline: the whole model on one (data, tensor) mesh of every rank.
/// `trained` (when given) receives the trained weights on rank 0.
inline run_result train_on_mesh(flexpar::communicator& comm, const config& c, const layout& lay,
                                const full_weights& init, const std::string& text, int steps, const optimizer& settings,
                                std::uint64_t seed, full_weights* trained) {
  // [snippet:gpt_mesh]
  fs::placement<2> mesh(comm, std::array<int, 2>{lay.data, lay.tensor});  // (data, tensor)
  stage_model m = make_stage(mesh, c, init, 0, c.layers, true, true);
  optimizer opt = settings;
  run_result r;
  for (int step = 0; step < steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    r.losses.push_back(train_step(m, opt, c, mesh, make_batch(text, c, step, seed)));
    r.step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // [/snippet:gpt_mesh]
  r.replica_disagreements = replica_disagreements(comm, m, mesh);
  if (trained != nullptr) *trained = gather(m, c, 0);
  return r;
}

/// `groups` (data, tensor) meshes of consecutive ranks: group g is ranks g D T ... (g + 1) D T - 1.
/// Collective over `comm`: every rank builds each.
inline std::vector<fs::placement<2>> stage_meshes(flexpar::communicator& comm, int groups, int data, int tensor) {
  std::vector<fs::placement<2>> meshes;
  for (int g = 0; g < groups; ++g) {
    std::vector<int> ranks;
    for (int k = 0; k < data * tensor; ++k) ranks.push_back(g * data * tensor + k);
    meshes.emplace_back(comm, std::array<int, 2>{data, tensor}, ranks);
  }
  return meshes;
}

/// The pipelined run: one group of data x tensor ranks per stage, group g running stage g (lay.blocks[g]
/// blocks) on its mesh; the activations between stages are (S(0), B) pieces on actor edges.
inline run_result train_pipelined(flexpar::communicator& comm, const config& c, const layout& lay,
                                  const full_weights& init, const std::string& text, int steps,
                                  const optimizer& settings, std::uint64_t seed, full_weights* trained) {
  const int rank = comm.rank(), per_group = lay.data * lay.tensor, group = rank / per_group;
  const int d = (rank % per_group) / lay.tensor, last_group = lay.stages() - 1;
  std::vector<std::size_t> first_block(1, 0);  // stage g holds blocks [first_block[g], first_block[g + 1])
  for (int b : lay.blocks) first_block.push_back(first_block.back() + static_cast<std::size_t>(b));
  // [snippet:gpt_pipeline]
  const std::vector<fs::placement<2>> meshes = stage_meshes(comm, lay.stages(), lay.data, lay.tensor);
  const fs::placement<2>& mesh = meshes[static_cast<std::size_t>(group)];
  const auto g0 = static_cast<std::size_t>(group);
  stage_model sm = make_stage(mesh, c, init, first_block[g0], first_block[g0 + 1] - first_block[g0], group == 0,
                              group == last_group);
  // The tied embedding's two copies (first and last stage): rank k of one mesh sums with rank k of the other.
  const bool holds_copy = group == 0 || group == last_group;
  std::optional<flexpar::communicator> tied = comm.split(holds_copy ? rank % per_group : -1, group);

  config mc = c;  // one micro-batch
  mc.batch = c.batch / static_cast<std::size_t>(lay.micro_batches);
  const std::size_t mrows = mc.batch * c.seq, my_rows = mrows / static_cast<std::size_t>(lay.data),
                    row0 = static_cast<std::size_t>(d) * my_rows;
  batch_ids batch;
  stage_grads acc(sm.blocks.size());
  auto ids = [&](auto&& value_of_row) {  // this rank's rows of a micro-batch as (S(0), B) ids
    flexpar::aligned_vector<std::int64_t> v(my_rows);
    for (std::size_t r = 0; r < my_rows; ++r) v[r] = value_of_row(r);
    return ids_t::adopt(mesh, {mrows}, std::move(v));
  };
  auto tokens_of = [&](const std::vector<float>& x) { return ids([&](std::size_t r) { return std::int64_t(x[r]); }); };
  auto positions = [&] { return ids([&](std::size_t r) { return std::int64_t((row0 + r) % c.seq); }); };
  auto acts = [&](const std::vector<float>& x) {
    return tensor<act_t>::adopt(mesh, {mrows, c.width}, flexpar::aligned_vector<float>(x.begin(), x.end()));
  };
  auto stage_input = [&](const std::vector<float>& x) {
    return sm.first ? embed_forward(sm, tokens_of(x), positions()) : acts(x);
  };
  flexpar::pipeline_stage body{
      "gpt",
      [&](int, const std::vector<float>& x, std::vector<float>& y) {
        const auto out = stage_forward(sm, mc, stage_input(x), nullptr);
        y.assign(out.to_local().begin(), out.to_local().end());
      },
      [&](int, const std::vector<float>& x, const std::vector<float>&, const std::vector<float>& gy,
          std::vector<float>& gx) {
        stage_trace f;  // recomputed: the stash holds a stage's input and output only
        (void)stage_forward(sm, mc, stage_input(x), &f);
        auto dx = stage_backward(sm, mc, f, acts(gy), acc);
        if (sm.first) {
          embed_backward(sm, tokens_of(x), positions(), dx, acc);
        } else {  // this replica's part: the pipeline adds the tensor ranks' parts (the gradient of B is P)
          const auto part = fs::to<fs::sbp<fs::split<0>, fs::partial_sum>>(std::move(dx));
          gx.assign(part.to_local().begin(), part.to_local().end());
        }
      }};
  flexpar::pipeline_builder builder(comm);
  for (int g = 0; g < lay.stages(); ++g)
    builder.stage(flexpar::stage_on<act_t, act_t>(meshes[static_cast<std::size_t>(g)]), body);
  std::vector<fs::shape_t> shapes(static_cast<std::size_t>(lay.stages() - 1), fs::shape_t{mrows, c.width});
  builder.activation_shapes(shapes)
      .micro_batches(lay.micro_batches)
      .schedule(lay.schedule)
      .input([&](int mb, std::vector<float>& x) {  // this rank's rows of micro-batch mb: byte ids
        x.resize(my_rows);
        for (std::size_t r = 0; r < my_rows; ++r) x[r] = float(batch.tokens[std::size_t(mb) * mrows + row0 + r]);
      })
      .loss([&](int mb, const std::vector<float>& out, std::vector<float>& g) {
        std::optional<tensor<act_t>> dhf;
        auto targets = ids([&](std::size_t r) { return batch.targets[std::size_t(mb) * mrows + row0 + r]; });
        const float l = head(sm, acts(out), targets, 1.0 / double(c.batch * c.seq), acc, dhf);
        g.assign(dhf->to_local().begin(), dhf->to_local().end());
        return mesh.my_index() == 0 ? l : 0.0f;  // every rank of the mesh has the loss: count it once
      });
  flexpar::pipeline pipe = builder.build();
  // [/snippet:gpt_pipeline]
  optimizer opt = settings;
  run_result r;
  for (int step = 0; step < steps; ++step) {
    batch = make_batch(text, c, step, seed);
    const auto t0 = std::chrono::steady_clock::now();
    const auto stats = pipe.run_step(comm.default_deadline());
    apply(sm, acc, opt, tied);
    acc = stage_grads(sm.blocks.size());
    r.step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    float loss = 0.0f, total = 0.0f;
    for (float v : stats.losses) loss += v;  // micro-batch order
    MPI_Reduce(&loss, &total, 1, MPI_FLOAT, MPI_SUM, 0, comm.mpi_comm());
    r.losses.push_back(total);
  }
  r.replica_disagreements = replica_disagreements(comm, sm, mesh);
  if (trained == nullptr) return r;
  // The trained weights on rank 0: each stage's mesh gathers its own, its first rank sends them on.
  full_weights mine = gather(sm, c, first_block[g0]);
  trained->w.resize(mine.w.size());
  for (std::size_t k = 0; k < mine.w.size(); ++k) {
    int owner = 0;  // the first rank of the stage that holds weight k
    if (k >= 2)
      while (first_block[static_cast<std::size_t>(owner) + 1] <= (k - 2) / 6) ++owner;
    owner *= per_group;
    if (owner == 0) {
      if (rank == 0) trained->w[k] = std::move(mine.w[k]);
    } else if (rank == owner) {
      MPI_Send(mine.w[k].data(), static_cast<int>(mine.w[k].size()), MPI_FLOAT, 0, 0, comm.mpi_comm());
    } else if (rank == 0) {
      trained->w[k].resize(init.w[k].size());
      MPI_Recv(trained->w[k].data(), static_cast<int>(trained->w[k].size()), MPI_FLOAT, owner, 0, comm.mpi_comm(),
               MPI_STATUS_IGNORE);
    }
  }
  return r;
}

/// The parallel run of `lay`: on one mesh when it has one stage, else pipelined.
inline run_result train(flexpar::communicator& comm, const config& c, const layout& lay, const full_weights& init,
                        const std::string& text, int steps, const optimizer& settings, std::uint64_t seed,
                        full_weights* trained) {
  return lay.stages() > 1 ? train_pipelined(comm, c, lay, init, text, steps, settings, seed, trained)
                          : train_on_mesh(comm, c, lay, init, text, steps, settings, seed, trained);
}

}  // namespace gpt
