// Scenarios of the relaxation tests, written against a communicator so that the in-process tests
// (threads as ranks) and the mpiexec tests run the same code. Each scenario runs an algorithm on
// this rank and compares its weights after every step (and after finish) with the serial reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/relax/async_model_average.hpp>
#include <flexpar/relax/bytegrad.hpp>
#include <flexpar/relax/gradient_allreduce.hpp>
#include <flexpar/relax/low_precision_decentralized.hpp>
#include <flexpar/relax/onebit_adam.hpp>
#include <flexpar/relax/registry.hpp>

#include "reference.hpp"

namespace flexpar::testing_support {

/// This rank's model: the test lengths, rank-specific initial weights, gradients set per step.
struct rank_model {
  std::vector<std::vector<float>> w, g;
  std::vector<float> one_buffer;  // `one_gradient_buffer`: every gradient, back to back
  std::vector<relax::parameter> params;

  /// `one_gradient_buffer`: the gradients are views of one flat buffer, in the parameters' order (the
  /// relaxations reduce it in place), instead of a buffer each.
  explicit rank_model(int rank, bool one_gradient_buffer = false) {
    const auto& lengths = model_lengths();
    w.resize(lengths.size());
    g.resize(lengths.size());
    std::size_t total = 0;
    for (std::size_t k = 0; k < lengths.size(); ++k) {
      for (std::size_t i = 0; i < lengths[k]; ++i) w[k].push_back(init_weight(rank, k, i));
      g[k].assign(lengths[k], 0.0f);
      total += lengths[k];
    }
    if (one_gradient_buffer) one_buffer.assign(total, 0.0f);
    std::size_t at = 0;
    for (std::size_t k = 0; k < lengths.size(); ++k) {
      const std::span<float> grad =
          one_gradient_buffer ? std::span<float>(one_buffer).subspan(at, lengths[k]) : std::span<float>(g[k]);
      params.push_back({std::string("p").append(std::to_string(k)), std::span<float>(w[k]), grad});
      at += lengths[k];
    }
  }
  void set_gradients(int rank, int step) {
    for (std::size_t k = 0; k < params.size(); ++k)
      for (std::size_t i = 0; i < params[k].gradient.size(); ++i) params[k].gradient[i] = grad_value(rank, step, k, i);
  }
  [[nodiscard]] flat weights() const {
    flat out;
    for (const auto& x : w) out.insert(out.end(), x.begin(), x.end());
    return out;
  }
};

/// Relative tolerance of the comparison after step s (steps = after finish); 0 = bitwise.
using tolerance_fn = std::function<float(int s)>;

inline void expect_close(const flat& got, const flat& want, float tol, const communicator& comm,
                         const std::string& what, int s) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool ok =
        tol == 0.0f ? got[i] == want[i] : std::abs(got[i] - want[i]) <= tol * std::max(1.0f, std::abs(want[i]));
    if (!ok) {
      ADD_FAILURE() << "[rank " << comm.rank() << " of " << comm.size() << "] " << what << " after "
                    << (s < 0 ? std::string("finish") : "step " + std::to_string(s)) << ": weight " << i << " is "
                    << got[i] << ", the serial reference " << want[i] << " (tolerance " << tol << ")";
      return;
    }
  }
}

/// Runs `algo` for `steps` steps and compares with `ref` (reference.hpp) after each; `after_step(s,
/// model)` may check more (collectively) after step s.
inline void run_against_reference(communicator& comm, relax::relaxation& algo, int steps, const history& ref,
                                  const tolerance_fn& tol, const std::string& what,
                                  const std::function<void(int, const rank_model&)>& after_step = {},
                                  bool one_gradient_buffer = false) {
  rank_model m(comm.rank(), one_gradient_buffer);
  relax::sgd opt = test_sgd();
  algo.start(m.params);
  const auto me = static_cast<std::size_t>(comm.rank());
  for (int s = 0; s < steps; ++s) {
    m.set_gradients(comm.rank(), s);
    algo.step(m.params, opt);
    expect_close(m.weights(), ref[static_cast<std::size_t>(s)][me], tol(s), comm, what, s);
    if (after_step) after_step(s, m);
  }
  algo.finish(m.params);
  expect_close(m.weights(), ref[static_cast<std::size_t>(steps)][me], tol(steps), comm, what, -1);
  EXPECT_EQ(algo.traffic_so_far().steps, static_cast<std::uint64_t>(steps));
}

