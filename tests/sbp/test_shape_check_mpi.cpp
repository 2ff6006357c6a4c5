// Issue 40, row 7: ranks that disagree about a global shape (`{4 + rank, 5}`) got a tensor of a
// different shape on each rank, silently. Construction from user data now checks the shape across
// the mesh (one small allreduce) and every rank gets a mismatch_error naming the shapes and ranks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/sbp/sbp.hpp>

namespace flexpar::sbp {
namespace {

struct shape_check : ::testing::Test {
  communicator comm = communicator::from_mpi(MPI_COMM_WORLD);
  placement<1> mesh{comm, {comm.size()}};
  int me = comm.rank(), p = comm.size();
  shape_t mine{static_cast<std::size_t>(4 + comm.rank()), 5};  // what the user wrote

  /// "[4, 5] on mesh rank {0}, [5, 5] on mesh rank {1} but [6, 5] on mesh rank {2}"
  std::string expected_text() const {
    std::string text;
    for (int q = 0; q < p; ++q) {
      if (q > 0) text += q + 1 == p ? " but " : ", ";
      text += "[" + std::to_string(4 + q) + ", 5] on mesh rank {" + std::to_string(q) + "}";
    }
    return text;
  }
  template <class Make>
  void expect_mismatch(const std::string& op, Make&& make) {
    if (p < 2) GTEST_SKIP() << "needs two ranks";
    try {
      make();
      FAIL() << op << " accepted shapes that differ across ranks";
    } catch (const mismatch_error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("[rank " + std::to_string(me) + "] " + op +
                          ": the mesh ranks disagree about the shape: " + expected_text()),
                std::string::npos)
          << what;
    }
  }
};

TEST_F(shape_check, from_full) {
  const std::vector<float> full(elements_of(mine), 1.0f);
  expect_mismatch("global_tensor::from_full",
                  [&] { (void)global_tensor<float, split<1>>::from_full(mesh, mine, full); });
}

TEST_F(shape_check, from_local_and_scatter) {
  expect_mismatch("global_tensor::from_local", [&] {
    (void)global_tensor<float, broadcast>::from_local(mesh, mine, std::vector<float>(elements_of(mine), 1.0f));
  });
  const std::vector<float> full(me == 0 ? elements_of(mine) : 0, 1.0f);
  expect_mismatch("global_tensor::scatter", [&] { (void)global_tensor<float, split<0>>::scatter(mesh, mine, full); });
}

TEST_F(shape_check, dynamic_from_full) {
  const std::vector<float> full(elements_of(mine), 1.0f);
  expect_mismatch("dynamic_tensor::from_full", [&] {
    (void)dynamic_tensor<float, 1>::from_full(mesh, mine, nd_parallel{{parallel::B()}, 1}, full);
  });
}

TEST_F(shape_check, agreeing_shapes_still_build) {
  const std::vector<float> full(20, 2.0f);
  auto t = global_tensor<float, split<0>>::from_full(mesh, {4, 5}, full);
  EXPECT_EQ(t.to_full(), full);
}

}  // namespace
}  // namespace flexpar::sbp
