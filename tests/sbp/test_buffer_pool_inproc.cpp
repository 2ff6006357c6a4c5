// The shard buffer pool and the static mesh, threads as ranks: the pool reuses, stays within its
// bound and is thread-safe; tensors give their buffers back on destruction and stay move-only;
// boxing in steady state allocates nothing new and boxes rvalues in place where the collective
// allows; every boxing pair stays exact when the pool hands out buffers full of garbage;
// static_mesh<E...> checks its extents against the communicator.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "support/test_config.hpp"

#include "boxing_checks.hpp"

namespace flexpar::sbp {
namespace {

using namespace testing_support;

// ---- buffer_pool on its own ----------------------------------------------------------------------

TEST(buffer_pool, a_returned_buffer_is_handed_out_again) {
  buffer_pool pool;
  flexpar::aligned_vector<float> a = pool.acquire<float>(1000);
  ASSERT_EQ(a.size(), 1000u);
  const float* where = a.data();
  EXPECT_EQ(pool.stats().misses, 1u);
  pool.give_back(std::move(a));
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(pool.cached_bytes(), 1000 * sizeof(float));
  flexpar::aligned_vector<float> b = pool.acquire<float>(900);  // same size class, fits
  EXPECT_EQ(b.data(), where);
  EXPECT_EQ(b.size(), 900u);
  EXPECT_EQ(pool.stats().hits, 1u);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  pool.give_back(std::move(b));
  flexpar::aligned_vector<float> c = pool.acquire<float>(1000);  // grows back into its capacity
  EXPECT_EQ(c.data(), where);
  EXPECT_EQ(c.size(), 1000u);
}

/// A block the pool knows only through pool_block<>, as it knows the device's: bytes that are all
/// usable (size = capacity), made by the pool on a miss.
struct byte_block {
  std::unique_ptr<std::byte[]> bytes;
  std::size_t n = 0;
};

}  // namespace

template <>
struct pool_block<byte_block> {
  using value_type = std::byte;
  static std::size_t capacity(const byte_block& b) noexcept { return b.n; }
  static std::size_t size(const byte_block& b) noexcept { return b.n; }
  static byte_block make(std::size_t n) { return {std::make_unique<std::byte[]>(n), n}; }
};

namespace {

TEST(buffer_pool, blocks_of_another_memory_take_the_same_size_classes_and_bound) {
  buffer_pool pool(4096);
  byte_block a = pool.acquire_block<byte_block>(1000);
  ASSERT_EQ(a.n, 1000u);
  const std::byte* where = a.bytes.get();
  pool.give_back(std::move(a));
  EXPECT_EQ(a.n, 0u);
  EXPECT_EQ(pool.cached_bytes(), 1000u);
  byte_block b = pool.acquire_block<byte_block>(600);  // the same size class: the kept block
  EXPECT_EQ(b.bytes.get(), where);
  EXPECT_EQ(b.n, 1000u);                                 // a block keeps its capacity: the caller uses the front
  byte_block far = pool.acquire_block<byte_block>(100);  // nothing kept: a new block
  EXPECT_EQ(far.n, 100u);
  byte_block big = pool.acquire_block<byte_block>(4000);
  pool.give_back(std::move(big));
  pool.give_back(std::move(b));  // 4000 + 1000 > 4096: freed
  const auto s = pool.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.returned, 2u);
  EXPECT_EQ(s.dropped, 1u);
  EXPECT_EQ(s.filled, 0u);
  EXPECT_EQ(pool.cached_bytes(), 4000u);
  // host vectors of the same pool are another list: a float request never takes a byte block
  flexpar::aligned_vector<float> v = pool.acquire<float>(10);
  EXPECT_EQ(pool.stats().misses, 4u);
  EXPECT_EQ(pool.cached_bytes(), 4000u);
}

/// Whether `p` starts a cache line.
bool on_a_cache_line(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % flexpar::cache_line_bytes == 0; }

TEST(buffer_pool, every_buffer_and_every_shard_starts_on_a_cache_line) {
  // glibc's malloc alone gives 16-byte alignment: a large std::vector<float> starts 16 bytes past a
  // page. Sizes below and above its mmap threshold, odd ones, and every element size.
  buffer_pool pool;
  for (const std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{1000}, std::size_t{33333},
                              std::size_t{1} << 20, (std::size_t{1} << 22) + 5}) {
    const flexpar::aligned_vector<float> f = pool.acquire<float>(n);
    const flexpar::aligned_vector<std::int8_t> b = pool.acquire<std::int8_t>(n);
    const flexpar::aligned_vector<double> d = pool.acquire<double>(n, 1.0);
    EXPECT_TRUE(on_a_cache_line(f.data())) << n;
    EXPECT_TRUE(on_a_cache_line(b.data())) << n;
    EXPECT_TRUE(on_a_cache_line(d.data())) << n;
  }
  run_in_process(
      2,
      [](communicator& comm) {
        placement<1> mesh(comm, {2});
        const std::vector<float> full(6 * 1001, 1.0f);
        auto t = global_tensor<float, split<1>>::from_full(mesh, {6, 1001}, full);
        EXPECT_TRUE(on_a_cache_line(t.to_local().data()));
        auto b = to<broadcast>(std::move(t));  // a boxing's result, from the pool
        EXPECT_TRUE(on_a_cache_line(b.to_local().data()));
        const std::vector<float> mine(3 * 1001, 2.0f);  // a std::vector shard is copied into an aligned buffer
        auto l = global_tensor<float, split<0>>::from_local(mesh, {6, 1001}, mine);
        EXPECT_TRUE(on_a_cache_line(l.to_local().data()));
        EXPECT_EQ(l.to_full(), std::vector<float>(6 * 1001, 2.0f));
      },
      flexpar::testing_support::with_timeout());
}