/// The same through the registry: make(name, comm, o).
inline void run_against_reference(communicator& comm, const std::string& name, const relax::options& o, int steps,
                                  const history& ref, const tolerance_fn& tol, const std::string& what) {
  auto algo = relax::make(name, comm, o);
  EXPECT_EQ(algo->name(), name);
  run_against_reference(comm, *algo, steps, ref, tol, what);
}

/// Every rank's `mine` (same length everywhere), rank after rank.
inline flat gather_all(communicator& comm, std::span<const float> mine) {
  flat all(mine.size() * static_cast<std::size_t>(comm.size()));
  flexpar::allgather(comm, mine, std::span<float>(all));
  return all;
}

/// low_precision_decentralized against its reference, and its invariant after every step: my replica
/// of neighbour j is bitwise rank j's last-sent replica; after a communicating step my weights are my
/// last-sent replica.
inline void low_precision_decentralized_matches_reference(communicator& comm, int interval, std::size_t chunk) {
  const int steps = 7;
  relax::low_precision_decentralized algo(comm, interval, chunk);
  const std::string what =
      "low_precision_decentralized interval " + std::to_string(interval) + " chunk " + std::to_string(chunk);
  tolerance_fn tol = [&](int s) { return s == steps && comm.size() > 1 ? 1e-5f : 0.0f; };
  auto invariant = [&](int s, const rank_model& m) {
    const flat sent(algo.sent_replica().begin(), algo.sent_replica().end());
    const flat all = gather_all(comm, sent);
    const std::size_t n = sent.size();
    EXPECT_EQ(algo.neighbours().size(), static_cast<std::size_t>(std::min(comm.size() - 1, 2)));
    for (std::size_t j = 0; j < algo.neighbours().size(); ++j) {
      const auto theirs = static_cast<std::size_t>(algo.neighbours()[j]);
      const flat want(all.begin() + static_cast<std::ptrdiff_t>(theirs * n),
                      all.begin() + static_cast<std::ptrdiff_t>((theirs + 1) * n));
      const flat got(algo.replica(j).begin(), algo.replica(j).end());
      expect_close(got, want, 0.0f, comm, what + ": replica of rank " + std::to_string(theirs), s);
    }
    if ((s + 1) % interval == 0 && comm.size() > 1)
      expect_close(m.weights(), sent, 0.0f, comm, what + ": x == sent", s);
  };
  run_against_reference(comm, algo, steps, reference_low_precision_decentralized(comm.size(), steps, interval, chunk),
                        tol, what, invariant);
}

inline float exact(int) { return 0.0f; }

inline void gradient_allreduce_matches_reference(communicator& comm, bool hierarchical) {
  const int steps = 5;
  run_against_reference(comm, "gradient_allreduce", {.hierarchical = hierarchical}, steps,
                        reference_gradient_allreduce(comm.size(), steps), exact,
                        hierarchical ? "gradient_allreduce(hierarchical)" : "gradient_allreduce");
  // gradients in one flat buffer, reduced where they lie (no gather, no scatter): the same weights
  relax::gradient_allreduce in_place(comm, hierarchical);
  run_against_reference(comm, in_place, steps, reference_gradient_allreduce(comm.size(), steps), exact,
                        "gradient_allreduce over one gradient buffer", {}, true);
}

inline void bytegrad_matches_reference(communicator& comm, std::size_t chunk) {
  const int steps = 4;
  relax::options o;
  o.chunk = chunk;
  run_against_reference(comm, "bytegrad", o, steps, reference_bytegrad(comm.size(), steps, chunk), exact,
                        "bytegrad chunk " + std::to_string(chunk));
}

