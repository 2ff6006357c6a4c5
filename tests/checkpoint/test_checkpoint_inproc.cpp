// Checkpoints with threads as ranks: every saving world size 1-4 to every loading world size 1-4 with
// every target SBP, 2 x 2 meshes both ways, sub-meshes, host tensors, async saves; and the errors a
// damaged or foreign checkpoint must raise (naming the file and the tensor), a rank that does not
// come, and crashes at random moments of a save (child processes killed with SIGKILL).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <flexpar/checkpoint/checkpoint.hpp>
#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "checkpoint_scenarios.hpp"
#include "support/test_config.hpp"

extern char** environ;

namespace flexpar::checkpoint {
namespace {

using flexpar::sbp::testing_support::distinct_source;
using flexpar::sbp::testing_support::logical;
using flexpar::testing_support::with_timeout;
using namespace testing_support;
/// An nd-SBP (nd<...>: the namespace and the type share a name).
template <class... P>
using nd = flexpar::sbp::sbp<P...>;

/// Removes this process's scratch directories after the last test (not in the crash test's child,
/// whose directory is its parent's).
class scratch_cleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!std::getenv("FLEXPAR_CHECKPOINT_CRASH_CHILD")) std::filesystem::remove_all(scratch_root());
  }
};
[[maybe_unused]] ::testing::Environment* const cleanup = ::testing::AddGlobalTestEnvironment(new scratch_cleanup);

/// Runs `body` on `ranks` thread ranks and returns each rank's error text ("" where none was thrown),
/// with whether it was an `E` or a peer_failure.
template <class E, class Body>
std::vector<std::string> errors_of(int ranks, Body body, std::chrono::seconds timeout = std::chrono::seconds(60)) {
  std::vector<std::string> texts(static_cast<std::size_t>(ranks));
  std::mutex m;
  int typed = 0;
  run_in_process(
      ranks,
      [&](communicator& comm) {
        try {
          body(comm);
        } catch (const peer_failure& e) {
          texts[static_cast<std::size_t>(comm.rank())] = e.what();
        } catch (const E& e) {
          std::lock_guard lock(m);
          ++typed;
          texts[static_cast<std::size_t>(comm.rank())] = e.what();
        }
      },
      with_timeout(timeout));
  EXPECT_GE(typed, 1) << "no rank threw the expected type";
  return texts;
}

/// Expects every rank's text to hold every one of `parts`.
void expect_all_name(const std::vector<std::string>& texts, std::initializer_list<std::string> parts) {
  for (std::size_t r = 0; r < texts.size(); ++r)
    for (const std::string& part : parts)
      EXPECT_NE(texts[r].find(part), std::string::npos)
          << "rank " << r << "'s error lacks \"" << part << "\": " << texts[r];
}

// ---- resharding ---------------------------------------------------------------------------------

class reshard_1d : public ::testing::TestWithParam<int> {};

// Chunks of 12 bytes: every region spans several chunks, and most reads start and end inside one.
TEST_P(reshard_1d, every_sbp_saved_on_n_ranks_loads_on_1_to_4_ranks_as_every_sbp) {
  const int n = GetParam();
  const auto dir = scratch("reshard_from_" + std::to_string(n));
  run_in_process(
      n, [&](communicator& comm) { save_model(comm, dir, 1000 + n, {.chunk_bytes = 12}); }, with_timeout());
  for (int m = 1; m <= 4; ++m)
    run_in_process(
        m,
        [&](communicator& comm) {
          expect_model<split<0>>(comm, dir, 1000 + n, m == n);
          expect_model<split<1>>(comm, dir, 1000 + n, false);
          expect_model<broadcast>(comm, dir, 1000 + n, false);
          expect_model<partial_sum>(comm, dir, 1000 + n, false);
          expect_model<partial<reduce_op::max>>(comm, dir, 1000 + n, false);
        },
        with_timeout());
}

INSTANTIATE_TEST_SUITE_P(saving_ranks, reshard_1d, ::testing::Values(1, 2, 3, 4));

