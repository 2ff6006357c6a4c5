// The public exchanges whose blocks the caller packs and places (the ones the SBP boxings build on):
// the shared-memory round exchange (shared_memory_rounds, shared_memory_alltoall_placed,
// shared_memory_reduce_scatter_packed, uses_shared_memory) and alltoall_v_placed over the transport,
// threads as ranks, world sizes 1-8, uneven blocks with empty ones, chunks of one element and more
// than one round.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/comm/run_in_process.hpp>

#include "oracle.hpp"
#include "support/test_config.hpp"
#include "support/world_sizes.hpp"

namespace flexpar {
namespace {

using namespace testing_support;

/// Elements rank `from` sends rank `to`: uneven, some empty.
std::size_t block_count(int from, int to, std::size_t scale) {
  return static_cast<std::size_t>((from * 3 + to * 5) % 4) * scale;
}

/// Element i of the block from `from` to `to`: tells both ranks and the index apart.
std::int32_t block_value(int from, int to, std::size_t i) {
  return static_cast<std::int32_t>(from * 1000000 + to * 10000 + static_cast<int>(i));
}

class round_exchange : public ::testing::TestWithParam<int> {};

std::string world_name(const ::testing::TestParamInfo<int>& info) {
  std::string name = std::to_string(info.param);
  return name.insert(0, 1, 'p');
}

// uses_shared_memory: transport never; automatic on one node of two ranks or more; p == 1 never;
// shared_memory across nodes is a usage_error naming the op.
TEST_P(round_exchange, uses_shared_memory_answers_per_path) {
  const int p = GetParam();
  run_in_process(
      p,
      [&](communicator& comm) {
        EXPECT_FALSE(uses_shared_memory(comm, staging{.path = staged_path::transport}, "test"));
        EXPECT_EQ(uses_shared_memory(comm, staging{}, "test"), p > 1);
        EXPECT_EQ(uses_shared_memory(comm, staging{.path = staged_path::shared_memory}, "test"), p > 1);
      },
      with_timeout());
  if (p < 2) return;
  run_in_process(
      p,
      [&](communicator& comm) {
        EXPECT_FALSE(uses_shared_memory(comm, staging{}, "test"));
        try {
          (void)uses_shared_memory(comm, staging{.path = staged_path::shared_memory}, "the op");
          ADD_FAILURE() << "no usage_error across nodes";
        } catch (const usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("the op: staging::path is shared_memory"), std::string::npos)
              << e.what();
        }
      },
      with_timeout(), 1);
}

// shared_memory_rounds: round k of every peer is drained once, in the order r+1, r+2, ..., with what
// that peer filled for round k; more rounds than the segment's depth (the buffers are reused).
TEST_P(round_exchange, shared_memory_rounds_drain_every_peer_once_per_round_in_order) {
  const int p = GetParam();
  if (p < 2) GTEST_SKIP() << "one rank has no segment to exchange through";
  constexpr std::uint64_t rounds = 2 * shm_depth + 3;
  run_in_process(
      p,
      [&](communicator& comm) {
        const int me = comm.rank();
        std::vector<int> drained;  // peer of each drain, in order
        bool content = true;
        for (int call = 0; call < 2; ++call)  // a second call continues the segment's round count
          shared_memory_rounds(
              comm, rounds, "test rounds",
              [&](std::uint64_t k, std::span<std::byte> buffer) {
                ASSERT_EQ(buffer.size(), shm_round_bytes);
                const std::int32_t v = block_value(me, call, static_cast<std::size_t>(k));
                std::memcpy(buffer.data(), &v, sizeof v);
                std::memcpy(buffer.data() + buffer.size() - sizeof v, &v, sizeof v);
              },
              [&](int q, std::uint64_t k, std::span<const std::byte> buffer) {
                std::int32_t head = 0, tail = 0;
                std::memcpy(&head, buffer.data(), sizeof head);
                std::memcpy(&tail, buffer.data() + buffer.size() - sizeof tail, sizeof tail);
                const std::int32_t want = block_value(q, call, static_cast<std::size_t>(k));
                content = content && head == want && tail == want;
                drained.push_back(q);
              });
        EXPECT_TRUE(content) << "rank " << me;
        std::vector<int> want;
        for (int call = 0; call < 2; ++call)
          for (std::uint64_t k = 0; k < rounds; ++k)
            for (int step = 1; step < p; ++step) want.push_back((me + step) % p);
        EXPECT_EQ(drained, want) << "rank " << me;
      },
      with_timeout());
}

// shared_memory_alltoall_placed: every element of every block I receive, my own included, is placed
// once at its offset with the sender's values; element chunks of one element and of several, uneven
// blocks with empty ones.
TEST_P(round_exchange, shared_memory_alltoall_placed_places_every_element_once) {
  const int p = GetParam();
  if (p < 2) GTEST_SKIP() << "one rank has no segment to exchange through";
  run_in_process(
      p,
      [&](communicator& comm) {
        const int me = comm.rank();
        // (scale, chunk): one element per chunk, several, and the default over several rounds
        for (const auto& [scale, chunk_bytes] :
             {std::pair{std::size_t{1}, sizeof(std::int32_t)}, std::pair{std::size_t{7}, sizeof(std::int32_t)},
              std::pair{std::size_t{7}, 5 * sizeof(std::int32_t)},
              std::pair{std::size_t{70000}, staging{}.chunk_bytes}}) {
          const round_chunks chunks = alltoall_round_chunks<std::int32_t>(staging{.chunk_bytes = chunk_bytes}, p);
          auto count = [scale](int from, int to) { return block_count(from, to, scale); };
          std::size_t rounds = 0;
          for (int from = 0; from < p; ++from)
            for (int to = 0; to < p; ++to) rounds = std::max(rounds, chunks.rounds(count(from, to)));
          std::vector<std::vector<std::int32_t>> got(static_cast<std::size_t>(p));
          std::vector<std::vector<int>> hits(static_cast<std::size_t>(p));
          for (int q = 0; q < p; ++q) {
            got[static_cast<std::size_t>(q)].assign(count(q, me), -1);
            hits[static_cast<std::size_t>(q)].assign(count(q, me), 0);
          }
          bool in_bounds = true;
          shared_memory_alltoall_placed<std::int32_t>(
              comm, rounds, element_pieces(chunks, count),
              [&](std::uint64_t k, std::span<const std::span<std::int32_t>> sections) {
                ASSERT_EQ(sections.size(), static_cast<std::size_t>(p));
                for (int q = 0; q < p; ++q)
                  for (std::size_t i = 0; i < sections[static_cast<std::size_t>(q)].size(); ++i)
                    sections[static_cast<std::size_t>(q)][i] = block_value(me, q, k * chunks.chunk + i);
              },
              [&](int q, std::size_t offset, std::span<const std::int32_t> piece) {
                auto& block = got[static_cast<std::size_t>(q)];
                if (offset + piece.size() > block.size()) {
                  in_bounds = false;
                  return;
                }
                for (std::size_t i = 0; i < piece.size(); ++i) {
                  block[offset + i] = piece[i];
                  ++hits[static_cast<std::size_t>(q)][offset + i];
                }
              },
              "test alltoall");
          const std::string what = "rank " + std::to_string(me) + " scale " + std::to_string(scale) + " chunk " +
                                   std::to_string(chunk_bytes) + " B";
          EXPECT_TRUE(in_bounds) << what;
          for (int q = 0; q < p; ++q) {
            const auto uq = static_cast<std::size_t>(q);
            std::vector<std::int32_t> want(count(q, me));
            for (std::size_t i = 0; i < want.size(); ++i) want[i] = block_value(q, me, i);
            EXPECT_TRUE(same_elements(got[uq], want, what + " from rank " + std::to_string(q)));
            EXPECT_TRUE(std::all_of(hits[uq].begin(), hits[uq].end(), [](int h) { return h == 1; }))
                << what << " from rank " << q;
          }
        }
      },
      with_timeout());
}

// shared_memory_reduce_scatter_packed: contiguous blocks packed by the caller, my block reduced by
// `first` from my own data and by the op from every peer's section, against the serial oracle; the
// result apart from my data and at the front of it (result_at::front's layout, reduced forward).
TEST_P(round_exchange, shared_memory_reduce_scatter_packed_matches_the_oracle) {
  const int p = GetParam();
  if (p < 2) GTEST_SKIP() << "one rank has no segment to exchange through";
  run_in_process(
      p,
      [&](communicator& comm) {
        const int me = comm.rank();
        const auto um = static_cast<std::size_t>(me);
        for (const reduce_op op : {reduce_op::sum, reduce_op::max})
          for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1003}, std::size_t{300001}})
            for (const bool at_front : {false, true}) {
              const std::vector<std::size_t> counts = [&] {
                std::vector<std::size_t> c(static_cast<std::size_t>(p));
                for (int q = 0; q < p; ++q) c[static_cast<std::size_t>(q)] = count * static_cast<std::size_t>(q % 3);
                return c;
              }();
              const block_layout layout = block_layout::of_counts(counts);
              std::vector<float> data = make_input<float>(op, me, layout.total);
              std::vector<float> apart(counts[um], -1.0f);
              const std::span<float> out =
                  at_front ? std::span<float>(data).first(counts[um]) : std::span<float>(apart);
              const std::span<const float> mine = layout.of(std::span<const float>(data), me);
              const round_chunks chunks = alltoall_round_chunks<float>(staging{}, p);
              std::size_t rounds = 0;
              for (const std::size_t n : counts) rounds = std::max(rounds, chunks.rounds(n));
              auto piece = element_pieces(chunks, [&](int q, int) { return counts[static_cast<std::size_t>(q)]; });
              shared_memory_reduce_scatter_packed<float>(
                  comm, rounds, [&](int q, std::uint64_t k) { return piece(q, q, k); },
                  [&](std::uint64_t k, std::span<const std::span<float>> sections) {
                    for (int q = 0; q < p; ++q) {
                      const std::span<float> to = sections[static_cast<std::size_t>(q)];
                      if (q != me && !to.empty())
                        std::memcpy(to.data(), layout.of(std::span<const float>(data), q).data() + k * chunks.chunk,
                                    to.size_bytes());
                    }
                  },
                  [&](std::uint64_t k, std::span<float> result, std::span<const float> theirs) {
                    with_reduce_kernel<float>(op, [&](auto reduce) {
                      reduce(result.data(), mine.data() + k * chunks.chunk, theirs.data(), result.size());
                    });
                  },
                  out, op, "test reduce_scatter");
              const std::vector<float> got(out.begin(), out.end());
              EXPECT_TRUE(same_elements(got, expected_reduction<float>(op, p, counts[um], layout.displs[um]),
                                        "rank " + std::to_string(me) + " " + std::string(name_of(op)) + " count " +
                                            std::to_string(count) + (at_front ? " at the front" : " apart")));
            }
      },
      with_timeout());
}