inline void decentralized_matches_reference(communicator& comm, const std::string& peers, int interval) {
  const int steps = 7;
  relax::options o;
  o.peers = peers;
  o.interval = interval;
  const relax::peer_selection sel = relax::peer_selection_of(peers);
  // Peer averages are computed in a fixed order: bitwise. `all` and finish() go through allreduce,
  // whose summation order differs from the reference's rank order: a tolerance.
  tolerance_fn tol = [&](int s) {
    return (s == steps && comm.size() > 1) || sel == relax::peer_selection::all ? 1e-5f : 0.0f;
  };
  run_against_reference(comm, "decentralized", o, steps, reference_decentralized(comm.size(), steps, sel, interval),
                        tol, "decentralized " + peers + " interval " + std::to_string(interval));
}

inline void local_sgd_matches_reference(communicator& comm, int interval) {
  const int steps = 7;
  relax::options o;
  o.interval = interval;
  // Bitwise until the first average (allreduce's summation order differs from rank order).
  tolerance_fn tol = [&](int s) { return s + 1 < interval || comm.size() == 1 ? 0.0f : 1e-5f; };
  run_against_reference(comm, "local_sgd", o, steps, reference_local_sgd(comm.size(), steps, interval), tol,
                        "local_sgd interval " + std::to_string(interval));
}

/// The bytes counted by traffic_so_far() follow the documented formulas, written out here
/// (doc/relaxations.md, relax/compressed_average.hpp): decentralized shift_one M per exchange, and the
/// rank whose partner is the empty slot (odd p) sends nothing in its round; gradient_allreduce the
/// ring's 2 (p - 1) / p M in whole bytes per step; bytegrad the alltoall of p - 1 partitions padded to the widest
/// encoding B plus a ring allgather of every encoded partition but my right neighbour's, E(k) = k + 8 ceil(k / c).
inline void traffic_follows_the_formulas(communicator& comm) {
  const int p = comm.size(), steps = 3;
  const std::uint64_t model_bytes = model_size() * sizeof(float);  // the test model: 1008 floats
  {
    rank_model m(comm.rank());
    relax::sgd opt = test_sgd();
    auto algo = relax::make("decentralized", comm, {.interval = 1, .peers = "shift_one"});
    algo->start(m.params);
    std::uint64_t expected = 0, exchanges = 0;
    for (int s = 0; s < steps; ++s) {
      m.set_gradients(comm.rank(), s);
      algo->step(m.params, opt);
      if (reference_shift_one_peer(comm.rank(), p, static_cast<std::uint64_t>(s)) >= 0) {
        expected += model_bytes;
        ++exchanges;
      }
      EXPECT_EQ(algo->traffic_so_far().bytes_sent, expected) << "[rank " << comm.rank() << "] step " << s;
    }
    EXPECT_EQ(algo->traffic_so_far().exchanges, exchanges);
    algo->finish(m.params);
  }
  {
    rank_model m(comm.rank());
    relax::sgd opt = test_sgd();
    auto algo = relax::make("gradient_allreduce", comm);
    algo->start(m.params);
    for (int s = 0; s < steps; ++s) {
      m.set_gradients(comm.rank(), s);
      algo->step(m.params, opt);
    }
    // the ring's 2 (p - 1) / p of the model in whole bytes per step (rounded down: 6451 of 6451.2 at p = 5)
    const std::uint64_t ring_bytes =
        2 * static_cast<std::uint64_t>(p - 1) * model_bytes / static_cast<std::uint64_t>(p);
    EXPECT_EQ(algo->traffic_so_far().bytes_sent, steps * ring_bytes);
    EXPECT_EQ(algo->traffic_so_far().exchanges, static_cast<std::uint64_t>(steps));
    algo->finish(m.params);
  }
  {
    const std::size_t chunk = 64;
    rank_model m(comm.rank());
    relax::sgd opt = test_sgd();
    auto algo = relax::make("bytegrad", comm, {.chunk = chunk});
    algo->start(m.params);
    for (int s = 0; s < steps; ++s) {
      m.set_gradients(comm.rank(), s);
      algo->step(m.params, opt);
    }
    auto encoded = [chunk](std::size_t k) { return k + 8 * ((k + chunk - 1) / chunk); };
    std::uint64_t widest = 0, all = 0;
    for (int j = 0; j < p; ++j) {
      widest = std::max<std::uint64_t>(widest, encoded(partition(model_size(), p, j).second));
      all += encoded(partition(model_size(), p, j).second);
    }
    const std::uint64_t right = encoded(partition(model_size(), p, (comm.rank() + 1) % p).second);
    const std::uint64_t per_step = p == 1 ? 0 : static_cast<std::uint64_t>(p - 1) * widest + (all - right);
    EXPECT_EQ(algo->traffic_so_far().bytes_sent, steps * per_step) << "[rank " << comm.rank() << "] bytegrad";
    algo->finish(m.params);
  }
}