TEST(buffer_pool, a_request_takes_the_buffer_that_needs_the_least_filling) {
  buffer_pool pool;
  flexpar::aligned_vector<float> cut(1024), whole(1024);  // same capacity; `cut` is cut down to half its size
  cut.resize(512);
  const float* cut_at = cut.data();
  const float* whole_at = whole.data();
  pool.give_back(std::move(cut));
  pool.give_back(std::move(whole));  // the most recently returned
  // half a buffer: `cut` already has that size, cutting `whole` down would waste 512 elements
  flexpar::aligned_vector<float> half = pool.acquire<float>(512);
  EXPECT_EQ(half.data(), cut_at);
  flexpar::aligned_vector<float> full = pool.acquire<float>(1024);  // `whole` needs no filling
  EXPECT_EQ(full.data(), whole_at);
  EXPECT_EQ(pool.stats().filled, 0u);
  // with only cut-down buffers left, the one cut the least is grown, and the fill is counted
  half.resize(100);
  full.resize(700);
  pool.give_back(std::move(full));
  pool.give_back(std::move(half));
  flexpar::aligned_vector<float> again = pool.acquire<float>(1024);
  EXPECT_EQ(again.data(), whole_at);
  EXPECT_EQ(pool.stats().filled, 1024u - 700u);
  // a new buffer is not counted: only reused ones are grown into
  flexpar::aligned_vector<float> fresh = pool.acquire<float>(4096);
  EXPECT_EQ(pool.stats().misses, 1u);
  EXPECT_EQ(pool.stats().filled, 1024u - 700u);
}

TEST(buffer_pool, a_buffer_far_too_large_is_not_used_for_a_small_request) {
  buffer_pool pool;
  pool.give_back(pool.acquire<double>(4096));
  flexpar::aligned_vector<double> small = pool.acquire<double>(100);  // 4096 is over 4x of 100: allocate instead
  EXPECT_EQ(pool.stats().hits, 0u);
  EXPECT_EQ(pool.stats().misses, 2u);
  EXPECT_EQ(pool.cached_bytes(), 4096 * sizeof(double));
}

