// Every boxing pair, 1-D and on 2 x 2 meshes, threads as ranks: box a tensor, gather it (to_full,
// which does not use boxing) and compare with the serial logical tensor it started from. Shapes are
// uneven for 2, 3 and 4 ranks, include an empty axis, and every tensor axis is split.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <numeric>
#include <tuple>
#include <utility>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "support/test_config.hpp"

#include "boxing_checks.hpp"

// GCC 12 pairs the replaced operator new/delete below with std::free and warns wrongly.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

// Allocations made by this thread (the identity-boxing test checks that boxing X -> X makes none).
namespace {
thread_local std::uint64_t allocations_here = 0;
}
// Every replaceable form of new and delete goes through malloc and free, so that sanitizers see matching
// pairs whichever form the standard library uses (std::stable_sort's buffer uses the nothrow form).
namespace {
void* counted_allocation(std::size_t n) noexcept {
  ++allocations_here;
  return std::malloc(n ? n : 1);
}
}  // namespace
void* operator new(std::size_t n) {
  if (void* p = counted_allocation(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted_allocation(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_allocation(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_allocation(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace flexpar::sbp {
namespace {

using namespace testing_support;

class boxing_1d : public ::testing::TestWithParam<int> {};

TEST_P(boxing_1d, every_pair_gives_back_the_logical_tensor) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        int salt = 0;
        for (const shape_t& shape : shapes())
          for_each_pair(one_axis{}, [&]<class From, class To>(From, To) {
            check_pair<std::int32_t, From, To>(mesh, shape, ++salt);
          });
        for_each_pair(list<split<1>, partial_sum, broadcast>{}, [&]<class From, class To>(From, To) {
          check_pair<double, From, To>(mesh, {3, 5}, ++salt);
          check_pair<float, From, To>(mesh, {6, 2}, ++salt);
        });
      },
      flexpar::testing_support::with_timeout());
}

// The packed layouts (S(i) -> B with i inner, S(i) -> S(j)) stream through staging slots of the
// transport or through shared-memory rounds. Small chunks (1, 3 and 5 elements, 2 or 3 slots) take
// the multi-chunk paths on small tensors, with row counts that are not multiples of the chunk;
// 40 elements take S(i) -> S(j)'s rounds of whole outer indices over several rounds: box_axis is
// called with its axis_view's staging set.
template <class From, class To>
void check_staged(const placement<1>& mesh, const shape_t& shape, const staging& stage, int salt) {
  using T = std::int32_t;
  const std::vector<T> full = logical<T>(shape, salt);
  auto t = global_tensor<T, From>::from_full(mesh, shape, full);
  axis_view<T> v{mesh.axis(0), shape, std::move(t).release(), mesh.pool(), stage};
  box_axis(v, From{}, To{});
  auto boxed = global_tensor<T, To>::adopt(mesh, shape, std::move(v.local));
  EXPECT_EQ(boxed.to_full(), full) << to_string<From>() << " -> " << to_string<To>() << " " << to_string(shape)
                                   << " chunk " << stage.chunk_bytes << " B, " << stage.slots << " slots, path "
                                   << static_cast<int>(stage.path) << ", rank " << mesh.parent().rank();
}

TEST_P(boxing_1d, packed_layouts_stream_across_chunk_boundaries) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        int salt = 0;
        for (const shape_t& shape : {shape_t{7, 13, 5}, shape_t{11, 6, 3}, shape_t{2, 9, 1}, shape_t{0, 3, 2}})
          for (const staging stage :
               {staging{4, 2, staged_path::transport}, staging{12, 3, staged_path::transport},
                staging{20, 2, staged_path::transport}, staging{4, 2, staged_path::shared_memory},
                staging{20, 2, staged_path::shared_memory}, staging{160, 2, staged_path::shared_memory}, staging{}}) {
            check_staged<split<1>, broadcast>(mesh, shape, stage, ++salt);
            check_staged<split<2>, broadcast>(mesh, shape, stage, ++salt);
            check_staged<split<0>, split<1>>(mesh, shape, stage, ++salt);
            check_staged<split<1>, split<0>>(mesh, shape, stage, ++salt);
            check_staged<split<1>, split<2>>(mesh, shape, stage, ++salt);
            check_staged<split<2>, split<1>>(mesh, shape, stage, ++salt);
            check_staged<split<0>, split<2>>(mesh, shape, stage, ++salt);
            check_staged<split<2>, split<0>>(mesh, shape, stage, ++salt);
          }
        // S(1) -> B into a destination of 4 MiB and more, placed with streaming stores (each run's
        // head and tail up to a line boundary through the cache): 256 and 255 columns, one chunk per
        // block and chunks of 1 KiB
        for (const shape_t& shape : {shape_t{4100, 256}, shape_t{4100, 255}})
          for (const staging stage : {staging{}, staging{4096, 2, staged_path::shared_memory}})
            check_staged<split<1>, broadcast>(mesh, shape, stage, ++salt);
        // S(0) -> S(1) with a result of 4 MiB and more on every rank: my own block goes from my shard
        // into the result with streaming stores, in the rounds' pack (4 198 400 bytes a rank). With
        // 255 columns results lie just under (through the cache): 4 182 000 bytes on 1 and 3 ranks;
        // on 2 and 4 ranks the ranks with a narrower block lie under, the others over. S(2) -> S(1)
        // and S(1) -> S(2) of [65600, 9, 8] stream it into a result where its runs are strided (at
        // least 4 198 400 bytes a rank on 1-4 ranks), the first also cutting each run of my shard
        // across several of the result's
        const std::size_t rows = 4100 * static_cast<std::size_t>(comm.size());
        for (const staging stage : {staging{}, staging{4096, 2, staged_path::shared_memory}}) {
          for (const shape_t& shape : {shape_t{rows, 256}, shape_t{rows, 255}})
            check_staged<split<0>, split<1>>(mesh, shape, stage, ++salt);
          check_staged<split<2>, split<1>>(mesh, shape_t{65600, 9, 8}, stage, ++salt);
          check_staged<split<1>, split<2>>(mesh, shape_t{65600, 9, 8}, stage, ++salt);
        }
      },
      flexpar::testing_support::with_timeout());
}

// P -> S(i) with i an inner axis: on one node the shared-memory rounds read every rank's strided
// rows where they lie and leave my block at the front of the buffer; with the transport the rows are
// packed first. Every rank holds its own summand (small integers: the sum is exact), against the
// serial reduction of all of them; chunks of 1, 5 and 40 elements take several rounds.
template <reduce_op Op, int I>
void check_partial_to_split(const placement<1>& mesh, const shape_t& shape, const staging& stage, int salt) {
  using T = std::int32_t;
  const int p = mesh.parent().size();
  std::vector<T> expected = logical<T>(shape, salt);
  for (int r = 1; r < p; ++r) {
    const std::vector<T> other = logical<T>(shape, salt + 7 * r);
    for (std::size_t e = 0; e < expected.size(); ++e)
      expected[e] = Op == reduce_op::sum ? expected[e] + other[e] : std::max(expected[e], other[e]);
  }
  auto t = global_tensor<T, partial<Op>>::from_local(mesh, shape, logical<T>(shape, salt + 7 * mesh.parent().rank()));
  axis_view<T> v{mesh.axis(0), shape, std::move(t).release(), mesh.pool(), stage};
  box_axis(v, partial<Op>{}, split<I>{});
  auto boxed = global_tensor<T, split<I>>::adopt(mesh, shape, std::move(v.local));
  EXPECT_EQ(boxed.to_full(), expected) << to_string<partial<Op>>() << " -> " << to_string<split<I>>() << " "
                                       << to_string(shape) << " chunk " << stage.chunk_bytes << " B, path "
                                       << static_cast<int>(stage.path) << ", rank " << mesh.parent().rank();
}

TEST_P(boxing_1d, partial_to_inner_split_reduces_strided_rows_where_they_lie) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        int salt = 0;
        for (const shape_t& shape : {shape_t{7, 13, 5}, shape_t{11, 6, 3}, shape_t{2, 9, 1}, shape_t{0, 3, 2},
                                     shape_t{5, 2, 4}, shape_t{3, 64, 2}})
          for (const staging stage :
               {staging{4, 2, staged_path::transport}, staging{4, 2, staged_path::shared_memory},
                staging{20, 2, staged_path::shared_memory}, staging{160, 2, staged_path::shared_memory}, staging{}}) {
            check_partial_to_split<reduce_op::sum, 1>(mesh, shape, stage, ++salt);
            check_partial_to_split<reduce_op::sum, 2>(mesh, shape, stage, ++salt);
            check_partial_to_split<reduce_op::sum, 0>(mesh, shape, stage, ++salt);
            check_partial_to_split<reduce_op::max, 1>(mesh, shape, stage, ++salt);
          }
        // MiB-sized summands, even and odd columns: in several rounds of outer indices, and in element
        // chunks of 32 elements, shorter than a run. Whether their lines are read in the fill (a source in
        // memory) follows this machine's cache; the_streaming_thresholds_change_no_result takes both forms.
        for (const shape_t& shape : {shape_t{4100, 256}, shape_t{4100, 255}})
          for (const staging stage : {staging{}, staging{128, 2, staged_path::shared_memory}})
            check_partial_to_split<reduce_op::sum, 1>(mesh, shape, stage, ++salt);
      },
      flexpar::testing_support::with_timeout());
}

