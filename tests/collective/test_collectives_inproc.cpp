// Every collective x algorithm x dtype x op against the serial oracle, threads as ranks, world sizes
// 1-8 (support/world_sizes.hpp), counts {0, 1, 7, one chunk + 1, 1 MiB + 3}, in place and out of place.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>

#include <flexpar/collective.hpp>
#include <flexpar/comm/cpu_cache.hpp>
#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/transport/inproc.hpp>

#include "oracle.hpp"
#include "support/world_sizes.hpp"
#include "sweep.hpp"

namespace flexpar {
namespace {

using namespace testing_support;

config test_config() {
  config c;
  c.timeout = std::chrono::seconds(60);
  return c;
}

// ---- allreduce ---------------------------------------------------------------------------------

struct allreduce_param {
  int world;
  algorithm alg;
  int ranks_per_node;  // 0: one node
};

std::string allreduce_name(const ::testing::TestParamInfo<allreduce_param>& info) {
  return std::string(name_of(info.param.alg)) + "_p" + std::to_string(info.param.world) +
         (info.param.ranks_per_node ? "_node" + std::to_string(info.param.ranks_per_node) : "");
}

class inproc_allreduce : public ::testing::TestWithParam<allreduce_param> {};

TEST_P(inproc_allreduce, matches_the_serial_oracle) {
  const allreduce_param param = GetParam();
  for_each_dtype([&](auto zero) {
    using T = decltype(zero);
    const auto cases = sweep_cases<T>(big_for(dtype_of<T>));
    std::map<std::pair<reduce_op, std::size_t>, std::vector<T>> expected;
    for (const auto& c : cases)
      expected.try_emplace({c.op, c.count}, expected_reduction<T>(c.op, param.world, c.count));
    run_in_process(
        param.world,
        [&](communicator& comm) {
          for (const auto& c : cases) {
            const std::vector<T> input = make_input<T>(c.op, comm.rank(), c.count);
            std::vector<T> out(c.count, from_int<T>(99));
            if (c.in_place) {
              out = input;
              allreduce(comm, std::span(out), c.op, param.alg);
            } else {
              allreduce(comm, std::span(input), std::span(out), c.op, param.alg);
              EXPECT_TRUE(same_elements(input, make_input<T>(c.op, comm.rank(), c.count), "input kept"));
            }
            EXPECT_TRUE(same_elements(out, expected.at({c.op, c.count}), describe<T>(c, comm, "allreduce")));
          }
        },
        test_config(), param.ranks_per_node);
  });
}

// Random floats of mixed magnitude (oracle.hpp's random_input), whose sum depends on its order: every
// rank's result must have the same bits (doc/collectives.md: bitwise identical on every rank for every
// algorithm) and lie within the rounding bound of the serial sum; every floating dtype, the cases of
// random_float_cases (below, at and above a pipeline chunk).
TEST_P(inproc_allreduce, random_floats_are_bitwise_identical_on_every_rank_and_near_the_serial_sum) {
  const allreduce_param param = GetParam();
  std::uint64_t seed = 1;
  for (dtype t : float_dtypes)
    visit_dtype(t, [&](auto zero) {
      using T = decltype(zero);
      for (const auto& [count, op] : random_float_cases<T>()) {
        const std::vector<std::vector<T>> inputs = random_inputs<T>(param.world, count, ++seed);
        std::vector<std::vector<T>> results = inputs;
        run_in_process(
            param.world,
            [&](communicator& comm) {
              allreduce(comm, std::span(results[static_cast<std::size_t>(comm.rank())]), op, param.alg);
            },
            test_config(), param.ranks_per_node);
        const std::string what = "allreduce " + std::string(name_of(param.alg)) + " " + std::string(name_of(t)) + " " +
                                 std::string(name_of(op)) + " count " + std::to_string(count) + " on " +
                                 std::to_string(param.world) + " ranks";
        EXPECT_TRUE(same_bits_on_every_rank(results, what));
        EXPECT_TRUE(close_to_serial_sum(results[0], inputs, op, what));
      }
    });
}

std::vector<allreduce_param> allreduce_params() {
  std::vector<allreduce_param> params;
  for (int p : inproc_world_sizes)
    for (algorithm a : {algorithm::ring, algorithm::halving_doubling, algorithm::shared_memory, algorithm::automatic})
      params.push_back({p, a, 0});
  // hierarchical: uniform meshes of several nodes (and the one-node and one-rank-per-node edges)
  for (auto [p, per_node] : {std::pair{1, 1}, {2, 1}, {2, 2}, {4, 2}, {6, 3}, {6, 2}, {8, 4}, {8, 2}})
    params.push_back({p, algorithm::hierarchical, per_node});
  params.push_back({8, algorithm::automatic, 4});
  return params;
}

INSTANTIATE_TEST_SUITE_P(all, inproc_allreduce, ::testing::ValuesIn(allreduce_params()), allreduce_name);

// ---- reduce_scatter, allgather (even and v) ------------------------------------------------------

class inproc_collectives : public ::testing::TestWithParam<int> {};

TEST_P(inproc_collectives, reduce_scatter_and_v_match_the_oracle) {
  const int p = GetParam();
  for_each_dtype([&](auto zero) {
    using T = decltype(zero);
    const auto cases = sweep_cases<T>(false);
    run_in_process(
        p,
        [&](communicator& comm) {
          const auto me = static_cast<std::size_t>(comm.rank());
          for (const auto& c : cases) {
            for (bool uneven : {false, true}) {
              const std::vector<std::size_t> counts =
                  uneven ? uneven_counts(p, c.count) : std::vector<std::size_t>(static_cast<std::size_t>(p), c.count);
              const block_layout layout = block_layout::of_counts(counts);
              // the input and the oracle once per layout (the serial oracle was most of the test's time)
              const std::vector<T> original = make_input<T>(c.op, comm.rank(), layout.total);
              const std::vector<T> want = expected_reduction<T>(c.op, p, counts[me], layout.displs[me]);
              // (automatic is shared_memory on this one node: test_collectives_mpi and the boxing
              // tests run it)
              for (algorithm a : {algorithm::ring, algorithm::shared_memory}) {
                std::vector<T> input = original;
                std::vector<T> got;
                if (c.in_place) {
                  std::span<T> mine = uneven ? reduce_scatter_v(comm, std::span(input), counts, c.op, a)
                                             : reduce_scatter(comm, std::span(input), c.op, a);
                  EXPECT_EQ(mine.data(), input.data() + layout.displs[me]);
                  got.assign(mine.begin(), mine.end());
                } else {
                  got.assign(counts[me], from_int<T>(99));
                  if (uneven)
                    reduce_scatter_v(comm, std::span<const T>(input), std::span(got), counts, c.op, a);
                  else
                    reduce_scatter(comm, std::span<const T>(input), std::span(got), c.op, a);
                  EXPECT_EQ(input, original) << "out of place changed its input";
                }
                EXPECT_TRUE(same_elements(got, want,
                                          describe<T>(c, comm, uneven ? "reduce_scatter_v" : "reduce_scatter") + " " +
                                              std::string(name_of(a))));
              }
            }
          }
        },
        test_config());
  });
}

// result_at::front: my reduced block lands at the start of the buffer. Layouts: uneven with zero
// counts; even; even with blocks of 4 chunks and more (every rank but 0 lands the peer's partials
// straight in the front); a first block of one element (the front overlaps my block 1 element before
// it: the short-gap move); a first block of 1500 elements (a longer gap, reduced forward in pieces).
TEST_P(inproc_collectives, reduce_scatter_v_with_the_result_at_the_front_matches_the_oracle) {
  const int p = GetParam();
  for_each_dtype([&](auto zero) {
    using T = decltype(zero);
    const auto cases = sweep_cases<T>(false);
    run_in_process(
        p,
        [&](communicator& comm) {
          const auto me = static_cast<std::size_t>(comm.rank());
          for (const auto& c : cases) {
            if (!c.in_place) continue;
            std::vector<std::vector<std::size_t>> layouts{
                uneven_counts(p, c.count), std::vector<std::size_t>(static_cast<std::size_t>(p), c.count)};
            if (c.count > 7 && c.op == reduce_op::sum)  // blocks of 4 chunks and more: partials land in the front
              layouts.emplace_back(static_cast<std::size_t>(p), 4 * c.count + 3);
            for (std::size_t first : {std::size_t{1}, std::size_t{1500}}) {
              std::vector<std::size_t> counts{first};
              for (int r = 1; r < p; ++r) counts.push_back(2 * c.count + static_cast<std::size_t>(r));
              layouts.push_back(counts);
            }
            for (const auto& counts : layouts) {
              const block_layout layout = block_layout::of_counts(counts);
              const std::vector<T> original = make_input<T>(c.op, comm.rank(), layout.total);
              const std::vector<T> want = expected_reduction<T>(c.op, p, counts[me], layout.displs[me]);
              for (algorithm a : {algorithm::ring, algorithm::shared_memory}) {
                std::vector<T> input = original;
                const std::span<T> mine = reduce_scatter_v(comm, std::span(input), counts, c.op, result_at::front, a);
                EXPECT_EQ(mine.data(), input.data());
                EXPECT_EQ(mine.size(), counts[me]);
                EXPECT_TRUE(same_elements(std::vector<T>(mine.begin(), mine.end()), want,
                                          describe<T>(c, comm, "reduce_scatter_v(result_at::front)") + " " +
                                              std::string(name_of(a)) + " first block " + std::to_string(counts[0])));
              }
            }
          }
        },
        test_config());
  });
}

TEST_P(inproc_collectives, allgather_and_v_match_the_oracle) {
  const int p = GetParam();
  for_each_dtype([&](auto zero) {
    using T = decltype(zero);
    const auto cases = sweep_cases<T>(false);
    run_in_process(
        p,
        [&](communicator& comm) {
          const auto me = static_cast<std::size_t>(comm.rank());
          for (const auto& c : cases) {
            if (c.op != reduce_op::sum) continue;  // allgather has no op: one pass per count and placement
            for (bool uneven : {false, true}) {
              const std::vector<std::size_t> counts =
                  uneven ? uneven_counts(p, c.count) : std::vector<std::size_t>(static_cast<std::size_t>(p), c.count);
              const block_layout layout = block_layout::of_counts(counts);
              std::vector<T> want;
              for (int q = 0; q < p; ++q) {
                const auto block = make_input<T>(c.op, q, counts[static_cast<std::size_t>(q)],
                                                 layout.displs[static_cast<std::size_t>(q)]);
                want.insert(want.end(), block.begin(), block.end());
              }
              const std::vector<T> mine = make_input<T>(c.op, comm.rank(), counts[me], layout.displs[me]);
              for (algorithm a :
                   {algorithm::ring, algorithm::recursive_doubling, algorithm::shared_memory, algorithm::automatic}) {
                std::vector<T> out(layout.total, from_int<T>(99));
                if (c.in_place) {
                  std::copy(mine.begin(), mine.end(), out.begin() + static_cast<std::ptrdiff_t>(layout.displs[me]));
                  if (uneven)
                    allgather_v(comm, std::span(out), counts, a);
                  else
                    allgather(comm, std::span(out), a);
                } else if (uneven) {
                  allgather_v(comm, std::span(mine), std::span(out), counts, a);
                } else {
                  allgather(comm, std::span(mine), std::span(out), a);
                }
                EXPECT_TRUE(same_elements(
                    out, want,
                    describe<T>(c, comm,
                                std::string(uneven ? "allgather_v " : "allgather ") + std::string(name_of(a)))));
              }
            }
          }
        },
        test_config());
  });
}

// allgather_v_placed: every element of every block, mine included, is handed to `place` exactly
// once with its block and offset; here placed in reverse order of the concatenated blocks. Chunks of
// 1 and 3 elements (2 and 3 slots) through the transport and through shared-memory rounds, and the
// default staging; counts uneven with zeros, and even.
TEST_P(inproc_collectives, allgather_v_placed_places_every_element_once) {
  const int p = GetParam();
  auto check = [&](auto zero) {
    using T = decltype(zero);
    run_in_process(
        p,
        [&](communicator& comm) {
          const auto me = static_cast<std::size_t>(comm.rank());
          for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1003}})
            for (bool uneven : {false, true})
              for (const staging stage :
                   {staging{1, 2, staged_path::transport}, staging{3 * sizeof(T), 3, staged_path::transport},
                    staging{1, 2, staged_path::shared_memory}, staging{3 * sizeof(T), 3, staged_path::shared_memory},
                    staging{}}) {
                const std::vector<std::size_t> counts =
                    uneven ? uneven_counts(p, count) : std::vector<std::size_t>(static_cast<std::size_t>(p), count);
                const block_layout layout = block_layout::of_counts(counts);
                std::vector<T> want(layout.total);
                for (int q = 0; q < p; ++q) {
                  const auto uq = static_cast<std::size_t>(q);
                  const auto block = make_input<T>(reduce_op::sum, q, counts[uq], layout.displs[uq]);
                  for (std::size_t i = 0; i < block.size(); ++i)
                    want[layout.total - 1 - (layout.displs[uq] + i)] = block[i];
                }
                const std::vector<T> mine = make_input<T>(reduce_op::sum, comm.rank(), counts[me], layout.displs[me]);
                std::vector<T> out(layout.total, from_int<T>(99));
                std::vector<int> hits(layout.total, 0);
                bool in_bounds = true;
                allgather_v_placed<T>(
                    comm, std::span(mine), counts,
                    [&](int block, std::size_t offset, std::span<const T> piece) {
                      const auto b = static_cast<std::size_t>(block);
                      if (block < 0 || block >= p || offset + piece.size() > counts[b]) {
                        in_bounds = false;
                        return;
                      }
                      for (std::size_t i = 0; i < piece.size(); ++i) {
                        const std::size_t at = layout.total - 1 - (layout.displs[b] + offset + i);
                        out[at] = piece[i];
                        ++hits[at];
                      }
                    },
                    stage);
                const std::string what = describe<T>({reduce_op::sum, count, false}, comm, "allgather_v_placed") +
                                         (uneven ? " uneven" : " even") + " chunk " +
                                         std::to_string(stage.chunk_bytes) + " B, path " +
                                         std::to_string(static_cast<int>(stage.path));
                EXPECT_TRUE(in_bounds) << what;
                EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; })) << what;
                EXPECT_TRUE(same_elements(out, want, what));
              }
        },
        test_config());
  };
  check(std::int32_t{});
  check(double{});
}

