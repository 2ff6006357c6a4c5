// SBP global tensors in device memory (flexpar/cuda/sbp.hpp), threads as ranks on one GPU: every
// boxing pair on 1-4 ranks and on a 2 x 2 mesh gives back the logical tensor it started from (gathered
// by to_full, which does not box) and the same shard as the host boxing of the same source; identity
// boxing allocates and copies nothing; the device ops against the host ops and the serial results on
// the same inputs (small integers: exact in f32 and bf16), with P(sum) operands whose parts differ on
// every rank, uneven splits, and on 1-D meshes of 1-3 ranks and a 2 x 2 mesh; the run-time form's
// conversions (from, as<S>() and its error, to_host, release, adopt).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/cuda/sbp.hpp>
#include <flexpar/cuda/sbp_dynamic.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "sbp/boxing_checks.hpp"
#include "support/test_config.hpp"

namespace flexpar::sbp {
namespace {

using namespace testing_support;
using namespace std::chrono_literals;

/// One pair on the device: the host source (distinct partials), its device copy boxed by the consuming
/// and by the const form, each compared with the logical tensor and with the host boxing's shard.
template <class T, class From, class To, std::size_t N>
void check_device_pair(const cuda::device_placement<N>& gpu, const shape_t& shape, int salt) {
  const std::string what = to_string<From>() + " -> " + to_string<To>() + " " + to_string(shape) + " on rank " +
                           std::to_string(gpu.parent().rank());
  const std::vector<T> full = logical<T>(shape, salt);
  const auto source = distinct_source<T, From>(gpu.host(), shape, full, salt);
  auto&& on_host = to<To>(source);
  const std::vector<T> host_shard(on_host.to_local().begin(), on_host.to_local().end());

  auto device = to_device(source, gpu);
  auto&& kept = to<To>(device);  // the const form: device stays usable
  EXPECT_EQ(kept.to_full(), full) << what << " (const form)";
  EXPECT_EQ(device.to_full(), full) << what << ": the source changed";
  auto boxed = to<To>(std::move(device));
  EXPECT_EQ(boxed.local_shape(), boxed.my_box().extent) << what;
  EXPECT_EQ(boxed.to_local().size(), elements_of(boxed.local_shape())) << what;
  EXPECT_EQ(boxed.download(), host_shard) << what << ": the device shard differs from the host boxing's";
  EXPECT_EQ(boxed.to_full(), full) << what;
}

class device_boxing_1d : public ::testing::TestWithParam<int> {};

TEST_P(device_boxing_1d, every_pair_gives_back_the_logical_tensor_and_the_host_shard) {
  run_in_process(
      GetParam(),
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        int salt = 0;
        for (const shape_t& shape : shapes())
          for_each_pair(one_axis{}, [&]<class From, class To>(From, To) {
            check_device_pair<std::int32_t, From, To>(gpu, shape, ++salt);
          });
        for_each_pair(list<split<1>, partial_sum, broadcast>{}, [&]<class From, class To>(From, To) {
          check_device_pair<double, From, To>(gpu, {3, 5}, ++salt);
          check_device_pair<float, From, To>(gpu, {6, 2}, ++salt);
        });
      },
      flexpar::testing_support::with_timeout(120s));
}

INSTANTIATE_TEST_SUITE_P(ranks, device_boxing_1d, ::testing::Values(1, 2, 3, 4));

TEST(device_boxing_2x2, every_nd_route_gives_back_the_logical_tensor_and_the_host_shard) {
  run_in_process(
      4,
      [](communicator& comm) {
        placement<2> mesh(comm, {2, 2});
        cuda::device_placement gpu(mesh, 0);
        int salt = 0;
        for (const shape_t& shape : {shape_t{4, 6, 2}, shape_t{5, 3, 7}, shape_t{3, 1, 4}})
          for_each_pair(two_axes{}, [&]<class From, class To>(From, To) {
            check_device_pair<std::int32_t, From, To>(gpu, shape, ++salt);
          });
      },
      flexpar::testing_support::with_timeout(180s));
}

TEST(device_boxing, identity_allocates_and_copies_nothing) {
  run_in_process(
      2,
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        const shape_t shape{6, 4};
        auto t = global_tensor<float, split<0>, memory::cuda>::from_full(gpu, shape, logical<float>(shape, 1));
        const auto before = gpu.pool().stats();
        const float* data = t.to_local().data();
        auto&& same = to<split<0>>(t);
        auto moved = to<split<0>>(std::move(t));
        const auto after = gpu.pool().stats();
        EXPECT_EQ(&same, &t);
        EXPECT_EQ(moved.to_local().data(), data);
        EXPECT_EQ(after.misses, before.misses);
        EXPECT_EQ(after.hits, before.hits);
      },
      flexpar::testing_support::with_timeout(60s));
}

