// samples/allreduce_alone.cpp — flexpar's collectives on an existing MPI communicator, nothing else.
//
//   mpiexec.mpich -n 3 build/samples/allreduce_alone
// The snippet is the whole program: doc/guide-collectives.md shows it, and a test builds it from the
// guide with the guide's pkg-config line (tests/support/run_guide_commands.sh).

// [snippet:collectives]
#include <flexpar/collective.hpp>
#include <flexpar/core/uncaught.hpp>

#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  std::set_terminate(flexpar::report_uncaught_and_abort);  // a rank's uncaught error: one whole line
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);  // your MPI program, as it is
  int wrong = 0;
  {
    auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);  // a duplicate: never mixes with your traffic
    std::vector<float> grad(1 << 20, static_cast<float>(comm.rank() + 1));

    flexpar::allreduce(comm, std::span(grad), flexpar::reduce_op::sum);  // algorithm chosen by cost
    flexpar::allreduce(comm, std::span(grad), flexpar::reduce_op::avg, flexpar::algorithm::ring);  // or named

    const float expected = comm.size() * (comm.size() + 1) / 2.0f;  // 1 + ... + p; the average of equal values keeps it
    for (float g : grad) wrong += g != expected;
    std::printf("rank %d: automatic picks %s for 4 MiB, %d wrong\n", comm.rank(),  // choose_ is collective too
                std::string(flexpar::name_of(flexpar::choose_allreduce(comm, grad.size() * sizeof(float)))).c_str(),
                wrong);
  }
  MPI_Finalize();
  return wrong == 0 ? 0 : 1;
}
// [/snippet:collectives]
