// Ranks that disagree about a collective: every rank throws the same mismatch_error naming each side
// and its ranks, before anything is written (guard words past every buffer, and the buffers
// themselves, stay as they were). Through the shared-memory segment (threads as ranks on one node)
// the communicator is refused afterwards; through the transport (collective/call_agreement.hpp:
// threads as ranks on nodes of one rank, tests/collective/mismatch_cases.hpp) it goes on working.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/comm/run_in_process.hpp>

#include "mismatch_cases.hpp"
#include "support/test_config.hpp"

namespace flexpar {
namespace {

using namespace testing_support;

/// Runs `call` on every one of `p` ranks (one node); each must throw a mismatch_error whose text
/// holds every string of `says`; then any collective on the communicator is a usage_error.
void expect_mismatch_everywhere(int p, const std::function<void(communicator&)>& call,
                                const std::vector<std::string>& says) {
  std::vector<std::string> seen(static_cast<std::size_t>(p));
  run_in_process(
      p,
      [&](communicator& comm) {
        try {
          call(comm);
          ADD_FAILURE() << "rank " << comm.rank() << ": the mismatched call returned";
          return;
        } catch (const mismatch_error& e) {
          seen[static_cast<std::size_t>(comm.rank())] = e.what();
        }
        std::vector<float> one(1, 1.0f);
        try {
          allreduce(comm, std::span(one), reduce_op::sum);
          ADD_FAILURE() << "rank " << comm.rank() << ": a collective after the mismatch ran";
        } catch (const usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("out of step since an earlier one failed"), std::string::npos)
              << e.what();
        }
      },
      with_timeout(std::chrono::seconds(30)));
  for (int r = 0; r < p; ++r) {
    const std::string& text = seen[static_cast<std::size_t>(r)];
    EXPECT_NE(text.find("[rank " + std::to_string(r) + "]"), std::string::npos) << text;
    for (const std::string& s : says) EXPECT_NE(text.find(s), std::string::npos) << "rank " << r << ": " << text;
  }
}

TEST(shared_memory_mismatch, counts_differ_in_a_one_round_allreduce) {
  // the case measured in the issue: automatic on one node, rank 2 passes 3000 floats, the others 1000
  expect_mismatch_everywhere(3,
                             [](communicator& comm) {
                               // a machine on which the segment wins: a measured one would follow the load
                               // of this machine (and count its own calls through the segment)
                               set_cost_params(comm, cost_params{20e-6, 1.0 / 1e9, 1.0 / 10e9, 0.5e-6, 1.0 / 20e9});
                               const std::size_t n = comm.rank() == 2 ? 3000 : 1000;
                               auto v = guarded<float>(n);
                               try {
                                 allreduce(comm, std::span(v).first(n), reduce_op::sum);
                               } catch (...) {
                                 EXPECT_TRUE(untouched(v, n)) << "rank " << comm.rank();
                                 throw;
                               }
                             },
                             {"allreduce(shared_memory): the ranks disagree about the call: ",
                              "allreduce(shared_memory) of 1000 f32 (sum) in 1 round, call 0 on ranks {0,1} but "
                              "allreduce(shared_memory) of 3000 f32 (sum) in 1 round, call 0 on rank {2}"});
}

TEST(shared_memory_mismatch, counts_differ_in_a_many_round_allreduce) {
  expect_mismatch_everywhere(
      2,
      [](communicator& comm) {
        const std::size_t n = comm.rank() == 0 ? 300000 : 600000;
        auto v = guarded<float>(n);
        try {
          allreduce(comm, std::span(v).first(n), reduce_op::sum, algorithm::shared_memory);
        } catch (...) {
          EXPECT_TRUE(untouched(v, n)) << "rank " << comm.rank();
          throw;
        }
      },
      {"of 300000 f32 (sum) in 2 rounds, call 0 on rank {0} but allreduce(shared_memory) of 600000 f32 (sum) "
       "in 3 rounds, call 0 on rank {1}"});
}

TEST(shared_memory_mismatch, dtypes_differ) {
  expect_mismatch_everywhere(
      3,
      [](communicator& comm) {
        if (comm.rank() == 1) {
          auto v = guarded<std::int32_t>(64);
          allreduce(comm, std::span(v).first(64), reduce_op::sum, algorithm::shared_memory);
        } else {
          auto v = guarded<float>(64);
          allreduce(comm, std::span(v).first(64), reduce_op::sum, algorithm::shared_memory);
        }
      },
      {"of 64 f32 (sum) in 1 round, call 0 on ranks {0,2} but allreduce(shared_memory) of 64 i32 (sum) in 1 "
       "round, call 0 on rank {1}"});
}

TEST(shared_memory_mismatch, ops_differ) {
  expect_mismatch_everywhere(
      3,
      [](communicator& comm) {
        auto v = guarded<float>(5);
        allreduce(comm, std::span(v).first(5), comm.rank() == 0 ? reduce_op::max : reduce_op::sum,
                  algorithm::shared_memory);
      },
      {"of 5 f32 (max) in 1 round, call 0 on rank {0} but allreduce(shared_memory) of 5 f32 (sum) in 1 round, "
       "call 0 on ranks {1,2}"});
}

TEST(shared_memory_mismatch, an_empty_buffer_on_one_rank_still_says_so) {
  expect_mismatch_everywhere(
      2,
      [](communicator& comm) {
        const std::size_t n = comm.rank() == 1 ? 0 : 7;
        auto v = guarded<double>(n);
        allreduce(comm, std::span(v).first(n), reduce_op::sum, algorithm::shared_memory);
      },
      {"of 7 f64 (sum) in 1 round, call 0 on rank {0} but allreduce(shared_memory) of 0 f64 (sum) in 1 round, "
       "call 0 on rank {1}"});
}

TEST(shared_memory_mismatch, a_call_the_others_did_not_make) {
  // rank 1 makes an allgather first: its call 0 meets the others' allreduce
  expect_mismatch_everywhere(3,
                             [](communicator& comm) {
                               std::vector<float> v(6, 1.0f);
                               if (comm.rank() == 1) allgather(comm, std::span(v), algorithm::shared_memory);
                               allreduce(comm, std::span(v), reduce_op::sum, algorithm::shared_memory);
                             },
                             {"call 0 on ranks {0,2} but ", "in 1 round, call 0 on rank {1}"});
}

TEST(shared_memory_mismatch, allgather_reduce_scatter_and_alltoall_counts_differ) {
  for (const char* which : {"allgather", "reduce_scatter", "alltoall"}) {
    SCOPED_TRACE(which);
    const std::string name = std::string(which) + "(shared_memory)";
    expect_mismatch_everywhere(3,
                               [&](communicator& comm) {
                                 const std::size_t n = comm.rank() == 0 ? 6 : 9;
                                 auto v = guarded<float>(n);
                                 const std::span<float> data = std::span(v).first(n);
                                 try {
                                   if (name == "allgather(shared_memory)")
                                     allgather(comm, data, algorithm::shared_memory);
                                   if (name == "reduce_scatter(shared_memory)")
                                     reduce_scatter(comm, data, reduce_op::sum, algorithm::shared_memory);
                                   if (name == "alltoall(shared_memory)")
                                     alltoall(comm, data, algorithm::shared_memory);
                                 } catch (...) {
                                   EXPECT_TRUE(untouched(v, n)) << "rank " << comm.rank();
                                   throw;
                                 }
                               },
                               {name + ": the ranks disagree about the call: " + name + " of 6 f32",
                                " on rank {0} but " + name + " of 9 f32", " on ranks {1,2}"});
  }
}

TEST(shared_memory_mismatch, agreeing_calls_after_agreeing_calls_still_run) {
  // the check's control: the same sequence on every rank, empty buffers included, gives the sums
  run_in_process(
      3,
      [](communicator& comm) {
        for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{300000}, std::size_t{0}, std::size_t{17}}) {
          std::vector<float> v(n, static_cast<float>(comm.rank() + 1));
          allreduce(comm, std::span(v), reduce_op::sum, algorithm::shared_memory);
          EXPECT_EQ(v, std::vector<float>(n, 6.0f)) << n;
          std::vector<float> g(3 * n, 0.0f);
          std::fill_n(g.begin() + static_cast<std::ptrdiff_t>(comm.rank() * n), n, 1.0f);
          allgather(comm, std::span(g), algorithm::shared_memory);
          EXPECT_EQ(g, std::vector<float>(3 * n, 1.0f)) << n;
        }
      },
      with_timeout(std::chrono::seconds(30)));
}