// The layout of the files is what the SBP says: S(0) on 3 ranks writes three row blocks, one per
// file, B writes one copy (rank 0's), P(sum) is reduced to S(0) first.
TEST(checkpoint_metadata, regions_follow_the_sbp_and_broadcast_copies_are_written_once) {
  const auto dir = scratch("layout");
  run_in_process(
      3, [&](communicator& comm) { save_model(comm, dir, 7); }, with_timeout());
  const contents c = read_contents(dir);
  EXPECT_EQ(c.world_size, 3);
  EXPECT_EQ(c.integer("step"), 7);
  const tensor_info* w = c.find(w_s0.name);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->sbp, "S(0)");
  EXPECT_EQ(w->shape, w_s0.shape);
  EXPECT_EQ(w->mesh, std::vector<int>{3});
  const tensor_info* p = c.find(p_sum.name);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->sbp, "P(sum)");
  EXPECT_EQ(p->saved_as, "S(0)");
  EXPECT_EQ(c.find(scalar_p.name)->saved_as, "B");
  EXPECT_EQ(c.find("rng")->kind, holding::per_rank);
  // Every distinct region once: B [6] of f64, B [10] of u8, the scalar (P reduced to B) and the
  // replicated host tensor in rank 0's file only; P(sum) [4, 6] and P(max) [3, 5] as S(0).
  //   rank 0: w_s0 rows 0-2 (60 B), w_s1 columns 0-2 (60), b_f64 (48), p_sum rows 0-1 (48), p_max row 0
  //           (20), s2_i64 slices 0-1 of axis 2 (96), s0_bf16 rows 0-2 (12), b_u8 (10), scalar_p (4),
  //           adam.beta (24), rng (8)
  //   rank 1: 40 + 40 + 24 + 20 + 96 + 12 + rng 16;  rank 2: 40 + 40 + 24 + 20 + 48 + 12 + rng 24
  const auto bytes = [&](int r) { return std::filesystem::file_size(dir / ("rank_" + std::to_string(r) + ".data")); };
  EXPECT_EQ(bytes(0), 390u);
  EXPECT_EQ(bytes(1), 248u);
  EXPECT_EQ(bytes(2), 208u);
}