TEST(buffer_pool, element_types_do_not_mix) {
  buffer_pool pool;
  pool.give_back(pool.acquire<float>(64));
  flexpar::aligned_vector<double> d = pool.acquire<double>(32);
  EXPECT_EQ(pool.stats().hits, 0u);
  flexpar::aligned_vector<float> f = pool.acquire<float>(64);
  EXPECT_EQ(pool.stats().hits, 1u);
}

TEST(buffer_pool, the_filled_form_fills_a_reused_buffer) {
  buffer_pool pool;
  pool.give_back(flexpar::aligned_vector<int>(100, 7));
  const flexpar::aligned_vector<int> v = pool.acquire<int>(80, -1);
  EXPECT_EQ(pool.stats().hits, 1u);
  EXPECT_EQ(v, flexpar::aligned_vector<int>(80, -1));
}

TEST(buffer_pool, the_copying_form_copies_into_a_reused_buffer) {
  buffer_pool pool;
  pool.give_back(flexpar::aligned_vector<int>(8, 7));
  const std::vector<int> values{1, 2, 3, 4, 5};  // the old 7s must not show through
  const flexpar::aligned_vector<int> v = pool.acquire_copy(std::span<const int>(values));
  EXPECT_EQ(pool.stats().hits, 1u);
  EXPECT_EQ(std::vector<int>(v.begin(), v.end()), values);
  EXPECT_TRUE(pool.acquire_copy(std::span<const int>()).empty());
}

TEST(buffer_pool, holds_at_most_its_bound) {
  buffer_pool pool(4096);
  pool.give_back(flexpar::aligned_vector<char>(5000));  // larger than the bound: freed
  EXPECT_EQ(pool.cached_bytes(), 0u);
  EXPECT_EQ(pool.stats().dropped, 1u);
  pool.give_back(flexpar::aligned_vector<char>(3000));
  pool.give_back(flexpar::aligned_vector<char>(1000));
  pool.give_back(flexpar::aligned_vector<char>(200));  // 4200 > 4096: freed
  EXPECT_EQ(pool.cached_bytes(), 4000u);
  EXPECT_EQ(pool.stats().returned, 2u);
  EXPECT_EQ(pool.stats().dropped, 2u);
  pool.clear();
  EXPECT_EQ(pool.cached_bytes(), 0u);
  buffer_pool none(0);
  none.give_back(flexpar::aligned_vector<int>(1));
  EXPECT_EQ(none.cached_bytes(), 0u);
}

TEST(buffer_pool, is_thread_safe) {
  buffer_pool pool(1 << 20);
  constexpr int threads = 4, rounds = 2000;
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w)
    workers.emplace_back([&pool, w] {
      for (int i = 0; i < rounds; ++i) {
        const auto n = static_cast<std::size_t>(1 + (i * 37 + w * 11) % 3000);
        flexpar::aligned_vector<std::int32_t> v = pool.acquire<std::int32_t>(n, w);
        for (std::int32_t x : v) ASSERT_EQ(x, w);  // nobody else writes my buffer
        pool.give_back(std::move(v));
      }
    });
  for (auto& t : workers) t.join();
  const auto s = pool.stats();
  EXPECT_EQ(s.hits + s.misses, std::size_t{threads * rounds});
  EXPECT_EQ(s.returned + s.dropped, std::size_t{threads * rounds});
  EXPECT_GT(s.hits, 0u);
  EXPECT_LE(pool.cached_bytes(), pool.max_bytes());
}

// ---- tensors and boxing on a pool ----------------------------------------------------------------

static_assert(!std::is_copy_constructible_v<global_tensor<float, split<0>>>);
static_assert(!std::is_copy_assignable_v<global_tensor<float, split<0>>>);
static_assert(std::is_nothrow_move_constructible_v<global_tensor<float, split<0>>>);
static_assert(std::is_nothrow_move_assignable_v<global_tensor<float, split<0>>>);

