// Serial references of the relaxations: all p replicas simulated in one thread, the same rule as the
// algorithm's header, written out without communication. Inputs are small integers (exact sums).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <flexpar/collective/context.hpp>
#include <flexpar/compress/minmax_uint8.hpp>
#include <flexpar/relax/relaxation.hpp>
#include <flexpar/relax/decentralized.hpp>
#include <flexpar/relax/onebit_adam.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/relax/qadam.hpp>

namespace flexpar::testing_support {

/// Lengths of the test model: odd, empty (in the middle), one, more than one chunk.
inline const std::vector<std::size_t>& model_lengths() {
  static const std::vector<std::size_t> lengths{7, 0, 1, 1000};
  return lengths;
}

inline std::size_t model_size() {
  std::size_t n = 0;
  for (std::size_t l : model_lengths()) n += l;
  return n;
}

/// Gradient of element i of parameter `param` on `rank` at `step`: a small integer in [-4, 4].
inline float grad_value(int rank, int step, std::size_t param, std::size_t i) {
  return static_cast<float>(static_cast<int>((static_cast<std::size_t>(rank) * 7 + static_cast<std::size_t>(step) * 3 +
                                              param * 5 + i * 11 + i * i % 13) %
                                             9) -
                            4);
}

/// Initial weight (different on every rank: start() must broadcast rank 0's).
inline float init_weight(int rank, std::size_t param, std::size_t i) {
  return static_cast<float>(static_cast<int>((static_cast<std::size_t>(rank) * 13 + param * 3 + i) % 11) - 5);
}

using flat = std::vector<float>;

inline flat flat_init(int rank) {
  flat w;
  for (std::size_t k = 0; k < model_lengths().size(); ++k)
    for (std::size_t i = 0; i < model_lengths()[k]; ++i) w.push_back(init_weight(rank, k, i));
  return w;
}

inline flat flat_grad(int rank, int step) {
  flat g;
  for (std::size_t k = 0; k < model_lengths().size(); ++k)
    for (std::size_t i = 0; i < model_lengths()[k]; ++i) g.push_back(grad_value(rank, step, k, i));
  return g;
}

/// opt.apply on every parameter's slice of the flat weights and gradients.
inline void apply_all(relax::optimizer& opt, flat& w, const flat& g) {
  std::size_t offset = 0;
  for (std::size_t k = 0; k < model_lengths().size(); ++k) {
    const std::size_t n = model_lengths()[k];
    opt.apply(k, std::span<float>(w).subspan(offset, n), std::span<const float>(g).subspan(offset, n));
    offset += n;
  }
}

/// The SGD every algorithm test uses.
inline relax::sgd test_sgd() { return relax::sgd({.learning_rate = 0.25f, .momentum = 0.5f, .weight_decay = 0.0f}); }

/// History of a serial run: weights[s][r] = rank r's flat weights after step s (s = steps: after finish).
using history = std::vector<std::vector<flat>>;

/// Sum over ranks in rank order, then / p (the rule of the exact averages).
inline flat average(const std::vector<flat>& xs) {
  flat sum = xs[0];
  for (std::size_t r = 1; r < xs.size(); ++r)
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += xs[r][i];
  const auto p = static_cast<float>(xs.size());
  for (float& v : sum) v = v / p;
  return sum;
}

/// gradient_allreduce: exact average of the gradients, then the same SGD on every rank.
inline history reference_gradient_allreduce(int p, int steps) {
  history h;
  std::vector<flat> w(static_cast<std::size_t>(p), flat_init(0));
  std::vector<relax::sgd> opts(static_cast<std::size_t>(p), test_sgd());
  for (int s = 0; s < steps; ++s) {
    std::vector<flat> g;
    for (int r = 0; r < p; ++r) g.push_back(flat_grad(r, s));
    const flat avg = average(g);
    for (int r = 0; r < p; ++r) apply_all(opts[static_cast<std::size_t>(r)], w[static_cast<std::size_t>(r)], avg);
    h.push_back(w);
  }
  h.push_back(w);
  return h;
}

/// decode(encode(x)) with min-max uint8 chunks of `chunk`.
inline flat quantize(std::span<const float> x, std::size_t chunk) {
  compress::minmax_uint8 q{chunk};
  std::vector<std::byte> bytes(q.encoded_size(x.size()));
  q.encode(x, bytes);
  flat y(x.size());
  q.decode(bytes, y);
  return y;
}

/// bytegrad: per partition j (block_layout::even), the average of the quantized partitions,
/// quantized again.
inline history reference_bytegrad(int p, int steps, std::size_t chunk) {
  history h;
  const std::size_t n = model_size();
  std::vector<flat> w(static_cast<std::size_t>(p), flat_init(0));
  std::vector<relax::sgd> opts(static_cast<std::size_t>(p), test_sgd());
  const block_layout parts = block_layout::even(n, p);
  for (int s = 0; s < steps; ++s) {
    flat avg(n);
    for (int j = 0; j < p; ++j) {
      std::vector<flat> versions;
      for (int r = 0; r < p; ++r) {
        const flat g = flat_grad(r, s);
        versions.push_back(quantize(parts.of(std::span<const float>(g), j), chunk));
      }
      const flat reduced = quantize(average(versions), chunk);
      std::copy(reduced.begin(), reduced.end(), avg.begin() + static_cast<std::ptrdiff_t>(parts.displ(j)));
    }
    for (int r = 0; r < p; ++r) apply_all(opts[static_cast<std::size_t>(r)], w[static_cast<std::size_t>(r)], avg);
    h.push_back(w);
  }
  h.push_back(w);
  return h;
}

/// decentralized (shift_one or ring; `all` and finish are averages checked with a tolerance): local
/// SGD, then every `interval` steps the peer average of the header.
inline history reference_decentralized(int p, int steps, relax::peer_selection peers, int interval) {
  history h;
  std::vector<flat> w(static_cast<std::size_t>(p), flat_init(0));
  std::vector<relax::sgd> opts(static_cast<std::size_t>(p), test_sgd());
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < p; ++r)
      apply_all(opts[static_cast<std::size_t>(r)], w[static_cast<std::size_t>(r)], flat_grad(r, s));
    if ((s + 1) % interval == 0 && p > 1) {
      const auto round = static_cast<std::uint64_t>((s + 1) / interval - 1);
      std::vector<flat> next = w;
      for (int r = 0; r < p; ++r) {
        std::vector<int> with;
        if (peers == relax::peer_selection::shift_one) {
          const int q = relax::shift_one_peer(r, p, round);
          if (q >= 0) with.push_back(q);
        } else if (peers == relax::peer_selection::ring) {
          with.push_back((r + p - 1) % p);
          if (p > 2) with.push_back((r + 1) % p);
        } else {
          for (int q = 0; q < p; ++q)
            if (q != r) with.push_back(q);
        }
        if (with.empty()) continue;
        flat& x = next[static_cast<std::size_t>(r)];
        for (std::size_t i = 0; i < x.size(); ++i) {
          float sum = w[static_cast<std::size_t>(r)][i];
          for (int q : with) sum += w[static_cast<std::size_t>(q)][i];
          x[i] = sum / static_cast<float>(with.size() + 1);
        }
      }
      w = next;
    }
    h.push_back(w);
  }
  if (p > 1) {
    const flat avg = average(w);
    for (auto& x : w) x = avg;
  }
  h.push_back(w);
  return h;
}

