// flexpar/cuda/nccl.hpp: the communicator on one GPU (one NCCL rank: a GPU holds one rank of a
// communicator), its stream ordering, and the watchdog turning a peer that never comes into an error.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/cuda/nccl.hpp>

#include "support/test_config.hpp"

namespace fc = flexpar::cuda;
using flexpar::reduce_op;
using namespace std::chrono_literals;

TEST(Nccl, OneRankCollectivesAreTheIdentityAndKeepStreamOrder) {
  flexpar::run_in_process(
      1,
      [](flexpar::communicator& comm) {
        fc::nccl_communicator nccl(comm, 0);
        EXPECT_EQ(nccl.size(), 1);
        fc::stream user;
        std::vector<float> host(1 << 20);
        for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 97);
        fc::device_buffer<float> a(host.size()), b(host.size());
        // The upload is on the user's stream; the allreduce must start after it, the download after it.
        fc::copy_async(a.span(), std::span(host), user);
        nccl.allreduce(fc::device_span<const float>(a.span()), b.span(), reduce_op::sum, user);
        nccl.allgather(fc::device_span<const float>(b.span()), a.span(), user);
        nccl.broadcast(a.span(), 0, user);
        std::vector<float> back(host.size());
        fc::copy_async(std::span(back), fc::device_span<const float>(a.span()), user);
        nccl.synchronize(user, "identity collectives");
        EXPECT_EQ(back, host);
      },
      flexpar::testing_support::with_timeout(60s));
}

TEST(Nccl, APeerThatNeverJoinsIsATimeoutNotAHang) {
  // Two host ranks exchange the unique id; rank 1 never creates its NCCL communicator. Rank 0's
  // non-blocking init must give up at its deadline with an error naming the bootstrap.
  flexpar::run_in_process(
      2,
      [](flexpar::communicator& comm) {
        if (comm.rank() == 1) {
          std::array<std::uint8_t, 128> id{};
          flexpar::broadcast(comm, std::span<std::uint8_t>(id), 0);  // the bootstrap's broadcast, then nothing
          return;
        }
        fc::nccl_options o;
        o.timeout = 2s;
        const auto start = std::chrono::steady_clock::now();
        try {
          fc::nccl_communicator nccl(comm, 0, o);
          FAIL() << "no error";
        } catch (const flexpar::timeout_error& e) {
          EXPECT_NE(std::string(e.what()).find("[rank 0] nccl bootstrap"), std::string::npos) << e.what();
        }
        EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
      },
      flexpar::testing_support::with_timeout(60s));
}

TEST(Nccl, AbortEndsTheCommunicatorAndLaterCallsThrow) {
  flexpar::run_in_process(
      1,
      [](flexpar::communicator& comm) {
        fc::nccl_communicator nccl(comm, 0);
        fc::stream user;
        fc::device_buffer<float> a(16);
        nccl.abort("test");
        EXPECT_TRUE(nccl.failed());
        EXPECT_THROW(nccl.allreduce(a.span(), reduce_op::sum, user), flexpar::peer_failure);
        EXPECT_THROW(nccl.synchronize(user, "after abort"), flexpar::peer_failure);
      },
      flexpar::testing_support::with_timeout(60s));
}

TEST(Nccl, MismatchedBuffersAreUsageErrorsNamingTheOp) {
  flexpar::run_in_process(
      1,
      [](flexpar::communicator& comm) {
        fc::nccl_communicator nccl(comm, 0);
        fc::stream user;
        fc::device_buffer<float> a(16), b(15);
        try {
          nccl.allreduce(fc::device_span<const float>(a.span()), b.span(), reduce_op::sum, user);
          FAIL() << "no error";
        } catch (const flexpar::usage_error& e) {
          EXPECT_NE(std::string(e.what()).find("allreduce: the buffers do not match: 16 elements expected, 15 given"),
                    std::string::npos)
              << e.what();
        }
      },
      flexpar::testing_support::with_timeout(60s));
}