// ---- broadcast, reduce ---------------------------------------------------------------------------

TEST_P(inproc_collectives, broadcast_and_reduce_match_the_oracle_from_every_kind_of_root) {
  const int p = GetParam();
  for_each_dtype([&](auto zero) {
    using T = decltype(zero);
    const auto cases = sweep_cases<T>(false);
    run_in_process(
        p,
        [&](communicator& comm) {
          for (const auto& c : cases) {
            // inputs and oracles once per case (the serial oracle was most of the test's time)
            const std::vector<T> input = make_input<T>(c.op, comm.rank(), c.count);
            const std::vector<T> reduced = expected_reduction<T>(c.op, p, c.count);
            for (int root : {0, p - 1, p / 2}) {
              const std::vector<T> root_data = make_input<T>(c.op, root, c.count);
              for (algorithm a : {algorithm::chain, algorithm::binomial_tree, algorithm::automatic}) {
                const std::string how = std::string(name_of(a)) + " root " + std::to_string(root);
                if (c.op == reduce_op::sum && c.in_place) {  // broadcast has no op and is always in place
                  std::vector<T> data = comm.rank() == root ? root_data : std::vector<T>(c.count, from_int<T>(99));
                  broadcast(comm, std::span(data), root, a);
                  EXPECT_TRUE(same_elements(data, root_data, describe<T>(c, comm, "broadcast " + how)));
                }
                std::vector<T> out = c.in_place ? input : std::vector<T>(c.count, from_int<T>(99));
                if (c.in_place)
                  reduce(comm, std::span(out), c.op, root, a);
                else
                  reduce(comm, std::span(input), std::span(out), c.op, root, a);
                if (comm.rank() == root) {
                  EXPECT_TRUE(same_elements(out, reduced, describe<T>(c, comm, "reduce " + how)));
                } else if (c.in_place) {
                  EXPECT_TRUE(same_elements(out, input, describe<T>(c, comm, "reduce leaves non-roots alone, " + how)));
                }
              }
            }
          }
        },
        test_config());
  });
}