/// A placement change of a device tensor: the logical tensor on the destination, and the same shard as
/// the host's placement change of the same source (partials distinct by rank).
template <class From, class To, std::size_t N1, std::size_t N2>
void check_device_move(const cuda::device_placement<N1>& a, const cuda::device_placement<N2>& b, const shape_t& shape,
                       int salt) {
  const std::vector<std::int32_t> full = logical<std::int32_t>(shape, salt);
  const auto source = distinct_source<std::int32_t, From>(a.host(), shape, full, salt);
  const auto on_host = to<To>(source, b.host());
  const auto moved = to<To>(to_device(source, a), b);
  static_assert(std::is_same_v<std::remove_cvref_t<decltype(moved)>, global_tensor<std::int32_t, To, memory::cuda>>);
  const std::string what = to_string<From>() + " on " + a.describe() + " -> " + to_string<To>() + " on " +
                           b.describe() + " " + to_string(shape);
  const std::vector<std::int32_t> host_shard(on_host.to_local().begin(), on_host.to_local().end());
  EXPECT_EQ(moved.download(), host_shard) << what;
  if (b.contains_me()) {
    EXPECT_EQ(moved.to_full(), full) << what;
  }
}

TEST(device_boxing, placement_changes_keep_the_logical_tensor) {
  run_in_process(
      4,
      [](communicator& comm) {
        placement<1> all(comm, {4}), first3(comm, {3}, {0, 1, 2}), last(comm, {1}, {3}), one(comm, {1}, {0}),
            middle(comm, {2}, {2, 1});
        placement<2> grid(comm, {2, 2});
        cuda::device_placement d_all(all, 0), d_first3(first3, 0), d_last(last, 0), d_one(one, 0), d_middle(middle, 0);
        cuda::device_placement d_grid(grid, 0);
        int salt = 0;
        for (const shape_t& shape : {shape_t{5, 3}, shape_t{7, 2}, shape_t{0, 4}}) {
          check_device_move<split<0>, broadcast>(d_first3, d_last, shape, ++salt);                // 3 -> 1
          check_device_move<broadcast, split<1>>(d_one, d_all, shape, ++salt);                    // 1 -> 4
          check_device_move<split<1>, split<0>>(d_first3, d_middle, shape, ++salt);               // 3 -> 2, reordered
          check_device_move<partial_sum, split<0>>(d_all, d_first3, shape, ++salt);               // P source
          check_device_move<split<0>, partial_sum>(d_middle, d_all, shape, ++salt);               // P target
          check_device_move<sbp<split<0>, split<1>>, split<0>>(d_grid, d_first3, shape, ++salt);  // 2-D -> 1-D
          check_device_move<sbp<partial_sum, split<0>>, sbp<split<1>, partial_sum>>(d_grid, d_grid, shape, ++salt);
        }
      },
      flexpar::testing_support::with_timeout(std::chrono::seconds(120)));
}