/// Every algorithm through the registry: start, a few steps, finish, weights identical on every rank
/// after finish.
inline void every_algorithm_ends_with_one_model(communicator& comm) {
  for (std::string_view name : relax::algorithm_names()) {
    rank_model m(comm.rank());
    relax::sgd opt = test_sgd();
    relax::options o;
    o.warmup_steps = 2;
    o.period_ms = 1;
    auto algo = relax::make(name, comm, o);
    algo->start(m.params);
    for (int s = 0; s < 4; ++s) {
      m.set_gradients(comm.rank(), s);
      algo->step(m.params, opt);
    }
    algo->finish(m.params);
    const flat mine = m.weights();
    flat all(mine.size() * static_cast<std::size_t>(comm.size()));
    flexpar::allgather(comm, std::span<const float>(mine), std::span<float>(all));
    for (int r = 0; r < comm.size(); ++r)
      for (std::size_t i = 0; i < mine.size(); ++i)
        if (all[static_cast<std::size_t>(r) * mine.size() + i] != mine[i]) {
          ADD_FAILURE() << "[rank " << comm.rank() << "] " << name << ": after finish weight " << i << " is " << mine[i]
                        << " here and " << all[static_cast<std::size_t>(r) * mine.size() + i] << " on rank " << r;
          r = comm.size();
          break;
        }
  }
}

/// onebit_adam / qadam against the serial rule (warm-up 2 exact steps, then compressed momentum).
inline void momentum_adam_matches_reference(communicator& comm, const std::string& name, std::size_t chunk) {
  const int steps = 6, warmup = 2;
  relax::options o;
  o.warmup_steps = warmup;
  o.adam = {.learning_rate = 0.01f};
  o.chunk = chunk;
  o.onebit_chunk = chunk;
  const history ref =
      reference_momentum_adam(comm.size(), steps, warmup, o.adam,
                              name == "onebit_adam" ? momentum_codec::onebit : momentum_codec::minmax, chunk);
  run_against_reference(comm, name, o, steps, ref, exact, name + " chunk " + std::to_string(chunk));
}