TEST(buffer_pool, a_tensor_gives_its_buffer_back_and_the_next_one_reuses_it) {
  run_in_process(
      2,
      [](communicator& comm) {
        placement<1> mesh(comm, {2});
        const shape_t shape{6, 5};
        const auto full = logical<float>(shape, 1);
        const float* where = nullptr;
        {
          auto t = global_tensor<float, split<0>>::from_full(mesh, shape, full);
          where = t.to_local().data();
          auto moved = std::move(t);  // moves own the buffer; the moved-from tensor gives nothing back
          EXPECT_EQ(moved.to_local().data(), where);
          EXPECT_TRUE(t.to_local().empty());  // NOLINT(bugprone-use-after-move): checking the moved-from state
          EXPECT_EQ(mesh.pool().cached_bytes(), 0u);
        }
        EXPECT_EQ(mesh.pool().cached_bytes(), 15 * sizeof(float));
        auto again = global_tensor<float, split<0>>::from_full(mesh, shape, full);
        EXPECT_EQ(again.to_local().data(), where);
        auto other = global_tensor<float, split<0>>::from_full(mesh, shape, full);
        other = std::move(again);  // the buffer `other` held goes back to the pool
        EXPECT_EQ(other.to_local().data(), where);
        EXPECT_EQ(mesh.pool().cached_bytes(), 15 * sizeof(float));
        EXPECT_EQ(other.to_full(), full);
      },
      flexpar::testing_support::with_timeout());
}

TEST(buffer_pool, rvalue_boxing_works_in_the_tensors_own_buffer) {
  run_in_process(
      3,
      [](communicator& comm) {
        placement<1> mesh(comm, {3});
        const shape_t shape{7, 4};
        const auto full = logical<double>(shape, 2);
        {  // P -> B: allreduce in place
          auto t = distinct_source<double, partial_sum>(mesh, shape, full, 2);
          const double* where = t.to_local().data();
          auto b = to<broadcast>(std::move(t));
          EXPECT_EQ(b.to_local().data(), where);
          EXPECT_EQ(b.to_full(), full);
        }
        {  // P -> S(0): reduce-scatter in place, my block kept in the same buffer
          auto t = distinct_source<double, partial_sum>(mesh, shape, full, 3);
          const double* where = t.to_local().data();
          auto s = to<split<0>>(std::move(t));
          EXPECT_EQ(s.to_local().data(), where);
          EXPECT_EQ(s.to_full(), full);
        }
        {  // B -> S(0): my rows kept in the same buffer
          auto t = global_tensor<double, broadcast>::from_full(mesh, shape, full);
          const double* where = t.to_local().data();
          auto s = to<split<0>>(std::move(t));
          EXPECT_EQ(s.to_local().data(), where);
          EXPECT_EQ(s.to_full(), full);
        }
      },
      flexpar::testing_support::with_timeout());
}

TEST(buffer_pool, boxing_in_a_steady_state_allocates_no_new_buffers) {
  for (int p : {2, 3}) {
    run_in_process(
        p,
        [](communicator& comm) {
          placement<1> mesh(comm, {comm.size()});
          const shape_t shape{9, 10};
          const auto full = logical<float>(shape, 3);
          std::size_t misses_after_first = 0;
          for (int round = 0; round < 5; ++round) {
            auto t = distinct_source<float, partial_sum>(mesh, shape, full, round);
            auto s1 = to<split<1>>(std::move(t));                 // pack -> reduce-scatter
            auto s0 = to<split<0>>(std::move(s1));                // pack -> alltoall
            auto b = to<broadcast>(to<split<1>>(std::move(s0)));  // alltoall -> unpack; allgather -> unpack
            if (round == 4) {
              EXPECT_EQ(b.to_full(), full);
            }
            if (round == 1) misses_after_first = mesh.pool().stats().misses;
          }
          EXPECT_EQ(mesh.pool().stats().misses, misses_after_first) << "boxing allocated after the second round";
          EXPECT_LE(mesh.pool().cached_bytes(), mesh.pool().max_bytes());
        },
        flexpar::testing_support::with_timeout());
  }
}