/// cuda::copy_box against the host copy_box on the same boxes: the destination starts as a pattern
/// (what the box does not cover must stay), element sizes 1, 2, 4, 8 and 16 bytes, offsets that make
/// every chunk width (1 ... 16 bytes) the widest that divides run, strides and addresses.
template <class T>
void check_copy_box(const shape_t& src_shape, const shape_t& src_at, const shape_t& dst_shape, const shape_t& dst_at,
                    const shape_t& extent, cudaStream_t s) {
  std::vector<T> src(elements_of(src_shape)), dst(elements_of(dst_shape));
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<T>(i % 251 + 1);
  for (std::size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<T>(i % 7 + 300);
  const auto d_src = cuda::to_device(std::span<const T>(src), s);
  auto d_dst = cuda::to_device(std::span<const T>(dst), s);
  cuda::copy_box<T>(cuda::device_span<const T>(d_src.span()), src_shape, src_at, d_dst.span(), dst_shape, dst_at,
                    extent, s);
  copy_box<T>(src, src_shape, src_at, std::span<T>(dst), dst_shape, dst_at, extent);
  EXPECT_EQ(cuda::to_host(cuda::device_span<const T>(d_dst.span()), s, std::chrono::seconds(30), "copy_box"), dst)
      << sizeof(T) << "-byte elements, box " << to_string(extent) << " at " << to_string(src_at) << " of "
      << to_string(src_shape) << " to " << to_string(dst_at) << " of " << to_string(dst_shape);
}

template <class T>
void check_copy_boxes(cudaStream_t s) {
  // (src shape, src offset, dst shape, dst offset, extent)
  const std::vector<std::array<shape_t, 5>> cases = {
      {shape_t{37}, {5}, {40}, {1}, {30}},                               // one run (cudaMemcpyAsync)
      {shape_t{8, 64}, {0, 16}, {8, 32}, {0, 0}, {8, 32}},               // a split inner axis: aligned rows
      {shape_t{8, 64}, {1, 3}, {9, 33}, {2, 1}, {5, 29}},                // odd offsets and widths
      {shape_t{6, 10}, {0, 0}, {6, 10}, {0, 0}, {6, 10}},                // whole: folds to one run
      {shape_t{3, 7, 10}, {1, 2, 4}, {4, 8, 12}, {0, 1, 2}, {2, 5, 6}},  // two outer axes
      {shape_t{4, 6, 8}, {0, 0, 4}, {4, 6, 4}, {0, 0, 0}, {4, 6, 4}},    // S(2) block of a 3-D tensor
      {shape_t{2, 3, 4, 6}, {1, 0, 1, 2}, {1, 3, 4, 4}, {0, 0, 0, 1}, {1, 3, 3, 3}},
      {shape_t{4, 1, 5, 3, 2}, {1, 0, 2, 0, 0}, {3, 1, 3, 3, 2}, {0, 0, 0, 0, 0}, {3, 1, 3, 3, 2}},
      {shape_t{5, 0, 3}, {0, 0, 0}, {5, 0, 3}, {0, 0, 0}, {5, 0, 3}},  // empty
      {shape_t{}, {}, {}, {}, {}},                                     // a scalar
  };
  for (const auto& c : cases) check_copy_box<T>(c[0], c[1], c[2], c[3], c[4], s);
}

struct sixteen_bytes {
  std::uint64_t lo = 0, hi = 0;
  sixteen_bytes() = default;
  explicit sixteen_bytes(std::size_t v) : lo(v), hi(~v) {}
  friend bool operator==(const sixteen_bytes&, const sixteen_bytes&) = default;
  friend std::ostream& operator<<(std::ostream& o, const sixteen_bytes& v) { return o << v.lo; }
};

TEST(device_copy_box, matches_the_host_copy_box_for_every_chunk_width) {
  const cuda::device_guard on(0);
  const cuda::stream s;
  check_copy_boxes<std::uint8_t>(s);
  check_copy_boxes<std::uint16_t>(s);
  check_copy_boxes<float>(s);
  check_copy_boxes<double>(s);
  check_copy_boxes<sixteen_bytes>(s);
}

TEST(device_tensor, round_trips_through_the_host_and_names_a_foreign_placement) {
  run_in_process(
      3,
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()}), other(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        const shape_t shape{7, 5};
        const auto full = logical<std::int32_t>(shape, 3);
        const auto h = global_tensor<std::int32_t, split<1>>::from_full(mesh, shape, full);
        const auto d = to_device(h, gpu);
        EXPECT_EQ(d.local_shape(), h.local_shape());
        const auto back = to_host(d);
        EXPECT_EQ(back.to_full(), full);
        EXPECT_TRUE(back.where() == mesh);
        const auto foreign = global_tensor<std::int32_t, split<1>>::from_full(other, shape, full);
        try {
          (void)to_device(foreign, gpu);
          ADD_FAILURE() << "a host tensor of another placement was copied";
        } catch (const usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("to_device"), std::string::npos) << e.what();
        }
        // a device shard of the wrong size is refused, naming both sizes
        cuda::device_buffer<std::int32_t> wrong(3);
        EXPECT_THROW((void)(global_tensor<std::int32_t, split<1>, memory::cuda>::from_local(
                         gpu, shape, cuda::device_span<const std::int32_t>(wrong.span()))),
                     usage_error);
      },
      flexpar::testing_support::with_timeout(60s));
}