/// Every case of mismatch_cases on `p` threads as ranks in nodes of `ranks_per_node` (0: one node,
/// where the ranks agree through the segment; otherwise over the transport). Every rank throws a
/// mismatch_error naming both sides, with its buffers untouched. Afterwards, on one node the
/// communicator is refused; across nodes every message of the agreement was received, and the next
/// collective runs and is right.
void expect_every_case(int p, int odd, int ranks_per_node) {
  for (const mismatch_case& mc : mismatch_cases(p, odd)) {
    SCOPED_TRACE(mc.name);
    std::vector<std::string> seen(static_cast<std::size_t>(p));
    run_in_process(
        p,
        [&](communicator& comm) {
          try {
            mc.call(comm, comm.rank() == odd);
            ADD_FAILURE() << "rank " << comm.rank() << ": the mismatched call returned";
          } catch (const mismatch_error& e) {
            seen[static_cast<std::size_t>(comm.rank())] = e.what();
          }
          std::vector<float> one(1, 1.0f);
          if (ranks_per_node == 0) {
            EXPECT_THROW(allreduce(comm, std::span(one), reduce_op::sum, algorithm::ring), usage_error);
          } else {
            allreduce(comm, std::span(one), reduce_op::sum, algorithm::ring);
            EXPECT_EQ(one[0], static_cast<float>(p)) << "rank " << comm.rank();
          }
        },
        with_timeout(std::chrono::seconds(20)), ranks_per_node);
    for (int r = 0; r < p; ++r) {
      const std::string& text = seen[static_cast<std::size_t>(r)];
      EXPECT_NE(text.find("[rank " + std::to_string(r) + "]"), std::string::npos) << text;
      EXPECT_NE(text.find("the ranks disagree about the call: "), std::string::npos) << text;
      for (const side& s : mc.says)
        EXPECT_TRUE(names_side(text, s)) << s.description << " on " << s.ranks << "\n" << text;
    }
  }
}

