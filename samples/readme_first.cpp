// samples/readme_first.cpp — the README's first example: a column-parallel matmul whose output
// layout the compiler deduces, then one collective to gather it.
//
//   mpiexec -n 3 build/samples/readme_first
#include <cstdio>
#include <vector>

// [snippet:readme]
#include <flexpar/core/uncaught.hpp>
#include <flexpar/sbp/sbp.hpp>
using namespace flexpar::sbp;

int main(int argc, char** argv) {
  std::set_terminate(flexpar::report_uncaught_and_abort);  // a rank's uncaught error: one whole line
  int provided, wrong = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);  // yours: flexpar never initializes MPI
  {
    auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);  // no global state: objects you own
    placement<1> ranks(comm, {comm.size()});
    auto x = global_tensor<float, broadcast>::from_full(ranks, {4, 8}, std::vector<float>(32, 1.0f));
    auto w = global_tensor<float, split<1>>::from_full(ranks, {8, 6}, std::vector<float>(48, 0.5f));
    auto y = to<broadcast>(matmul(x, w));             // (B, S(1)) -> S(1) by type, then one allgather
    for (float v : y.to_local()) wrong += v != 4.0f;  // every y is 8 products 1 x 0.5
    std::printf("rank %d of %d: y is %s, %d wrong\n", comm.rank(), comm.size(), to_string(y.shape()).c_str(), wrong);
  }
  MPI_Finalize();
  return wrong == 0 ? 0 : 1;
}
// [/snippet:readme]