TEST(device_dynamic_tensor, from_as_to_host_release_and_adopt_keep_the_shard) {
  run_in_process(
      3,
      [](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        const shape_t shape{7, 4};  // 7 rows over 3 ranks: shards of 3, 2 and 2 rows
        const auto full = logical<float>(shape, 5);
        using dyn = dynamic_tensor<float, 1, memory::cuda>;
        // static -> run-time (no copy: the same device block) -> static
        auto s = global_tensor<float, split<0>, memory::cuda>::from_full(gpu, shape, full);
        const std::vector<float> shard = s.download();
        const float* block = s.to_local().data();
        dyn d = dyn::from(std::move(s));
        EXPECT_EQ(d.layout(), nd_parallel{parallel::S(0)});
        EXPECT_EQ(d.shape(), shape);
        EXPECT_EQ(d.to_local().data(), block) << "from() copied the shard";
        EXPECT_EQ(d.download(), shard);
        EXPECT_EQ(d.to_full(), full);
        // as<S>() of another SBP: an error naming both, the tensor kept
        try {
          (void)std::move(d).as<broadcast>();
          ADD_FAILURE() << "as<broadcast>() of an S(0) tensor succeeded";
        } catch (const usage_error& e) {
          const std::string text = e.what();
          EXPECT_NE(text.find("dynamic_tensor::as"), std::string::npos) << text;
          EXPECT_NE(text.find("S(0)"), std::string::npos) << text;
          EXPECT_NE(text.find("B"), std::string::npos) << text;
          EXPECT_NE(text.find("[rank " + std::to_string(comm.rank()) + "]"), std::string::npos) << text;
        }
        EXPECT_EQ(d.download(), shard) << "a refused as<S>() changed the shard";
        // to_host: the same logical tensor and layout on the placement's host side
        const dynamic_tensor<float, 1> h = to_host(d);
        EXPECT_TRUE(h.where() == mesh);
        EXPECT_EQ(h.layout(), d.layout());
        EXPECT_EQ(std::vector<float>(h.to_local().begin(), h.to_local().end()), shard);
        EXPECT_EQ(h.to_full(), full);
        // boxed at run time, then back to its static type
        dyn b = to(std::move(d), nd_parallel{parallel::B()});
        auto whole = std::move(b).as<broadcast>();
        EXPECT_EQ(whole.download(), full);
        // release() hands the shard out and leaves the tensor empty; adopt() takes it (same block), and
        // refuses a shard of another size naming both sizes
        dyn r = dyn::from(std::move(whole));
        const float* whole_block = r.to_local().data();
        cuda::device_shard<float> taken = std::move(r).release();
        EXPECT_EQ(r.to_local().size(), 0u);
        EXPECT_EQ(taken.count, full.size());
        dyn again = dyn::adopt(gpu, shape, nd_parallel{parallel::B()}, std::move(taken));
        EXPECT_EQ(again.to_local().data(), whole_block);
        EXPECT_EQ(again.to_full(), full);
        try {
          (void)dyn::adopt(gpu, shape, nd_parallel{parallel::S(0)}, dyn::acquire(gpu, 5));
          ADD_FAILURE() << "adopt() took a shard of the wrong size";
        } catch (const usage_error& e) {
          const std::string text = e.what();
          EXPECT_NE(text.find("5 were given"), std::string::npos) << text;
          EXPECT_NE(text.find(std::to_string(shard.size()) + " elements"), std::string::npos) << text;
        }
      },
      flexpar::testing_support::with_timeout(60s));
}

/// Runs `body(mesh, gpu)` on `world` thread ranks sharing GPU 0: a 1-D mesh of every rank and its
/// device side.
template <class Body>
void on_one_gpu(int world, Body body) {
  run_in_process(
      world,
      [&](communicator& comm) {
        placement<1> mesh(comm, {comm.size()});
        cuda::device_placement gpu(mesh, 0);
        body(mesh, gpu);
      },
      flexpar::testing_support::with_timeout(std::chrono::seconds(120)));
}

/// True when a mesh axis of S is partial.
template <class S>
constexpr bool has_partial() {
  for (std::size_t d = 0; d < nd_of<S>::mesh_rank; ++d)
    if (nd_of<S>::value[d].is_partial()) return true;
  return false;
}

/// Integers in [-2, 2] from logical (every product and sum of the matmuls here is exact in f32 and bf16).
std::vector<float> small_values(const shape_t& shape, int salt) {
  std::vector<float> out = logical<float>(shape, salt);
  for (float& x : out) x = static_cast<float>((static_cast<int>(x) + 11) % 5 - 2);
  return out;
}

