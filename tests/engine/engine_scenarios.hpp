// Engine scenarios shared by the in-process and the mpiexec tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <flexpar/engine/engine.hpp>

namespace flexpar::testing_support {

/// "t<i>" (built without `"t" + std::to_string(i)`, which trips GCC 12's -Wrestrict false positive).
inline std::string tensor_name(int i) {
  std::string name = std::to_string(i);
  name.insert(name.begin(), 't');
  return name;
}

inline std::string what_of(const handle& h) {
  try {
    h.wait();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

/// Every rank submits `n` allreduces of sizes drawn from one shared seed, in its own random order,
/// some from a second thread; every result is compared exactly with the serial sum.
inline void random_order_allreduces(communicator& comm, const config& cfg, int n, std::size_t max_count) {
  engine eng(comm, cfg);
  const int p = comm.size(), me = comm.rank();
  std::mt19937_64 shared(12345);
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  for (auto& c : counts) c = std::uniform_int_distribution<std::size_t>(0, max_count)(shared);
  std::vector<std::vector<float>> data(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto& d = data[static_cast<std::size_t>(i)];
    d.resize(counts[static_cast<std::size_t>(i)]);
    for (std::size_t k = 0; k < d.size(); ++k)
      d[k] = static_cast<float>((me + 1) * ((i + static_cast<int>(k)) % 7 + 1));
  }
  std::vector<int> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 mine(1000 + static_cast<unsigned>(me));
  std::shuffle(order.begin(), order.end(), mine);
  std::vector<handle> handles(static_cast<std::size_t>(n));
  // Half submitted from this thread, half from another: the engine takes submissions from any thread.
  std::thread helper([&] {
    for (std::size_t j = order.size() / 2; j < order.size(); ++j) {
      const int i = order[j];
      handles[static_cast<std::size_t>(i)] =
          eng.allreduce_async(tensor_name(i), std::span(data[static_cast<std::size_t>(i)]), reduce_op::sum);
    }
  });
  for (std::size_t j = 0; j < order.size() / 2; ++j) {
    const int i = order[j];
    handles[static_cast<std::size_t>(i)] =
        eng.allreduce_async(tensor_name(i), std::span(data[static_cast<std::size_t>(i)]), reduce_op::sum);
  }
  helper.join();
  const float rank_sum = static_cast<float>(p * (p + 1) / 2);
  for (int i = 0; i < n; ++i) {
    handles[static_cast<std::size_t>(i)].wait();
    const auto& d = data[static_cast<std::size_t>(i)];
    for (std::size_t k = 0; k < d.size(); ++k)
      ASSERT_EQ(d[k], rank_sum * static_cast<float>((i + static_cast<int>(k)) % 7 + 1))
          << "tensor " << i << " element " << k;
  }
  if (cfg.fusion_threshold > 0 && p > 1) {
    EXPECT_GT(eng.stats().fused_collectives, 0u);
  }
  if (cfg.fusion_threshold == 0) {
    EXPECT_EQ(eng.stats().fused_collectives, 0u);
  }
}

/// The other collectives through the engine, against serial results.
inline void every_collective(communicator& comm, const config& cfg) {
  engine eng(comm, cfg);
  const int p = comm.size(), me = comm.rank();
  // allgather with a different count on every rank
  std::vector<std::int32_t> mine(static_cast<std::size_t>(me + 1), me * 10);
  std::vector<std::int32_t> all(static_cast<std::size_t>(p * (p + 1) / 2) + 3, -1);  // room to spare
  handle g = eng.allgather_async("gather", std::span<const std::int32_t>(mine), std::span(all));
  // broadcast from the last rank
  std::vector<double> b(5, me == p - 1 ? 2.5 : 0.0);
  handle bc = eng.broadcast_async("bcast", std::span(b), p - 1);
  // reduce_scatter of 2p + 1 elements (uneven blocks)
  const std::size_t n = static_cast<std::size_t>(2 * p + 1);
  std::vector<std::int64_t> rs_in(n);
  for (std::size_t k = 0; k < n; ++k) rs_in[k] = static_cast<std::int64_t>(k) * (me + 1);
  std::vector<std::int64_t> rs_out(3);
  handle rs = eng.reduce_scatter_async("rs", std::span<const std::int64_t>(rs_in), std::span(rs_out), reduce_op::sum);
  // alltoall of 2 elements per pair
  std::vector<std::int32_t> a_in(static_cast<std::size_t>(2 * p)), a_out(static_cast<std::size_t>(2 * p));
  for (int j = 0; j < p; ++j)
    for (int e = 0; e < 2; ++e) a_in[static_cast<std::size_t>(2 * j + e)] = 100 * me + 10 * j + e;
  handle aa = eng.alltoall_async("a2a", std::span<const std::int32_t>(a_in), std::span(a_out));
  // max allreduce in bf16 (small integers are exact)
  std::vector<bfloat16> m(9, bfloat16(static_cast<float>(me)));
  handle mx = eng.allreduce_async("max", std::span(m), reduce_op::max);

  g.wait();
  EXPECT_EQ(g.result_count(), static_cast<std::size_t>(p * (p + 1) / 2));
  std::size_t at = 0;
  for (int r = 0; r < p; ++r)
    for (int k = 0; k <= r; ++k) EXPECT_EQ(all[at++], r * 10);
  EXPECT_EQ(all[at], -1) << "allgather wrote past the result";
  bc.wait();
  EXPECT_EQ(b, std::vector<double>(5, 2.5));
  rs.wait();
  const std::size_t base = n / static_cast<std::size_t>(p), extra = n % static_cast<std::size_t>(p);
  const std::size_t my_count = base + (static_cast<std::size_t>(me) < extra ? 1 : 0);
  const std::size_t my_first =
      static_cast<std::size_t>(me) * base + std::min<std::size_t>(static_cast<std::size_t>(me), extra);
  EXPECT_EQ(rs.result_count(), my_count);
  for (std::size_t k = 0; k < my_count; ++k)
    EXPECT_EQ(rs_out[k], static_cast<std::int64_t>(my_first + k) * p * (p + 1) / 2) << "block element " << k;
  aa.wait();
  for (int i = 0; i < p; ++i)
    for (int e = 0; e < 2; ++e) EXPECT_EQ(a_out[static_cast<std::size_t>(2 * i + e)], 100 * i + 10 * me + e);
  mx.wait();
  for (auto v : m) EXPECT_EQ(static_cast<float>(v), static_cast<float>(p - 1));
}

/// One field differs on one rank: every rank's handle fails with a text naming the field and the
/// ranks; the next correct submission still works.
inline void mismatches(communicator& comm, const config& cfg) {
  engine eng(comm, cfg);
  const int p = comm.size(), me = comm.rank();
  ASSERT_GE(p, 2);
  const bool odd = me == 1;
  std::vector<float> f(odd ? 2048 : 1024, 1.0f);
  std::vector<double> d(1024, 1.0);
  std::string others = p == 2 ? "rank {0}" : "ranks {0";
  if (p > 2) {
    for (int r = 2; r < p; ++r) others.append(",").append(std::to_string(r));
    others += "}";
  }
  // count, allreduce
  handle h = eng.allreduce_async("fc1.grad", std::span(f), reduce_op::sum);
  EXPECT_NE(what_of(h).find("allreduce \"fc1.grad\": count 1024 on " + others + " but 2048 on rank {1}"),
            std::string::npos)
      << what_of(h);
  EXPECT_THROW(h.wait(), mismatch_error);
  // dtype, allreduce
  handle hd = odd ? eng.allreduce_async("w", std::span(d), reduce_op::sum)
                  : eng.allreduce_async("w", std::span(f).first(1024), reduce_op::sum);
  EXPECT_NE(what_of(hd).find("allreduce \"w\": dtype f32 on " + others + " but f64 on rank {1}"), std::string::npos)
      << what_of(hd);
  // op, reduce_scatter
  std::vector<float> rs_out(1024);
  handle ho = eng.reduce_scatter_async("rs", std::span<const float>(f).first(1024), std::span(rs_out),
                                       odd ? reduce_op::max : reduce_op::sum);
  EXPECT_NE(what_of(ho).find("reduce_scatter \"rs\": op sum on " + others + " but max on rank {1}"), std::string::npos)
      << what_of(ho);
  // root, broadcast
  handle hr = eng.broadcast_async("b", std::span(f).first(8), odd ? 1 : 0);
  EXPECT_NE(what_of(hr).find("broadcast \"b\": root 0 on " + others + " but 1 on rank {1}"), std::string::npos)
      << what_of(hr);
  // count, allgather is legal (counts may differ), but a different collective under one name is not
  std::vector<float> out(4096);
  handle hk = odd ? eng.allgather_async("k", std::span<const float>(f).first(4), std::span(out))
                  : eng.allreduce_async("k", std::span(f).first(4), reduce_op::sum);
  EXPECT_NE(what_of(hk).find("tensor \"k\": collective allreduce on " + others + " but allgather on rank {1}"),
            std::string::npos)
      << what_of(hk);
  // count, alltoall
  std::vector<float> a_out(2048);
  handle ha = eng.alltoall_async(
      "a", std::span<const float>(f).first(odd ? 2 * static_cast<std::size_t>(p) : static_cast<std::size_t>(p)),
      std::span(a_out));
  EXPECT_NE(what_of(ha).find("alltoall \"a\": count"), std::string::npos) << what_of(ha);
  // The engine still works.
  std::vector<float> ok(10, 1.0f);
  handle good = eng.allreduce_async("fc1.grad", std::span(ok), reduce_op::sum);
  good.wait();
  EXPECT_EQ(ok, std::vector<float>(10, static_cast<float>(p)));
}

/// The whole matrix: every field that must agree (count, dtype, op, root) on every collective that
/// has it, differing on rank 1 only. Every rank gets the mismatch naming the field, both values and
/// the ranks; afterwards the engine still runs a correct collective.
inline void mismatch_matrix(communicator& comm, const config& cfg) {
  engine eng(comm, cfg);
  const int p = comm.size(), me = comm.rank();
  ASSERT_GE(p, 2);
  const bool odd = me == 1;
  std::string others = p == 2 ? "rank {0}" : "ranks {0";
  if (p > 2) {
    for (int r = 2; r < p; ++r) others.append(",").append(std::to_string(r));
    others += "}";
  }
  const std::size_t n = 4 * static_cast<std::size_t>(p);  // divisible by p, for alltoall
  std::vector<float> f(4 * n, 1.0f), f_out(16 * n);
  std::vector<double> d(4 * n, 1.0), d_out(16 * n);
  const std::size_t my_n = odd ? 2 * n : n;
  auto expect = [&](const handle& h, const std::string& want) {
    const std::string got = what_of(h);
    EXPECT_NE(got.find(want), std::string::npos) << "want: " << want << "\ngot:  " << got;
    EXPECT_THROW(h.wait(), mismatch_error);
  };
  const auto f_in = [&](std::size_t k) { return std::span<const float>(f).first(k); };
  const std::string counts =
      "count " + std::to_string(n) + " on " + others + " but " + std::to_string(2 * n) + " on rank {1}";
  const std::string dtypes = "dtype f32 on " + others + " but f64 on rank {1}";
  // count
  expect(eng.allreduce_async("c.ar", std::span(f).first(my_n), reduce_op::sum), "allreduce \"c.ar\": " + counts);
  expect(eng.broadcast_async("c.bc", std::span(f).first(my_n), 0), "broadcast \"c.bc\": " + counts);
  expect(eng.reduce_scatter_async("c.rs", f_in(my_n), std::span(f_out), reduce_op::sum),
         "reduce_scatter \"c.rs\": " + counts);
  expect(eng.alltoall_async("c.aa", f_in(my_n), std::span(f_out)), "alltoall \"c.aa\": " + counts);
  // dtype (allgather too: its counts may differ, its dtype may not)
  auto typed = [&](auto&& with_float, auto&& with_double) { return odd ? with_double() : with_float(); };
  expect(typed([&] { return eng.allreduce_async("t.ar", std::span(f).first(n), reduce_op::sum); },
               [&] { return eng.allreduce_async("t.ar", std::span(d).first(n), reduce_op::sum); }),
         "allreduce \"t.ar\": " + dtypes);
  expect(typed([&] { return eng.allgather_async("t.ag", f_in(n), std::span(f_out)); },
               [&] { return eng.allgather_async("t.ag", std::span<const double>(d).first(n), std::span(d_out)); }),
         "allgather \"t.ag\": " + dtypes);
  expect(typed([&] { return eng.broadcast_async("t.bc", std::span(f).first(n), 0); },
               [&] { return eng.broadcast_async("t.bc", std::span(d).first(n), 0); }),
         "broadcast \"t.bc\": " + dtypes);
  expect(typed([&] { return eng.reduce_scatter_async("t.rs", f_in(n), std::span(f_out), reduce_op::sum); },
               [&] {
                 return eng.reduce_scatter_async("t.rs", std::span<const double>(d).first(n), std::span(d_out),
                                                 reduce_op::sum);
               }),
         "reduce_scatter \"t.rs\": " + dtypes);
  expect(typed([&] { return eng.alltoall_async("t.aa", f_in(n), std::span(f_out)); },
               [&] { return eng.alltoall_async("t.aa", std::span<const double>(d).first(n), std::span(d_out)); }),
         "alltoall \"t.aa\": " + dtypes);
  // op
  const reduce_op op = odd ? reduce_op::min : reduce_op::max;
  expect(eng.allreduce_async("o.ar", std::span(f).first(n), op),
         "allreduce \"o.ar\": op max on " + others + " but min on rank {1}");
  expect(eng.reduce_scatter_async("o.rs", f_in(n), std::span(f_out), op),
         "reduce_scatter \"o.rs\": op max on " + others + " but min on rank {1}");
  // root
  expect(eng.broadcast_async("r.bc", std::span(f).first(n), odd ? p - 1 : 0),
         "broadcast \"r.bc\": root 0 on " + others + " but " + std::to_string(p - 1) + " on rank {1}");
  // and the engine still works
  std::vector<std::int32_t> ok(5, 1);
  eng.allreduce_async("after", std::span(ok), reduce_op::sum).wait();
  EXPECT_EQ(ok, std::vector<std::int32_t>(5, p));
}

/// join: rank r runs r + 1 steps of an allreduce; the others see zeros from joined ranks.
inline void uneven_steps_with_join(communicator& comm, const config& cfg) {
  engine eng(comm, cfg);
  const int p = comm.size(), me = comm.rank();
  for (int step = 0; step <= me; ++step) {
    std::vector<std::int64_t> v(100, me + 1);
    eng.allreduce_async("grad", std::span(v), reduce_op::sum).wait();
    // Ranks still stepping at `step`: those with rank >= step; their (rank + 1) summed.
    std::int64_t want = 0;
    for (int r = step; r < p; ++r) want += r + 1;
    ASSERT_EQ(v[0], want) << "step " << step;
    ASSERT_EQ(v[99], want) << "step " << step;
  }
  const int last = eng.join();
  EXPECT_EQ(last, p - 1);
  // After a join the engine runs normally again.
  std::vector<std::int64_t> v(3, 1);
  eng.allreduce_async("after", std::span(v), reduce_op::sum).wait();
  EXPECT_EQ(v[2], p);
}

}  // namespace flexpar::testing_support