/// compressed_average_streamed against compressed_average on the same inputs, step after step: the
/// data (and the 1-bit codec's residuals) bitwise equal, for pieces of one chunk up to more than a
/// partition, models smaller than the ranks, uneven partitions; the bytes sent are the exact encoded
/// sizes (no padding to the widest partition).
template <class Codec>
void streamed_average_is_the_average_bitwise(communicator& comm, Codec make_codec, const std::string& what) {
  const int p = comm.size(), me = comm.rank();
  for (const std::size_t n : {static_cast<std::size_t>(p > 1 ? p - 1 : 1), std::size_t{1008}, std::size_t{5003}})
    for (const std::size_t piece : {std::size_t{1}, std::size_t{100}, std::size_t{700}, std::size_t{4096}}) {
      const block_layout parts = block_layout::even(n, p);
      Codec plain = make_codec, streamed = make_codec;
      plain.prepare(parts, me);
      streamed.prepare(parts, me);
      relax::detail::compressed_scratch s1, s2;
      const std::string where = what + ", " + std::to_string(n) + " elements, pieces of " + std::to_string(piece) +
                                ", rank " + std::to_string(me) + " of " + std::to_string(p);
      for (int step = 0; step < 3; ++step) {
        flat x(n);
        for (std::size_t i = 0; i < n; ++i)
          x[i] = std::ldexp(static_cast<float>(static_cast<int>((i * 37 + static_cast<std::size_t>(me) * 11 +
                                                                 static_cast<std::size_t>(step) * 5) %
                                                                23) -
                                               11),
                            static_cast<int>(i % 5) - 2);
        flat y = x;
        relax::detail::compressed_average(comm, std::span<float>(x), plain, s1);
        const std::uint64_t sent =
            relax::detail::compressed_average_streamed(comm, std::span<float>(y), streamed, s2, piece);
        ASSERT_EQ(std::memcmp(x.data(), y.data(), n * sizeof(float)), 0) << where << ", step " << step;
        const std::size_t rounded =
            std::max<std::size_t>(1, (piece + plain.chunk() - 1) / plain.chunk()) * plain.chunk();
        const std::size_t pieces = (parts.count(0) + rounded - 1) / rounded;
        if (p > 1 && pieces > 1) {  // the streamed path (not its fallback): exact encoded sizes
          std::uint64_t want = 0;
          for (int j = 0; j < p; ++j)
            if (j != me) want += plain.encoded_size(parts.count(j)) + plain.encoded_size(parts.count(me));
          EXPECT_EQ(sent, want) << where;
        }
      }
      if constexpr (requires { plain.server_residual(); }) {
        const auto a = plain.server_residual(), b = streamed.server_residual();
        EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << where << ": server residuals differ";
        for (std::size_t j = 0; j < static_cast<std::size_t>(p); ++j) {
          const auto u = plain.worker_residual(j), v = streamed.worker_residual(j);
          EXPECT_TRUE(std::equal(u.begin(), u.end(), v.begin(), v.end())) << where << ": worker residuals differ";
        }
      }
    }
}

/// host_adam_model's fused compression step (momentum update, streamed average, weight update in
/// one pass) against the three steps one after another: bitwise the same weights and momentum,
/// three steps in a row, weight decay on, pieces small enough to stream.
template <class Codec>
void fused_momentum_step_is_the_three_steps(communicator& comm, const Codec& codec, const std::string& what) {
  const std::size_t n = 5003;
  relax::adam_options o;
  o.learning_rate = 0.01f;
  o.epsilon = 0.5f;
  o.weight_decay = 0.01f;
  for (const std::size_t piece : {std::size_t{16}, std::size_t{700}}) {
    relax::detail::host_adam_model<Codec> three(comm, codec), fused(comm, codec);
    flat w3(n), g3(n), wf(n), gf(n);
    for (std::size_t i = 0; i < n; ++i) w3[i] = wf[i] = static_cast<float>(static_cast<int>(i % 13) - 6) * 0.25f;
    const std::vector<relax::parameter> p3{{"w", w3, g3}}, pf{{"w", wf, gf}};
    three.start("test", p3, false);
    fused.start("test", pf, false);
    three.reset();
    fused.reset();
    for (int step = 1; step <= 3; ++step) {
      for (std::size_t i = 0; i < n; ++i)
        g3[i] = gf[i] = static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(comm.rank()) * 3 +
                                                             static_cast<std::size_t>(step)) %
                                                            11) -
                                           5) *
                        0.125f;
      const float c1 = 1.0f - std::pow(o.beta1, static_cast<float>(step));
      three.load(p3);
      three.momentum_update(o.beta1, o.weight_decay);
      three.average_momentum();
      three.frozen_update(o, c1);
      three.store(p3);
      fused.load(pf);
      fused.fused_momentum_step(o, c1, piece);
      fused.store(pf);
      const std::string where = what + ", pieces of " + std::to_string(piece) + ", step " + std::to_string(step) +
                                ", rank " + std::to_string(comm.rank());
      ASSERT_EQ(std::memcmp(w3.data(), wf.data(), n * sizeof(float)), 0) << where << ": weights differ";
      ASSERT_TRUE(std::equal(three.momentum().begin(), three.momentum().end(), fused.momentum().begin(),
                             fused.momentum().end()))
          << where << ": momentum differs";
    }
  }
}