TEST(buffer_pool, boxing_in_a_loop_fills_nothing_after_the_first_rounds) {
  // a training loop gathering and transposing shards of the same shapes: the shard and the result
  // must keep buffers of their own sizes (swapping them would zero half a buffer per call). Not
  // P -> S(i): its result keeps the front of a full buffer, which the next full-size request must
  // grow again unless a spare full buffer is cached.
  for (int p : {2, 3}) {
    run_in_process(
        p,
        [](communicator& comm) {
          placement<1> mesh(comm, {comm.size()});
          const shape_t shape{12, 64};
          const auto full = logical<float>(shape, 5);
          std::size_t filled_after_warmup = 0;
          for (int round = 0; round < 6; ++round) {
            {
              auto b = to<broadcast>(global_tensor<float, split<0>>::from_full(mesh, shape, full));
              auto c = to<broadcast>(global_tensor<float, split<1>>::from_full(mesh, shape, full));
              auto d = to<split<1>>(global_tensor<float, split<0>>::from_full(mesh, shape, full));
              if (round == 5) {
                EXPECT_EQ(b.to_full(), full);
                EXPECT_EQ(c.to_full(), full);
                EXPECT_EQ(d.to_full(), full);
              }
            }
            if (round == 1) filled_after_warmup = mesh.pool().stats().filled;
          }
          EXPECT_EQ(mesh.pool().stats().filled, filled_after_warmup)
              << "acquire() grew reused buffers in the steady state";
        },
        flexpar::testing_support::with_timeout());
  }
}

/// Fills `pool` with buffers of many sizes holding `junk`, so that every boxing works on reused,
/// dirty memory.
template <class T>
void poison(buffer_pool& pool, T junk) {
  for (std::size_t n = 1; n <= 512; n = n * 3 / 2 + 1)
    for (int copies = 0; copies < 4; ++copies) pool.give_back(flexpar::aligned_vector<T>(n, junk));
}

class dirty_pool : public ::testing::TestWithParam<int> {};

TEST_P(dirty_pool, every_pair_is_exact_on_reused_buffers) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        int salt = 0;
        for (const shape_t& shape : shapes())
          for_each_pair(one_axis{}, [&]<class From, class To>(From, To) {
            poison<std::int32_t>(mesh.pool(), 999);
            check_pair<std::int32_t, From, To>(mesh, shape, ++salt);
          });
        for_each_pair(list<split<1>, partial<reduce_op::max>, broadcast>{}, [&]<class From, class To>(From, To) {
          poison<float>(mesh.pool(), std::numeric_limits<float>::quiet_NaN());
          check_pair<float, From, To>(mesh, {5, 3}, ++salt);
        });
      },
      flexpar::testing_support::with_timeout());
}

INSTANTIATE_TEST_SUITE_P(worlds, dirty_pool, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::string("p").append(std::to_string(info.param)); });

// ---- ops draw their results from the pool --------------------------------------------------------