// ---- alltoall, barrier ---------------------------------------------------------------------------

TEST_P(inproc_collectives, alltoall_delivers_every_block_to_its_rank) {
  const int p = GetParam();
  for_each_dtype([&](auto zero) {
    using T = decltype(zero);
    run_in_process(
        p,
        [&](communicator& comm) {
          // the largest count takes several shared-memory rounds (a section is at most 256 KiB)
          for (std::size_t count :
               {std::size_t{0}, std::size_t{1}, std::size_t{7}, pipeline_chunk_bytes / sizeof(T) + 1}) {
            const std::size_t total = count * static_cast<std::size_t>(p);
            const std::vector<T> input = make_input<T>(reduce_op::sum, comm.rank(), total);
            std::vector<T> want;
            for (int from = 0; from < p; ++from) {
              const auto block =
                  make_input<T>(reduce_op::sum, from, count, static_cast<std::size_t>(comm.rank()) * count);
              want.insert(want.end(), block.begin(), block.end());
            }
            for (algorithm a : {algorithm::pairwise, algorithm::shared_memory, algorithm::automatic})
              for (bool in_place : {true, false}) {
                std::vector<T> out = in_place ? input : std::vector<T>(total, from_int<T>(99));
                if (in_place)
                  alltoall(comm, std::span(out), a);
                else
                  alltoall(comm, std::span(input), std::span(out), a);
                EXPECT_TRUE(same_elements(
                    out, want,
                    describe<T>({reduce_op::sum, count, in_place}, comm, "alltoall " + std::string(name_of(a)))));
              }
          }
        },
        test_config());
  });
}

