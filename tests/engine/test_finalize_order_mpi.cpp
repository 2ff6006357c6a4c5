// Issue 40, row 3: an engine, a gradient_sync and their communicator still alive at MPI_Finalize (no
// inner scope). MPI_Finalize shuts them down first (core/mpi_finalize.hpp): the engine's thread
// stops and writes its timeline, the communicator's transport closes; afterwards every use is a
// usage_error naming MPI_Finalize, and the destructors at the end of main only free memory. Before,
// the engine's thread went on calling MPI (or UCX) after MPI_Finalize: a segfault, and no timeline.
//
//   mpiexec -n N test_finalize_order_mpi TIMELINE_PATH      (FLEXPAR_TRANSPORT=mpi or ucx)
//
// Each rank prints "rank R: ok ..." or "rank R: FAILED ...", and exits 1 on failure. Its own main:
// the objects must outlive MPI_Finalize, which GoogleTest's main calls after every test.
#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/engine/engine.hpp>
#include <flexpar/engine/gradient_sync.hpp>

namespace {

std::vector<std::string> failures;

void expect(bool ok, const std::string& what) {
  if (!ok) failures.push_back(what);
}

/// Runs `use`; expects a usage_error whose text names MPI_Finalize.
template <class Use>
void expect_refused(const std::string& what, Use&& use) {
  try {
    use();
    failures.push_back(what + " after MPI_Finalize did not fail");
  } catch (const flexpar::usage_error& e) {
    expect(std::string(e.what()).find("MPI_Finalize") != std::string::npos,
           what + ": the usage_error does not name MPI_Finalize: " + e.what());
  } catch (const std::exception& e) {
    failures.push_back(what + " after MPI_Finalize: not a usage_error: " + e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string timeline_path = argc > 1 ? argv[1] : "";

  flexpar::config cfg = flexpar::config::from_environment();
  cfg.timeline_path = timeline_path;
  auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, cfg, flexpar::thread_need::multiple);
  flexpar::engine eng(comm);
  flexpar::gradient_sync sync(eng);
  std::vector<float> w(4096, static_cast<float>(rank)), g(4096, 1.0f);
  sync.register_parameter("w", std::span(w), std::span(g));
  sync.broadcast_parameters(0);
  sync.on_gradient_ready("w");
  sync.synchronize();
  std::vector<float> direct(1000, 1.0f);
  flexpar::allreduce(comm, std::span(direct), flexpar::reduce_op::sum);  // the collectives' channel too
  expect(w[0] == 0.0f && g[0] == 1.0f && direct[0] == static_cast<float>(comm.size()), "the step before MPI_Finalize");

  MPI_Finalize();  // everything above is still alive

  expect_refused("engine::allreduce_async",
                 [&] { eng.allreduce_async("late", std::span(direct), flexpar::reduce_op::sum).wait(); });
  expect_refused("gradient_sync::synchronize", [&] {
    sync.on_gradient_ready("w");
    sync.synchronize();
  });
  expect_refused("allreduce", [&] { flexpar::allreduce(comm, std::span(direct), flexpar::reduce_op::sum); });
  expect_refused("transport::isend", [&] { (void)comm.transport().isend(0, 1, std::as_bytes(std::span(direct))); });
  expect_refused("communicator::split", [&] { (void)comm.split(0, rank); });
  expect_refused("engine (a new one)", [&] { flexpar::engine late(comm); });
  if (rank == 0 && !timeline_path.empty()) {
    std::ifstream in(timeline_path);
    std::stringstream text;
    text << in.rdbuf();
    expect(text.str().find("\"traceEvents\"") != std::string::npos && text.str().find("grad.w") != std::string::npos,
           "the timeline " + timeline_path + " was not written at MPI_Finalize");
  }
  for (const std::string& f : failures) std::printf("rank %d: FAILED %s\n", rank, f.c_str());
  if (failures.empty()) std::printf("rank %d: ok, shut down at MPI_Finalize, every later use refused\n", rank);
  std::fflush(stdout);
  return failures.empty() ? 0 : 1;  // the destructors run now, after MPI_Finalize
}
