// samples/fashion_mnist_zero.cpp — the Fashion-MNIST MLP (784-256-128-10) trained with sharded data
// parallelism: ZeRO stage 1, 2 or 3 (flexpar::zero), or plain data parallelism (--zero 0, the
// gradient_allreduce relaxation) to compare with, on the same data, seed and optimizer.
//
//   mpiexec.mpich -n 4 build/samples/fashion_mnist_zero --zero 3 --epochs 2
//   FLEXPAR_RANKS_PER_NODE=2 mpiexec.mpich -n 4 build/samples/fashion_mnist_zero --zero 3 --hybrid
//   mpiexec.mpich -n 2 build/samples/fashion_mnist_zero --zero 3 --quantize both     # ZeRO++ qwZ + qgZ
//
// The passes read each layer's parameters through a parameter_source that gathers them (S(0) -> B)
// just in time and marks each layer's gradients ready as backward makes them (their P -> S(0) starts
// then). Each epoch prints loss, accuracies, the median step time and the bytes sent per rank; the end
// prints the bytes of parameters, gradients and optimizer state each rank held (now and at peak), what
// data parallelism holds, the process's peak RSS, and a digest of the final weights: with SGD on two
// ranks every stage ends with the weights of --zero 0, bit for bit (sums of two values do not depend
// on the order).
//
// Exit status: 0, 1 (an error, or the accuracy below --min-accuracy), 2 (bad command line), 77 (no
// data set).
#include <mpi.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/relax/registry.hpp>
#include <flexpar/zero/sharded_data_parallel.hpp>

#include "support/fashion_mnist.hpp"
#include "support/mlp.hpp"
#include "support/mlp_scores.hpp"
#include "support/scheduled_optimizer.hpp"
#include "support/training_cli.hpp"

#ifdef FLEXPAR_SAMPLE_OPENBLAS
extern "C" void openblas_set_num_threads(int);
#endif

namespace {

namespace fm = flexpar::samples;

struct settings : fm::training_settings {
  int zero = 3;  // 0: data parallelism (gradient_allreduce)
  bool hybrid = false;
  std::string optimizer = "sgd";
  double bucket_mb = 1;
  int prefetch = 1;
  bool no_overlap = false;
  std::string quantize = "none";  // ZeRO++: weights (qwZ), gradients (qgZ), both, none
};

std::string parameter_name(std::size_t l, bool weight) {
  std::string name = "fc";
  name.append(std::to_string(l + 1)).append(weight ? ".weight" : ".bias");
  return name;
}

/// The MLP's parameters as a sharded model holds them: gathered per layer, gradients per layer.
// [snippet:zero_source]
template <std::size_t N>
class sharded_source final : public fm::parameter_source {
 public:
  sharded_source(flexpar::zero::sharded_data_parallel<N>& model, std::size_t layers)
      : model_(model), weights_(layers), biases_(layers) {}
  std::span<const float> weight(std::size_t l) override {
    return weights_[l].emplace(model_.gather(parameter_name(l, true))).values();
  }
  std::span<const float> bias(std::size_t l) override {
    return biases_[l].emplace(model_.gather(parameter_name(l, false))).values();
  }
  void done(std::size_t l) override {
    weights_[l].reset();
    biases_[l].reset();
  }
  std::span<float> weight_grad(std::size_t l) override { return model_.gradient(parameter_name(l, true)); }
  std::span<float> bias_grad(std::size_t l) override { return model_.gradient(parameter_name(l, false)); }
  void gradients_ready(std::size_t l) override {
    model_.gradient_ready(parameter_name(l, true));
    model_.gradient_ready(parameter_name(l, false));
  }