// The engine's fusion without a fusion buffer: several tensors reduced through the segment as their
// concatenation, each read from its input and written to its output. Each rank cuts the
// concatenation differently (empty pieces too; in place and out of place): exact against the oracle
// for small integers, and bitwise the contiguous allreduce's result for random floats (one hand-off
// and several rounds).
TEST_P(inproc_collectives, allreduce_of_pieces_is_the_allreduce_of_their_concatenation) {
  const int p = GetParam();
  // cuts of `total` for rank r: lengths from a rank-dependent pattern, zeros included
  auto cuts = [](int r, std::size_t total) {
    std::vector<std::size_t> lengths;
    const std::size_t pattern[] = {0, 1, 1000, 7, 0, 4099, 262147};
    for (std::size_t at = 0, k = static_cast<std::size_t>(r); at < total; ++k) {
      const std::size_t n = std::min(pattern[k % 7], total - at);
      lengths.push_back(n);
      at += n;
    }
    lengths.push_back(0);
    return lengths;
  };
  for (const std::size_t total : {std::size_t{0}, std::size_t{5}, std::size_t{3000}, (std::size_t{1} << 20) + 3})
    for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::avg}) {
      const std::vector<float> want = expected_reduction<float>(op, p, total);
      run_in_process(
          p,
          [&](communicator& comm) {
            const std::vector<float> input = make_input<float>(op, comm.rank(), total);
            const std::vector<std::size_t> lengths = cuts(comm.rank(), total);
            std::vector<std::vector<float>> ins, outs;
            std::vector<allreduce_piece<float>> pieces;
            std::size_t at = 0;
            for (std::size_t k = 0; k < lengths.size(); ++k) {
              ins.emplace_back(input.begin() + static_cast<std::ptrdiff_t>(at),
                               input.begin() + static_cast<std::ptrdiff_t>(at + lengths[k]));
              outs.emplace_back(lengths[k], 99.0f);
              at += lengths[k];
            }
            for (std::size_t k = 0; k < lengths.size(); ++k) {
              const bool in_place = k % 2 == 0;
              pieces.push_back({ins[k].data(), in_place ? ins[k].data() : outs[k].data(), lengths[k]});
            }
            allreduce_shared_memory_pieces(comm, std::span<const allreduce_piece<float>>(pieces), op);
            std::vector<float> got;
            for (std::size_t k = 0; k < lengths.size(); ++k) {
              const std::vector<float>& result = k % 2 == 0 ? ins[k] : outs[k];
              got.insert(got.end(), result.begin(), result.end());
            }
            EXPECT_TRUE(same_elements(got, want,
                                      "allreduce of " + std::to_string(lengths.size()) + " pieces, " +
                                          std::to_string(total) + " elements, " + std::string(name_of(op)) +
                                          " on rank " + std::to_string(comm.rank()) + " of " + std::to_string(p)));
          },
          test_config());
    }
  // random floats: bitwise what the contiguous allreduce(shared_memory) gives, on every rank
  for (const std::size_t total : {std::size_t{3000}, (std::size_t{1} << 19) + 17}) {
    const std::vector<std::vector<float>> inputs = random_inputs<float>(p, total, 7 + total);
    std::vector<std::vector<float>> contiguous = inputs, pieced(static_cast<std::size_t>(p));
    run_in_process(
        p,
        [&](communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          allreduce(comm, std::span(contiguous[r]), reduce_op::sum, algorithm::shared_memory);
          pieced[r].assign(total, 0.0f);
          std::vector<allreduce_piece<float>> pieces;
          std::size_t at = 0;
          for (std::size_t n : cuts(comm.rank(), total)) {
            pieces.push_back({inputs[r].data() + at, pieced[r].data() + at, n});
            at += n;
          }
          allreduce_shared_memory_pieces(comm, std::span<const allreduce_piece<float>>(pieces), reduce_op::sum);
        },
        test_config());
    for (int r = 0; r < p; ++r)
      EXPECT_TRUE(same_elements(pieced[static_cast<std::size_t>(r)], contiguous[static_cast<std::size_t>(r)],
                                "random floats, pieces vs contiguous, " + std::to_string(total) + " elements, rank " +
                                    std::to_string(r) + " of " + std::to_string(p)));
  }
}

