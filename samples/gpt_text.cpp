// gpt_text: a small decoder-only transformer (GPT) trained on real text — the fortunes of Debian's
// fortunes-min package, one token per byte — built from SBP ops on a (data x tensor) mesh, and the
// same model trained on one rank from the same seed as the oracle.
//
//   mpiexec.mpich -n 1 ./gpt_text --steps 300                    # serial: the loss curve and sample text
//   mpiexec.mpich -n 2 ./gpt_text --steps 20 --data 2            # data parallel
//   mpiexec.mpich -n 2 ./gpt_text --steps 20 --tensor 2          # Megatron tensor parallel
//   mpiexec.mpich -n 4 ./gpt_text --steps 20 --data 2 --tensor 2 # both
//
// The model: token and position embeddings, `--layers` pre-norm blocks (layer norm, causal multi-head
// attention, layer norm, GELU MLP of 4 x width, residuals; no biases, no norm gains), a final layer
// norm and the output layer tied to the token embedding; Adam. Every tensor's layout is its type:
// activations (S(0), B) — rows by the data axis, whole over the tensor axis; q, k, v and the MLP's
// hidden (S(0), S(1)); W_q, W_k, W_v, W_1 column-parallel (B, S(1)), W_o, W_2 and the embedding
// row-parallel (B, S(0)). The ops deduce the rest, and every communication is a boxing the types
// ask for: the P(sum) -> B allreduces of Megatron's row-parallel layers and of the input gradients,
// and the weight gradients, which come out P(sum) over the data axis, boxed to B (the data-parallel
// gradient allreduce). A layout that does not fit an op does not compile.
//
// With --data or --tensor above 1, rank 0 also trains the same model on a 1 x 1 mesh (the serial
// run) and prints both losses: they agree to float rounding (the splits add partial sums in another
// order); exit status 1 if the relative difference exceeds 1e-3 at any step. Alone (-n 1) the loss
// must fall. Both end by generating text from the trained weights (gathered to rank 0).
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/sbp/sbp.hpp>