 private:
  using view = typename flexpar::zero::sharded_data_parallel<N>::view;
  flexpar::zero::sharded_data_parallel<N>& model_;
  std::vector<std::optional<view>> weights_, biases_;
};
// [/snippet:zero_source]

/// One training run; `Mesh` is 1 (ZeRO over every rank) or 2 (hybrid: {nodes, ranks per node}).
template <std::size_t Mesh>
int train(flexpar::communicator& comm, const settings& opt, std::array<int, Mesh> mesh_shape) {
  const int rank = comm.rank(), size = comm.size();
  const fm::training_data data = fm::load_training_data(opt, rank, size, "fashion_mnist_zero");
  const std::size_t px = data.train.pixels();
  std::vector<float> train_x(data.train.images.size()), test_x(data.test.images.size());
  fm::normalize_pixels(data.train.images, train_x);
  fm::normalize_pixels(data.test.images, test_x);

  fm::mlp model({px, 256, 128, 10}, opt.seed);
  std::unique_ptr<flexpar::relax::optimizer> base;
  if (opt.optimizer == "sgd")
    base = std::make_unique<flexpar::relax::sgd>(
        flexpar::relax::sgd_options{.learning_rate = opt.lr, .momentum = opt.momentum});
  else
    base = std::make_unique<flexpar::relax::adam>(flexpar::relax::adam_options{.learning_rate = opt.lr});
  fm::scheduled_optimizer optimizer(*base);

  // --zero 0: the mlp's own parameters, averaged by gradient_allreduce; otherwise the sharded model
  // takes the initial values and the mlp frees its own.
  std::vector<flexpar::relax::parameter> params;
  std::unique_ptr<flexpar::relax::relaxation> data_parallel;
  std::optional<flexpar::sbp::placement<Mesh>> mesh;
  std::optional<flexpar::zero::sharded_data_parallel<Mesh>> sharded;
  std::optional<sharded_source<Mesh>> source;
  if (opt.zero == 0) {
    for (std::size_t l = 0; l < model.layers(); ++l) {
      params.push_back({parameter_name(l, true), model.weight(l), model.weight_grad(l)});
      params.push_back({parameter_name(l, false), model.bias(l), model.bias_grad(l)});
    }
    data_parallel = flexpar::relax::make("gradient_allreduce", comm);
    data_parallel->start(params);
  } else {
    mesh.emplace(comm, mesh_shape);
    sharded.emplace(
        *mesh, flexpar::zero::options{.stage = opt.zero,
                                      .bucket_bytes = static_cast<std::size_t>(opt.bucket_mb * (1 << 20)),
                                      .overlap = !opt.no_overlap,
                                      .prefetch = opt.prefetch,
                                      .quantize_weights = opt.quantize == "weights" || opt.quantize == "both",
                                      .quantize_gradients = opt.quantize == "gradients" || opt.quantize == "both"});
    for (std::size_t l = 0; l < model.layers(); ++l) {
      sharded->add(parameter_name(l, true), model.weight(l));
      sharded->add(parameter_name(l, false), model.bias(l));
    }
    sharded->start();
    model.drop_parameters();
    source.emplace(*sharded, model.layers());
  }
  fm::parameter_source* src = source ? &*source : nullptr;
  if (rank == 0)
    std::printf(
        "fashion_mnist_zero: %s on %d ranks%s, MLP 784-256-128-10 (%zu parameters, %zu buckets), batch %zu "
        "per rank, %zu steps per epoch, %s lr %g\n",
        opt.zero == 0 ? "data parallelism" : ("ZeRO-" + std::to_string(opt.zero)).c_str(), size,
        Mesh == 2 ? (" as (B, S(0)) on " + std::to_string(mesh_shape[0]) + " nodes").c_str() : "",
        model.parameter_count(), sharded ? sharded->buckets() : 0, opt.batch, data.steps_per_epoch,
        opt.optimizer.c_str(), static_cast<double>(opt.lr));

  std::vector<std::size_t> order(data.train.count);
  std::vector<float> batch_x(opt.batch * px);
  std::vector<std::uint8_t> batch_y(opt.batch);
  const std::size_t total_steps = data.steps_per_epoch * static_cast<std::size_t>(opt.epochs);
  std::size_t step_index = 0;
  std::vector<double> all_step_ms;
  using clock = std::chrono::steady_clock;
  auto sent_so_far = [&]() -> std::uint64_t {
    return sharded ? sharded->traffic().wire_bytes : data_parallel->traffic_so_far().bytes_sent;
  };
  // Evaluation needs every parameter on every rank: a copy of the model from `full`, what
  // full_parameters() gathered (stage 3 frees its buckets after).
  using named_values = std::vector<std::pair<std::string, std::vector<float>>>;
  auto test_score = [&](const named_values& full) {
    if (!sharded) return fm::sum_over_ranks(comm, fm::evaluate(model, test_x, data.test));
    fm::mlp copy(model.widths(), opt.seed);
    for (const auto& [name, values] : full) {
      const std::size_t l = static_cast<std::size_t>(std::stoul(name.substr(2))) - 1;
      const auto target = name.ends_with(".weight") ? copy.weight(l) : copy.bias(l);
      std::copy(values.begin(), values.end(), target.begin());
    }
    return fm::sum_over_ranks(comm, fm::evaluate(copy, test_x, data.test));
  };
  for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
    std::seed_seq seq{opt.seed, static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(epoch)};
    std::mt19937_64 rng(seq);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin(), order.end(), rng);
    const std::uint64_t sent_before = sent_so_far();
    std::vector<double> step_ms;
    fm::batch_result seen;
    for (std::size_t s = 0; s < data.steps_per_epoch; ++s, ++step_index) {
      for (std::size_t i = 0; i < opt.batch; ++i) {
        const std::size_t k = order[s * opt.batch + i];
        std::copy_n(train_x.begin() + static_cast<std::ptrdiff_t>(k * px), px,
                    batch_x.begin() + static_cast<std::ptrdiff_t>(i * px));
        batch_y[i] = data.train.labels[k];
      }
      if (opt.schedule == "cosine") optimizer.set_factor(fm::schedule_factor(opt.schedule, step_index, total_steps));
      const auto t0 = clock::now();
      model.train_step(batch_x, batch_y, opt.batch, seen, src);
      if (sharded)
        sharded->step(optimizer);
      else
        data_parallel->step(params, optimizer);
      step_ms.push_back(std::chrono::duration<double, std::milli>(clock::now() - t0).count());
    }
    all_step_ms.insert(all_step_ms.end(), step_ms.begin(), step_ms.end());
    const fm::batch_result train_r = fm::sum_over_ranks(comm, seen);
    const fm::batch_result test_r = test_score(sharded ? sharded->full_parameters() : named_values{});
    if (rank == 0)
      std::printf("epoch %2d/%d  loss %.4f  train accuracy %.4f  test accuracy %.4f  step %.2f ms  sent %.2f MB/rank\n",
                  epoch, opt.epochs, train_r.loss_sum / static_cast<double>(train_r.examples),
                  static_cast<double>(train_r.correct) / static_cast<double>(train_r.examples),
                  static_cast<double>(test_r.correct) / static_cast<double>(test_r.examples), fm::median(step_ms),
                  static_cast<double>(sent_so_far() - sent_before) / 1e6);
    std::fflush(stdout);
  }

  // The final weights (every rank's full copy) and what each rank held.
  std::vector<float> weights;
  const named_values full = sharded ? sharded->full_parameters() : named_values{};
  if (sharded) {
    for (const auto& [name, values] : full) weights.insert(weights.end(), values.begin(), values.end());
  } else {
    for (std::size_t l = 0; l < model.layers(); ++l) {
      weights.insert(weights.end(), model.weight(l).begin(), model.weight(l).end());
      weights.insert(weights.end(), model.bias(l).begin(), model.bias(l).end());
    }
  }
  const fm::batch_result test_r = test_score(full);
  const double accuracy = static_cast<double>(test_r.correct) / static_cast<double>(test_r.examples);
  flexpar::zero::memory_report m;
  if (sharded) {
    m = sharded->memory();
  } else {  // data parallelism: full parameters, gradients and optimizer state on every rank
    std::size_t state = 0;
    for (std::size_t i = 0; i < params.size(); ++i)
      for (const auto& piece : base->state(i, params[i].weight.size()))
        state += piece.floats.size_bytes() + piece.counters.size_bytes();
    m.parameter_bytes = m.peak_parameter_bytes = m.gradient_bytes = m.peak_gradient_bytes =
        model.parameter_count() * sizeof(float);
    m.optimizer_bytes = state;
    m.data_parallel_bytes = 2 * model.parameter_count() * sizeof(float) + state;
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  if (rank == 0) {
    std::printf(
        "held per rank (bytes): parameters %zu (peak %zu)  gradients %zu (peak %zu)  optimizer %zu  "
        "= %.3f of data parallelism's %zu  (peak RSS of rank 0: %ld KiB)\n",
        m.parameter_bytes, m.peak_parameter_bytes, m.gradient_bytes, m.peak_gradient_bytes, m.optimizer_bytes,
        static_cast<double>(m.parameter_bytes + m.gradient_bytes + m.optimizer_bytes) /
            static_cast<double>(m.data_parallel_bytes),
        m.data_parallel_bytes, usage.ru_maxrss);
    std::printf(
        "summary zero=%d quantize=%s hybrid=%d ranks=%d epochs=%d step_ms=%.3f sent_per_step=%.0f test_accuracy=%.4f "
        "weights=%016llx\n",
        opt.zero, opt.quantize.c_str(), Mesh == 2 ? 1 : 0, size, opt.epochs, fm::median(all_step_ms),
        static_cast<double>(sent_so_far()) / static_cast<double>(std::max<std::size_t>(1, step_index)), accuracy,
        static_cast<unsigned long long>(fm::digest(weights)));
  }
  return fm::final_status(rank, accuracy, opt.min_accuracy, 0);
}