// alltoall_v_placed over the transport: blocks sent from the caller's data or from a staging buffer
// packed in source(), received into their place or into a staging buffer unpacked in landed(); my own
// block is not exchanged. Checked against the blocks' values, with empty blocks.
TEST_P(round_exchange, alltoall_v_placed_delivers_every_peer_block) {
  const int p = GetParam();
  run_in_process(
      p,
      [&](communicator& comm) {
        const int me = comm.rank();
        for (const std::size_t scale : {std::size_t{1}, std::size_t{1001}})
          for (const bool staged : {false, true}) {
            std::vector<std::vector<std::int32_t>> send(static_cast<std::size_t>(p)), got(static_cast<std::size_t>(p));
            for (int q = 0; q < p; ++q) {
              auto& block = send[static_cast<std::size_t>(q)];
              block.resize(block_count(me, q, scale));
              for (std::size_t i = 0; i < block.size(); ++i) block[i] = block_value(me, q, i);
              got[static_cast<std::size_t>(q)].assign(block_count(q, me, scale), -1);
            }
            std::vector<std::int32_t> out_stage, in_stage;
            std::vector<int> sources, landings;
            alltoall_v_placed<std::int32_t>(
                comm,
                [&](int to) {
                  sources.push_back(to);
                  const auto& block = send[static_cast<std::size_t>(to)];
                  if (!staged) return std::span<const std::int32_t>(block);
                  out_stage.assign(block.begin(), block.end());
                  return std::span<const std::int32_t>(out_stage);
                },
                [&](int from) {
                  auto& block = got[static_cast<std::size_t>(from)];
                  if (!staged) return std::span<std::int32_t>(block);
                  in_stage.assign(block.size(), -2);
                  return std::span<std::int32_t>(in_stage);
                },
                [&](int from, std::span<const std::int32_t> landed) {
                  landings.push_back(from);
                  if (staged) std::copy(landed.begin(), landed.end(), got[static_cast<std::size_t>(from)].begin());
                });
            const std::string what =
                "rank " + std::to_string(me) + " scale " + std::to_string(scale) + (staged ? " staged" : " in place");
            std::vector<int> want_sources, want_landings;
            for (int step = 1; step < p; ++step) {
              want_sources.push_back((me + step) % p);
              want_landings.push_back((me - step + p) % p);
            }
            EXPECT_EQ(sources, want_sources) << what;
            EXPECT_EQ(landings, want_landings) << what;
            for (int q = 0; q < p; ++q) {
              if (q == me) continue;  // my own block is the caller's
              std::vector<std::int32_t> want(block_count(q, me, scale));
              for (std::size_t i = 0; i < want.size(); ++i) want[i] = block_value(q, me, i);
              EXPECT_TRUE(
                  same_elements(got[static_cast<std::size_t>(q)], want, what + " from rank " + std::to_string(q)));
            }
          }
      },
      with_timeout());
}

