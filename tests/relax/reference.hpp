// Serial references of the relaxations: all p replicas simulated in one thread, the same rule as the
// algorithm's header, written out without communication. Inputs are small integers (exact sums).
// Nothing here calls the code under test: the SGD rule (relax/optimizer.hpp), the min-max uint8 and
// 1-bit codecs (compress/), the compressed average's partitions and codecs (relax/compressed_average.hpp,
// bytegrad.hpp, onebit_adam.hpp) and shift_one's pairing (relax/decentralized.hpp) are written out
// below from what those headers document, so that a wrong codec, wrapper or optimizer fails.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <flexpar/collective/context.hpp>
#include <flexpar/compress/minmax_uint8.hpp>
#include <flexpar/relax/decentralized.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/relax/relaxation.hpp>

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

/// The settings of the SGD every algorithm test uses.
inline constexpr float test_learning_rate = 0.25f, test_momentum = 0.5f;

/// The SGD the algorithms under test are given.
inline relax::sgd test_sgd() {
  return relax::sgd({.learning_rate = test_learning_rate, .momentum = test_momentum, .weight_decay = 0.0f});
}

/// The reference's SGD: relax/optimizer.hpp's rule with momentum and no weight decay, written out
/// (b = momentum b + g; w -= learning_rate b), one momentum buffer per parameter index.
struct reference_sgd {
  std::vector<flat> buffers;
  void apply(std::size_t k, std::span<float> w, std::span<const float> g) {
    if (buffers.size() <= k) buffers.resize(k + 1);
    flat& b = buffers[k];
    if (b.size() != w.size()) b.assign(w.size(), 0.0f);
    for (std::size_t i = 0; i < w.size(); ++i) {
      b[i] = test_momentum * b[i] + g[i];
      w[i] -= test_learning_rate * b[i];
    }
  }
};

/// opt.apply on every parameter's slice of the flat weights and gradients.
inline void apply_all(reference_sgd& opt, flat& w, const flat& g) {
  std::size_t offset = 0;
  for (std::size_t k = 0; k < model_lengths().size(); ++k) {
    const std::size_t n = model_lengths()[k];
    opt.apply(k, std::span<float>(w).subspan(offset, n), std::span<const float>(g).subspan(offset, n));
    offset += n;
  }
}

/// Partition j of n floats over p ranks (relax/compressed_average.hpp: sizes differ by at most one,
/// the first n mod p partitions have the extra element): {offset, count}.
inline std::pair<std::size_t, std::size_t> partition(std::size_t n, int p, int j) {
  const auto pp = static_cast<std::size_t>(p), jj = static_cast<std::size_t>(j);
  const std::size_t base = n / pp, extra = n % pp;
  return {jj * base + std::min(jj, extra), base + (jj < extra ? 1 : 0)};
}

/// shift_one's peer of `rank` in `round` by the circle method of round-robin tournaments
/// (relax/decentralized.hpp's header), built as a table of pairs: slots 0 .. m (m = p - 1 for even p;
/// for odd p one more, empty slot m = p); in round t slot m meets t mod m and, for k = 1, 2, ...,
/// slot (t + k) mod m meets (t - k) mod m. -1 when the partner is the empty slot (or p = 1).
inline int reference_shift_one_peer(int rank, int p, std::uint64_t round) {
  if (p <= 1) return -1;
  const int slots = p % 2 == 0 ? p : p + 1, m = slots - 1;
  const int t = static_cast<int>(round % static_cast<std::uint64_t>(m));
  std::vector<int> partner(static_cast<std::size_t>(slots), -1);
  auto pair = [&](int a, int b) {
    partner[static_cast<std::size_t>(a)] = b;
    partner[static_cast<std::size_t>(b)] = a;
  };
  pair(m, t);
  for (int k = 1; k <= (m - 1) / 2; ++k) pair((t + k) % m, ((t - k) % m + m) % m);
  const int q = partner[static_cast<std::size_t>(rank)];
  return q >= p ? -1 : q;
}

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
  std::vector<reference_sgd> opts(static_cast<std::size_t>(p));
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

/// decode(encode(x)) with min-max uint8 chunks of `chunk`, by compress/minmax_uint8.hpp's rule written
/// out: per chunk lo = min, hi = max, s = 255 / (hi - lo) (0 for a constant chunk),
/// q = floor((x - lo) s + 1/2), decoded lo + q (hi - lo) / 255, every step in float.
inline flat quantize(std::span<const float> x, std::size_t chunk) {
  flat y(x.size());
  for (std::size_t begin = 0; begin < x.size(); begin += chunk) {
    const std::size_t end = std::min(x.size(), begin + chunk);
    const auto [lo_at, hi_at] = std::minmax_element(x.begin() + static_cast<std::ptrdiff_t>(begin),
                                                    x.begin() + static_cast<std::ptrdiff_t>(end));
    const float lo = *lo_at, hi = *hi_at;
    const float scale = hi > lo ? 255.0f / (hi - lo) : 0.0f, step = (hi - lo) / 255.0f;
    for (std::size_t i = begin; i < end; ++i) {
      const float q = std::floor((x[i] - lo) * scale + 0.5f);
      y[i] = lo + q * step;
    }
  }
  return y;
}