namespace {

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

struct config {
  std::size_t vocab = 256, seq = 32, width = 64, heads = 4, layers = 2, batch = 16;
};

struct block {
  tensor<col_t> wq, wk, wv, w1;
  tensor<row_t> wo, w2;
};

struct model {
  tensor<row_t> embed;     // [vocab, width], also the output layer (tied)
  tensor<rep_t> position;  // [seq, width]
  std::vector<block> blocks;
};

/// Full weights in one fixed order (embedding, positions, then per block q, k, v, o, 1, 2).
struct full_weights {
  std::vector<std::vector<float>> w;
};

/// The initial weights: the same on every rank and in both runs.
full_weights initial_weights(const config& c, std::uint64_t seed) {
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

model make_model(const fs::placement<2>& mesh, const config& c, const full_weights& init) {
  std::size_t k = 0;
  auto next = [&]() -> const std::vector<float>& { return init.w[k++]; };
  const std::size_t d = c.width, h = 4 * c.width;
  model m{tensor<row_t>::from_full(mesh, {c.vocab, d}, next()), tensor<rep_t>::from_full(mesh, {c.seq, d}, next()), {}};
  for (std::size_t l = 0; l < c.layers; ++l) {
    auto wq = tensor<col_t>::from_full(mesh, {d, d}, next());
    auto wk = tensor<col_t>::from_full(mesh, {d, d}, next());
    auto wv = tensor<col_t>::from_full(mesh, {d, d}, next());
    auto wo = tensor<row_t>::from_full(mesh, {d, d}, next());
    auto w1 = tensor<col_t>::from_full(mesh, {d, h}, next());
    auto w2 = tensor<row_t>::from_full(mesh, {h, d}, next());
    m.blocks.push_back({std::move(wq), std::move(wk), std::move(wv), std::move(w1), std::move(wo), std::move(w2)});
  }
  return m;
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
block_forward_result block_forward(const block& b, tensor<act_t> x, const config& c) {
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

/// The gradients of one block's weights, laid out as the weights once boxed over the data axis, and
/// the gradient of its input.
struct block_grads {
  tensor<col_t> wq, wk, wv, w1;
  tensor<row_t> wo, w2;
  tensor<act_t> dx;
};

// [snippet:gpt_block_backward]
/// dy -> dx, and the weights' gradients: each comes out P(sum) over the data axis (every data rank
/// has its rows' share) and is boxed to the weight's layout — data parallelism's allreduce.
block_grads block_backward(const block& b, const block_cache& f, const tensor<act_t>& dy, const config& c) {
  auto dg = fs::matmul(dy, fs::transpose(b.w2));                  // (S0, S1)
  auto dw2 = fs::to<row_t>(fs::matmul(fs::transpose(f.g), dy));   // (P, S0) -> (B, S0)
  auto du = fs::gelu_grad(f.u, dg);                               // (S0, S1)
  auto dw1 = fs::to<col_t>(fs::matmul(fs::transpose(f.h2), du));  // (P, S1) -> (B, S1)
  auto dh2 = fs::to<act_t>(fs::matmul(du, fs::transpose(b.w1)));  // (S0, P) -> (S0, B)
  auto dx2 = fs::add(dy, fs::layer_norm_grad<1>(f.x2, dh2));      // residual
  auto da = fs::matmul(dx2, fs::transpose(b.wo));                 // (S0, S1)
  auto dwo = fs::to<row_t>(fs::matmul(fs::transpose(f.a), dx2));  // (P, S0) -> (B, S0)
  auto d = fs::causal_attention_grad(f.q, f.k, f.v, da, c.heads, c.seq);
  auto dh1 =
      fs::to<act_t>(fs::add(fs::add(fs::matmul(d.dq, fs::transpose(b.wq)), fs::matmul(d.dk, fs::transpose(b.wk))),
                            fs::matmul(d.dv, fs::transpose(b.wv))));  // three partial sums, one allreduce
  auto dx = fs::add(dx2, fs::layer_norm_grad<1>(f.x, dh1));
  auto h1t = fs::transpose(f.h1);
  return {fs::to<col_t>(fs::matmul(h1t, d.dq)),
          fs::to<col_t>(fs::matmul(h1t, d.dk)),
          fs::to<col_t>(fs::matmul(h1t, d.dv)),
          std::move(dw1),
          std::move(dwo),
          std::move(dw2),
          std::move(dx)};
}
// [/snippet:gpt_block_backward]

/// Adam on the shards (every data rank holds the same shard of a weight and of its gradient).
struct adam {
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
    if (slot == m.size()) {
      m.emplace_back(w.to_local().size(), 0.0f);
      v.emplace_back(w.to_local().size(), 0.0f);
    }
    std::vector<float>&ms = m[slot], &vs = v[slot];
    ++slot;
    const auto ws = w.to_local();
    const auto gs = g.to_local();
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

batch_ids make_batch(const std::string& text, const config& c, int step, std::uint64_t seed) {
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

/// The forward to the logits [rows, vocab] (S(0), B); fills the caches the backward needs.
struct forward_pass {
  std::vector<block_cache> blocks;
  std::vector<tensor<act_t>> hidden;  // x_L, the final norm's output
};

tensor<act_t> logits_of(const model& m, const config& c, const ids_t& tokens, const ids_t& positions,
                        forward_pass* keep) {
  // embedding(E (B, S0), ids (S0, B)) -> (S0, P): the vocabulary-parallel lookup, then its allreduce
  auto x = fs::add(fs::to<act_t>(fs::embedding(m.embed, tokens)), fs::embedding(m.position, positions));
  for (const block& b : m.blocks) {
    block_forward_result r = block_forward(b, std::move(x), c);
    if (keep != nullptr) keep->blocks.push_back(std::move(r.cache));
    x = std::move(r.y);
  }
  auto hf = fs::layer_norm<1>(x);
  auto logits = fs::to<act_t>(fs::matmul(hf, fs::transpose(m.embed)));  // (S0, S1) -> (S0, B): an allgather
  if (keep != nullptr) {
    keep->hidden.push_back(std::move(x));
    keep->hidden.push_back(std::move(hf));
  }
  return logits;
}

/// One training step on `mesh`: forward, loss, backward, Adam. Returns the batch's mean loss.
float train_step(model& m, adam& opt, const config& c, const fs::placement<2>& mesh, const batch_ids& batch) {
  const std::size_t rows = c.batch * c.seq;
  auto tokens = ids_t::from_full(mesh, {rows}, batch.tokens);
  auto targets = ids_t::from_full(mesh, {rows}, batch.targets);
  auto positions = ids_t::from_full(mesh, {rows}, batch.positions);
  forward_pass f;
  auto logits = logits_of(m, c, tokens, positions, &f);
  auto loss = fs::to<rep_t>(fs::reduce_sum<0>(fs::cross_entropy(logits, targets)));  // (P, B) -> B
  const float mean_loss = loss.to_local()[0] / static_cast<float>(rows);

  // [snippet:gpt_head_backward]
  auto dlogits = fs::to<head_t>(fs::cross_entropy_grad(logits, targets, 1.0 / double(rows)));  // B -> S(1): a slice
  auto dembed = fs::matmul(fs::transpose(dlogits), f.hidden[1]);  // (P, S0): the tied output layer
  auto dx = fs::layer_norm_grad<1>(f.hidden[0], fs::to<act_t>(fs::matmul(dlogits, m.embed)));
  // [/snippet:gpt_head_backward]
  std::vector<block_grads> grads;
  for (std::size_t l = m.blocks.size(); l-- > 0;) {
    grads.push_back(block_backward(m.blocks[l], f.blocks[l], dx, c));
    dx = std::move(grads.back().dx);
  }
  auto dE = fs::to<row_t>(fs::add(dembed, fs::embedding_grad(m.embed, tokens, dx)));  // (P, S0) -> (B, S0)
  auto dP = fs::to<rep_t>(fs::embedding_grad(m.position, positions, dx));             // (P, B) -> B

  opt.begin();
  opt.update(m.embed, dE);
  opt.update(m.position, dP);
  for (std::size_t l = 0; l < m.blocks.size(); ++l) {
    block& b = m.blocks[l];
    const block_grads& g = grads[m.blocks.size() - 1 - l];
    opt.update(b.wq, g.wq);
    opt.update(b.wk, g.wk);
    opt.update(b.wv, g.wv);
    opt.update(b.wo, g.wo);
    opt.update(b.w1, g.w1);
    opt.update(b.w2, g.w2);
  }
  return mean_loss;
}

/// The model's weights gathered whole (collective over the mesh), in initial_weights' order.
full_weights gather(const model& m) {
  full_weights all;
  all.w.push_back(m.embed.to_full());
  all.w.push_back(m.position.to_full());
  for (const block& b : m.blocks) {
    for (const auto* w : {&b.wq, &b.wk, &b.wv}) all.w.push_back(w->to_full());
    all.w.push_back(b.wo.to_full());
    all.w.push_back(b.w1.to_full());
    all.w.push_back(b.w2.to_full());
  }
  return all;
}

/// Text sampled from `m` (on a 1 x 1 mesh) after `prompt`, `count` bytes at temperature 0.8.
std::string generate(const model& m, const config& c, const fs::placement<2>& one, std::string prompt,
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
    const auto logits = logits_of(m, g, ids_t::from_full(one, {c.seq}, ids), pos, nullptr);
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

std::string printable(const std::string& s) {
  std::string out;
  for (char ch : s) out.push_back((ch == '\n' || (ch >= 32 && ch < 127)) ? ch : '?');
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a GPT trained on the fortunes corpus with data x tensor parallelism, against the 1-rank run"};
  config c;
  int steps = 20, data_ranks = 1, tensor_ranks = 1, report = 1;
  std::size_t sample_bytes = 200;
  float lr = 3e-3f;
  std::uint64_t seed = 7;
  std::string corpus = "/usr/share/games/fortunes/fortunes";
  app.add_option("--steps", steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--data", data_ranks, "data-parallel ranks (the batch's sequences split)")->check(CLI::PositiveNumber);
  app.add_option("--tensor", tensor_ranks, "tensor-parallel ranks (heads, MLP columns, vocabulary split)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", c.batch, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--seq", c.seq, "bytes per sequence")->check(CLI::Range(2, 4096));
  app.add_option("--width", c.width, "model width")->check(CLI::PositiveNumber);
  app.add_option("--heads", c.heads, "attention heads")->check(CLI::PositiveNumber);
  app.add_option("--layers", c.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "Adam's learning rate");
  app.add_option("--seed", seed, "seed of the weights and the batches");
  app.add_option("--report", report, "print the loss every this many steps")->check(CLI::PositiveNumber);
  app.add_option("--sample", sample_bytes, "bytes of text to generate at the end (0: none)");
  app.add_option("--corpus", corpus, "the text to train on (Debian: apt-get install fortunes-min)");
  CLI11_PARSE(app, argc, argv);

  MPI_Init(&argc, &argv);
  int status = 0;
  {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    const int rank = comm.rank();
    std::ifstream in(corpus, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto fail = [&](const std::string& why) {
      if (rank == 0) std::fprintf(stderr, "gpt_text: %s\n", why.c_str());
      status = 2;
    };
    if (text.size() < 4 * c.seq)
      fail("cannot read a corpus of at least 4 sequences at " + corpus + " (Debian: apt-get install fortunes-min)");
    else if (comm.size() != data_ranks * tensor_ranks)
      fail("run with --data x --tensor ranks (" + std::to_string(data_ranks * tensor_ranks) + "), not " +
           std::to_string(comm.size()));
    else if (c.batch % static_cast<std::size_t>(data_ranks) != 0)
      fail("--batch must be a multiple of --data (whole sequences per data rank)");
    else if (c.width % c.heads != 0 || c.heads % static_cast<std::size_t>(tensor_ranks) != 0 ||
             c.vocab % static_cast<std::size_t>(tensor_ranks) != 0)
      fail("--heads must divide --width, and --tensor must divide --heads and the 256 byte values");
    if (status == 0) {
      const full_weights init = initial_weights(c, seed);
      const bool parallel = comm.size() > 1;
      fs::placement<2> one(comm, std::array<int, 2>{1, 1}, std::vector<int>{0});  // the serial run's mesh
      std::vector<float> serial_losses, parallel_losses;
      full_weights trained = init;
      if (one.contains_me()) {
        model m = make_model(one, c, init);
        adam opt;
        opt.lr = lr;
        for (int step = 0; step < steps; ++step)
          serial_losses.push_back(train_step(m, opt, c, one, make_batch(text, c, step, seed)));
        trained = gather(m);
      }
      if (parallel) {
        // [snippet:gpt_mesh]
        fs::placement<2> mesh(comm, std::array<int, 2>{data_ranks, tensor_ranks});  // (data, tensor)
        model m = make_model(mesh, c, init);
        adam opt;
        opt.lr = lr;
        for (int step = 0; step < steps; ++step)
          parallel_losses.push_back(train_step(m, opt, c, mesh, make_batch(text, c, step, seed)));
        // [/snippet:gpt_mesh]
        trained = gather(m);  // generate from the parallel run's weights
      }
      if (rank == 0) {
        double worst = 0;
        for (int s = 0; s < steps; ++s) {
          const float a = serial_losses[static_cast<std::size_t>(s)];
          if (parallel) {
            const float b = parallel_losses[static_cast<std::size_t>(s)];
            worst = std::max(worst, std::fabs(double(a) - b) / std::max(1e-12, std::fabs(double(a))));
            if (s % report == 0 || s + 1 == steps)
              std::printf("step %4d  serial loss %.6f  parallel loss %.6f\n", s, double(a), double(b));
          } else if (s % report == 0 || s + 1 == steps) {
            std::printf("step %4d  loss %.6f\n", s, double(a));
          }
        }
        if (parallel) {
          const bool match = worst < 1e-3;
          std::printf(
              "gpt (%zu layers, width %zu, %zu heads) on a %d x %d (data x tensor) mesh vs serial: max "
              "relative loss difference %.3g -> %s\n",
              c.layers, c.width, c.heads, data_ranks, tensor_ranks, worst,
              match ? "match to float rounding" : "MISMATCH");
          if (!match) status = 1;
        } else if (steps > 1) {
          const bool fell = serial_losses.back() < serial_losses.front();
          std::printf("loss %s: %.4f at step 0, %.4f at step %d (uniform over 256 bytes: %.4f)\n",
                      fell ? "fell" : "DID NOT FALL", double(serial_losses.front()), double(serial_losses.back()),
                      steps - 1, std::log(256.0));
          if (!fell) status = 1;
        }
        if (sample_bytes > 0) {
          model m = make_model(one, c, trained);
          const std::string prompt = text.substr(0, c.seq);
          std::printf("--- generated after \"%s\":\n%s\n---\n", printable(prompt).c_str(),
                      printable(generate(m, c, one, prompt, sample_bytes, seed)).c_str());
        }
      }
    }
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return status;
}
