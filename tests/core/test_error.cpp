#include <gtest/gtest.h>

#include <flexpar/core/check_mpi.hpp>
#if FLEXPAR_TEST_UCX
#include <flexpar/core/check_ucx.hpp>
#endif
#include <flexpar/core/error.hpp>

namespace flexpar {
namespace {

TEST(error, hierarchy_lets_callers_catch_one_kind_or_all) {
  EXPECT_THROW(throw usage_error("x"), error);
  EXPECT_THROW(throw mismatch_error("x"), error);
  EXPECT_THROW(throw timeout_error("x"), error);
  EXPECT_THROW(throw peer_failure("x"), error);
  EXPECT_THROW(throw transport_error("MPI", 1, "x"), error);
  EXPECT_THROW(throw timeout_error("x"), std::runtime_error);
}

TEST(error, one_helper_builds_rank_op_what) {
  EXPECT_EQ(rank_prefix(3), "[rank 3] ");
  EXPECT_EQ(rank_prefix(-1), "[rank ?] ");
  EXPECT_EQ(on_rank(0, "allreduce"), "[rank 0] allreduce: ");
  EXPECT_EQ(on_rank(2, ""), "[rank 2] ");
  const std::string name = "grad.w";
  const std::size_t count = 4097;
  EXPECT_EQ(error_text(1, "engine", "allreduce \"", name, "\": ", count, " elements, ", -2, ' ', std::string_view("x")),
            "[rank 1] engine: allreduce \"grad.w\": 4097 elements, -2 x");
  const usage_error e =
      error_on<usage_error>(5, "broadcast", "root ", 9, " is outside the communicator of ", 4u, " ranks");
  EXPECT_STREQ(e.what(), "[rank 5] broadcast: root 9 is outside the communicator of 4 ranks");
  const int ranks[] = {0, 2, 3};
  EXPECT_EQ(rank_set(std::span<const int>(ranks, 1)), "rank {0}");
  EXPECT_EQ(rank_set(ranks), "ranks {0,2,3}");
  EXPECT_EQ(seconds_text(std::chrono::milliseconds(250)), "0.25 s");
}

int failing_mpi_call() { return MPI_ERR_RANK; }

TEST(error, check_mpi_carries_the_call_text_mpi_string_code_and_location) {
  try {
    FLEXPAR_CHECK_MPI(failing_mpi_call());
    FAIL() << "no exception";
  } catch (const transport_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.library(), "MPI");
    EXPECT_EQ(e.code(), MPI_ERR_RANK);
    // MPI is not initialized in this unit test: the rank is unknown, and says so.
    EXPECT_NE(what.find("[rank ?] failing_mpi_call() failed: "), std::string::npos) << what;
    EXPECT_NE(what.find("test_error.cpp:"), std::string::npos) << what;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(MPI_ERR_RANK, text, &length);
    EXPECT_NE(what.find(std::string(text, static_cast<std::size_t>(length))), std::string::npos) << what;
  }
  EXPECT_NO_THROW(FLEXPAR_CHECK_MPI(MPI_SUCCESS));
}

#if FLEXPAR_TEST_UCX
TEST(error, check_ucx_carries_the_rank_call_text_and_ucs_status_string) {
  try {
    FLEXPAR_CHECK_UCX(3, UCS_ERR_MESSAGE_TRUNCATED);
    FAIL() << "no exception";
  } catch (const transport_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.library(), "UCX");
    EXPECT_NE(what.find("[rank 3] UCS_ERR_MESSAGE_TRUNCATED failed: Message truncated"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(FLEXPAR_CHECK_UCX(0, UCS_OK));
  EXPECT_NO_THROW(FLEXPAR_CHECK_UCX(0, UCS_INPROGRESS));
}

#endif

}  // namespace
}  // namespace flexpar