TEST_P(inproc_collectives, barrier_holds_every_rank_until_the_last_arrives) {
  const int p = GetParam();
  std::vector<std::atomic<bool>> arrived(static_cast<std::size_t>(p));
  run_in_process(
      p,
      [&](communicator& comm) {
        for (int round = 0; round < 3; ++round) {
          // the last rank arrives late; nobody may leave before it has arrived
          if (comm.rank() == p - 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
          arrived[static_cast<std::size_t>(comm.rank())] = true;
          barrier(comm);
          for (int q = 0; q < p; ++q)
            EXPECT_TRUE(arrived[static_cast<std::size_t>(q)]) << "rank " << q << " round " << round;
          barrier(comm);
          arrived[static_cast<std::size_t>(comm.rank())] = false;
          barrier(comm, algorithm::dissemination);
        }
      },
      test_config());
}

INSTANTIATE_TEST_SUITE_P(world, inproc_collectives, ::testing::ValuesIn(inproc_world_sizes),
                         [](const auto& info) { return "p" + std::to_string(info.param); });

// ---- contracts -----------------------------------------------------------------------------------

TEST(inproc_collective_contracts, collectives_never_match_user_point_to_point_messages) {
  run_in_process(
      3,
      [](communicator& comm) {
        // A user receive on tag 0 is posted before the collectives (whose first tag is 0 too); it must
        // still get the user's own message, sent after them.
        std::vector<int> user(1, -1);
        const int from = (comm.rank() + comm.size() - 1) % comm.size();
        request r = comm.transport().irecv(from, 0, std::as_writable_bytes(std::span(user)));
        std::vector<float> data(1000, 1.0f);
        allreduce(comm, std::span(data), reduce_op::sum, algorithm::ring);
        barrier(comm);
        const int mine = 1000 + comm.rank();
        comm.transport().send((comm.rank() + 1) % comm.size(), 0, std::as_bytes(std::span(&mine, 1)),
                              comm.default_deadline());
        r.wait(comm.default_deadline());
        EXPECT_EQ(user[0], 1000 + from);
        EXPECT_EQ(data[0], 3.0f);
      },
      test_config());
}

TEST(inproc_collective_contracts, an_algorithm_a_collective_lacks_is_a_usage_error_that_lists_the_ones_it_has) {
  run_in_process(
      2,
      [](communicator& comm) {
        std::vector<float> data(4);
        try {
          broadcast(comm, std::span(data), 0, algorithm::ring);
          FAIL() << "broadcast accepted algorithm::ring";
        } catch (const usage_error& e) {
          EXPECT_NE(std::string(e.what()).find(
                        "broadcast: has no algorithm 'ring'; it offers automatic, chain, binomial_tree"),
                    std::string::npos)
              << e.what();
        }
      },
      test_config());
}

TEST(inproc_collective_contracts, hierarchical_on_uneven_nodes_is_a_usage_error) {
  // 5 ranks in nodes of 2: nodes of 2, 2 and 1 rank
  EXPECT_THROW(run_in_process(
                   5,
                   [](communicator& comm) {
                     std::vector<float> data(4);
                     allreduce(comm, std::span(data), reduce_op::sum, algorithm::hierarchical);
                   },
                   test_config(), 2),
               usage_error);
}

TEST(inproc_collective_contracts, the_source_threshold_is_the_last_level_cache_shared_among_my_nodes_ranks) {
  // Unset, config::source_in_memory_min_bytes is resolved when the communicator is made: the cache
  // this machine's sysfs names divided among the ranks of my node (streaming_min_bytes where it names
  // none: this VM); a value that is set is kept.
  auto resolved = [](int ranks_per_node, std::optional<std::size_t> set) {
    std::vector<std::size_t> seen(4);
    config cfg = test_config();
    cfg.source_in_memory_min_bytes = set;
    run_in_process(
        4,
        [&](communicator& comm) {
          seen[static_cast<std::size_t>(comm.rank())] = *comm.settings().source_in_memory_min_bytes;
        },
        cfg, ranks_per_node);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), seen[0]), 4);
    return seen[0];
  };
  const std::size_t cache = last_level_cache_bytes(), fallback = config{}.streaming_min_bytes;
  EXPECT_EQ(resolved(2, std::nullopt), cache_share(cache, 2, fallback));
  EXPECT_EQ(resolved(4, std::nullopt), cache_share(cache, 4, fallback));
  EXPECT_EQ(resolved(2, std::size_t{12345}), 12345u);
  EXPECT_EQ(resolved(4, std::size_t{0}), 0u);
  // the share itself: 4 ranks in nodes of 2 hold twice what 4 ranks in one node hold
  EXPECT_EQ(cache_share(32 << 20, 2, fallback), std::size_t{16} << 20);
  EXPECT_EQ(cache_share(32 << 20, 4, fallback), std::size_t{8} << 20);
  EXPECT_EQ(cache_share(3, 4, fallback), 1u);
  EXPECT_EQ(cache_share(0, 4, fallback), fallback);
}