// Whether data is taken to be in memory picks streaming stores for destinations
// (config::streaming_min_bytes) and, for sources (config::source_in_memory_min_bytes), inline run
// copies and, for P -> S(i), my runs' lines read in the fill: it must change no result. At 1 byte
// a path takes its in-memory form on small tensors (the tests above reach it only where a tensor
// reaches the default thresholds: 4 MiB for destinations, this machine's cache share for sources),
// at 0 (never) it does not; each of the four combinations.
// The boxing another memory runs (the device's: boxing/equal_blocks.hpp, padded blocks through
// collectives of equal blocks, and B -> S keeping rows in place only when they are the front), run
// here on host memory: a view that has the host's members but keeps only a front range, as the
// device view does, takes the generic overloads of box_axis for every pair. Uneven shapes, an empty
// axis, every tensor axis split; P holds a different summand on every rank (exact integer sums).
namespace {
template <class T>
struct equal_block_view : axis_view<T> {
  bool keep_range(std::size_t from, std::size_t count) {
    if (from != 0) return false;
    this->local.resize(count);
    return true;
  }
};

template <class From, class To>
void check_equal_blocks(const placement<1>& mesh, const shape_t& shape, int salt) {
  using T = std::int32_t;
  const int p = mesh.parent().size();
  std::vector<T> full = logical<T>(shape, salt);
  aligned_vector<T> mine;
  if constexpr (nd_of<From>::value[0].is_partial()) {  // rank r holds summand r; the logical tensor is their sum
    mine = mesh.pool().acquire_copy(std::span<const T>(logical<T>(shape, salt + 7 * mesh.parent().rank())));
    std::fill(full.begin(), full.end(), T{0});
    for (int r = 0; r < p; ++r) {
      const std::vector<T> summand = logical<T>(shape, salt + 7 * r);
      for (std::size_t e = 0; e < full.size(); ++e) full[e] += summand[e];
    }
  } else {
    mine = global_tensor<T, From>::from_full(mesh, shape, full).release();
  }
  equal_block_view<T> v{{mesh.axis(0), shape, std::move(mine), mesh.pool()}};
  box_axis(v, From{}, To{});
  auto boxed = global_tensor<T, To>::adopt(mesh, shape, std::move(v.local));
  EXPECT_EQ(boxed.to_full(), full) << to_string<From>() << " -> " << to_string<To>() << " " << to_string(shape)
                                   << ", rank " << mesh.parent().rank();
}
}  // namespace