/// matmul of device tensors against the host matmul of the same inputs and against the serial product.
/// Each operand is built from its logical values by distinct_source: a P(sum) operand holds a
/// different non-zero part on every rank (not the whole on one rank and zeros elsewhere).
template <class T, class A, class B, std::size_t N>
void check_matmul(const cuda::device_placement<N>& gpu, const shape_t& sa, const shape_t& sb, int salt) {
  const auto fa = small_values(sa, salt), fb = small_values(sb, salt + 1);
  std::vector<T> ta(fa.size()), tb(fb.size());
  for (std::size_t i = 0; i < fa.size(); ++i) ta[i] = static_cast<T>(fa[i]);
  for (std::size_t i = 0; i < fb.size(); ++i) tb[i] = static_cast<T>(fb[i]);
  const auto ha = distinct_source<float, A>(gpu.host(), sa, fa, salt);
  const auto hb = distinct_source<float, B>(gpu.host(), sb, fb, salt + 1);
  const auto expected = matmul(ha, hb).to_full();
  std::vector<float> serial(sa[0] * sb[1], 0.0f);  // the oracle: the product of the logical operands
  for (std::size_t i = 0; i < sa[0]; ++i)
    for (std::size_t k = 0; k < sa[1]; ++k)
      for (std::size_t j = 0; j < sb[1]; ++j) serial[i * sb[1] + j] += fa[i * sa[1] + k] * fb[k * sb[1] + j];
  ASSERT_EQ(expected, serial) << "the host matmul " << to_string<A>() << " x " << to_string<B>();
  auto device_operand = [&]<class S>(S, const shape_t& shape, const std::vector<T>& values, int s) {
    if constexpr (std::is_same_v<T, float>) {
      return to_device(distinct_source<T, S>(gpu.host(), shape, values, s), gpu);
    } else {  // bf16 has no arithmetic on the host to split parts with: layouts without a partial axis
      static_assert(!has_partial<S>(), "a bf16 operand here is split or broadcast");
      return global_tensor<T, S, memory::cuda>::from_full(gpu, shape, values);
    }
  };
  const auto da = device_operand(A{}, sa, ta, salt);
  const auto db = device_operand(B{}, sb, tb, salt + 1);
  const auto dc = matmul(da, db);
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(dc)>::sbp_type,
                               typename std::remove_cvref_t<decltype(matmul(ha, hb))>::sbp_type>);
  const auto got = dc.to_full();
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(static_cast<float>(got[i]), expected[i]) << to_string<A>() << " x " << to_string<B>() << " i " << i;
}

/// add, mul and relu of device tensors of layout S against the serial results and the host ops; with
/// a partial axis in S, add (P + P -> P) and mul by the partner layout W (P x B -> P) only (mul of two
/// partials and relu of one have no signature). The operands' partial parts differ on every rank.
template <class S, class W, std::size_t N>
void check_elementwise(const cuda::device_placement<N>& gpu, const shape_t& shape, int salt) {
  const std::string what = to_string<S>() + " " + to_string(shape) + " on rank " + std::to_string(gpu.parent().rank());
  const auto fa = logical<float>(shape, salt), fb = logical<float>(shape, salt + 1);
  std::vector<float> sum(fa.size()), product(fa.size()), rectified(fa.size());
  for (std::size_t i = 0; i < fa.size(); ++i) {
    sum[i] = fa[i] + fb[i];
    product[i] = fa[i] * fb[i];
    rectified[i] = std::max(fa[i], 0.0f);
  }
  const auto ha = distinct_source<float, S>(gpu.host(), shape, fa, salt);
  const auto hb = distinct_source<float, S>(gpu.host(), shape, fb, salt + 1);
  const auto da = to_device(ha, gpu), db = to_device(hb, gpu);
  EXPECT_EQ(add(da, db).to_full(), sum) << "add " << what;
  EXPECT_EQ(add(ha, hb).to_full(), sum) << "the host add " << what;
  const auto hw = distinct_source<float, W>(gpu.host(), shape, fb, salt + 2);
  const auto dw = to_device(hw, gpu);
  EXPECT_EQ(mul(da, dw).to_full(), product) << "mul by " << to_string<W>() << " " << what;
  EXPECT_EQ(mul(ha, hw).to_full(), product) << "the host mul " << what;
  if constexpr (!has_partial<S>()) {
    EXPECT_EQ(relu(da).to_full(), rectified) << "relu " << what;
    EXPECT_EQ(relu(ha).to_full(), rectified) << "the host relu " << what;
  }
}

TEST(device_ops, matmul_add_mul_relu_match_the_host_ops_and_the_serial_results) {
  for (int world : {1, 2, 3})
    on_one_gpu(world, [](const placement<1>&, const cuda::device_placement<1>& gpu) {
      for (const auto& [sa, sb] : {std::pair{shape_t{7, 5}, shape_t{5, 4}}, std::pair{shape_t{4, 9}, shape_t{9, 6}},
                                   std::pair{shape_t{3, 0}, shape_t{0, 2}}}) {
        check_matmul<float, split<0>, broadcast>(gpu, sa, sb, 1);
        check_matmul<float, broadcast, split<1>>(gpu, sa, sb, 2);
        check_matmul<float, split<1>, split<0>>(gpu, sa, sb, 3);
        check_matmul<float, partial_sum, broadcast>(gpu, sa, sb, 6);  // P x B -> P: parts on every rank
        check_matmul<float, broadcast, partial_sum>(gpu, sa, sb, 7);
        check_matmul<bfloat16, split<0>, broadcast>(gpu, sa, sb, 4);
        check_matmul<bfloat16, split<1>, split<0>>(gpu, sa, sb, 5);
      }
      int salt = 10;
      // 7 and 5 rows split unevenly over 2 and 3 ranks; a column of one; no rows
      for (const shape_t& shape : {shape_t{6, 5}, shape_t{7, 3}, shape_t{5, 1}, shape_t{0, 4}}) {
        check_elementwise<split<0>, split<0>>(gpu, shape, ++salt);
        check_elementwise<split<1>, split<1>>(gpu, shape, ++salt);
        check_elementwise<broadcast, broadcast>(gpu, shape, ++salt);
        check_elementwise<partial_sum, broadcast>(gpu, shape, ++salt);
      }
    });
}

