// samples/relax_loop.cpp — doc/relaxations.md's first example: a training loop whose gradients cross
// the network through a relaxation (bytegrad: min-max uint8), here a linear least-squares model whose
// ranks see different examples of one teacher. Checks that the loss falls to a tenth and that every
// rank ends with the same weights.
//
//   mpiexec -n 2 build/samples/relax_loop
#include <cstdio>
#include <cstring>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/uncaught.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/relax/registry.hpp>

int main(int argc, char** argv) {
  std::set_terminate(flexpar::report_uncaught_and_abort);  // a rank's uncaught error: one whole line
  int provided = 0, status = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  {
    auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    constexpr std::size_t features = 8, examples = 16;
    const int steps = 60;
    // this rank's examples x (small values that differ by rank) labelled by the teacher t_j = (j + 1) / 8
    std::vector<float> x(features * examples), y(examples), w(features, 0.0f), g(features, 0.0f), error(examples);
    for (std::size_t e = 0; e < examples; ++e) {
      for (std::size_t j = 0; j < features; ++j)
        x[e * features + j] = static_cast<float>(static_cast<int>((e * 3 + j * 5 + 7 * comm.rank()) % 7) - 3) / 4;
      for (std::size_t j = 0; j < features; ++j) y[e] += x[e * features + j] * static_cast<float>(j + 1) / 8;
    }
    std::vector<flexpar::relax::parameter> params{{"w", std::span(w), std::span(g)}};
    float loss = 0, first_loss = -1;
    auto forward = [&] {  // error = x w - y, loss = mean error^2
      loss = 0;
      for (std::size_t e = 0; e < examples; ++e) {
        error[e] = -y[e];
        for (std::size_t j = 0; j < features; ++j) error[e] += x[e * features + j] * w[j];
        loss += error[e] * error[e] / examples;
      }
      if (first_loss < 0) first_loss = loss;
    };
    auto backward = [&] {  // g = 2 x^T error / examples
      for (std::size_t j = 0; j < features; ++j) {
        g[j] = 0;
        for (std::size_t e = 0; e < examples; ++e) g[j] += 2 * x[e * features + j] * error[e] / examples;
      }
    };

    // [snippet:relax_loop]
    flexpar::relax::sgd opt({.learning_rate = 0.05f, .momentum = 0.9f});
    auto algo = flexpar::relax::make("bytegrad", comm, {});  // registry.hpp: names, options
    algo->start(params);                                     // collective: rank 0's weights everywhere
    for (int step = 0; step < steps; ++step) {
      forward();
      backward();
      algo->step(params, opt);
    }
    algo->finish(params);  // collective: one model again
    // [/snippet:relax_loop]

    forward();
    std::vector<float> all(features * static_cast<std::size_t>(comm.size()));
    MPI_Allgather(w.data(), static_cast<int>(features), MPI_FLOAT, all.data(), static_cast<int>(features), MPI_FLOAT,
                  MPI_COMM_WORLD);
    const bool same = std::memcmp(all.data(), all.data() + features * static_cast<std::size_t>(comm.rank()),
                                  features * sizeof(float)) == 0;
    const bool learned = loss < first_loss / 10;
    std::printf("rank %d of %d: %s, loss %.5f -> %.5f (%s), weights %s rank 0's\n", comm.rank(), comm.size(),
                std::string(algo->name()).c_str(), static_cast<double>(first_loss), static_cast<double>(loss),
                learned ? "fell" : "DID NOT FALL", same ? "identical to" : "DIFFERENT FROM");
    status = learned && same ? 0 : 1;
  }
  MPI_Finalize();
  return status;
}
