// samples/fashion_mnist_gpu.cpp — the data-parallel Fashion-MNIST MLP of fashion_mnist_mlp.cpp on
// GPUs: the same model, initial weights, batches (the same shuffles of the same shards), SGD with
// momentum and cosine schedule, with the forward and backward passes on the device (cuBLAS GEMMs,
// flexpar's kernels) and the gradients averaged by a device collective of flexpar's
// (cuda::device_communicator: NCCL where every rank has a GPU of its own, the CUDA IPC path where
// ranks share one, staged through host memory otherwise; `--path` picks one), or by Horovod's way:
// a gradient_sync over the engine with a device backend (`--sync engine`), each layer's gradients
// reduced while the backward pass of the layers below it still runs, optionally as bfloat16 on the
// wire (`--wire bf16`).
//
//   mpiexec.mpich -n 2 build/samples/fashion_mnist_gpu --epochs 10
//   mpiexec.mpich -n 2 build/samples/fashion_mnist_gpu --epochs 10 --sync engine --wire bf16
//
// Each rank keeps its shard of the data set on its GPU and gathers every batch there; all gradients
// are one device buffer, reduced by one allreduce per step (`--sync collective`) or per layer. One line per epoch
// (loss, accuracies, median step time), then the final test accuracy and a check that every rank holds the same
// weights. Exit status: 0, 1 (an error, or --min-accuracy not met), 2 (bad command line), 77 (no data set or no GPU:
// ctest counts it as skipped).
#include <mpi.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/cuda/collective.hpp>
#include <flexpar/cuda/engine.hpp>
#include <flexpar/cuda/nn.hpp>
#include <flexpar/cuda/relax.hpp>

#include "support/fashion_mnist.hpp"
#include "support/mlp_cuda.hpp"
#include "support/training_cli.hpp"