/// local_sgd: local SGD, every `interval` steps (and at finish if steps remain) the average.
inline history reference_local_sgd(int p, int steps, int interval) {
  history h;
  std::vector<flat> w(static_cast<std::size_t>(p), flat_init(0));
  std::vector<relax::sgd> opts(static_cast<std::size_t>(p), test_sgd());
  int since = 0;
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < p; ++r)
      apply_all(opts[static_cast<std::size_t>(r)], w[static_cast<std::size_t>(r)], flat_grad(r, s));
    if (++since == interval) {
      since = 0;
      const flat avg = average(w);
      for (auto& x : w) x = avg;
    }
    h.push_back(w);
  }
  if (since > 0) {
    const flat avg = average(w);
    for (auto& x : w) x = avg;
  }
  h.push_back(w);
  return h;
}

/// low_precision_decentralized: ring averaging with the neighbours' last-sent replicas, SGD, then the
/// quantized difference against my last-sent replica (the header's steps 1-5; a rank's replica of a
/// neighbour is that neighbour's last-sent replica, which the test checks separately).
inline history reference_low_precision_decentralized(int p, int steps, int interval, std::size_t chunk) {
  history h;
  std::vector<flat> w(static_cast<std::size_t>(p), flat_init(0)), sent = w;
  std::vector<relax::sgd> opts(static_cast<std::size_t>(p), test_sgd());
  for (int s = 0; s < steps; ++s) {
    const bool communicate = (s + 1) % interval == 0 && p > 1;
    std::vector<flat> next_sent = sent;
    for (int r = 0; r < p; ++r) {
      flat& x = w[static_cast<std::size_t>(r)];
      if (communicate) {
        std::vector<int> with{(r + p - 1) % p};
        if (p > 2) with.push_back((r + 1) % p);
        for (std::size_t i = 0; i < x.size(); ++i) {
          float sum = x[i];
          for (int q : with) sum += sent[static_cast<std::size_t>(q)][i];
          x[i] = sum / static_cast<float>(with.size() + 1);
        }
      }
      apply_all(opts[static_cast<std::size_t>(r)], x, flat_grad(r, s));
      if (!communicate) continue;
      const flat& mine = sent[static_cast<std::size_t>(r)];
      flat z(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) z[i] = x[i] - mine[i];
      const flat qz = quantize(z, chunk);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = mine[i] + qz[i];
      next_sent[static_cast<std::size_t>(r)] = x;
    }
    sent = next_sent;
    h.push_back(w);
  }
  if (p > 1) {
    const flat avg = average(w);
    for (auto& x : w) x = avg;
  }
  h.push_back(w);
  return h;
}

