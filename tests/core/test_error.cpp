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