// A 2 x 2 mesh saved, loaded on 1, 3 and 4 ranks (1-D and 2 x 2 with other nd-SBPs); and a 1-D save
// of 3 ranks loaded onto 2 x 2.
TEST(reshard_2d, a_2x2_mesh_to_1_3_and_4_ranks_and_3_ranks_to_a_2x2_mesh) {
  const auto dir = scratch("mesh_2x2");
  const shape_t shape{7, 5, 3};
  using AB = nd<split<0>, split<1>>;
  using BS = nd<broadcast, split<0>>;
  using PS = nd<partial_sum, split<1>>;
  using SB = nd<split<1>, broadcast>;
  using PP = nd<partial_sum, partial_sum>;
  run_in_process(
      4,
      [&](communicator& comm) {
        placement<2> mesh(comm, {2, 2});
        auto a = distinct_source<float, AB>(mesh, shape, logical<float>(shape, 21), 21);
        auto b = distinct_source<double, BS>(mesh, shape, logical<double>(shape, 22), 22);
        auto c = distinct_source<float, PS>(mesh, shape, logical<float>(shape, 23), 23);
        auto d = distinct_source<std::int32_t, SB>(mesh, shape, logical<std::int32_t>(shape, 24), 24);
        auto e = distinct_source<float, PP>(mesh, shape, logical<float>(shape, 25), 25);
        state s;
        s.add("a", a).add("b", b).add("c", c).add("d", d).add("e", e);
        save(comm, dir, s, {.chunk_bytes = 20});
      },
      with_timeout());
  EXPECT_EQ(read_contents(dir).find("c")->saved_as, "(S(0), S(1))");
  EXPECT_EQ(read_contents(dir).find("e")->saved_as, "(S(0), S(0))");

  // load all five as one layout `As` on `mesh` and compare
  auto check_all = [&]<class As, std::size_t N>(const placement<N>& mesh, As) {
    auto a = filled<float, As>(mesh, shape, 99.0f);
    auto b = filled<double, As>(mesh, shape, 99.0);
    auto c = filled<float, As>(mesh, shape, 99.0f);
    auto d = filled<std::int32_t, As>(mesh, shape, 99);
    auto e = filled<float, As>(mesh, shape, 99.0f);
    state s;
    s.add("a", a).add("b", b).add("c", c).add("d", d).add("e", e);
    load(mesh.parent(), dir, s);
    const std::string as = " as " + to_string<As>() + " on " + mesh.describe();
    EXPECT_EQ(a.to_full(), logical<float>(shape, 21)) << "a" << as;
    EXPECT_EQ(b.to_full(), logical<double>(shape, 22)) << "b" << as;
    EXPECT_EQ(c.to_full(), logical<float>(shape, 23)) << "c" << as;
    EXPECT_EQ(d.to_full(), logical<std::int32_t>(shape, 24)) << "d" << as;
    EXPECT_EQ(e.to_full(), logical<float>(shape, 25)) << "e" << as;
  };
  run_in_process(
      1, [&](communicator& comm) { check_all(placement<1>(comm, {1}), broadcast{}); }, with_timeout());
  run_in_process(
      3,
      [&](communicator& comm) {
        check_all(placement<1>(comm, {3}), split<1>{});
        check_all(placement<1>(comm, {3}), split<2>{});
      },
      with_timeout());
  run_in_process(
      4,
      [&](communicator& comm) {
        placement<2> mesh(comm, {2, 2});
        check_all(mesh, nd<split<1>, split<0>>{});
        check_all(mesh, nd<broadcast, partial_sum>{});
        check_all(mesh, nd<split<2>, split<2>>{});
        check_all(placement<2>(comm, {4, 1}), nd<split<0>, broadcast>{});
      },
      with_timeout());

  run_in_process(
      3,
      [&](communicator& comm) {
        placement<1> mesh(comm, {3});
        auto a = distinct_source<float, split<2>>(mesh, shape, logical<float>(shape, 21), 21);
        auto b = distinct_source<double, partial_sum>(mesh, shape, logical<double>(shape, 22), 22);
        auto c = distinct_source<float, split<0>>(mesh, shape, logical<float>(shape, 23), 23);
        auto d = distinct_source<std::int32_t, broadcast>(mesh, shape, logical<std::int32_t>(shape, 24), 24);
        auto e = distinct_source<float, split<1>>(mesh, shape, logical<float>(shape, 25), 25);
        state s;
        s.add("a", a).add("b", b).add("c", c).add("d", d).add("e", e);
        save(comm, dir, s, {.chunk_bytes = 20});  // replaces the 2 x 2 checkpoint
      },
      with_timeout());
  EXPECT_EQ(read_contents(dir).world_size, 3);
  run_in_process(
      4,
      [&](communicator& comm) {
        placement<2> mesh(comm, {2, 2});
        check_all(mesh, nd<split<0>, split<1>>{});
        check_all(mesh, nd<partial_sum, broadcast>{});
      },
      with_timeout());
}

// A placement over ranks {1, 2} of three saves what those two hold; the load goes onto all three, and
// onto a sub-mesh of rank 1 alone out of two.
TEST(reshard_1d_submesh, a_tensor_on_a_sub_mesh_saves_and_loads) {
  const auto dir = scratch("submesh");
  const shape_t shape{5, 4};
  run_in_process(
      3,
      [&](communicator& comm) {
        placement<1> half(comm, {2}, {1, 2});
        auto t = distinct_source<float, split<0>>(half, shape, logical<float>(shape, 31), 31);
        state s;
        s.add("t", t);
        save(comm, dir, s);
      },
      with_timeout());
  run_in_process(
      3,
      [&](communicator& comm) {
        placement<1> all(comm, {3});
        auto t = filled<float, broadcast>(all, shape, 99.0f);
        state s;
        s.add("t", t);
        load(comm, dir, s);
        EXPECT_EQ(t.to_full(), logical<float>(shape, 31));
      },
      with_timeout());
  run_in_process(
      2,
      [&](communicator& comm) {
        placement<1> one(comm, {1}, {1});
        auto t = filled<float, split<1>>(one, shape, 99.0f);
        state s;
        s.add("t", t);
        load(comm, dir, s);
        if (one.contains_me()) {
          EXPECT_EQ(t.to_full(), logical<float>(shape, 31));
        }
      },
      with_timeout());
}