/// The onebit_adam / qadam rule (momentum_adam.hpp) with a serial compressed average: `codecs[r]` is
/// rank r's codec, prepared like the algorithm's; the average follows compressed_average.hpp.
template <class Codec>
history reference_momentum_adam(int p, int steps, int warmup, const relax::adam_options& a, std::vector<Codec> codecs) {
  history h;
  const std::size_t n = model_size();
  const auto pp = static_cast<std::size_t>(p);
  const block_layout parts = block_layout::even(n, p);
  for (int r = 0; r < p; ++r) codecs[static_cast<std::size_t>(r)].prepare(parts, r);
  flat x = flat_init(0), v(n, 0.0f);
  std::vector<flat> m(pp, flat(n, 0.0f));  // momenta differ between ranks before their average
  for (int s = 0; s < steps; ++s) {
    const auto t = static_cast<double>(s + 1);
    const auto c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(a.beta1), t));
    if (s + 1 <= warmup) {
      std::vector<flat> g;
      for (int r = 0; r < p; ++r) g.push_back(flat_grad(r, s));
      const flat avg = average(g);
      const auto c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(a.beta2), t));
      flat& mm = m[0];
      for (std::size_t i = 0; i < n; ++i) {
        const float gi = avg[i];
        mm[i] = a.beta1 * mm[i] + (1.0f - a.beta1) * gi;
        v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
        x[i] -= a.learning_rate * (mm[i] / c1) / (std::sqrt(v[i] / c2) + a.epsilon);
      }
      for (std::size_t r = 1; r < pp; ++r) m[r] = mm;
      if (s + 1 == warmup)
        for (float& vi : v) vi = vi / c2;
    } else {
      for (int r = 0; r < p; ++r) {
        const flat g = flat_grad(r, s);
        flat& mm = m[static_cast<std::size_t>(r)];
        for (std::size_t i = 0; i < n; ++i) mm[i] = a.beta1 * mm[i] + (1.0f - a.beta1) * g[i];
      }
      flat avg(n);
      for (int j = 0; j < p; ++j) {  // partition j, owned by rank j
        const std::size_t count = parts.count(j);
        std::vector<flat> versions;
        for (int r = 0; r < p; ++r) {
          Codec& c = codecs[static_cast<std::size_t>(r)];
          std::vector<std::byte> bytes(c.encoded_size(count));
          c.encode(j, parts.of(std::span<const float>(m[static_cast<std::size_t>(r)]), j), bytes);
          flat y(count);
          c.decode(bytes, y);
          versions.push_back(y);
        }
        const flat reduced = average(versions);
        Codec& owner = codecs[static_cast<std::size_t>(j)];
        std::vector<std::byte> bytes(owner.encoded_size(count));
        owner.encode_reduced(reduced, bytes);
        owner.decode(bytes, parts.of(std::span<float>(avg), j));
      }
      for (auto& mm : m) mm = avg;
      for (std::size_t i = 0; i < n; ++i) x[i] -= a.learning_rate * (avg[i] / c1) / (std::sqrt(v[i]) + a.epsilon);
    }
    h.push_back(std::vector<flat>(pp, x));
  }
  h.push_back(std::vector<flat>(pp, x));
  return h;
}

}  // namespace flexpar::testing_support
