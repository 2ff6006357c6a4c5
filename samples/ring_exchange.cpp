// samples/ring_exchange.cpp — the README's first example: a ring of point-to-point messages over
// the transport chosen by FLEXPAR_TRANSPORT (mpi or ucx), every wait bounded by a deadline.
//
//   mpiexec -n 3 build/samples/ring_exchange
#include <cstdio>
#include <string>
#include <vector>

// [snippet:readme]
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/uncaught.hpp>

int main(int argc, char** argv) {
  std::set_terminate(flexpar::report_uncaught_and_abort);  // a rank's uncaught error: one whole line
  int provided, wrong = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);  // yours: flexpar never initializes MPI
  {
    auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);  // transport: FLEXPAR_TRANSPORT=mpi|ucx
    const int next = (comm.rank() + 1) % comm.size(), prev = (comm.rank() + comm.size() - 1) % comm.size();
    std::vector<std::byte> out(1 << 20, std::byte(comm.rank())), in(1 << 20);
    flexpar::request r = comm.transport().irecv(prev, /*tag=*/0, in);
    comm.transport().send(next, /*tag=*/0, out, comm.default_deadline());  // timeout_error past the deadline
    r.wait(comm.default_deadline());
    for (std::byte b : in) wrong += b != std::byte(prev);
    std::printf("rank %d of %d: received %zu bytes from rank %d over %s, %d wrong\n", comm.rank(), comm.size(),
                r.bytes(), prev, std::string(flexpar::name_of(comm.transport().kind())).c_str(), wrong);
  }
  MPI_Finalize();
  return wrong == 0 ? 0 : 1;
}
// [/snippet:readme]