// A model saved sharded loads whole into one process's host buffers, and host tensors into global ones.
TEST(checkpoint_host, global_and_replicated_tensors_load_into_either) {
  const auto dir = scratch("cross");
  run_in_process(
      3, [&](communicator& comm) { save_model(comm, dir, 3); }, with_timeout());
  run_in_process(
      1,
      [&](communicator& comm) {
        std::vector<float> w(35, 99.0f);
        std::vector<std::int64_t> s2(30, 99);
        state s;
        s.add_replicated(w_s0.name, std::span<float>(w), w_s0.shape)
            .add_replicated(s2_i64.name, std::span<std::int64_t>(s2), s2_i64.shape);
        load(comm, dir, s);
        EXPECT_EQ(w, logical<float>(w_s0.shape, w_s0.salt));
        EXPECT_EQ(s2, logical<std::int64_t>(s2_i64.shape, s2_i64.salt));
      },
      with_timeout());
  run_in_process(
      2,
      [&](communicator& comm) {
        placement<1> mesh(comm, {2});
        auto beta = filled<float, split<1>>(mesh, {2, 3}, 99.0f);
        state s;
        s.add("adam.beta", beta);
        load(comm, dir, s);
        EXPECT_EQ(beta.to_full(), replicated_values());
      },
      with_timeout());
}

// ---- async saves ---------------------------------------------------------------------------------

// The saver snapshots: the tensors change and the caller's collectives run while it writes
// (save_model does both), and the checkpoint holds the values of the call. A second save waits for
// the first; three in a row, each loaded.
TEST(checkpoint_async, the_step_goes_on_while_the_previous_checkpoint_is_written) {
  const auto one = scratch("async_1"), two = scratch("async_2"), three = scratch("async_3"), four = scratch("async_4");
  run_in_process(
      3,
      [&](communicator& comm) {
        async_saver saver(comm);
        save_model(comm, one, 11, {.chunk_bytes = 64}, &saver);
        save_model(comm, two, 12, {}, &saver);
        // two saves in flight back to back: the second call waits for the first
        placement<1> mesh(comm, {3});
        auto t = distinct_source<float, split<1>>(mesh, {6, 9}, logical<float>({6, 9}, 41), 41);
        state s;
        s.add("t", t);
        save_handle first = saver.save(three, s);
        for (float& x : t.to_local()) x += 1;  // the next step's values
        save_handle second = saver.save(four, s);
        EXPECT_TRUE(first.done()) << "a second save() returns only after the first is written";
        second.wait();
        first.wait();
      },
      with_timeout());
  run_in_process(
      2,
      [&](communicator& comm) {
        expect_model<split<1>>(comm, one, 11, false);
        expect_model<partial_sum>(comm, two, 12, false);
        placement<1> mesh(comm, {2});
        for (const auto& [dir, bump] : {std::pair{three, 0.0f}, std::pair{four, 1.0f}}) {
          auto t = filled<float, split<0>>(mesh, {6, 9}, 99.0f);
          state s;
          s.add("t", t);
          load(comm, dir, s);
          std::vector<float> want = logical<float>({6, 9}, 41);
          for (float& x : want) x += bump;
          EXPECT_EQ(t.to_full(), want) << dir;
        }
      },
      with_timeout());
}