inline void streamed_averages_are_the_averages_bitwise(communicator& comm) {
  streamed_average_is_the_average_bitwise(comm, relax::detail::minmax_codec{{5}}, "minmax chunk 5");
  streamed_average_is_the_average_bitwise(comm, relax::detail::minmax_codec{{512}}, "minmax chunk 512");
  streamed_average_is_the_average_bitwise(comm, relax::detail::onebit_codec(16), "onebit chunk 16");
  streamed_average_is_the_average_bitwise(comm, relax::detail::onebit_codec(64), "onebit chunk 64");
  fused_momentum_step_is_the_three_steps(comm, relax::detail::onebit_codec(16), "onebit_adam");
  fused_momentum_step_is_the_three_steps(comm, relax::detail::minmax_codec{{5}}, "qadam");
}

/// Error feedback of the 1-bit compressed average: over T steps, the sum of what came out equals the
/// sum of the true averages minus (mean of the worker residuals + the server residual), and the
/// residuals stay bounded.
inline void onebit_error_feedback_tracks_the_true_sum(communicator& comm, std::size_t chunk) {
  const int p = comm.size(), steps = 40;
  const std::size_t n = model_size();
  const block_layout parts = block_layout::even(n, p);
  relax::detail::onebit_codec codec(chunk);
  codec.prepare(parts, comm.rank());
  relax::detail::compressed_scratch scratch;
  auto input = [](int r, int s, std::size_t i) {
    return static_cast<float>(
               static_cast<int>(
                   (static_cast<std::size_t>(r) * 31 + static_cast<std::size_t>(s) * 17 + i * 7 + i * i % 5) % 19) -
               9) *
           0.37f;
  };
  std::vector<double> sum_out(n, 0.0), sum_true(n, 0.0);
  float largest_input = 0.0f;
  for (int s = 0; s < steps; ++s) {
    flat x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = input(comm.rank(), s, i);
    relax::detail::compressed_average(comm, std::span<float>(x), codec, scratch);
    for (std::size_t i = 0; i < n; ++i) {
      sum_out[i] += x[i];
      double avg = 0;
      for (int r = 0; r < p; ++r) avg += input(r, s, i);
      sum_true[i] += avg / p;
      largest_input = std::max(largest_input, std::abs(input(comm.rank(), s, i)));
    }
  }
  flat worker(n, 0.0f), server(n, 0.0f);
  for (int j = 0; j < p; ++j) {
    const auto res = codec.worker_residual(static_cast<std::size_t>(j));
    std::copy(res.begin(), res.end(), worker.begin() + static_cast<std::ptrdiff_t>(parts.displ(j)));
  }
  const auto mine = codec.server_residual();
  std::copy(mine.begin(), mine.end(), server.begin() + static_cast<std::ptrdiff_t>(parts.displ(comm.rank())));
  const flat workers = gather_all(comm, worker), servers = gather_all(comm, server);
  float largest_residual = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    double worker_mean = 0, server_res = 0;
    for (int r = 0; r < p; ++r) {
      worker_mean += workers[static_cast<std::size_t>(r) * n + i];
      server_res += servers[static_cast<std::size_t>(r) * n + i];
      largest_residual = std::max({largest_residual, std::abs(workers[static_cast<std::size_t>(r) * n + i]),
                                   std::abs(servers[static_cast<std::size_t>(r) * n + i])});
    }
    worker_mean /= p;
    const double predicted = sum_true[i] - worker_mean - server_res;
    if (std::abs(sum_out[i] - predicted) > 1e-3 * (1.0 + std::abs(sum_true[i]))) {
      ADD_FAILURE() << "[rank " << comm.rank() << " of " << p << "] element " << i << ": transmitted sum " << sum_out[i]
                    << ", true sum " << sum_true[i] << " minus residuals " << worker_mean << " + " << server_res
                    << " = " << predicted;
      break;
    }
  }
  // A sign carries at most the chunk's mean |v|; what it leaves behind stays of the inputs' order.
  EXPECT_LE(largest_residual, 4.0f * largest_input) << "[rank " << comm.rank() << "] residuals grew";
  EXPECT_GT(largest_residual, 0.0f) << "1-bit compression of varied data always leaves a residual";
}

