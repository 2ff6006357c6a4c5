// A rank of one node killed (SIGKILL) while the others wait for it in a collective through the
// shared-memory segment: every survivor must throw peer_failure naming that rank within 3 s, with
// FLEXPAR_TIMEOUT at 300 s. Run by tests/collective/dead_peer.sh (which launches so that the
// launcher leaves the survivors running), which checks what each survivor prints:
//
//   test_dead_peer_mpi allreduce_small | allreduce_large | allgather
//
// The last rank kills itself after one collective that every rank finishes (it builds the channel
// and the segment and checks the sum); each survivor then prints
// "survivor R: peer_failure after S s: TEXT" and leaves with _exit (MPI cannot finalize without the
// dead rank), status 0 when TEXT names the last rank's exit, 1 otherwise.
#include <mpi.h>

#include <unistd.h>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>

namespace {

void run(flexpar::communicator& comm, const std::string& op, std::vector<float>& data) {
  if (op == "allgather")
    flexpar::allgather(comm, std::span(data), flexpar::algorithm::shared_memory);
  else
    flexpar::allreduce(comm, std::span(data), flexpar::reduce_op::sum, flexpar::algorithm::shared_memory);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  const std::string op = argc > 1 ? argv[1] : "allreduce_small";
  if (op != "allreduce_small" && op != "allreduce_large" && op != "allgather") {
    std::fprintf(stderr, "test_dead_peer_mpi: unknown operation '%s'\n", op.c_str());
    return 2;
  }
  auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  const int rank = comm.rank(), size = comm.size(), victim = size - 1;
  const std::size_t n = op == "allreduce_large" ? std::size_t{3} << 20 : std::size_t{3} * 1024;
  std::vector<float> data(n, 1.0f);
  run(comm, op, data);  // every rank: the channel, the segment, one round
  if (op != "allgather" && data[n - 1] != static_cast<float>(size)) {
    std::printf("rank %d: the first allreduce gave %g, not %d\n", rank, static_cast<double>(data[n - 1]), size);
    return 1;
  }
  std::fflush(stdout);
  if (rank == victim) std::raise(SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  int status = 1;
  try {
    run(comm, op, data);
    std::printf("survivor %d: FAILED: %s returned although rank %d was killed\n", rank, op.c_str(), victim);
  } catch (const flexpar::peer_failure& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string text = e.what();
    const bool names_it = text.find("rank " + std::to_string(victim) + " ") != std::string::npos &&
                          text.find("has exited") != std::string::npos;
    std::printf("survivor %d: peer_failure after %.3f s: %s\n", rank, s, text.c_str());
    status = names_it ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("survivor %d: FAILED: not a peer_failure: %s\n", rank, e.what());
  }
  std::fflush(stdout);
  ::_exit(status);
}