// A save that fails in the background reports its error at wait(), on every rank; one that no
// wait() collected is thrown by the next save(), and the saver works on.
TEST(checkpoint_async, a_failed_save_is_reported_by_wait_or_by_the_next_save) {
  const auto dir = scratch("async_refused"), after = scratch("async_after_refusal");
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "notes.txt") << "not a checkpoint\n";
  std::vector<std::string> at_wait(2), at_next_save(2);
  run_in_process(
      2,
      [&](communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        async_saver saver(comm);
        placement<1> mesh(comm, {2});
        auto t = distinct_source<float, split<0>>(mesh, {4, 2}, logical<float>({4, 2}, 51), 51);
        state s;
        s.add("t", t);
        save_handle h = saver.save(dir, s);
        try {
          h.wait();
        } catch (const flexpar::error& e) {
          at_wait[r] = e.what();
        }
        saver.save(dir, s);  // fails the same way, and nobody waits for it
        try {
          saver.save(after, s);
        } catch (const flexpar::error& e) {
          at_next_save[r] = e.what();
        }
        saver.save(after, s).wait();
      },
      with_timeout());
  for (const auto& texts : {at_wait, at_next_save})
    expect_all_name(texts, {dir.string(), "is not a flexpar checkpoint"});
  EXPECT_TRUE(std::filesystem::exists(dir / "notes.txt"));
  EXPECT_EQ(read_contents(after).tensors.size(), 1u);
}

// wait() gives up at its deadline with timeout_error naming the directory; the save goes on.
TEST(checkpoint_async, wait_has_a_deadline) {
  const auto dir = scratch("async_deadline");
  std::vector<std::string> texts(2);
  run_in_process(
      2,
      [&](communicator& comm) {
        async_saver saver(comm);
        placement<1> mesh(comm, {2});
        const shape_t shape{2048, 2048};  // 16 MiB: not written and synced in no time
        auto t = global_tensor<float, split<1>>::from_full(mesh, shape, std::vector<float>(2048 * 2048, 3.0f));
        state s;
        s.add("t", t);
        save_handle h = saver.save(dir, s);
        try {
          h.wait(flexpar::clock::now());
        } catch (const timeout_error& e) {
          texts[static_cast<std::size_t>(comm.rank())] = e.what();
        }
        h.wait();
      },
      with_timeout());
  expect_all_name(texts, {dir.string(), "still running at the deadline"});
  EXPECT_EQ(read_contents(dir).find("t")->shape, (shape_t{2048, 2048}));
}

// ---- errors ------------------------------------------------------------------------------------

/// Loads tensor `name` of `shape` as S(0) of T on every rank of `comm`.
template <class T>
void load_as(communicator& comm, const std::filesystem::path& dir, const std::string& name, const shape_t& shape) {
  placement<1> mesh(comm, {comm.size()});
  auto t = filled<T, split<0>>(mesh, shape, T(99));
  state s;
  s.add(name, t);
  load(comm, dir, s);
}

/// The load of the scenario's S(0) tensor (its region at the front of rank 0's file).
void load_w(communicator& comm, const std::filesystem::path& dir) { load_as<float>(comm, dir, w_s0.name, w_s0.shape); }

std::filesystem::path saved_model(const std::string& name, int ranks = 2) {
  const auto dir = scratch(name);
  run_in_process(
      ranks, [&](communicator& comm) { save_model(comm, dir, 5, {.chunk_bytes = 16}); }, with_timeout());
  return dir;
}

TEST(checkpoint_errors, a_truncated_data_file_names_the_file_and_the_tensor) {
  const auto dir = saved_model("truncated");
  const auto file = dir / "rank_1.data";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 3);
  expect_all_name(errors_of<error>(2, [&](communicator& comm) { load_w(comm, dir); }),
                  {"rank_1.data", "truncated", "\"w_s0\""});
}

