// Ranks that disagree about a collective through the shared-memory segment: every rank throws the
// same mismatch_error naming each side and its ranks, before anything is written (guard words past
// every buffer, and the buffers themselves, stay as they were), and the communicator is refused
// afterwards. Threads as ranks on one node (the segment's path). Through the transport, a count
// that differs is an error on the ranks that receive the other size, never a result.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/comm/run_in_process.hpp>

#include "support/test_config.hpp"

namespace flexpar {
namespace {

using testing_support::with_timeout;

/// `n` elements of value 1 followed by 16 guard elements of value 77.
template <class T>
std::vector<T> guarded(std::size_t n) {
  std::vector<T> v(n + 16, T(77));
  std::fill_n(v.begin(), n, T(1));
  return v;
}

/// True when `v` is still guarded(n): nothing was written into it or past its first n elements.
template <class T>
bool untouched(const std::vector<T>& v, std::size_t n) {
  return v == guarded<T>(n);
}

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

TEST(transport_mismatch, counts_that_differ_end_in_errors_never_in_a_result) {
  // Through the transport each message's size is computed by both sides; a receive gets exactly
  // that many bytes or fails: shorter is a mismatch_error, longer the transport's truncation error.
  // Ranks that wait on a rank that failed end at the deadline (2 s here). Rank 2 passes 3 x the
  // others' count (999, divisible by 3 for the collectives that need it); some rank fails, nothing
  // is written past any buffer, and no allreduce returns on any rank. Where some rank receives a
  // shorter message than it computed (a root or chain end that receives from rank 2 receives a
  // longer one), that rank's error is the mismatch_error.
  struct variant {
    const char* name;
    bool every_rank_throws;
    bool a_rank_receives_less;
    std::function<void(communicator&, std::span<float>)> call;
  };
  const std::vector<variant> variants = {
      {"allreduce ring", true, true,
       [](communicator& c, std::span<float> d) { allreduce(c, d, reduce_op::sum, algorithm::ring); }},
      {"allreduce halving_doubling", true, true,
       [](communicator& c, std::span<float> d) { allreduce(c, d, reduce_op::sum, algorithm::halving_doubling); }},
      {"broadcast chain", false, true,
       [](communicator& c, std::span<float> d) { broadcast(c, d, 0, algorithm::chain); }},
      {"broadcast binomial_tree", false, true,
       [](communicator& c, std::span<float> d) { broadcast(c, d, 0, algorithm::binomial_tree); }},
      {"reduce chain", false, false,
       [](communicator& c, std::span<float> d) { reduce(c, d, reduce_op::sum, 0, algorithm::chain); }},
      {"reduce binomial_tree", false, false,
       [](communicator& c, std::span<float> d) { reduce(c, d, reduce_op::sum, 0, algorithm::binomial_tree); }},
      {"allgather ring", false, true, [](communicator& c, std::span<float> d) { allgather(c, d, algorithm::ring); }},
      {"allgather recursive_doubling", false, false,
       [](communicator& c, std::span<float> d) { allgather(c, d, algorithm::recursive_doubling); }},
      {"reduce_scatter ring", false, true,
       [](communicator& c, std::span<float> d) { reduce_scatter(c, d, reduce_op::sum, algorithm::ring); }},
      {"alltoall pairwise", false, true,
       [](communicator& c, std::span<float> d) { alltoall(c, d, algorithm::pairwise); }},
  };
  const config cfg = with_timeout(std::chrono::seconds(2));
  for (const variant& v : variants) {
    SCOPED_TRACE(v.name);
    std::vector<int> returned(3, 0), mismatches(3, 0);
    run_in_process(
        3,
        [&](communicator& comm) {
          const std::size_t n = comm.rank() == 2 ? 2997 : 999;
          auto data = guarded<float>(n);
          try {
            v.call(comm, std::span(data).first(n));
            returned[static_cast<std::size_t>(comm.rank())] = 1;
          } catch (const mismatch_error& e) {
            mismatches[static_cast<std::size_t>(comm.rank())] = 1;
            EXPECT_NE(std::string(e.what()).find("the ranks disagree about a collective"), std::string::npos)
                << e.what();
          } catch (const error&) {
          }
          EXPECT_TRUE(std::equal(data.begin() + static_cast<std::ptrdiff_t>(n), data.end(),
                                 guarded<float>(n).begin() + static_cast<std::ptrdiff_t>(n)))
              << "rank " << comm.rank() << " wrote past its buffer";
        },
        cfg);
    EXPECT_LT(std::count(returned.begin(), returned.end(), 1), 3);
    if (v.a_rank_receives_less) {
      EXPECT_GE(std::count(mismatches.begin(), mismatches.end(), 1), 1);
    }
    if (v.every_rank_throws) {
      EXPECT_EQ(std::count(returned.begin(), returned.end(), 1), 0);
    }
  }
}

}  // namespace
}  // namespace flexpar
