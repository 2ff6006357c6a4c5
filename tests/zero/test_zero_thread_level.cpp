// sharded_data_parallel's communication thread (options::overlap) refuses an MPI initialized below
// MPI_THREAD_MULTIPLE with a usage_error that says what to ask MPI_Init_thread for, and without the
// thread (overlap = false) it trains on such an MPI. Its own main: the shared test main asks for MULTIPLE.
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/zero/sharded_data_parallel.hpp>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int failed = 0;
  if (provided >= MPI_THREAD_MULTIPLE) {
    std::puts("SKIP: this MPI gave MPI_THREAD_MULTIPLE when asked for SINGLE");
    MPI_Finalize();
    return 77;
  }
  {
    flexpar::config cfg = flexpar::config::from_environment();
    cfg.transport = flexpar::transport_kind::mpi;
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, cfg);
    flexpar::sbp::placement<1> mesh(comm, {comm.size()});
    try {
      flexpar::zero::sharded_data_parallel<1> model(mesh, {.stage = 3, .overlap = true});
      std::puts("FAIL: overlap accepted an MPI without MPI_THREAD_MULTIPLE");
      failed = 1;
    } catch (const flexpar::usage_error& e) {
      const std::string text = e.what();
      if (text.find("MPI_THREAD_MULTIPLE") == std::string::npos || text.find("overlap = false") == std::string::npos) {
        std::printf("FAIL: unclear message: %s\n", e.what());
        failed = 1;
      } else {
        std::printf("ok: %s\n", e.what());
      }
    }
    flexpar::zero::sharded_data_parallel<1> model(mesh, {.stage = 3, .overlap = false});
    // 11 values (uneven shards), each rank's gradient its own: rank r's g[i] = (r + 1) (i + 1); the
    // mean over p ranks is (p + 1) / 2 (i + 1), exact in f32 here, and a step of 0.5 moves w[i] by it
    const int p = comm.size(), r = comm.rank();
    std::vector<float> w(11), expected(11);
    for (std::size_t i = 0; i < w.size(); ++i) {
      w[i] = 100.0f + float(i);
      expected[i] = w[i] - 0.5f * float(p + 1) / 2.0f * float(i + 1);
    }
    model.add("w", w);
    model.start();
    const auto g = model.gradient("w");
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = float(r + 1) * float(i + 1);
    model.gradient_ready("w");
    flexpar::relax::sgd opt({.learning_rate = 0.5f});
    model.step(opt);
    const auto full = model.full_parameters();
    if (full.size() != 1 || full[0].second != expected) {
      std::printf("FAIL: rank %d: without the thread, one SGD step did not give w - 0.5 * mean over ranks of g\n", r);
      failed = 1;
    }
  }
  MPI_Finalize();
  return failed;
}
