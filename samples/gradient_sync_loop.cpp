// samples/gradient_sync_loop.cpp — data-parallel gradient synchronization in a C++ training loop.
//
// A model of `layers` dense layers; each step runs a (real, small) backward pass from the last layer
// to the first, marks each layer's gradient ready as soon as it is computed (so its allreduce
// overlaps the backward of the layers below), then synchronizes and applies SGD. Every rank starts
// from rank 0's parameters and ends with the same ones.
//
//   FLEXPAR_TIMELINE=timeline.json mpiexec -n 2 build/samples/gradient_sync_loop --steps 5
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// [snippet:header]
#include <flexpar/core/uncaught.hpp>
#include <flexpar/engine/gradient_sync.hpp>  // flexpar::engine, flexpar::gradient_sync (and the communicator)
// [/snippet:header]

namespace {

/// A stand-in for one layer's backward: gradient = f(parameters, step, rank), O(n) work.
void backward_of_layer(std::vector<float>& gradient, const std::vector<float>& weights, int step, int rank) {
  for (std::size_t i = 0; i < gradient.size(); ++i)
    gradient[i] = std::sin(weights[i] + 0.001f * static_cast<float>(step + rank)) * 0.01f;
}

/// What two ranks compare to find their weights identical: a hash of the bytes and the sum.
struct checksum {
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a offset basis
  double sum = 0;
  void add(const std::vector<float>& w) {
    for (float x : w) {
      sum += x;
      unsigned char bytes[sizeof x];
      std::memcpy(bytes, &x, sizeof x);
      for (unsigned char b : bytes) hash = (hash ^ b) * 1099511628211ull;  // FNV-1a prime
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::set_terminate(flexpar::report_uncaught_and_abort);  // a rank's uncaught error: one whole line
  CLI::App app{"gradient_sync_loop: data-parallel SGD steps with overlapped, fused gradient allreduces"};
  int steps = 10, layers = 8;
  std::size_t width = 1 << 16;
  app.add_option("--steps", steps, "training steps");
  app.add_option("--layers", layers, "layers");
  app.add_option("--width", width, "parameters per layer");
  CLI11_PARSE(app, argc, argv);

  // [snippet:init]
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // the engine's thread calls MPI too
  int status = 0;
  // [/snippet:init]
  {
    // [snippet:training]
    auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, flexpar::config::from_environment(),
                                                flexpar::thread_need::multiple);
    flexpar::engine eng(comm);  // background negotiation + fusion; FLEXPAR_TIMELINE=path records it
    flexpar::gradient_sync sync(eng, {.reduction = flexpar::gradient_reduction::average});

    std::vector<std::vector<float>> weights(layers), grads(layers);
    for (int l = 0; l < layers; ++l) {
      weights[l].assign(width, static_cast<float>(comm.rank() + l));  // different on purpose: see below
      grads[l].resize(width);
      sync.register_parameter("layer" + std::to_string(l), std::span(weights[l]), std::span(grads[l]));
    }
    sync.broadcast_parameters(0);  // every rank starts from rank 0's weights

    for (int step = 0; step < steps; ++step) {
      const auto start = std::chrono::steady_clock::now();
      for (int l = layers - 1; l >= 0; --l) {  // backward: last layer first
        backward_of_layer(grads[l], weights[l], step, comm.rank());
        sync.on_gradient_ready("layer" + std::to_string(l));  // its allreduce starts now
      }
      if (sync.synchronize())  // waits for the averaged gradients
        for (int l = 0; l < layers; ++l)
          for (std::size_t i = 0; i < width; ++i) weights[l][i] -= 0.1f * grads[l][i];
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      if (comm.rank() == 0) std::printf("step %d: %.2f ms\n", step, ms);
    }
    // [/snippet:training]
    // Every rank must hold the same weights: every rank's checksums (an FNV-1a hash of the weights'
    // bytes and their sum) gathered on every rank and compared, so that each rank decides alike.
    checksum mine;
    for (const auto& w : weights) mine.add(w);
    std::vector<checksum> all(static_cast<std::size_t>(comm.size()));
    MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, MPI_COMM_WORLD);
    for (int r = 1; r < comm.size(); ++r) {
      const checksum& c = all[static_cast<std::size_t>(r)];
      if (c.hash == all[0].hash && c.sum == all[0].sum) continue;
      if (comm.rank() == 0)
        std::fprintf(stderr, "rank %d's weights differ from rank 0's (sum %.17g vs %.17g, hash %016llx vs %016llx)\n",
                     r, c.sum, all[0].sum, static_cast<unsigned long long>(c.hash),
                     static_cast<unsigned long long>(all[0].hash));
      status = 1;
    }
    if (status == 0 && comm.rank() == 0)
      std::printf("weights identical on all %d ranks (checksum %.6f)\n", comm.size(), mine.sum);
  }
  MPI_Finalize();
  return status;
}