TEST(device_ops, matmul_and_elementwise_ops_on_a_2x2_mesh_match_the_serial_results) {
  run_in_process(
      4,
      [](communicator& comm) {
        placement<2> mesh(comm, {2, 2});
        cuda::device_placement gpu(mesh, 0);
        for (const auto& [sa, sb] :
             {std::pair{shape_t{7, 5}, shape_t{5, 3}}, std::pair{shape_t{4, 6}, shape_t{6, 5}}}) {
          check_matmul<float, sbp<split<0>, broadcast>, sbp<broadcast, split<1>>>(gpu, sa, sb, 1);     // (S0, S1)
          check_matmul<float, sbp<split<0>, split<1>>, sbp<broadcast, split<0>>>(gpu, sa, sb, 2);      // (S0, P)
          check_matmul<float, sbp<partial_sum, split<0>>, sbp<broadcast, broadcast>>(gpu, sa, sb, 3);  // (P, S0)
          check_matmul<bfloat16, sbp<split<0>, broadcast>, sbp<broadcast, split<1>>>(gpu, sa, sb, 4);
        }
        int salt = 20;
        for (const shape_t& shape : {shape_t{7, 5}, shape_t{5, 3}, shape_t{2, 1}}) {
          check_elementwise<sbp<split<0>, split<1>>, sbp<split<0>, split<1>>>(gpu, shape, ++salt);
          check_elementwise<sbp<split<1>, broadcast>, sbp<split<1>, broadcast>>(gpu, shape, ++salt);
          check_elementwise<sbp<partial_sum, split<1>>, sbp<broadcast, split<1>>>(gpu, shape, ++salt);
          check_elementwise<sbp<split<0>, partial_sum>, sbp<split<0>, broadcast>>(gpu, shape, ++salt);
          check_elementwise<sbp<partial_sum, partial_sum>, sbp<broadcast, broadcast>>(gpu, shape, ++salt);
        }
      },
      flexpar::testing_support::with_timeout(180s));
}

/// Within float rounding: the host and the device both compute in double and round once; exp and erf
/// of the two math libraries may differ in the last bit of a double.
void expect_near_all(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-6f * std::max(1.0f, std::fabs(want[i]))) << what << " i " << i;
}

TEST(device_ops, gelu_softmax_layer_norm_reduce_sum_match_the_host_ops) {
  for (int world : {1, 2, 3})
    on_one_gpu(world, [](const placement<1>& mesh, const cuda::device_placement<1>& gpu) {
      const shape_t shape{5, 7, 3};
      const auto full = logical<float>(shape, 9);
      const auto rows = global_tensor<float, split<0>>::from_full(mesh, shape, full);
      const auto cols = global_tensor<float, split<2>>::from_full(mesh, shape, full);
      const auto d_rows = to_device(rows, gpu);
      const auto d_cols = to_device(cols, gpu);
      expect_near_all(gelu(d_rows).to_full(), gelu(rows).to_full(), "gelu");
      expect_near_all(softmax<1>(d_rows).to_full(), softmax<1>(rows).to_full(), "softmax<1> of S(0)");
      expect_near_all(softmax<0>(d_cols).to_full(), softmax<0>(cols).to_full(), "softmax<0> of S(2)");
      expect_near_all(softmax<2>(d_rows).to_full(), softmax<2>(rows).to_full(), "softmax<2> of S(0)");
      expect_near_all(layer_norm<2>(d_rows).to_full(), layer_norm<2>(rows).to_full(), "layer_norm<2>");
      expect_near_all(layer_norm<0>(d_cols, 1e-3).to_full(), layer_norm<0>(cols, 1e-3).to_full(), "layer_norm<0>");
      // small integers: the sums are exact, in either order
      EXPECT_EQ(reduce_sum<1>(d_rows).to_full(), reduce_sum<1>(rows).to_full());
      const auto split_sum = reduce_sum<0>(d_rows);  // over the split axis: P(sum)
      static_assert(std::is_same_v<std::remove_cvref_t<decltype(split_sum)>::sbp_type, partial_sum>);
      EXPECT_EQ(split_sum.to_full(), reduce_sum<0>(rows).to_full());
      EXPECT_THROW((void)softmax<3>(d_rows), usage_error);
    });
}

