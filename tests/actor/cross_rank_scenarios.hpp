// Graphs across ranks, checked against the serial result; shared by the threads-as-ranks test and
// the mpiexec test. Every rank describes the whole graph; each runs only the actors placed on it.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <flexpar/actor/deterministic_scheduler.hpp>
#include <flexpar/actor/executor.hpp>

namespace flexpar::testing_support {

/// Which executor runs each rank's part.
enum class drive { pool, deterministic };

inline void run_graph(actor_graph& g, drive how, std::uint64_t seed) {
  const auto until = deadline_after(std::chrono::seconds(60));
  if (how == drive::pool) {
    actor_executor pool(2);
    pool.run(g, until);
  } else {
    deterministic_scheduler s(g);
    std::mt19937_64 rng(seed + static_cast<std::uint64_t>(g.rank()));
    s.run_random(rng, until);
  }
}

/// The payload of the chain: a vector of `width` floats holding small integers (exact sums).
inline std::vector<float> chain_message(int i, std::size_t width) {
  std::vector<float> v(width);
  for (std::size_t k = 0; k < width; ++k) v[k] = static_cast<float>((i + static_cast<int>(k)) % 17);
  return v;
}

/// source (rank 0) -> scale x3 (rank 1) -> add k (rank 2) -> sink (rank 3), ranks modulo the size;
/// `width` floats per message (0 = empty vectors), `messages` messages. The sink, on its rank,
/// compares every message with the serial computation.
inline void chain_across_ranks(communicator& comm, int messages, std::size_t width, drive how) {
  const int p = comm.size();
  actor_graph g(comm);
  auto& src =
      g.add_actor<out<std::vector<float>, 2>>(0, "source", [i = 0, messages, width](std::vector<float>& v) mutable {
        if (i == messages) return fire_result::done;
        v = chain_message(i++, width);
        return fire_result::emit;
      });
  auto& scale = g.add_actor<in<std::vector<float>>, out<std::vector<float>, 1>>(
      1 % p, "scale", [](const std::vector<float>& x, std::vector<float>& y) {
        y.resize(x.size());
        for (std::size_t k = 0; k < x.size(); ++k) y[k] = 3 * x[k];
      });
  auto& add = g.add_actor<in<std::vector<float>>, out<std::vector<float>, 3>>(
      2 % p, "add k", [](const std::vector<float>& x, std::vector<float>& y) {
        y.resize(x.size());
        for (std::size_t k = 0; k < x.size(); ++k) y[k] = x[k] + static_cast<float>(k);
      });
  int received = 0, wrong = 0;
  auto& sink = g.add_actor<in<std::vector<float>>>(3 % p, "sink", [&](const std::vector<float>& y) {
    const auto x = chain_message(received++, width);
    if (y.size() != width) ++wrong;
    for (std::size_t k = 0; k < width && k < y.size(); ++k)
      if (y[k] != 3 * x[k] + static_cast<float>(k)) ++wrong;
  });
  g.connect(src.output<0>(), scale.input<0>());
  g.connect(scale.output<0>(), add.input<0>());
  g.connect(add.output<0>(), sink.input<0>());
  run_graph(g, how, 5);
  if (comm.rank() == 3 % p) {
    EXPECT_EQ(received, messages) << "rank " << comm.rank();
    EXPECT_EQ(wrong, 0);
  }
  if (comm.rank() == 1 % p) {
    EXPECT_LE(scale.output<0>().peak_registers_in_use(), 1u);
  }
  if (comm.rank() == 0) {
    EXPECT_LE(src.output<0>().peak_registers_in_use(), 2u);
  }
}

/// A (rank 0) fans out to B (rank 1) and C (rank 2); D (rank 3) joins them; ranks modulo the size.
/// D's results equal the serial ones: d_i = 2 i^2 + (i + 7).
inline void diamond_across_ranks(communicator& comm, int messages, drive how) {
  const int p = comm.size();
  actor_graph g(comm);
  auto& a = g.add_actor<out<std::int64_t, 2>>(0, "A", [i = std::int64_t{0}, messages](std::int64_t& x) mutable {
    if (i == messages) return fire_result::done;
    x = i++;
    return fire_result::emit;
  });
  auto& b = g.add_actor<in<std::int64_t>, out<std::int64_t, 2>>(
      1 % p, "B", [](const std::int64_t& x, std::int64_t& y) { y = 2 * x * x; });
  auto& c = g.add_actor<in<std::int64_t>, out<std::int64_t, 1>>(
      2 % p, "C", [](const std::int64_t& x, std::int64_t& y) { y = x + 7; });
  std::int64_t received = 0, wrong = 0;
  auto& d =
      g.add_actor<in<std::int64_t>, in<std::int64_t>>(3 % p, "D", [&](const std::int64_t& x, const std::int64_t& y) {
        const std::int64_t i = received++;
        if (x + y != 2 * i * i + i + 7) ++wrong;
      });
  g.connect(a.output<0>(), b.input<0>());
  g.connect(a.output<0>(), c.input<0>());
  g.connect(b.output<0>(), d.input<0>());
  g.connect(c.output<0>(), d.input<1>());
  run_graph(g, how, 9);
  if (comm.rank() == 3 % p) {
    EXPECT_EQ(received, messages) << "rank " << comm.rank();
    EXPECT_EQ(wrong, 0);
  }
  if (comm.rank() == 0) {
    EXPECT_LE(a.output<0>().peak_registers_in_use(), 2u);
  }
}

/// An actor on the last rank throws: that rank reports it with the label; rank 0, whose actor feeds
/// it, ends soon after with peer_failure naming the edge (the failing rank aborts its edges), long
/// before its deadline. `how` drives both ranks.
inline void failure_across_ranks(communicator& comm, drive how) {
  const int p = comm.size();
  actor_graph g(comm);
  auto& a = g.add_actor<out<int, 2>>(0, "A", [i = 0](int& x) mutable {
    if (i == 1000) return fire_result::done;
    x = i++;
    return fire_result::emit;
  });
  auto& z = g.add_actor<in<int>>(p - 1, "Z", [](const int& x) {
    if (x == 3) throw std::runtime_error("bad message 3");
  });
  g.connect(a.output<0>(), z.input<0>());
  const auto begin = clock::now();
  try {
    run_graph(g, how, 3);
    if (comm.rank() == 0 || comm.rank() == p - 1) ADD_FAILURE() << "rank " << comm.rank() << ": no error";
  } catch (const actor_failure& e) {
    EXPECT_EQ(comm.rank(), p - 1);
    EXPECT_EQ(e.label(), "Z");
  } catch (const peer_failure& e) {
    EXPECT_EQ(comm.rank(), 0) << e.what();
    EXPECT_NE(std::string(e.what()).find("'A->Z'"), std::string::npos) << e.what();
    std::string rank_text = "rank ";
    rank_text += std::to_string(p - 1);
    rank_text += " stopped its graph";
    EXPECT_NE(std::string(e.what()).find(rank_text), std::string::npos) << e.what();
  }
  EXPECT_LT(clock::now() - begin, std::chrono::seconds(20)) << "ended by the deadline, not by the abort";
}

}  // namespace flexpar::testing_support