TEST(buffer_pool, ops_in_a_training_loop_reuse_the_buffers_of_the_last_step) {
  // the Megatron block of samples/megatron_block.cpp plus the element-wise ops: once the pool has
  // settled (two steps, as for boxing above) every result shard is a buffer a dead tensor of the
  // previous step gave back. An op that allocated
  // its result itself would neither count as a hit nor get the address just given back.
  for (int p : {2, 3}) {
    run_in_process(
        p,
        [](communicator& comm) {
          placement<1> mesh(comm, {comm.size()});
          const std::size_t batch = 5, hidden = 4, ffn = 7;
          const auto xv = logical<float>({batch, hidden}, 1), w1v = logical<float>({hidden, ffn}, 2),
                     w2v = logical<float>({ffn, hidden}, 3);
          const auto x = global_tensor<float, broadcast>::from_full(mesh, {batch, hidden}, xv);
          const auto w1 = global_tensor<float, split<1>>::from_full(mesh, {hidden, ffn}, w1v);
          const auto w2 = global_tensor<float, split<0>>::from_full(mesh, {ffn, hidden}, w2v);
          constexpr std::size_t ops_per_step = 7;  // matmul, relu, matmul, add, mul, reduce_sum, softmax
          std::size_t misses_after_first = 0;
          for (int step = 0; step < 5; ++step) {
            const buffer_pool::statistics before = mesh.pool().stats();
            auto h = relu(matmul(x, w1));           // column parallel: B x S(1) -> S(1)
            auto y = to<broadcast>(matmul(h, w2));  // row parallel: S(1) x S(0) -> P -> B
            auto z = mul(add(y, y), y);             // B
            auto rows = reduce_sum<1>(z);           // B
            auto soft = softmax<1>(z);              // B
            const buffer_pool::statistics after = mesh.pool().stats();
            if (step == 1) misses_after_first = after.misses;  // the pool's fit settles in two steps
            if (step > 1) {
              EXPECT_EQ(after.misses, misses_after_first) << "step " << step << " allocated";
              EXPECT_GE(after.hits - before.hits, ops_per_step) << "step " << step << ": an op bypassed the pool";
            }
            if (step == 4) {  // serial: relu(x w1) w2, then (y + y) y and its row sums (small integers: exact)
              std::vector<float> hs(batch * ffn, 0.0f), ys(batch * hidden, 0.0f), zs(batch * hidden);
              std::vector<float> sums(batch, 0.0f);
              for (std::size_t i = 0; i < batch; ++i)
                for (std::size_t k = 0; k < hidden; ++k)
                  for (std::size_t j = 0; j < ffn; ++j) hs[i * ffn + j] += xv[i * hidden + k] * w1v[k * ffn + j];
              for (float& e : hs) e = std::max(e, 0.0f);
              for (std::size_t i = 0; i < batch; ++i)
                for (std::size_t k = 0; k < ffn; ++k)
                  for (std::size_t j = 0; j < hidden; ++j) ys[i * hidden + j] += hs[i * ffn + k] * w2v[k * hidden + j];
              for (std::size_t i = 0; i < zs.size(); ++i) zs[i] = (ys[i] + ys[i]) * ys[i];
              for (std::size_t i = 0; i < batch; ++i)
                for (std::size_t j = 0; j < hidden; ++j) sums[i] += zs[i * hidden + j];
              EXPECT_EQ(y.to_full(), ys);
              EXPECT_EQ(z.to_full(), zs);
              EXPECT_EQ(rows.to_full(), sums);
              std::vector<float> softs(zs.size());  // the op's formula, in double
              for (std::size_t i = 0; i < batch; ++i) {
                double hi = -INFINITY, sum = 0;
                for (std::size_t j = 0; j < hidden; ++j) hi = std::max(hi, double(zs[i * hidden + j]));
                for (std::size_t j = 0; j < hidden; ++j) sum += std::exp(double(zs[i * hidden + j]) - hi);
                for (std::size_t j = 0; j < hidden; ++j)
                  softs[i * hidden + j] = float(std::exp(double(zs[i * hidden + j]) - hi) / sum);
              }
              EXPECT_EQ(soft.to_full(), softs);
            }
          }
          {  // the buffer a dead result gave back is the next result's
            const float* given_back = nullptr;
            {
              auto r = relu(x);
              given_back = r.to_local().data();
            }
            auto again = relu(x);
            EXPECT_EQ(again.to_local().data(), given_back);
          }
        },
        flexpar::testing_support::with_timeout());
  }
}