template <class T, class W, class I>
void check_embedding(const placement<1>& mesh, const cuda::device_placement<1>& gpu) {
  const shape_t ws{7, 5};
  const std::vector<T> wf = logical<T>(ws, 4);
  const std::vector<std::int64_t> ids{3, 0, 6, 2, 3, 5, 1};
  const auto expected = embedding(global_tensor<T, W>::from_full(mesh, ws, wf),
                                  global_tensor<std::int64_t, I>::from_full(mesh, {ids.size()}, ids));
  const auto got = embedding(global_tensor<T, W, memory::cuda>::from_full(gpu, ws, wf),
                             global_tensor<std::int64_t, I, memory::cuda>::from_full(gpu, {ids.size()}, ids));
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(got)>::sbp_type,
                               typename std::remove_cvref_t<decltype(expected)>::sbp_type>);
  EXPECT_EQ(got.to_full(), expected.to_full())
      << to_string<W>() << ", " << to_string<I>() << " on " << mesh.size() << " ranks";
}

TEST(device_ops, embedding_matches_the_host_op_and_names_an_id_outside_the_vocabulary) {
  for (int world : {1, 2, 3})
    on_one_gpu(world, [](const placement<1>& mesh, const cuda::device_placement<1>& gpu) {
      check_embedding<float, split<0>, broadcast>(mesh, gpu);  // vocabulary rows split: P(sum)
      check_embedding<float, split<1>, broadcast>(mesh, gpu);  // embedding columns split (3 ranks: uneven)
      check_embedding<float, broadcast, split<0>>(mesh, gpu);  // ids split
      check_embedding<float, broadcast, broadcast>(mesh, gpu);
      check_embedding<double, split<0>, broadcast>(mesh, gpu);
      check_embedding<std::int32_t, broadcast, split<0>>(mesh, gpu);
      const auto w = global_tensor<float, split<0>, memory::cuda>::from_full(gpu, {7, 5}, logical<float>({7, 5}, 4));
      const std::vector<std::int64_t> bad{3, 7, 1};
      const auto ids = global_tensor<std::int64_t, broadcast, memory::cuda>::from_full(gpu, {3}, bad);
      try {
        (void)embedding(w, ids);
        ADD_FAILURE() << "id 7 of a vocabulary of 7 rows was looked up";
      } catch (const usage_error& e) {
        EXPECT_NE(std::string(e.what()).find("id 7 (position 1"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("vocabulary of 7 rows"), std::string::npos) << e.what();
      }
    });
}

template <class T, class A>
void check_transpose(const placement<1>& mesh, const cuda::device_placement<1>& gpu, const shape_t& shape) {
  const std::vector<T> full = logical<T>(shape, 8);
  const auto expected = transpose(global_tensor<T, A>::from_full(mesh, shape, full));
  const auto got = transpose(global_tensor<T, A, memory::cuda>::from_full(gpu, shape, full));
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(got)>::sbp_type,
                               typename std::remove_cvref_t<decltype(expected)>::sbp_type>);
  EXPECT_EQ(got.shape(), expected.shape());
  EXPECT_EQ(got.to_full(), expected.to_full()) << "transpose of " << to_string<A>() << " " << to_string(shape);
}

TEST(device_ops, transpose_matches_the_host_op) {
  for (int world : {1, 2, 3})
    on_one_gpu(world, [](const placement<1>& mesh, const cuda::device_placement<1>& gpu) {
      // more than one 32 x 32 tile each way, ragged at both edges; a single row; empty
      for (const shape_t& shape : {shape_t{45, 70}, shape_t{1, 33}, shape_t{0, 5}}) {
        check_transpose<float, split<0>>(mesh, gpu, shape);
        check_transpose<float, split<1>>(mesh, gpu, shape);
        check_transpose<float, broadcast>(mesh, gpu, shape);
        check_transpose<float, partial_sum>(mesh, gpu, shape);
        check_transpose<double, split<1>>(mesh, gpu, shape);
        check_transpose<std::int32_t, split<0>>(mesh, gpu, shape);
      }
      const auto cube = global_tensor<float, broadcast, memory::cuda>::from_full(gpu, {2, 2, 2}, std::vector<float>(8));
      EXPECT_THROW((void)transpose(cube), usage_error);
    });
}

/// Integers in [-2, 2] from `logical`: every product and sum of the convolutions below is exact in f32.
std::vector<float> small_ints(const shape_t& shape, int salt) {
  std::vector<float> v = logical<float>(shape, salt);
  for (float& e : v) e = static_cast<float>((static_cast<int>(e) % 5 + 5) % 5 - 2);
  return v;
}

