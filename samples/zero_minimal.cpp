// samples/zero_minimal.cpp — ZeRO (sharded data parallelism) on a model of your own, with the
// library's headers only: a linear least-squares model y = W x + b whose parameters, gradients and
// optimizer state are sharded over the ranks, checked against the same model trained serially.
//
//   mpiexec.mpich -n 2 build/samples/zero_minimal [stage 1|2|3] [steps]
// [snippet:zero_minimal]
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/uncaught.hpp>
#include <flexpar/relax/optimizer.hpp>  // flexpar::relax::sgd, adam: the optimizer step() applies
#include <flexpar/zero/sharded_data_parallel.hpp>

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr std::size_t in = 8, out = 4, rows = 16;  // rows of data per rank
constexpr float learning_rate = 0.01f;

// Example `row` (of all ranks' rows) and its target: small integers, the same on every rank.
float x_of(std::size_t row, std::size_t j) { return static_cast<float>((row * 7 + j * 3) % 5) - 2.0f; }
float t_of(std::size_t row, std::size_t i) { return static_cast<float>((row + 2 * i) % 3) - 1.0f; }

// Adds the gradient of 0.5 |W x + b - t|^2, summed over rows [first, first + count), into gw and gb.
void backward(const float* w, const float* b, std::size_t first, std::size_t count, float* gw, float* gb) {
  for (std::size_t r = first; r < first + count; ++r)
    for (std::size_t i = 0; i < out; ++i) {
      float e = b[i] - t_of(r, i);
      for (std::size_t j = 0; j < in; ++j) e += w[i * in + j] * x_of(r, j);
      for (std::size_t j = 0; j < in; ++j) gw[i * in + j] += e * x_of(r, j);
      gb[i] += e;
    }
}

int main(int argc, char** argv) {
  std::set_terminate(flexpar::report_uncaught_and_abort);  // a rank's uncaught error: one whole line
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // its communication thread calls MPI
  const int stage = argc > 1 ? std::atoi(argv[1]) : 3, steps = argc > 2 ? std::atoi(argv[2]) : 20;
  int status = 0;
  {
    auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, flexpar::config::from_environment(),
                                                flexpar::thread_need::multiple);
    const auto p = static_cast<std::size_t>(comm.size()), me = static_cast<std::size_t>(comm.rank());
    flexpar::sbp::placement<1> ranks(comm, {comm.size()});
    flexpar::zero::sharded_data_parallel<1> model(ranks, {.stage = stage});  // gradients averaged over ranks

    std::vector<float> w(out * in), b(out, 0.0f);  // the serial oracle's parameters, also the initial ones
    for (std::size_t k = 0; k < w.size(); ++k) w[k] = static_cast<float>(k % 7) / 8.0f - 0.375f;
    model.add("weight", w);  // the same names, sizes and order on every rank
    model.add("bias", b);
    model.start();  // collective: buckets, each rank keeps its shard of parameters and optimizer state
    flexpar::relax::sgd opt({.learning_rate = learning_rate});

    for (int step = 0; step < steps; ++step) {
      {
        const auto wv = model.gather("weight"), bv = model.gather("bias");  // S(0) -> B (stage 3: each step)
        backward(wv.values().data(), bv.values().data(), me * rows, rows, model.gradient("weight").data(),
                 model.gradient("bias").data());  // gradient() is zero-filled: add into it
      }                                           // views released before step()
      model.gradient_ready("weight");             // P -> S(0): the reduce-scatter starts
      model.gradient_ready("bias");
      model.step(opt);  // SGD on this rank's shard

      std::vector<float> gw(w.size(), 0.0f), gb(b.size(), 0.0f);  // serial: every rank's rows, averaged
      for (std::size_t r = 0; r < p; ++r) {
        std::vector<float> part_w(w.size(), 0.0f), part_b(b.size(), 0.0f);
        backward(w.data(), b.data(), r * rows, rows, part_w.data(), part_b.data());
        for (std::size_t k = 0; k < w.size(); ++k) gw[k] += part_w[k];
        for (std::size_t k = 0; k < b.size(); ++k) gb[k] += part_b[k];
      }
      for (std::size_t k = 0; k < w.size(); ++k) w[k] -= learning_rate * (gw[k] / static_cast<float>(p));
      for (std::size_t k = 0; k < b.size(); ++k) b[k] -= learning_rate * (gb[k] / static_cast<float>(p));
    }

    double worst = 0;  // the sharded model's parameters, gathered, against the serial ones
    for (const auto& [name, values] : model.full_parameters()) {
      const std::vector<float>& serial = name == "weight" ? w : b;
      for (std::size_t k = 0; k < values.size(); ++k)
        worst = std::fmax(worst, std::fabs(static_cast<double>(values[k]) - serial[k]));
    }
    const flexpar::zero::memory_report held = model.memory();
    status = worst <= 1e-5 ? 0 : 1;
    std::printf(
        "rank %d: ZeRO-%d on %zu ranks, %d steps: max |w - serial w| = %.1e (%s), "
        "holds %zu of data parallelism's %zu bytes\n",
        comm.rank(), stage, p, steps, worst, status == 0 ? "match" : "WRONG",
        held.parameter_bytes + held.gradient_bytes + held.optimizer_bytes, held.data_parallel_bytes);
  }
  MPI_Finalize();
  return status;
}
// [/snippet:zero_minimal]