TEST(inproc_collective_contracts, the_last_level_cache_is_read_from_a_sysfs_layout) {
  // A directory laid out as sysfs's cpu0/cache: L1 data and instruction, a unified L2 and L3; the
  // highest data or unified level counts, an instruction cache or an unreadable entry does not.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("flexpar-cache-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto entry = [&](int index, const char* level, const char* type, const char* size) {
    const std::filesystem::path d = dir / ("index" + std::to_string(index));
    std::filesystem::create_directories(d);
    std::ofstream(d / "level") << level << "\n";
    std::ofstream(d / "type") << type << "\n";
    std::ofstream(d / "size") << size << "\n";
  };
  EXPECT_EQ(last_level_cache_bytes(dir), 0u) << "no directory";
  entry(0, "1", "Data", "32K");
  entry(1, "1", "Instruction", "32K");
  EXPECT_EQ(last_level_cache_bytes(dir), std::size_t{32} << 10);
  entry(2, "2", "Unified", "1M");
  EXPECT_EQ(last_level_cache_bytes(dir), std::size_t{1} << 20);
  entry(3, "3", "Unified", "32768K");
  EXPECT_EQ(last_level_cache_bytes(dir), std::size_t{32} << 20);
  entry(4, "4", "Instruction", "64M");  // a higher level, but not data
  entry(5, "4", "Unified", "lots");     // unreadable
  EXPECT_EQ(last_level_cache_bytes(dir), std::size_t{32} << 20);
  entry(6, "4", "Data", "4194304");  // bytes without a unit
  EXPECT_EQ(last_level_cache_bytes(dir), std::size_t{4} << 20);
  std::filesystem::remove_all(dir);
}