TEST(checkpoint_errors, a_damaged_byte_fails_its_chunks_crc32_naming_the_file_and_the_tensor) {
  const auto dir = saved_model("flipped");
  {
    std::fstream f(dir / "rank_0.data", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(21);  // inside w_s0's rows (the first region of rank 0's file), in its second chunk
    const char c = static_cast<char>(f.get());
    f.seekp(21);
    f.put(static_cast<char>(c ^ 0x10));
  }
  expect_all_name(errors_of<error>(2, [&](communicator& comm) { load_w(comm, dir); }),
                  {"rank_0.data", "crc32", "\"w_s0\"", "damaged", "bytes [16, 32)"});
}

TEST(checkpoint_errors, a_missing_rank_file_is_named_even_when_no_rank_reads_it_now) {
  const auto dir = saved_model("missing_file", 3);
  std::filesystem::remove(dir / "rank_2.data");
  // the replicated tensor is in rank_0.data alone; rank 0 checks every file all the same
  expect_all_name(errors_of<error>(2,
                                   [&](communicator& comm) {
                                     std::vector<float> beta(6);
                                     state s;
                                     s.add_replicated("adam.beta", std::span<float>(beta), {2, 3});
                                     load(comm, dir, s);
                                   }),
                  {"rank_2.data is missing", "\"w_s0\""});
}

TEST(checkpoint_errors, a_directory_without_metadata_is_refused) {
  const auto dir = saved_model("no_metadata");
  std::filesystem::remove(dir / "metadata.json");
  expect_all_name(errors_of<error>(2, [&](communicator& comm) { load_w(comm, dir); }),
                  {dir.string() + " has no metadata.json", "did not finish"});
  expect_all_name(errors_of<error>(1, [&](communicator& comm) { load_w(comm, dir / "nowhere"); }), {"does not exist"});
}

TEST(checkpoint_errors, a_damaged_or_truncated_metadata_file_is_refused) {
  const auto dir = saved_model("bad_metadata");
  const auto meta = dir / "metadata.json";
  std::string text;
  {
    std::ifstream in(meta);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto at = text.find("\"step\":5");
  ASSERT_NE(at, std::string::npos) << text;
  std::string edited = text;
  edited[at + 7] = '6';  // a value changed: valid JSON, a different checkpoint
  std::ofstream(meta, std::ios::trunc) << edited;
  expect_all_name(errors_of<error>(2, [&](communicator& comm) { load_w(comm, dir); }),
                  {meta.string(), "crc32", "damaged"});
  std::ofstream(meta, std::ios::trunc) << text.substr(0, text.size() / 2);
  expect_all_name(errors_of<error>(2, [&](communicator& comm) { load_w(comm, dir); }),
                  {meta.string(), "not valid JSON"});
}

TEST(checkpoint_errors, another_models_checkpoint_names_the_tensor_and_both_sides) {
  const auto dir = saved_model("other_model");
  const std::string meta = (dir / "metadata.json").string();
  expect_all_name(errors_of<mismatch_error>(2,
                                            [&](communicator& comm) {
                                              load_as<float>(comm, dir, "decoder.w", {7, 5});
                                            }),
                  {"\"decoder.w\" is not in the checkpoint", meta, "\"w_s0\""});
  expect_all_name(errors_of<mismatch_error>(2,
                                            [&](communicator& comm) {
                                              load_as<float>(comm, dir, w_s0.name, {7, 6});
                                            }),
                  {"\"w_s0\"", "shape [7, 5]", "shape [7, 6]", meta});
  expect_all_name(errors_of<mismatch_error>(2,
                                            [&](communicator& comm) {
                                              load_as<double>(comm, dir, w_s0.name, {7, 5});
                                            }),
                  {"\"w_s0\"", "dtype f32", "f64"});
  expect_all_name(errors_of<mismatch_error>(3,
                                            [&](communicator& comm) {
                                              std::vector<std::int64_t> mine(1);
                                              state s;
                                              s.add_per_rank("rng", std::span<std::int64_t>(mine));
                                              load(comm, dir, s);
                                            }),
                  {"\"rng\"", "saved by 2 ranks cannot be loaded on 3"});
  expect_all_name(errors_of<mismatch_error>(2,
                                            [&](communicator& comm) {
                                              std::int64_t epoch = 0;
                                              state s;
                                              s.add_integer("epoch", epoch);
                                              load(comm, dir, s);
                                            }),
                  {"integer \"epoch\" is not in the checkpoint"});
}

TEST(checkpoint_errors, a_save_refuses_to_replace_what_is_not_a_checkpoint) {
  const auto dir = scratch("user_data");
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "data.bin") << "precious";
  auto save_one = [&](communicator& comm, const save_options& options) {
    placement<1> mesh(comm, {comm.size()});
    auto t = distinct_source<float, split<0>>(mesh, {3, 2}, logical<float>({3, 2}, 61), 61);
    state s;
    s.add("t", t);
    save(comm, dir, s, options);
  };
  expect_all_name(errors_of<usage_error>(2, [&](communicator& comm) { save_one(comm, {}); }),
                  {dir.string(), "is not a flexpar checkpoint", "not replaced"});
  EXPECT_TRUE(std::filesystem::exists(dir / "data.bin"));
  std::filesystem::remove(dir / "data.bin");
  run_in_process(
      2, [&](communicator& comm) { save_one(comm, {}); }, with_timeout());  // an empty directory: replaced
  expect_all_name(errors_of<usage_error>(2, [&](communicator& comm) { save_one(comm, {.existing = if_exists::fail}); }),
                  {dir.string(), "exists"});
  EXPECT_EQ(read_contents(dir).tensors.size(), 1u);
}

TEST(checkpoint_errors, ranks_that_pass_different_states_are_named) {
  const auto dir = scratch("different_states");
  expect_all_name(errors_of<mismatch_error>(3,
                                            [&](communicator& comm) {
                                              std::vector<float> x(4, 1.0f);
                                              state s;
                                              s.add_replicated(comm.rank() == 2 ? "y" : "x", std::span<float>(x));
                                              save(comm, dir, s);
                                            }),
                  {"different states", "rank {2}"});
  EXPECT_FALSE(std::filesystem::exists(dir));
  expect_all_name(
      errors_of<usage_error>(2,
                             [&](communicator& comm) {
                               std::vector<float> x(4, 1.0f);
                               state s;
                               s.add_replicated("x", std::span<float>(x)).add_per_rank("x", std::span<float>(x));
                               save(comm, dir, s);
                             }),
      {"names \"x\" twice"});
}

// A rank that never calls save: the others end with timeout_error at the communicator's deadline.
TEST(checkpoint_errors, a_rank_that_does_not_come_ends_the_save_with_a_timeout) {
  const auto dir = scratch("no_show");
  std::vector<std::string> texts(2);
  run_in_process(
      2,
      [&](communicator& comm) {
        // the collectives' channel first (its split has a deadline of its own), then rank 1 leaves
        flexpar::barrier(comm);
        if (comm.rank() == 1) return;
        std::vector<float> x(4, 1.0f);
        state s;
        s.add_replicated("x", std::span<float>(x));
        try {
          save(comm, dir, s);
        } catch (const timeout_error& e) {
          texts[0] = e.what();
        }  // anything else fails the test
      },
      with_timeout(std::chrono::seconds(2)));
  EXPECT_FALSE(texts[0].empty());
  EXPECT_FALSE(std::filesystem::exists(dir / "metadata.json"));
}

// ---- atomicity -----------------------------------------------------------------------------------

constexpr const char* crash_child_variable = "FLEXPAR_CHECKPOINT_CRASH_CHILD";
constexpr std::size_t crash_rows = 512, crash_cols = 256;  // 512 KiB of f32 per tensor

/// The values of step k's tensors: every element k (then one tensor shows which save it came from).
std::vector<float> step_values(std::int64_t k) { return std::vector<float>(crash_rows * crash_cols, float(k)); }

// Run only as the child of the test below: saves steps 1, 2, 3, ... into the directory its
// environment names, replacing each time, until it is killed.
TEST(checkpoint_crash, child_saves_until_killed) {
  const char* where = std::getenv(crash_child_variable);
  if (!where) GTEST_SKIP() << "the child of checkpoint_crash.a_killed_save_leaves_the_old_or_the_new_checkpoint";
  const std::filesystem::path dir = where;
  const std::int64_t first =
      std::filesystem::exists(dir / "metadata.json") ? read_contents(dir).integer("step").value_or(0) + 1 : 1;
  run_in_process(
      2,
      [&](communicator& comm) {
        placement<1> mesh(comm, {2});
        for (std::int64_t k = first;; ++k) {
          auto a = global_tensor<float, split<0>>::from_full(mesh, {crash_rows, crash_cols}, step_values(k));
          auto b = global_tensor<float, split<1>>::from_full(mesh, {crash_rows, crash_cols}, step_values(k));
          state s;
          s.add("a", a).add("b", b).add_integer("step", k);
          save(comm, dir, s, {.chunk_bytes = 64 << 10});
        }
      },
      with_timeout());
}

// SIGKILL at seeded random moments of a loop of saves into one directory: afterwards the directory
// is either absent (no save had finished) or a whole checkpoint of one step, whose tensors all hold
// that step's values. The next save cleans up what the killed one left.
TEST(checkpoint_crash, a_killed_save_leaves_the_old_or_the_new_checkpoint) {
  if (std::getenv(crash_child_variable)) GTEST_SKIP() << "in the child";
  const auto dir = scratch("crash");
  std::string variable = std::string(crash_child_variable) + "=" + dir.string();
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  env.push_back(variable.data());
  env.push_back(nullptr);
  std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=checkpoint_crash.child_saves_until_killed";
  char* argv[] = {exe.data(), filter.data(), nullptr};
  posix_spawn_file_actions_t quiet;  // the child's gtest output is not this test's
  ::posix_spawn_file_actions_init(&quiet);
  ::posix_spawn_file_actions_addopen(&quiet, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  // The kills must fall before, inside and after saves on this machine (a sanitized build on a loaded
  // one starts and writes several times slower): first a child runs until its first checkpoint is
  // committed, which times one start and save; the trials then kill after 5 ms up to 3 times that.
  auto first_commit = std::chrono::milliseconds(400);
  {
    pid_t child = 0;
    ASSERT_EQ(::posix_spawn(&child, exe.c_str(), &quiet, nullptr, argv, env.data()), 0);
    const auto t0 = std::chrono::steady_clock::now();
    while (!std::filesystem::exists(dir) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    first_commit = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    ASSERT_TRUE(std::filesystem::exists(dir)) << "no checkpoint committed within 60 s";
    std::filesystem::remove_all(dir);
  }
  std::mt19937 rng(20261201);
  std::uniform_int_distribution<int> delay_ms(5, std::max(400, 3 * static_cast<int>(first_commit.count())));
  std::int64_t last_step = 0;
  int whole = 0;
  for (int trial = 0; trial < 12; ++trial) {
    pid_t child = 0;
    ASSERT_EQ(::posix_spawn(&child, exe.c_str(), &quiet, nullptr, argv, env.data()), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child ended by itself (status " << status << ")";
    if (!std::filesystem::exists(dir)) {
      EXPECT_EQ(last_step, 0) << "trial " << trial << ": a committed checkpoint disappeared";
      continue;
    }
    const contents c = read_contents(dir);  // throws (fails the test) when it is not whole
    const std::int64_t step = c.integer("step").value_or(-1);
    EXPECT_GE(step, last_step) << "trial " << trial;
    last_step = step;
    ++whole;
    run_in_process(
        3,
        [&](communicator& comm) {
          placement<1> mesh(comm, {3});
          auto a = filled<float, split<1>>(mesh, {crash_rows, crash_cols}, -1.0f);
          auto b = filled<float, split<0>>(mesh, {crash_rows, crash_cols}, -1.0f);
          state s;
          s.add("a", a).add("b", b);
          load(comm, dir, s);
          EXPECT_EQ(a.to_full(), step_values(step)) << "trial " << trial;
          EXPECT_EQ(b.to_full(), step_values(step)) << "trial " << trial;
        },
        with_timeout());
  }
  ::posix_spawn_file_actions_destroy(&quiet);
  std::printf(
      "12 saves killed within 5-%d ms (a first commit took %lld ms): %d left a whole checkpoint (the others "
      "none yet), the last of step %lld\n",
      delay_ms.max(), static_cast<long long>(first_commit.count()), whole, static_cast<long long>(last_step));
  EXPECT_GT(whole, 0) << "no save finished before its kill: the delays are too short for this machine";
  EXPECT_GT(last_step, 0);
  // a save after the crashes removes the hidden directory a killed one left
  run_in_process(
      1,
      [&](communicator& comm) {
        std::int64_t k = last_step + 1;
        state s;
        s.add_integer("step", k);
        save(comm, dir, s);
      },
      with_timeout());
  for (const auto& entry : std::filesystem::directory_iterator(dir.parent_path()))
    EXPECT_EQ(entry.path().filename().string().find(".crash.flexpar-saving"), std::string::npos) << entry.path();
}

}  // namespace
}  // namespace flexpar::checkpoint