TEST_P(boxing_1d, the_equal_block_scripts_of_other_memories_give_back_the_logical_tensor) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        using P = partial<reduce_op::sum>;
        int salt = 0;
        for (const shape_t& shape :
             {shape_t{7, 13, 5}, shape_t{2, 9, 1}, shape_t{0, 3, 2}, shape_t{5, 2, 4}, shape_t{8, 4, 2}}) {
          check_equal_blocks<P, split<0>>(mesh, shape, ++salt);
          check_equal_blocks<P, split<1>>(mesh, shape, ++salt);
          check_equal_blocks<P, split<2>>(mesh, shape, ++salt);
          check_equal_blocks<P, broadcast>(mesh, shape, ++salt);
          check_equal_blocks<split<0>, broadcast>(mesh, shape, ++salt);
          check_equal_blocks<split<1>, broadcast>(mesh, shape, ++salt);
          check_equal_blocks<split<2>, broadcast>(mesh, shape, ++salt);
          check_equal_blocks<split<0>, split<1>>(mesh, shape, ++salt);
          check_equal_blocks<split<1>, split<0>>(mesh, shape, ++salt);
          check_equal_blocks<split<1>, split<2>>(mesh, shape, ++salt);
          check_equal_blocks<split<2>, split<0>>(mesh, shape, ++salt);
          check_equal_blocks<broadcast, split<0>>(mesh, shape, ++salt);
          check_equal_blocks<broadcast, split<1>>(mesh, shape, ++salt);
          check_equal_blocks<broadcast, P>(mesh, shape, ++salt);
          check_equal_blocks<split<1>, P>(mesh, shape, ++salt);
        }
      },
      flexpar::testing_support::with_timeout());
}