/// decode(encode(x)) of compress/onebit.hpp with error feedback, its rule written out: v = x + residual;
/// per chunk, scale = mean |v| (the sum as onebit.hpp's header specifies it: in float, in 8 lanes, element
/// i of the chunk's first 8 floor(n / 8) in lane i mod 8 and the rest in lane 0, the lanes added in
/// double, divided by n in double, rounded to float); out = -scale where v < 0, else +scale; the
/// residual keeps v - out.
inline flat onebit_round_trip(std::span<const float> x, flat& residual, std::size_t chunk) {
  flat out(x.size());
  for (std::size_t begin = 0; begin < x.size(); begin += chunk) {
    const std::size_t n = std::min(chunk, x.size() - begin);
    float lanes[8] = {};
    for (std::size_t i = 0; i < n; ++i) {
      float& v = residual[begin + i];
      v += x[begin + i];
      lanes[i < n / 8 * 8 ? i % 8 : 0] += std::abs(v);
    }
    double total = 0;
    for (float lane : lanes) total += lane;
    const auto scale = static_cast<float>(total / static_cast<double>(n));
    for (std::size_t i = 0; i < n; ++i) {
      float& v = residual[begin + i];
      out[begin + i] = v < 0 ? -scale : scale;
      v -= out[begin + i];
    }
  }
  return out;
}

/// bytegrad: per partition j (block_layout::even), the average of the quantized partitions,
/// quantized again.
inline history reference_bytegrad(int p, int steps, std::size_t chunk) {
  history h;
  const std::size_t n = model_size();
  std::vector<flat> w(static_cast<std::size_t>(p), flat_init(0));
  std::vector<reference_sgd> opts(static_cast<std::size_t>(p));
  for (int s = 0; s < steps; ++s) {
    flat avg(n);
    for (int j = 0; j < p; ++j) {
      const auto [offset, count] = partition(n, p, j);
      std::vector<flat> versions;
      for (int r = 0; r < p; ++r) {
        const flat g = flat_grad(r, s);
        versions.push_back(quantize(std::span<const float>(g).subspan(offset, count), chunk));
      }
      const flat reduced = quantize(average(versions), chunk);
      std::copy(reduced.begin(), reduced.end(), avg.begin() + static_cast<std::ptrdiff_t>(offset));
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
  std::vector<reference_sgd> opts(static_cast<std::size_t>(p));
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < p; ++r)
      apply_all(opts[static_cast<std::size_t>(r)], w[static_cast<std::size_t>(r)], flat_grad(r, s));
    if ((s + 1) % interval == 0 && p > 1) {
      const auto round = static_cast<std::uint64_t>((s + 1) / interval - 1);
      std::vector<flat> next = w;
      for (int r = 0; r < p; ++r) {
        std::vector<int> with;
        if (peers == relax::peer_selection::shift_one) {
          const int q = reference_shift_one_peer(r, p, round);
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
  std::vector<reference_sgd> opts(static_cast<std::size_t>(p));
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
  std::vector<reference_sgd> opts(static_cast<std::size_t>(p));
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

/// The compressed momentum of onebit_adam or qadam (relax/momentum_adam.hpp's compression stage).
enum class momentum_codec { onebit, minmax };

/// The onebit_adam / qadam rule (momentum_adam.hpp) with the serial compressed average of
/// compressed_average.hpp: every rank's partition j goes through the codec (1-bit: with rank r's
/// residual of partition j), the p versions are summed in rank order and divided by p, and the owner
/// j sends the result through the codec again (1-bit: with its own, server-side residual).
inline history reference_momentum_adam(int p, int steps, int warmup, const relax::adam_options& a, momentum_codec codec,
                                       std::size_t chunk) {
  history h;
  const std::size_t n = model_size();
  const auto pp = static_cast<std::size_t>(p);
  std::vector<std::vector<flat>> worker_residual(pp);  // [rank][partition]
  std::vector<flat> server_residual;                   // [partition], kept by its owner
  for (int j = 0; j < p; ++j) {
    const std::size_t count = partition(n, p, j).second;
    for (auto& mine : worker_residual) mine.emplace_back(count, 0.0f);
    server_residual.emplace_back(count, 0.0f);
  }
  auto round_trip = [&](std::span<const float> x, flat& residual) {
    return codec == momentum_codec::onebit ? onebit_round_trip(x, residual, chunk) : quantize(x, chunk);
  };
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
        const auto [offset, count] = partition(n, p, j);
        const auto part = static_cast<std::size_t>(j);
        std::vector<flat> versions;
        for (std::size_t r = 0; r < pp; ++r)
          versions.push_back(round_trip(std::span<const float>(m[r]).subspan(offset, count), worker_residual[r][part]));
        const flat reduced = round_trip(average(versions), server_residual[part]);
        std::copy(reduced.begin(), reduced.end(), avg.begin() + static_cast<std::ptrdiff_t>(offset));
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