TEST(inproc_collective_contracts, shared_memory_across_nodes_is_a_usage_error_that_says_why) {
  // 4 ranks in nodes of 2: allgather, alltoall and the staged allgather cannot go through one segment
  run_in_process(
      4,
      [](communicator& comm) {
        std::vector<float> data(8, 1.0f), out(8);
        const std::vector<std::size_t> counts(4, 2);
        auto expect_says_why = [&](auto&& call, const std::string& what) {
          try {
            call();
            ADD_FAILURE() << what << " ran through shared memory across 2 nodes";
          } catch (const usage_error& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("spans 2 nodes"), std::string::npos) << e.what();
          }
        };
        expect_says_why([&] { allgather(comm, std::span(data), algorithm::shared_memory); },
                        "allgather(shared_memory)");
        expect_says_why([&] { alltoall(comm, std::span(data), algorithm::shared_memory); }, "alltoall(shared_memory)");
        expect_says_why([&] { reduce_scatter(comm, std::span(data), reduce_op::sum, algorithm::shared_memory); },
                        "reduce_scatter(shared_memory)");
        expect_says_why(
            [&] {
              reduce_scatter_v(comm, std::span<const float>(data), std::span(out).first(2), counts, reduce_op::sum,
                               algorithm::shared_memory);
            },
            "reduce_scatter_v(shared_memory)");
        expect_says_why(
            [&] {
              allgather_v_placed<float>(
                  comm, std::span(data).first(2), counts, [](int, std::size_t, std::span<const float>) {},
                  staging{64, 2, staged_path::shared_memory});
            },
            "allgather_v_placed: staging::path is shared_memory");
        // automatic stays on the transport there, and is right
        allgather(comm, std::span(data).first(2), std::span(out));
        EXPECT_EQ(out, std::vector<float>(8, 1.0f));
      },
      test_config(), 2);
}