INSTANTIATE_TEST_SUITE_P(worlds, round_exchange, ::testing::ValuesIn(inproc_world_sizes), world_name);

// reduce_into_forward and with_reduce_kernel: a result written ahead of the input it reads (by a gap
// shorter than the run), in place, and apart, against element-wise reference values.
TEST(reduce_forward, result_ahead_of_its_input_reads_before_it_overwrites) {
  for (const std::size_t gap : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{64}, std::size_t{5000}})
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      std::vector<float> buffer(gap + n), b(n);
      for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<float>(i % 97);
      for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<float>(i % 13);
      std::vector<float> want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = buffer[gap + i] + b[i];
      std::vector<float> by_kernel = buffer;
      reduce_into_forward(std::span<float>(buffer).first(n), std::span<const float>(buffer).subspan(gap, n),
                          std::span<const float>(b), reduce_op::sum);
      with_reduce_kernel<float>(reduce_op::sum,
                                [&](auto reduce) { reduce(by_kernel.data(), by_kernel.data() + gap, b.data(), n); });
      const std::string what = "gap " + std::to_string(gap) + " n " + std::to_string(n);
      EXPECT_TRUE(same_elements(std::vector<float>(buffer.begin(), buffer.begin() + static_cast<std::ptrdiff_t>(n)),
                                want, what + " reduce_into_forward"));
      EXPECT_TRUE(
          same_elements(std::vector<float>(by_kernel.begin(), by_kernel.begin() + static_cast<std::ptrdiff_t>(n)), want,
                        what + " with_reduce_kernel"));
    }
}

}  // namespace
}  // namespace flexpar