TEST(call_agreement, every_collective_over_the_transport_p3) { expect_every_case(3, 2, 1); }
TEST(call_agreement, every_collective_through_the_segment_p3) { expect_every_case(3, 2, 0); }
TEST(call_agreement, dissemination_with_the_odd_rank_anywhere) {
  // ceil(log2 p) steps, p not a power of two too; the odd rank first, in the middle, last
  for (auto [p, odd] : {std::pair{2, 0}, {4, 1}, {5, 3}, {5, 0}, {7, 6}}) {
    SCOPED_TRACE("p = " + std::to_string(p) + ", odd rank " + std::to_string(odd));
    std::vector<mismatch_case> cases = mismatch_cases(p, odd);
    cases.resize(1);  // allreduce by ring, counts
    std::vector<std::string> seen(static_cast<std::size_t>(p));
    run_in_process(
        p,
        [&](communicator& comm) {
          try {
            cases[0].call(comm, comm.rank() == odd);
          } catch (const mismatch_error& e) {
            seen[static_cast<std::size_t>(comm.rank())] = e.what();
          }
        },
        with_timeout(std::chrono::seconds(20)), 1);
    for (int r = 0; r < p; ++r)
      for (const side& s : cases[0].says)
        EXPECT_TRUE(names_side(seen[static_cast<std::size_t>(r)], s)) << seen[static_cast<std::size_t>(r)];
  }
}

TEST(call_agreement, the_shared_memory_path_and_a_transport_path_disagree) {
  // one node: rank 2 picks the ring where the others take the segment's allreduce (counts that
  // send automatic down different paths look like this)
  expect_mismatch_everywhere(3,
                             [](communicator& comm) {
                               auto v = guarded<float>(12);
                               allreduce(comm, std::span(v).first(12), reduce_op::sum,
                                         comm.rank() == 2 ? algorithm::ring : algorithm::shared_memory);
                             },
                             {"allreduce(shared_memory) of 12 f32 (sum) in 1 round, call 0 on ranks {0,1}",
                              "allreduce by ring of 12 f32 (sum), call 0 on rank {2}"});
}

TEST(call_agreement, agreeing_calls_pass_on_both_paths) {
  for (int ranks_per_node : {0, 1})
    run_in_process(
        3,
        [&](communicator& comm) {
          for (int i = 0; i < 20; ++i) {
            std::vector<float> v(9, 1.0f);
            allreduce(comm, std::span(v), reduce_op::sum, algorithm::ring);
            broadcast(comm, std::span(v), i % 3, algorithm::binomial_tree);
            barrier(comm);
            EXPECT_EQ(v, std::vector<float>(9, 3.0f));
          }
        },
        with_timeout(std::chrono::seconds(20)), ranks_per_node);
}

}  // namespace
}  // namespace flexpar