TEST_P(boxing_1d, the_streaming_thresholds_change_no_result) {
  for (const auto& [threshold, source_threshold] :
       {std::pair<std::size_t, std::size_t>{1, 1}, {0, 0}, {1, 0}, {0, 1}}) {
    config cfg = flexpar::testing_support::with_timeout();
    cfg.streaming_min_bytes = threshold;
    cfg.source_in_memory_min_bytes = source_threshold;
    run_in_process(
        GetParam(),
        [threshold, source_threshold](communicator& comm) {
          SCOPED_TRACE("streaming_min_bytes " + std::to_string(threshold) + ", source_in_memory_min_bytes " +
                       std::to_string(source_threshold));
          placement<1> mesh(comm, {comm.size()});
          int salt = 0;
          for (const shape_t& shape : {shape_t{7, 13, 5}, shape_t{11, 6, 3}, shape_t{0, 3, 2}, shape_t{3, 64, 2}}) {
            for_each_pair(one_axis{}, [&]<class From, class To>(From, To) {
              check_pair<std::int32_t, From, To>(mesh, shape, ++salt);
            });
            for (const staging stage : {staging{20, 2, staged_path::shared_memory}, staging{}}) {
              check_staged<split<1>, broadcast>(mesh, shape, stage, ++salt);
              check_staged<split<2>, broadcast>(mesh, shape, stage, ++salt);
              check_staged<split<0>, split<1>>(mesh, shape, stage, ++salt);
              check_staged<split<2>, split<1>>(mesh, shape, stage, ++salt);
              check_partial_to_split<reduce_op::sum, 1>(mesh, shape, stage, ++salt);
              check_partial_to_split<reduce_op::sum, 2>(mesh, shape, stage, ++salt);
            }
          }
        },
        cfg);
  }
}

INSTANTIATE_TEST_SUITE_P(worlds, boxing_1d, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::string("p").append(std::to_string(info.param)); });

// ---- routes are compile-time values ----------------------------------------------------------------

static_assert(route_of<split<0>, split<0>>.count == 0);
static_assert(route_of<partial_sum, broadcast>.count == 1);
static_assert(route_of<partial_sum, partial<reduce_op::max>>.count == 2);  // through B
static_assert(!route_of<sbp<split<0>, split<1>>, sbp<broadcast, broadcast>>.through_broadcast);
// (B, S(0)) -> (S(0), S(0)): axis 0 cannot split rows that axis 1 already splits; the route goes through B
static_assert(route_of<sbp<broadcast, split<0>>, sbp<split<0>, split<0>>>.through_broadcast);
static_assert(route_of<sbp<partial_sum, split<1>>, sbp<broadcast, broadcast>>.count == 2);

TEST(boxing, identity_allocates_and_copies_nothing) {
  run_in_process(
      1,
      [](communicator& comm) {
        placement<1> mesh(comm, {1});
        const std::vector<float> full = logical<float>({4, 4}, 1);
        auto t = global_tensor<float, split<0>>::from_full(mesh, {4, 4}, full);
        const float* data = t.to_local().data();
        const std::uint64_t before = allocations_here;
        auto&& same = to<split<0>>(t);
        auto moved = to<split<0>>(std::move(t));
        const std::uint64_t made = allocations_here - before;
        EXPECT_EQ(&same, &t);
        EXPECT_EQ(moved.to_local().data(), data);
        EXPECT_EQ(made, 0u) << "identity boxing allocated";
        EXPECT_EQ(moved.to_full(), full);
      },
      flexpar::testing_support::with_timeout());
}

