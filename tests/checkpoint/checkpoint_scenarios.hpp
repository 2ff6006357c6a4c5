// The checkpoint scenario shared by the in-process and the mpiexec tests: a model of every SBP
// (S(0), S(1), S(2), B, P(sum) with distinct summands, P(max)), several dtypes, a scalar, an empty
// tensor, host tensors and the step, saved from a 1-D mesh of one world size and loaded onto a 1-D
// mesh of another with every target SBP, compared with the serial logical tensors (small integers:
// exact in every dtype).
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <flexpar/checkpoint/checkpoint.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "sbp/boxing_checks.hpp"

namespace flexpar::checkpoint::testing_support {

using flexpar::sbp::broadcast;
using flexpar::sbp::global_tensor;
using flexpar::sbp::nd_of;
using flexpar::sbp::parallel;
using flexpar::sbp::partial;
using flexpar::sbp::partial_sum;
using flexpar::sbp::placement;
using flexpar::sbp::split;
using flexpar::sbp::to_string;
using sbp::shape_t;

/// Where this process's scratch directories are.
inline std::filesystem::path scratch_root() {
  return std::filesystem::temp_directory_path() / ("flexpar_checkpoint_test_" + std::to_string(::getpid()));
}

/// A directory of this process for the tests' checkpoints, emptied first.
inline std::filesystem::path scratch(const std::string& name) {
  const std::filesystem::path dir = scratch_root() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir.parent_path());
  return dir;
}

/// A tensor of `shape` on `where` with every element of every shard `value`: a load must overwrite
/// all of it (partial copies included, which from_full would have zeroed already).
template <class T, class S, std::size_t N>
sbp::global_tensor<T, S> filled(const sbp::placement<N>& where, const shape_t& shape, T value) {
  std::size_t n = 0;
  if (where.contains_me()) n = sbp::shard_box(shape, sbp::nd_of<S>::value, where.shape(), where.coords()).elements();
  return sbp::global_tensor<T, S>::from_local(where, shape, std::vector<T>(n, value));
}

/// The replicated host tensor and rank r's per-rank tensor of the scenario.
inline std::vector<float> replicated_values() { return {1, -2, 3, -4, 5, -6}; }
inline std::vector<std::int64_t> per_rank_values(int rank) {
  return std::vector<std::int64_t>(static_cast<std::size_t>(rank) + 1, 100 + rank);
}

/// One tensor of the model: its name, shape and salt (its values are logical<T>(shape, salt)).
struct spec {
  const char* name;
  shape_t shape;
  int salt;
};

// The model's tensors, one per (dtype, SBP) the scenario saves.
inline const spec w_s0{"w_s0", {7, 5}, 1};
inline const spec w_s1{"w_s1", {5, 7}, 2};
inline const spec b_f64{"b_f64", {6}, 3};
inline const spec p_sum{"p_sum", {4, 6}, 4};
inline const spec p_max{"p_max_i32", {3, 5}, 5};
inline const spec s2_i64{"s2_i64", {3, 2, 5}, 6};
inline const spec s0_bf16{"s0_bf16", {9, 2}, 7};
inline const spec b_u8{"b_u8", {10}, 8};
inline const spec scalar_p{"scalar_p", {}, 9};
inline const spec empty_s0{"empty_s0", {0, 3}, 10};