/// op(a, b) on device tensors against op on host tensors of the same values: the same deduced type and
/// the same logical tensor, exactly.
template <class A, class B, class Op>
void check_conv(const placement<1>& mesh, const cuda::device_placement<1>& gpu, const shape_t& sa, const shape_t& sb,
                Op op, const char* what) {
  const auto fa = small_ints(sa, 5), fb = small_ints(sb, 6);
  const auto expected =
      op(global_tensor<float, A>::from_full(mesh, sa, fa), global_tensor<float, B>::from_full(mesh, sb, fb));
  const auto got = op(global_tensor<float, A, memory::cuda>::from_full(gpu, sa, fa),
                      global_tensor<float, B, memory::cuda>::from_full(gpu, sb, fb));
  static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(got)>::sbp_type,
                               typename std::remove_cvref_t<decltype(expected)>::sbp_type>);
  EXPECT_EQ(got.to_full(), expected.to_full())
      << what << " (" << to_string<A>() << ", " << to_string<B>() << ") on " << mesh.size() << " ranks";
}

TEST(device_ops, conv2d_and_its_gradients_match_the_host_ops_in_every_signature) {
  for (int world : {1, 2, 3})
    on_one_gpu(world, [](const placement<1>& mesh, const cuda::device_placement<1>& gpu) {
      // x [N, C, H, W], w [K, C, R, S], pad 1: y and dy [2, 4, 5, 5]; 3 ranks cut K = 4 unevenly
      const shape_t x{2, 3, 5, 4}, w{4, 3, 3, 2}, dy{2, 4, 5, 5};
      const auto fwd = [](const auto& a, const auto& b) { return conv2d(a, b, 1); };
      check_conv<split<0>, broadcast>(mesh, gpu, x, w, fwd, "conv2d");
      check_conv<broadcast, split<0>>(mesh, gpu, x, w, fwd, "conv2d");
      check_conv<split<1>, split<1>>(mesh, gpu, x, w, fwd, "conv2d");
      check_conv<partial_sum, broadcast>(mesh, gpu, x, w, fwd, "conv2d");
      check_conv<broadcast, partial_sum>(mesh, gpu, x, w, fwd, "conv2d");
      check_conv<broadcast, broadcast>(mesh, gpu, x, w, fwd, "conv2d");
      const auto din = [](const auto& a, const auto& b) { return conv2d_grad_input(a, b, 1); };
      check_conv<split<0>, broadcast>(mesh, gpu, dy, w, din, "conv2d_grad_input");
      check_conv<split<1>, split<0>>(mesh, gpu, dy, w, din, "conv2d_grad_input");
      check_conv<broadcast, split<1>>(mesh, gpu, dy, w, din, "conv2d_grad_input");
      check_conv<partial_sum, broadcast>(mesh, gpu, dy, w, din, "conv2d_grad_input");
      check_conv<broadcast, broadcast>(mesh, gpu, dy, w, din, "conv2d_grad_input");
      const auto dw = [](const auto& a, const auto& b) { return conv2d_grad_weight(a, b, 1); };
      check_conv<split<0>, split<0>>(mesh, gpu, x, dy, dw, "conv2d_grad_weight");
      check_conv<broadcast, split<1>>(mesh, gpu, x, dy, dw, "conv2d_grad_weight");
      check_conv<split<1>, broadcast>(mesh, gpu, x, dy, dw, "conv2d_grad_weight");
      check_conv<broadcast, partial_sum>(mesh, gpu, x, dy, dw, "conv2d_grad_weight");
      check_conv<broadcast, broadcast>(mesh, gpu, x, dy, dw, "conv2d_grad_weight");
      // no padding, a 1 x 1 kernel, no samples
      const auto valid = [](const auto& a, const auto& b) { return conv2d(a, b, 0); };
      check_conv<split<0>, broadcast>(mesh, gpu, x, w, valid, "conv2d pad 0");
      check_conv<broadcast, split<0>>(mesh, gpu, x, shape_t{4, 3, 1, 1}, valid, "conv2d 1 x 1");
      check_conv<broadcast, broadcast>(mesh, gpu, shape_t{0, 3, 5, 4}, w, fwd, "conv2d of no samples");
      // shapes that do not convolve: the host's error
      const auto bad_x =
          global_tensor<float, broadcast, memory::cuda>::from_full(gpu, {2, 2, 5, 4}, small_ints({2, 2, 5, 4}, 1));
      const auto good_w = global_tensor<float, broadcast, memory::cuda>::from_full(gpu, w, small_ints(w, 2));
      EXPECT_THROW((void)conv2d(bad_x, good_w, 1), usage_error);
    });
}

}  // namespace
}  // namespace flexpar::sbp