int run(const settings& opt) {
  auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, flexpar::config::from_environment(),
                                              flexpar::thread_need::multiple);
  if (!opt.hybrid) return train<1>(comm, opt, {comm.size()});
  const flexpar::node_topology& t = comm.topology();
  if (!t.uniform())
    throw flexpar::usage_error("fashion_mnist_zero: --hybrid needs the same number of ranks on every node");
  return train<2>(comm, opt, {t.node_count(), t.local_size()});
}

}  // namespace

int main(int argc, char** argv) {
  settings opt;
  CLI::App app{"fashion_mnist_zero: the Fashion-MNIST MLP with sharded data parallelism (ZeRO)"};
  app.add_option("--zero", opt.zero, "ZeRO stage 1, 2 or 3; 0: data parallelism")
      ->capture_default_str()
      ->check(CLI::Range(0, 3));
  app.add_flag("--hybrid", opt.hybrid, "shard within a node, replicate across nodes: (B, S(0))");
  fm::add_training_options(app, opt, "cosine (decay to 0 over the run) or constant");
  app.add_option("--optimizer", opt.optimizer, "sgd or adam")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--bucket-mb", opt.bucket_mb, "bucket size (MiB of f32)")->capture_default_str();
  app.add_option("--prefetch", opt.prefetch, "buckets gathered ahead (stage 3)")->capture_default_str();
  app.add_option("--quantize", opt.quantize, "ZeRO++ 8-bit communication: weights (qwZ), gradients (qgZ), both")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "weights", "gradients", "both"}));
  app.add_flag("--no-overlap", opt.no_overlap, "communicate on the training thread (no communication thread)");
  CLI11_PARSE(app, argc, argv);
  if (opt.optimizer == "adam" && opt.schedule == "cosine") opt.schedule = "constant";
#ifdef FLEXPAR_SAMPLE_OPENBLAS
  openblas_set_num_threads(1);
#endif
  return fm::run_training(
      "fashion_mnist_zero", argc, argv, MPI_THREAD_MULTIPLE, opt.data_dir, [&] { return run(opt); },
      [] { return std::string(); });
}