TEST(boxing, scatter_from_a_root_equals_from_full) {
  run_in_process(
      4,
      [](communicator& comm) {
        placement<2> mesh(comm, {2, 2});
        const shape_t shape{5, 3};
        const std::vector<float> full = logical<float>(shape, 9);
        for (int root : {0, 3}) {
          const std::span<const float> given =
              mesh.my_index() == root ? std::span<const float>(full) : std::span<const float>();
          auto t = global_tensor<float, sbp<split<0>, partial_sum>>::scatter(mesh, shape, given, root);
          auto u = global_tensor<float, sbp<split<0>, partial_sum>>::from_full(mesh, shape, full);
          EXPECT_TRUE(std::ranges::equal(t.to_local(), u.to_local())) << "root " << root;
          EXPECT_EQ(t.to_full(), full);
        }
      },
      flexpar::testing_support::with_timeout());
}

TEST(boxing, cost_comes_from_the_collectives) {
  run_in_process(
      4,
      [](communicator& comm) {
        placement<1> mesh(comm, {4});
        const shape_t shape{1024, 256};
        const double bytes = 1024.0 * 256 * 4;
        const cost ar = boxing_cost<partial_sum, broadcast>(shape, mesh);
        EXPECT_DOUBLE_EQ(ar.wire_bytes, allreduce_ring_cost(4, bytes).wire_bytes);
        EXPECT_DOUBLE_EQ((boxing_cost<split<0>, broadcast>(shape, mesh).wire_bytes),
                         allgather_ring_cost(4, bytes).wire_bytes);
        EXPECT_DOUBLE_EQ((boxing_cost<partial_sum, split<1>>(shape, mesh).wire_bytes),
                         reduce_scatter_ring_cost(4, bytes).wire_bytes);
        EXPECT_DOUBLE_EQ((boxing_cost<split<0>, split<1>>(shape, mesh).wire_bytes),
                         alltoall_pairwise_cost(4, bytes / 4).wire_bytes);
        EXPECT_EQ((boxing_cost<broadcast, split<0>>(shape, mesh).wire_bytes), 0.0);
        EXPECT_EQ((boxing_cost<split<1>, split<1>>(shape, mesh).wire_bytes), 0.0);
      },
      flexpar::testing_support::with_timeout());
}

TEST(boxing, names_follow_oneflow) {
  EXPECT_EQ(to_string<split<0>>(), "S(0)");
  EXPECT_EQ(to_string<broadcast>(), "B");
  EXPECT_EQ(to_string<partial_sum>(), "P(sum)");
  EXPECT_EQ((to_string<sbp<split<0>, broadcast>>()), "(S(0), B)");
  EXPECT_EQ((to_string<sbp<partial<reduce_op::max>, split<1>>>()), "(P(max), S(1))");
}

TEST(boxing, bad_input_is_a_clear_error) {
  run_in_process(
      2,
      [](communicator& comm) {
        placement<1> mesh(comm, {2});
        try {
          (void)global_tensor<float, split<2>>::from_full(mesh, {4, 4}, std::vector<float>(16));
          ADD_FAILURE() << "split of a missing axis accepted";
        } catch (const usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("splits tensor axis 2 but the shape [4, 4] has 2 axes"),
                    std::string::npos)
              << e.what();
        }
        try {  // to<S> of an axis the tensor lacks: to<>, the source SBP, the shape and what would work
          auto t = global_tensor<float, split<1>>::from_full(mesh, {4, 6}, std::vector<float>(24));
          (void)to<split<2>>(std::move(t));
          ADD_FAILURE() << "to<S(2)> of a 2-axis tensor accepted";
        } catch (const usage_error& e) {
          const std::string expected = "[rank " + std::to_string(comm.rank()) +
                                       "] to<S(2)>: cannot box the S(1) tensor of shape [4, 6] to S(2): mesh axis 0 "
                                       "would split tensor axis 2, but the tensor has 2 axes; mesh axis 0 can take "
                                       "S(0) ... S(1), B or P";
          EXPECT_EQ(std::string(e.what()), expected);
        }
        try {
          (void)global_tensor<float, split<0>>::from_local(mesh, {5, 2}, std::vector<float>(3));
          ADD_FAILURE() << "wrong shard size accepted";
        } catch (const usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("S(0)"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find(comm.rank() == 0 ? "shard of 6 elements [3, 2]"
                                                                : "shard of 4 elements [2, 2]"),
                    std::string::npos)
              << e.what();
        }
        EXPECT_THROW(placement<2>(comm, {2, 2}), usage_error);
      },
      flexpar::testing_support::with_timeout());
}

}  // namespace
}  // namespace flexpar::sbp