TEST(inproc_collective_contracts, mismatched_lengths_are_usage_errors_with_context) {
  run_in_process(
      2,
      [](communicator& comm) {
        std::vector<float> in(4), out(5);
        try {
          allreduce(comm, std::span(in), std::span(out), reduce_op::sum);
          FAIL() << "allreduce accepted spans of different lengths";
        } catch (const usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("allreduce: input of 4 and output of 5 elements"), std::string::npos)
              << e.what();
        }
        std::vector<std::size_t> counts{1, 2, 3};
        EXPECT_THROW(allgather_v(comm, std::span(in), counts), usage_error);
        EXPECT_THROW(broadcast(comm, std::span(in), 2), usage_error);
      },
      test_config());
}

TEST(inproc_collective_contracts, a_missing_rank_ends_in_a_timeout_not_a_hang) {
  config c = test_config();
  c.timeout = std::chrono::milliseconds(300);
  for (algorithm a : {algorithm::ring, algorithm::shared_memory}) {
    EXPECT_THROW(run_in_process(
                     2,
                     [&](communicator& comm) {
                       // both ranks create the collective context (and the segment) together, then rank 1 stops
                       std::vector<float> data(1 << 16, 1.0f);
                       allreduce(comm, std::span(data), reduce_op::sum, a);
                       if (comm.rank() == 0) allreduce(comm, std::span(data), reduce_op::sum, a);
                     },
                     c),
                 timeout_error)
        << name_of(a);
  }
  // the shared-memory allgather, alltoall and reduce_scatter wait for the peer's round with the same
  // deadline
  for (const std::string op : {"allgather", "alltoall", "reduce_scatter"}) {
    try {
      run_in_process(
          2,
          [&](communicator& comm) {
            std::vector<float> data(1 << 16, 1.0f);
            allreduce(comm, std::span(data), reduce_op::sum, algorithm::shared_memory);
            if (comm.rank() != 0) return;
            if (op == "allgather")
              allgather(comm, std::span(data), algorithm::shared_memory);
            else if (op == "alltoall")
              alltoall(comm, std::span(data), algorithm::shared_memory);
            else
              reduce_scatter(comm, std::span(data), reduce_op::sum, algorithm::shared_memory);
          },
          c);
      ADD_FAILURE() << op << " did not time out";
    } catch (const timeout_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(op + "(shared_memory): rank 1 publishing round 0"), std::string::npos) << what;
    }
  }
}

TEST(inproc_collective_contracts, mismatched_counts_never_write_outside_the_buffers) {
  // Counts that differ across ranks are not detected (MPI's rule), but they may only end in an error
  // or in wrong values, never in a write past a buffer: guard elements after each buffer must
  // survive (and the AddressSanitizer run of this suite checks reads as well).
  config c = test_config();
  c.timeout = std::chrono::milliseconds(300);
  constexpr std::size_t guard = 64;
  constexpr float sentinel = -12345.0f;
  for (algorithm a : {algorithm::ring, algorithm::halving_doubling, algorithm::shared_memory, algorithm::automatic}) {
    for (std::size_t base : {std::size_t{5}, pipeline_chunk_bytes / sizeof(float) + 1}) {
      try {
        run_in_process(
            3,
            [&](communicator& comm) {
              const std::size_t count = base + 3 * static_cast<std::size_t>(comm.rank());
              std::vector<float> buffer(count + guard, sentinel);
              std::fill_n(buffer.begin(), count, 1.0f);
              try {
                allreduce(comm, std::span(buffer).first(count), reduce_op::sum, a);
              } catch (const error&) {
                // an error is one of the allowed outcomes
              }
              for (std::size_t i = count; i < buffer.size(); ++i)
                ASSERT_EQ(buffer[i], sentinel)
                    << name_of(a) << ": element " << i - count << " past the buffer was written";
            },
            c);
      } catch (const error&) {
        // the same, seen from run_in_process
      }
    }
  }
}

TEST(inproc_collective_contracts, the_type_erased_allreduce_is_the_typed_one) {
  run_in_process(
      3,
      [](communicator& comm) {
        std::vector<std::int64_t> data(10, comm.rank() + 1);
        allreduce(comm, dtype::i64, data.data(), data.data(), data.size(), reduce_op::sum);
        EXPECT_EQ(data, std::vector<std::int64_t>(10, 6));
        std::vector<float> in(5, 2.0f), out(5);
        allreduce(comm, dtype::f32, in.data(), out.data(), in.size(), reduce_op::prod, algorithm::halving_doubling);
        EXPECT_EQ(out, std::vector<float>(5, 8.0f));
      },
      test_config());
}

}  // namespace
}  // namespace flexpar