TEST(buffer_pool, ops_are_exact_on_reused_buffers) {
  // every op on a pool full of NaN against the same op on a placement that caches nothing (fresh,
  // zeroed buffers): a result element an op left unwritten would show as NaN, which equals nothing
  run_in_process(
      3,
      [](communicator& comm) {
        placement<1> dirty(comm, {comm.size()});
        placement<1> fresh(comm, {comm.size()}, {}, std::make_shared<buffer_pool>(0));
        const float nan = std::numeric_limits<float>::quiet_NaN();
        auto same = [&](const char* what, auto&& op) {
          poison<float>(dirty.pool(), nan);
          const std::vector<float> got = op(dirty).to_full(), want = op(fresh).to_full();
          EXPECT_EQ(got, want) << what;
        };
        auto full = [](const shape_t& s, int salt) { return logical<float>(s, salt); };
        for (auto [m, k, n] : {std::array<std::size_t, 3>{5, 3, 4}, {4, 0, 3}, {1, 7, 2}}) {
          same("matmul (S(0), B)", [&](const placement<1>& at) {
            return matmul(global_tensor<float, split<0>>::from_full(at, {m, k}, full({m, k}, 1)),
                          global_tensor<float, broadcast>::from_full(at, {k, n}, full({k, n}, 2)));
          });
          same("matmul (S(1), S(0)) -> P", [&](const placement<1>& at) {
            return matmul(global_tensor<float, split<1>>::from_full(at, {m, k}, full({m, k}, 3)),
                          global_tensor<float, split<0>>::from_full(at, {k, n}, full({k, n}, 4)));
          });
        }
        const shape_t s{5, 6};
        same("add", [&](const placement<1>& at) {
          return add(global_tensor<float, split<1>>::from_full(at, s, full(s, 5)),
                     global_tensor<float, split<1>>::from_full(at, s, full(s, 6)));
        });
        same("mul", [&](const placement<1>& at) {
          return mul(global_tensor<float, partial_sum>::from_full(at, s, full(s, 7)),
                     global_tensor<float, broadcast>::from_full(at, s, full(s, 8)));
        });
        same("relu", [&](const placement<1>& at) {
          return relu(global_tensor<float, split<0>>::from_full(at, s, full(s, 9)));
        });
        same("softmax<1>", [&](const placement<1>& at) {
          return softmax<1>(global_tensor<float, split<0>>::from_full(at, s, full(s, 10)));
        });
        same("reduce_sum<0> (S(0) -> P)", [&](const placement<1>& at) {
          return reduce_sum<0>(global_tensor<float, split<0>>::from_full(at, s, full(s, 11)));
        });
        same("embedding (S(0), B) -> P", [&](const placement<1>& at) {
          return embedding(
              global_tensor<float, split<0>>::from_full(at, {7, 3}, full({7, 3}, 12)),
              global_tensor<std::int64_t, broadcast>::from_full(at, {4}, std::vector<std::int64_t>{6, 0, 3, 3}));
        });
        const shape_t xs{3, 2, 4, 4}, ws{3, 2, 3, 3}, ys{3, 3, 4, 4};
        same("conv2d (S(0), B)", [&](const placement<1>& at) {
          return conv2d(global_tensor<float, split<0>>::from_full(at, xs, full(xs, 13)),
                        global_tensor<float, broadcast>::from_full(at, ws, full(ws, 14)), 1);
        });
        same("conv2d_grad_input (S(0), B)", [&](const placement<1>& at) {
          return conv2d_grad_input(global_tensor<float, split<0>>::from_full(at, ys, full(ys, 15)),
                                   global_tensor<float, broadcast>::from_full(at, ws, full(ws, 16)), 1);
        });
        same("conv2d_grad_weight (S(0), S(0)) -> P", [&](const placement<1>& at) {
          return conv2d_grad_weight(global_tensor<float, split<0>>::from_full(at, xs, full(xs, 17)),
                                    global_tensor<float, split<0>>::from_full(at, ys, full(ys, 18)), 1);
        });
        same("dynamic conv2d (S(1), S(1)) -> P", [&](const placement<1>& at) {
          return conv2d(dynamic_tensor<float, 1>::from_full(at, xs, nd_parallel{parallel::S(1)}, full(xs, 19)),
                        dynamic_tensor<float, 1>::from_full(at, ws, nd_parallel{parallel::S(1)}, full(ws, 20)), 1);
        });
      },
      flexpar::testing_support::with_timeout());
}