namespace {

namespace fm = flexpar::samples;
namespace fc = flexpar::cuda;

struct settings : fm::training_settings, fm::relaxation_settings {
  std::string path = "automatic";
  std::string sync = "collective";
  std::string wire = "none";
};

fc::device_path path_of(const std::string& name) {
  for (fc::device_path p : {fc::device_path::automatic, fc::device_path::nccl, fc::device_path::ring,
                            fc::device_path::staged, fc::device_path::ipc})
    if (fc::name_of(p) == name) return p;
  throw flexpar::usage_error("fashion_mnist_gpu: unknown --path " + name);
}

/// A data set shard on the device: normalized pixels and labels.
struct device_set {
  fc::device_buffer<float> x;
  fc::device_buffer<std::uint8_t> y;
  std::size_t count = 0;
};

device_set upload(const fm::fashion_mnist_set& set, cudaStream_t s) {
  device_set d;
  d.count = set.count;
  std::vector<float> x(set.images.size());
  fm::normalize_pixels(set.images, x);
  d.x = fc::device_buffer<float>(x.size());
  d.y = fc::device_buffer<std::uint8_t>(set.labels.size());
  fc::copy_async(d.x.span(), std::span<const float>(x), s);
  fc::copy_async(d.y.span(), std::span<const std::uint8_t>(set.labels), s);
  fc::synchronize(s, std::chrono::seconds(60), "fashion_mnist_gpu: upload of the data set");
  return d;
}

/// Loss and accuracy summed over ranks: {loss, correct, examples}.
std::array<double, 3> sum_over_ranks(const fc::score_sums& s, std::size_t examples) {
  double in[3] = {s.loss, static_cast<double>(s.correct), static_cast<double>(examples)};
  std::array<double, 3> out{};
  MPI_Allreduce(in, out.data(), 3, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return out;
}

int train(const settings& opt) {
  auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  const int rank = comm.rank(), size = comm.size();
  const int devices = fc::device_count();
  const int device = comm.topology().local_rank() % devices;
  const fc::device_guard on(device);
  fc::device_options options;
  options.use_nccl = devices >= comm.topology().local_size();  // NCCL holds one rank per GPU
  fc::device_communicator gpu(comm, device, options);
  const fc::device_path path = path_of(opt.path);
  fc::stream s;

  const fm::training_data data = fm::load_training_data(opt, rank, size, "fashion_mnist_gpu");
  const fm::fashion_mnist_set& train_set = data.train;
  const fm::fashion_mnist_set& test_set = data.test;
  const std::size_t steps_per_epoch = data.steps_per_epoch;
  const std::size_t px = train_set.pixels();
  const device_set train_d = upload(train_set, s), test_d = upload(test_set, s);

  constexpr std::size_t eval_chunk = 1000;
  fm::mlp_cuda model({px, 256, 128, 10}, opt.seed, std::max(opt.batch, eval_chunk), s);
  fc::device_buffer<float> momentum(model.parameters().size());
  FLEXPAR_CHECK_CUDA(rank, cudaMemsetAsync(momentum.data(), 0, momentum.size() * sizeof(float), s));
  fc::device_buffer<float> batch_x(opt.batch * px);
  fc::device_buffer<std::uint8_t> batch_y(opt.batch);
  fc::device_buffer<std::uint32_t> order_d(train_set.count);
  fc::device_buffer<fc::score_sums> sums(1);
  fc::pinned_buffer<fc::score_sums> sums_host(1);

  // --sync engine: the engine negotiates and fuses per-layer gradients as the backward pass queues them
  const bool by_engine = opt.sync == "engine";
  std::optional<fc::engine_backend> backend;
  std::optional<flexpar::engine> eng;
  std::optional<flexpar::gradient_sync> sync;
  std::vector<std::array<std::string, 2>> names;  // per layer: weight, bias
  if (by_engine) {
    for (std::size_t l = 0; l < model.layers(); ++l)
      names.push_back({"fc" + std::to_string(l + 1) + ".weight", "fc" + std::to_string(l + 1) + ".bias"});
    // [snippet:device_gradient_sync]
    backend.emplace(gpu);  // runs the engine's device responses on gpu
    eng.emplace(comm, std::nullopt, flexpar::log_sink{}, &*backend);
    const auto wire = opt.wire == "bf16" ? flexpar::wire_compression::bf16 : flexpar::wire_compression::none;
    sync.emplace(*eng, flexpar::gradient_sync_options{.compression = wire});
    for (std::size_t l = 0; l < model.layers(); ++l) {  // device spans: parameter and gradient
      fc::register_parameter(*sync, names[l][0], model.weight(l), model.weight_grad(l));
      fc::register_parameter(*sync, names[l][1], model.bias(l), model.bias_grad(l));
    }
    sync->broadcast_parameters(0, s);  // every rank starts from rank 0's weights
    // [/snippet:device_gradient_sync]
  }

  // --sync relax: a device relaxation (BAGUA's algorithms) over the per-layer parameters, SGD by cuda::sgd
  const bool by_relaxation = opt.sync == "relax";
  std::vector<fc::parameter> params;
  std::unique_ptr<fc::relaxation> algo;
  fc::sgd device_sgd({.learning_rate = opt.lr, .momentum = opt.momentum});
  if (by_relaxation) {
    // [snippet:device_relaxation]
    for (std::size_t l = 0; l < model.layers(); ++l) {
      const std::string layer = "fc" + std::to_string(l + 1);
      params.push_back({layer + ".weight", model.weight(l), model.weight_grad(l)});
      params.push_back({layer + ".bias", model.bias(l), model.bias_grad(l)});
    }
    flexpar::relax::options ropt;
    ropt.interval = opt.interval;
    ropt.peers = opt.peers;
    ropt.warmup_steps = opt.warmup;
    ropt.adam.learning_rate = opt.lr;  // onebit_adam and qadam are their own Adam (they ignore device_sgd)
    ropt.adam.epsilon = opt.adam_epsilon;
    algo = fc::make_relaxation(opt.algorithm, gpu, ropt);
    algo->start(params, s);  // every rank starts from rank 0's weights
    // [/snippet:device_relaxation]
  }

  if (rank == 0) {
    const std::string how =
        by_engine ? "gradient_sync over the engine, " + opt.wire + " on the wire"
        : by_relaxation
            ? "the device relaxation " + opt.algorithm
            : "one allreduce per step on path " + std::string(fc::name_of(path)) + " (automatic: " +
                  std::string(fc::name_of(gpu.choose("allreduce", model.parameters().size() * sizeof(float)).path)) +
                  ")";
    std::printf(
        "fashion_mnist_gpu: %d ranks on %d GPU(s), MLP 784-256-128-10 (%zu parameters), %zu images per rank, batch "
        "%zu per rank, %zu steps per epoch, sgd lr %g momentum %g (%s), gradients by %s\n",
        size, devices, model.parameters().size(), train_set.count, opt.batch, steps_per_epoch,
        static_cast<double>(opt.lr), static_cast<double>(opt.momentum), opt.schedule.c_str(), how.c_str());
    std::fflush(stdout);
  }

  auto read_sums = [&] {
    fc::copy_async(sums_host.span(), fc::device_span<const fc::score_sums>(sums.span()), s);
    fc::synchronize(s, std::chrono::seconds(60), "fashion_mnist_gpu: scores");
    return sums_host.data()[0];
  };
  auto evaluate = [&] {
    fc::reset(sums.data(), s);
    for (std::size_t b = 0; b < test_d.count; b += eval_chunk) {
      const std::size_t n = std::min(eval_chunk, test_d.count - b);
      model.evaluate(fc::device_span<const float>(test_d.x.data() + b * px, n * px),
                     fc::device_span<const std::uint8_t>(test_d.y.data() + b, n), n, sums.data(), s);
    }
    return sum_over_ranks(read_sums(), test_d.count);
  };

  std::vector<std::uint32_t> order(train_set.count);
  const std::size_t total_steps = steps_per_epoch * static_cast<std::size_t>(opt.epochs);
  std::size_t step_index = 0;
  double train_seconds = 0;
  std::vector<double> all_step_ms;
  // --sync engine: the GPU time the training stream waits for the reductions after the backward pass
  // (the communication the overlap leaves exposed), on every 64th step
  fc::event backward_done, synchronized;
  std::vector<double> exposed_ms;
  using clock = std::chrono::steady_clock;
  for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
    exposed_ms.clear();
    // the CPU sample's shuffle of the same shard: the same batches
    std::vector<std::size_t> shuffled(train_set.count);
    std::iota(shuffled.begin(), shuffled.end(), std::size_t{0});
    std::seed_seq seq{opt.seed, static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(epoch)};
    std::mt19937_64 rng(seq);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    std::copy(shuffled.begin(), shuffled.end(), order.begin());
    fc::copy_async(order_d.span(), std::span<const std::uint32_t>(order), s);
    fc::reset(sums.data(), s);
    const auto epoch_start = clock::now();
    for (std::size_t k = 0; k < steps_per_epoch; ++k, ++step_index) {
      const fc::device_span<const std::uint32_t> rows(order_d.data() + k * opt.batch, opt.batch);
      fc::gather_rows(batch_x.span().as_bytes(), fc::device_span<const float>(train_d.x.span()).as_bytes(),
                      px * sizeof(float), rows, s);
      fc::gather_rows(batch_y.span().as_bytes(), fc::device_span<const std::uint8_t>(train_d.y.span()).as_bytes(), 1,
                      rows, s);
      const float factor = fm::schedule_factor(opt.schedule, step_index, total_steps);
      if (by_relaxation) {
        // [snippet:device_relaxation_step]
        model.train_step(fc::device_span<const float>(batch_x.span()),
                         fc::device_span<const std::uint8_t>(batch_y.span()), opt.batch, sums.data(), s);
        device_sgd.set_factor(factor);      // the cosine schedule
        algo->step(params, device_sgd, s);  // after the backward pass queued on s: communicate, apply SGD
        // [/snippet:device_relaxation_step]
        if (k % 64 == 63) gpu.synchronize(s, "fashion_mnist_gpu: a training step");
        continue;
      }
      if (!by_engine) {
        model.train_step(fc::device_span<const float>(batch_x.span()),
                         fc::device_span<const std::uint8_t>(batch_y.span()), opt.batch, sums.data(), s);
        gpu.allreduce(model.gradients(), flexpar::reduce_op::avg, s, path);
      } else {
        // [snippet:device_backward]
        model.train_step(fc::device_span<const float>(batch_x.span()),
                         fc::device_span<const std::uint8_t>(batch_y.span()), opt.batch, sums.data(), s,
                         [&](std::size_t l) {  // layer l's gradients are queued on s: reduce them after
                           fc::on_gradient_ready(*sync, names[l][0], s);
                           fc::on_gradient_ready(*sync, names[l][1], s);
                         });
        if (k % 64 == 63) backward_done.record(s);
        fc::synchronize(*sync, s);  // s waits for the averaged gradients, on the device: no host wait
        // [/snippet:device_backward]
        if (k % 64 == 63) synchronized.record(s);
      }
      fc::sgd_momentum(model.parameters(), momentum.span(), fc::device_span<const float>(model.gradients()), opt.lr,
                       opt.momentum, factor, s);
      if (k % 64 == 63) {
        gpu.synchronize(s, "fashion_mnist_gpu: a training step");  // at most 64 steps queued
        if (by_engine) exposed_ms.push_back(fc::event::elapsed_ms(backward_done, synchronized));
      }
    }
    gpu.synchronize(s, "fashion_mnist_gpu: the epoch");
    const double epoch_seconds = std::chrono::duration<double>(clock::now() - epoch_start).count();
    train_seconds += epoch_seconds;
    const auto seen = sum_over_ranks(read_sums(), steps_per_epoch * opt.batch);
    const auto test = evaluate();
    all_step_ms.push_back(epoch_seconds * 1e3 / static_cast<double>(steps_per_epoch));
    if (rank == 0) {
      std::printf("epoch %2d/%d  loss %.4f  train accuracy %.4f  test accuracy %.4f  step %.3f ms", epoch, opt.epochs,
                  seen[0] / seen[2], seen[1] / seen[2], test[1] / test[2],
                  epoch_seconds * 1e3 / static_cast<double>(steps_per_epoch));
      if (!exposed_ms.empty()) std::printf("  exposed comm %.3f ms", fm::median(exposed_ms));
      std::printf("  time %.2f s\n", train_seconds);
    }
    std::fflush(stdout);
  }

  if (algo) algo->finish(params, s);  // decentralized and local algorithms: one consensus model
  // Every rank must hold the same weights: compare each rank's bytes with rank 0's on every rank.
  std::vector<float> mine(model.parameters().size());
  fc::copy_async(std::span<float>(mine), fc::device_span<const float>(model.parameters()), s);
  fc::synchronize(s, std::chrono::seconds(60), "fashion_mnist_gpu: download of the weights");
  const int ranks_differ = fm::ranks_differing_from_root(mine);
  const auto test = evaluate();
  const double accuracy = test[1] / test[2];
  if (rank == 0) {
    if (ranks_differ != 0)
      std::printf("weights differ from rank 0's on %d of %d ranks\n", ranks_differ, size);
    else
      std::printf("weights identical on all %d ranks\n", size);
    std::printf("summary ranks=%d epochs=%d step_ms=%.3f train_s=%.2f test_accuracy=%.4f\n", size, opt.epochs,
                fm::median(all_step_ms), train_seconds, accuracy);
  }
  return fm::final_status(rank, accuracy, opt.min_accuracy, ranks_differ);
}

}  // namespace

