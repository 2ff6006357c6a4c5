// samples/checkpoint_tour.cpp — doc/checkpoint.md's example: a checkpoint saved in the background
// from one number of ranks and SBP, loaded on another.
//
//   mpiexec.mpich -n 2 build/samples/checkpoint_tour save ckpt   # fc1.weight as S(0) on 2 ranks
//   mpiexec.mpich -n 3 build/samples/checkpoint_tour load ckpt   # ... loaded as S(1) on 3
//
// The weight is [6, 4] with element i = i; each run checks what it saved or loaded on every rank and
// exits 1 when anything differs.
#include <flexpar/checkpoint/checkpoint.hpp>
#include <flexpar/core/uncaught.hpp>
#include <flexpar/sbp/sbp.hpp>

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

using namespace flexpar::sbp;

namespace {

std::vector<float> logical_weight() {  // the weight every run checks against
  std::vector<float> v(24);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return v;
}

int save(flexpar::communicator& comm, const std::filesystem::path& checkpoints) {
  placement<1> mesh(comm, {comm.size()});
  auto w = global_tensor<float, split<0>>::from_full(mesh, {6, 4}, logical_weight());
  std::vector<float> lr_scale(4, 0.5f);
  std::int64_t step = 100;
  // [snippet:checkpoint_save]
  flexpar::checkpoint::state s;
  s.add("fc1.weight", w)                                // a global_tensor: any placement and SBP
      .add_replicated("lr_scale", std::span(lr_scale))  // host memory, the same on every rank
      .add_integer("step", step);
  flexpar::checkpoint::async_saver saver(comm);  // collective: its thread writes on a split of comm
  flexpar::checkpoint::save_handle saving = saver.save(checkpoints / "step_100", s);  // a snapshot
  for (float& x : w.to_local()) x = 0;  // the next step changes w while the files are written
  saving.wait();                        // committed: metadata.json and the directory renamed
  // [/snippet:checkpoint_save]
  if (comm.rank() == 0)
    std::printf("saved fc1.weight %s as %s on %d ranks and step %lld to %s\n", to_string(shape_t{6, 4}).c_str(),
                to_string<split<0>>().c_str(), comm.size(), static_cast<long long>(step),
                (checkpoints / "step_100").c_str());
  return 0;
}

int load(flexpar::communicator& comm, const std::filesystem::path& checkpoints) {
  // [snippet:checkpoint_load]
  const flexpar::checkpoint::contents saved = flexpar::checkpoint::read_contents(checkpoints / "step_100");
  const shape_t w_shape = saved.find("fc1.weight")->shape;                                    // [6, 4], as it was saved
  placement<1> mesh(comm, {comm.size()});                                                     // any number of ranks
  auto w = global_tensor<float, split<1>>::from_full(mesh, w_shape, std::vector<float>(24));  // any SBP
  std::vector<float> lr_scale(4);
  std::int64_t step = 0;
  flexpar::checkpoint::state s;
  s.add("fc1.weight", w).add_replicated("lr_scale", std::span(lr_scale)).add_integer("step", step);
  flexpar::checkpoint::load(comm, checkpoints / "step_100", s);  // each rank reads its columns
  // [/snippet:checkpoint_load]
  const bool right = w.to_full() == logical_weight() && step == 100 && lr_scale == std::vector<float>(4, 0.5f);
  std::printf("rank %d of %d: loaded fc1.weight as %s (%zu of its %zu columns here) and step %lld: %s\n", comm.rank(),
              comm.size(), to_string<split<1>>().c_str(), static_cast<std::size_t>(w.local_shape()[1]),
              static_cast<std::size_t>(w_shape[1]), static_cast<long long>(step), right ? "right" : "WRONG");
  return right ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::set_terminate(flexpar::report_uncaught_and_abort);  // a rank's uncaught error: one whole line
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // the saver's thread calls MPI
  int status = 2;
  {
    const std::string mode = argc == 3 ? argv[1] : "";
    auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, flexpar::config::from_environment(),
                                                flexpar::thread_need::multiple);
    if (mode == "save")
      status = save(comm, argv[2]);
    else if (mode == "load")
      status = load(comm, argv[2]);
    else if (comm.rank() == 0)
      std::fprintf(stderr, "usage: %s save|load DIRECTORY\n", argv[0]);
  }
  MPI_Finalize();
  return status;
}
