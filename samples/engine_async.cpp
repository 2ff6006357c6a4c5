// samples/engine_async.cpp — doc/engine.md's examples: an asynchronous allreduce through the engine,
// then gradient_sync with fp16 on the wire over two accumulated backward passes, then a gradient in
// gradient_sync's arena; every result checked on every rank (values exact in half precision, so the
// expected weights are exact too).
//
//   mpiexec -n 2 build/samples/engine_async
#include <cstdio>
#include <vector>

#include <flexpar/core/uncaught.hpp>
#include <flexpar/engine/gradient_sync.hpp>

int main(int argc, char** argv) {
  std::set_terminate(flexpar::report_uncaught_and_abort);  // a rank's uncaught error: one whole line
  int provided = 0, wrong = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  {
    auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, flexpar::config::from_environment(),
                                                flexpar::thread_need::multiple);
    const auto rank = static_cast<float>(comm.rank()), p = static_cast<float>(comm.size());
    std::vector<float> grad(4096, rank + 1);
    double busy = 0;
    auto compute_on = [&] {
      for (int i = 1; i <= 1000; ++i) busy += 1.0 / i;
    };

    // [snippet:async]
    flexpar::engine eng(comm);  // collective; needs MPI_THREAD_MULTIPLE on MPI
    flexpar::handle h = eng.allreduce_async("fc1.grad", std::span(grad), flexpar::reduce_op::avg);
    compute_on();  // the allreduce runs in the background meanwhile
    h.wait();      // or h.test(), or a completion callback
    // [/snippet:async]
    for (float g : grad) wrong += g != (p + 1) / 2;  // the mean of 1 .. p

    std::vector<float> w(1000, rank + 1), g(w.size(), 0.0f);
    auto backward = [&](std::vector<float>& into) {  // each pass adds (rank + 1) / 2
      for (float& x : into) x += (rank + 1) / 2;
    };
    auto optimizer_step = [&] {
      for (std::size_t i = 0; i < w.size(); ++i) w[i] -= g[i];
    };
    // [snippet:gradient_sync]
    flexpar::gradient_sync sync(eng, {.reduction = flexpar::gradient_reduction::average,
                                      .compression = flexpar::wire_compression::fp16,
                                      .backward_passes_per_step = 2});
    sync.register_parameter("fc1.weight", std::span(w), std::span(g));  // same names on every rank
    sync.broadcast_parameters(0);                                       // initial state from rank 0
    for (int pass = 0; pass < 2; ++pass) {
      backward(g);                               // accumulates this pass's gradient into g
      sync.on_gradient_ready("fc1.weight");      // final for this pass: on the last one its allreduce starts
      if (sync.synchronize()) optimizer_step();  // true on the last pass of a step
    }
    // [/snippet:gradient_sync]
    // g = sum over ranks of (rank + 1), divided by ranks x passes: (p + 1) / 4; w was rank 0's 1
    for (float x : w) wrong += x != 1 - (p + 1) / 4;

    std::vector<float> w2(333, rank);
    auto backward2 = [&](std::span<float> into) {  // the gradient (rank + 1) on each rank
      for (float& x : into) x = rank + 1;
    };
    // [snippet:arena]
    flexpar::gradient_sync arena_sync(eng, {.bucket_bytes = 64 << 10});
    arena_sync.register_parameter("fc2.weight", std::span(w2));  // no gradient buffer: the sync's
    const std::span<float> g2 = arena_sync.gradient<float>("fc2.weight");
    backward2(g2);  // the backward pass writes the gradient into the arena
    arena_sync.on_gradient_ready("fc2.weight");
    arena_sync.synchronize();  // g2 holds the average
    // [/snippet:arena]
    for (float x : g2) wrong += x != (p + 1) / 2;
    std::printf("rank %d of %d: engine allreduce and gradient_sync (fp16, 2 passes), %d wrong\n", comm.rank(),
                comm.size(), wrong);
  }
  MPI_Finalize();
  return wrong == 0 ? 0 : 1;
}