int main(int argc, char** argv) {
  settings opt;
  CLI::App app{
      "fashion_mnist_gpu: data-parallel MLP on Fashion-MNIST on GPUs, gradients by a flexpar device collective"};
  fm::add_training_options(app, opt, "cosine (decay to 0 over the run) or constant");
  app.add_option("--path", opt.path, "device path of the gradient allreduce: automatic, nccl, ring, ipc, staged")
      ->capture_default_str()
      ->check(CLI::IsMember({"automatic", "nccl", "ring", "ipc", "staged"}));
  app.add_option("--sync", opt.sync,
                 "how gradients are averaged: collective (one device allreduce of all per step), engine "
                 "(gradient_sync over the engine, per layer, during the backward pass) or relax (the device "
                 "relaxation --algorithm)")
      ->capture_default_str()
      ->check(CLI::IsMember({"collective", "engine", "relax"}));
  fm::add_relaxation_options(app, opt,
                             "with --sync relax: gradient_allreduce, bytegrad, local_sgd, decentralized, "
                             "low_precision_decentralized, onebit_adam, qadam (these two are their own Adam: --lr is "
                             "Adam's)");
  app.add_option("--wire", opt.wire, "with --sync engine: what the gradients travel as, none (f32) or bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "bf16"}));
  CLI11_PARSE(app, argc, argv);
  if (opt.wire != "none" && opt.sync != "engine") {
    std::fprintf(stderr, "fashion_mnist_gpu: --wire %s needs --sync engine\n", opt.wire.c_str());
    return 2;
  }
  return fm::run_training(
      "fashion_mnist_gpu", argc, argv, MPI_THREAD_MULTIPLE, opt.data_dir, [&] { return train(opt); },
      [] { return fc::device_count() == 0 ? std::string("CUDA device") : std::string(); });
}