/// Polls `done` every millisecond for up to `limit`; true once it holds.
template <class F>
bool eventually(F&& done, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

/// async_model_average: rounds run in the background; abort() pauses every rank in the same round
/// (the round counts agree and stop moving), resume() restarts them; after finish() every rank holds
/// the same weights, the average of the weights at the (paused) moment finish() was called.
inline void async_abort_resume_finish(communicator& comm) {
  rank_model m(comm.rank());
  relax::sgd opt = test_sgd();
  relax::async_model_average algo(comm, 1);
  EXPECT_THROW(algo.abort(), usage_error) << "not started";
  algo.start(m.params);
  for (int s = 0; s < 5; ++s) {
    m.set_gradients(comm.rank(), s);
    algo.step(m.params, opt);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(eventually([&] { return algo.rounds() >= 3; })) << "[rank " << comm.rank() << "] no background rounds";
  EXPECT_THROW(algo.resume(), usage_error) << "resume() before abort()";
  for (int pause = 0; pause < 2; ++pause) {
    algo.abort();
    const auto paused_at = static_cast<std::int64_t>(algo.rounds());
    std::vector<std::int64_t> everyone(static_cast<std::size_t>(comm.size()));
    flexpar::allgather(comm, std::span<const std::int64_t>(&paused_at, 1), std::span<std::int64_t>(everyone));
    for (std::int64_t r : everyone)
      EXPECT_EQ(r, paused_at) << "[rank " << comm.rank() << "] ranks paused in different rounds";
    m.set_gradients(comm.rank(), 5 + pause);
    algo.step(m.params, opt);  // local steps go on while paused
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(static_cast<std::int64_t>(algo.rounds()), paused_at) << "averaging went on after abort()";
    if (pause == 1) break;  // finish() from the paused state
    algo.resume();
    EXPECT_TRUE(eventually([&] { return static_cast<std::int64_t>(algo.rounds()) > paused_at; }))
        << "[rank " << comm.rank() << "] no rounds after resume()";
  }
  const flat before = m.weights();
  const flat all = gather_all(comm, before);
  const std::size_t n = before.size();
  std::vector<flat> each;
  for (int r = 0; r < comm.size(); ++r)
    each.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * n),
                      all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r + 1) * n));
  algo.finish(m.params);
  const flat after = m.weights();
  expect_close(after, average(each), 1e-5f, comm, "async_model_average: finish() against the average", -1);
  const flat finals = gather_all(comm, after);
  for (int r = 0; r < comm.size(); ++r)
    for (std::size_t i = 0; i < n; ++i)
      if (finals[static_cast<std::size_t>(r) * n + i] != after[i]) {
        ADD_FAILURE() << "[rank " << comm.rank() << "] after finish weight " << i << " differs from rank " << r;
        return;
      }
  EXPECT_GE(algo.traffic_so_far().exchanges, 4u);
  EXPECT_EQ(algo.traffic_so_far().steps, 7u);
}