/// The model on a 1-D mesh over `comm`, saved into `dir` (through `saver` when one is given: its
/// tensors are then overwritten as soon as save() returns, and the handle waited for after).
inline void save_model(communicator& comm, const std::filesystem::path& dir, std::int64_t step,
                       const save_options& options = {}, async_saver* saver = nullptr) {
  using flexpar::sbp::testing_support::distinct_source;
  using flexpar::sbp::testing_support::logical;
  placement<1> mesh(comm, {comm.size()});
  auto source = [&]<class T, class S>(const spec& x) {
    return distinct_source<T, S>(mesh, x.shape, logical<T>(x.shape, x.salt), x.salt);
  };
  auto a = source.operator()<float, split<0>>(w_s0);
  auto b = source.operator()<float, split<1>>(w_s1);
  auto c = source.operator()<double, broadcast>(b_f64);
  auto d = source.operator()<float, partial_sum>(p_sum);
  auto e = source.operator()<std::int32_t, partial<reduce_op::max>>(p_max);
  auto f = source.operator()<std::int64_t, split<2>>(s2_i64);
  auto g = global_tensor<bfloat16, split<0>>::from_full(mesh, s0_bf16.shape, logical<bfloat16>(s0_bf16.shape, 7));
  auto h = source.operator()<std::uint8_t, broadcast>(b_u8);
  auto i = source.operator()<float, partial_sum>(scalar_p);
  auto j = source.operator()<float, split<0>>(empty_s0);
  std::vector<float> replicated = replicated_values();
  std::vector<std::int64_t> mine = per_rank_values(comm.rank());
  state s;
  s.add(w_s0.name, a).add(w_s1.name, b).add(b_f64.name, c).add(p_sum.name, d).add(p_max.name, e);
  s.add(s2_i64.name, f).add(s0_bf16.name, g).add(b_u8.name, h).add(scalar_p.name, i).add(empty_s0.name, j);
  s.add_replicated("adam.beta", std::span<float>(replicated), {2, 3});
  s.add_per_rank("rng", std::span<std::int64_t>(mine));
  s.add_integer("step", step);
  if (!saver) {
    save(comm, dir, s, options);
    return;
  }
  save_handle done = saver->save(dir, s, options);
  // the step goes on: the tensors change, and the caller's collectives run while the saver writes
  for (float& x : a.to_local()) x = -1000;
  for (float& x : d.to_local()) x = -1000;
  for (float& x : replicated) x = -1000;
  std::int64_t sum = 1;
  flexpar::allreduce(comm, std::span<std::int64_t>(&sum, 1), reduce_op::sum);
  EXPECT_EQ(sum, comm.size());
  step = -1;
  done.wait();
  EXPECT_TRUE(done.done());
}

/// Loads the model from `dir` onto a 1-D mesh over `comm`, every tensor as `Target` (B where Target
/// splits an axis the tensor does not have), and expects the logical tensors and `step`.
template <class Target>
void expect_model(communicator& comm, const std::filesystem::path& dir, std::int64_t step, bool per_rank_too) {
  using flexpar::sbp::testing_support::logical;
  placement<1> mesh(comm, {comm.size()});
  const std::string where = " loaded as " + to_string<Target>() + " on " + std::to_string(comm.size()) +
                            " ranks from " + dir.string() + ", rank " + std::to_string(comm.rank());
  std::int64_t loaded_step = -5;
  std::vector<float> replicated(6, 99.0f);
  std::vector<std::int64_t> mine(static_cast<std::size_t>(comm.rank()) + 1, 99);
  state s;
  s.add_replicated("adam.beta", std::span<float>(replicated), {2, 3}).add_integer("step", loaded_step);
  if (per_rank_too) s.add_per_rank("rng", std::span<std::int64_t>(mine));

  // one target per tensor, filled with 99 (a load must overwrite every element), and its check
  std::vector<std::function<void()>> checks;
  auto add = [&]<class T, class As>(const spec& x, As) {
    auto t = std::make_shared<global_tensor<T, As>>(filled<T, As>(mesh, x.shape, T(99)));
    s.add(x.name, *t);
    checks.push_back([t, &x, where] {
      EXPECT_EQ(t->to_full(), logical<T>(x.shape, x.salt)) << x.name << " as " << to_string<As>() << where;
    });
  };
  auto add_as_target = [&]<class T>(const spec& x) {
    constexpr parallel v = nd_of<Target>::value[0];
    // a split of an axis the tensor lacks (a scalar's, a vector's axis 1) is not a layout: B instead
    if (v.is_split() && static_cast<std::size_t>(v.axis) >= x.shape.size()) {
      add.template operator()<T>(x, broadcast{});
    } else {
      add.template operator()<T>(x, Target{});
    }
  };
  add_as_target.template operator()<float>(w_s0);
  add_as_target.template operator()<float>(w_s1);
  add_as_target.template operator()<double>(b_f64);
  add_as_target.template operator()<float>(p_sum);
  add_as_target.template operator()<std::int32_t>(p_max);
  add_as_target.template operator()<std::int64_t>(s2_i64);
  add_as_target.template operator()<bfloat16>(s0_bf16);
  add_as_target.template operator()<std::uint8_t>(b_u8);
  add_as_target.template operator()<float>(scalar_p);
  add_as_target.template operator()<float>(empty_s0);
  load(comm, dir, s);
  for (auto& check : checks) check();  // to_full: collective over the mesh, every rank in order
  EXPECT_EQ(loaded_step, step) << where;
  EXPECT_EQ(replicated, replicated_values()) << where;
  if (per_rank_too) {
    EXPECT_EQ(mine, per_rank_values(comm.rank())) << where;
  }
}

}  // namespace flexpar::checkpoint::testing_support