TEST(buffer_pool, placements_can_share_one_pool_or_cache_nothing) {
  run_in_process(
      2,
      [](communicator& comm) {
        auto shared = std::make_shared<buffer_pool>();
        placement<1> a(comm, {2}, {}, shared), b(comm, {2}, {}, shared);
        EXPECT_EQ(&a.pool(), &b.pool());
        placement<1> none(comm, {2}, {}, std::make_shared<buffer_pool>(0));
        {
          auto t = global_tensor<int, broadcast>::from_full(none, {4}, std::vector<int>{1, 2, 3, 4});
          EXPECT_EQ(to<split<0>>(to<split<0>>(std::move(t))).to_full(), (std::vector<int>{1, 2, 3, 4}));
        }
        EXPECT_EQ(none.pool().cached_bytes(), 0u);
      },
      flexpar::testing_support::with_timeout());
}

// ---- static mesh ---------------------------------------------------------------------------------

static_assert(static_mesh<2, 2>::cells == 4);
static_assert(static_mesh<2, 3>::extents == std::array<int, 2>{2, 3});
static_assert(static_mesh<2, 2>::mesh_rank == 2);
static_assert(std::is_base_of_v<placement<2>, static_mesh<2, 2>>);
// the route of a boxing on a static mesh is still a compile-time value
static_assert(route_of<sbp<split<0>, split<1>>, sbp<broadcast, broadcast>>.count == 2);

TEST(static_mesh, boxes_like_the_placement_it_is) {
  run_in_process(
      4,
      [](communicator& comm) {
        static_mesh<2, 2> mesh(comm);
        EXPECT_EQ(mesh.shape(), (std::array<int, 2>{2, 2}));
        int salt = 0;
        for_each_pair(two_axes{}, [&]<class From, class To>(From, To) {
          check_pair<std::int64_t, From, To>(mesh, {5, 3, 4}, ++salt);
        });
        static_mesh<4> line(comm);
        check_pair<float, split<1>, split<0>>(line, {3, 7}, 1);
      },
      flexpar::testing_support::with_timeout());
}

TEST(static_mesh, a_sub_mesh_takes_the_listed_ranks) {
  run_in_process(
      4,
      [](communicator& comm) {
        static_mesh<2> odd(comm, {1, 3});
        EXPECT_EQ(odd.contains_me(), comm.rank() % 2 == 1);
        const std::vector<float> full{1, 2, 3, 4, 5};
        auto t = global_tensor<float, split<0>>::from_full(odd, {5}, full);
        auto b = to<broadcast>(std::move(t));
        if (odd.contains_me()) {
          EXPECT_EQ(b.to_full(), full);
        }
      },
      flexpar::testing_support::with_timeout());
}

TEST(static_mesh, the_wrong_number_of_ranks_is_a_clear_error) {
  run_in_process(
      3,
      [](communicator& comm) {
        try {
          static_mesh<2, 2> mesh(comm);
          ADD_FAILURE() << "a 2 x 2 static mesh was built over 3 ranks";
        } catch (const usage_error& e) {
          const std::string text = e.what();
          EXPECT_NE(text.find("[rank " + std::to_string(comm.rank()) + "]"), std::string::npos) << text;
          EXPECT_NE(text.find("static_mesh<2, 2>: the mesh has 4 cells but the communicator has 3 ranks"),
                    std::string::npos)
              << text;
        }
        try {
          static_mesh<2> mesh(comm, {0, 1, 2});
          ADD_FAILURE() << "a static mesh of 2 was built over 3 listed ranks";
        } catch (const usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("static_mesh<2>: the mesh has 2 cells but the rank list has 3 ranks"),
                    std::string::npos)
              << e.what();
        }
        static_mesh<3> fits(comm);  // and the right size builds
        EXPECT_EQ(fits.size(), 3);
      },
      flexpar::testing_support::with_timeout());
}

}  // namespace
}  // namespace flexpar::sbp