/// A rank that leaves without finish() (its destructor stops its thread locally): the others'
/// background rounds end at their deadline, and finish() rethrows that timeout_error.
inline void async_rank_leaving_early_is_a_timeout(communicator& comm) {
  rank_model m(comm.rank());
  relax::sgd opt = test_sgd();
  auto algo = std::make_unique<relax::async_model_average>(comm, 1);
  algo->start(m.params);
  m.set_gradients(comm.rank(), 0);
  algo->step(m.params, opt);
  if (comm.rank() == comm.size() - 1) {
    algo.reset();  // leaves
    return;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto begin = std::chrono::steady_clock::now();
  EXPECT_THROW(algo->finish(m.params), timeout_error);
  EXPECT_LT(std::chrono::steady_clock::now() - begin, comm.settings().timeout * 3);
}

/// What `f` throws, as text ("" if nothing).
template <class F>
std::string thrown_by(F&& f) {
  try {
    f();
  } catch (const usage_error& e) {
    return e.what();
  }
  return "";
}

/// Bad input: a clear usage_error on every rank, naming the rank, the algorithm and both sides.
inline void bad_input_is_a_usage_error(communicator& comm) {
  const int p = comm.size();
  // Parameter lists that differ across ranks (rank p-1 has a longer last tensor): caught at start.
  for (std::string_view name : relax::algorithm_names()) {
    rank_model m(comm.rank());
    std::vector<float> longer(1001, 0.0f), longer_g(1001, 0.0f);
    if (comm.rank() == p - 1 && p > 1) m.params.back() = {"p3", std::span<float>(longer), std::span<float>(longer_g)};
    auto algo = relax::make(name, comm);
    const std::string text = thrown_by([&] { algo->start(m.params); });
    if (p > 1) {
      EXPECT_NE(text.find("relax::" + std::string(name) + " start"), std::string::npos) << text;
      EXPECT_NE(text.find("rank " + std::to_string(p - 1)), std::string::npos) << text;
      EXPECT_NE(text.find("1001"), std::string::npos) << text;
      EXPECT_NE(text.find("1000"), std::string::npos) << text;
    } else {
      EXPECT_EQ(text, "");
    }
  }
  // Weight and gradient of different lengths on one rank: every rank throws at start.
  {
    rank_model m(comm.rank());
    std::vector<float> short_g(6, 0.0f);
    if (comm.rank() == 0) m.params[0].gradient = std::span<float>(short_g);
    auto algo = relax::make("bytegrad", comm);
    const std::string text = thrown_by([&] { algo->start(m.params); });
    EXPECT_NE(text.find("parameter 0"), std::string::npos) << text;
    EXPECT_NE(text.find("of rank 0 has 7 weights but 6 gradient values"), std::string::npos) << text;
  }
  // ... and at step (local check).
  {
    rank_model m(comm.rank());
    auto algo = relax::make("gradient_allreduce", comm);
    algo->start(m.params);
    relax::sgd opt = test_sgd();
    std::vector<float> short_g(999, 0.0f);
    auto bad = m.params;
    bad[3].gradient = std::span<float>(short_g);
    const std::string text = thrown_by([&] { algo->step(bad, opt); });
    EXPECT_NE(text.find("[rank " + std::to_string(comm.rank()) + "] relax::gradient_allreduce step"), std::string::npos)
        << text;
    EXPECT_NE(text.find("\"p3\") has 1000 weights and 999 gradient values"), std::string::npos) << text;
    auto fewer = m.params;
    fewer.pop_back();
    EXPECT_NE(thrown_by([&] { algo->step(fewer, opt); }).find("3 parameters; start() was given 4"), std::string::npos);
    algo->finish(m.params);
  }
  // Unknown names and options.
  const std::string unknown = thrown_by([&] { (void)relax::make("allreduce_please", comm); });
  EXPECT_NE(unknown.find("unknown algorithm 'allreduce_please'"), std::string::npos) << unknown;
  for (std::string_view name : relax::algorithm_names()) EXPECT_NE(unknown.find(name), std::string::npos) << unknown;
  EXPECT_NE(thrown_by([&] {
              (void)relax::make("decentralized", comm, {.peers = "star"});
            }).find("known: all, shift_one, ring"),
            std::string::npos);
  EXPECT_NE(thrown_by([&] { (void)relax::make("local_sgd", comm, {.interval = 0}); }).find("at least 1"),
            std::string::npos);
  EXPECT_NE(thrown_by([&] { (void)relax::make("bytegrad", comm, {.chunk = 0}); }).find("chunk must be positive"),
            std::string::npos);
}

}  // namespace flexpar::testing_support
