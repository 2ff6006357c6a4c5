// samples/fashion_mnist_mlp.cpp — data-parallel training of a 784-256-128-10 MLP on Fashion-MNIST,
// with any of flexpar's communication relaxations (BAGUA) choosing what crosses the network.
//
// Every rank reads the data set (Debian package dataset-fashion-mnist) and keeps its own shard of
// the 60000 training images; the forward and backward passes are GEMMs through OpenBLAS (one thread
// per rank); after each backward pass the chosen relaxation communicates and applies the optimizer.
// One line per epoch (loss, accuracies, median step time, bytes sent), then the final test accuracy
// of the consensus model:
//
//   mpiexec.mpich -n 2 build/samples/fashion_mnist_mlp --algorithm bytegrad --epochs 10
//
// Checkpoints (gradient_allreduce and bytegrad, whose replicas and optimizer states are equal on
// every rank after every step): `--checkpoint DIR --every N` saves the model, the optimizer's state
// and the position in the data (epoch, examples of it done) every N steps and at the end, in the
// background (checkpoint::async_saver); `--resume` starts from DIR's checkpoint when there is one,
// on any number of ranks. On as many ranks as saved it, a resumed run ends with the weights of an
// uninterrupted one, bit for bit; on another number the shards and batches differ from there on.
// `--kill-rank R --kill-at-step S` makes rank R SIGKILL itself at step S, inside the step's exchange
// (the failure a checkpoint is for: samples/support/checkpoint_resume.sh). `--on-failure shrink`: the
// survivors of a dead rank agree on a communicator without it (communicator::shrink) and go on
// training on their own shards (samples/support/shrink_and_go_on.sh).
//
// `--sync engine` averages the gradients through flexpar's engine instead of a relaxation: they live in
// a gradient_sync's arena, and each bucket (`--bucket-kib`) is reduced while the backward pass goes on
// with the layers below (support/engine_sync.hpp); "comm" is then the communication left exposed at
// the end of the backward pass. FLEXPAR_TIMELINE=t.json shows the overlap.
//
// Exit status: 0, 1 (an error: each rank prints it), 2 (bad command line), 77 (no data set; ctest
// counts it as skipped).
#include <mpi.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <flexpar/checkpoint/checkpoint.hpp>
#include <flexpar/collective/automatic.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/relax/registry.hpp>

#include "support/engine_sync.hpp"
#include "support/fashion_mnist.hpp"
#include "support/mlp.hpp"
#include "support/mlp_scores.hpp"
#include "support/scheduled_optimizer.hpp"
#include "support/training_cli.hpp"

#ifdef FLEXPAR_SAMPLE_OPENBLAS
extern "C" void openblas_set_num_threads(int);  // OpenBLAS's own entry point (cblas.h may be another BLAS's)
#endif

namespace {

namespace fm = flexpar::samples;

struct settings : fm::training_settings, fm::relaxation_settings {
  std::string optimizer = "sgd";
  std::string checkpoint;  // directory; empty: no checkpoints
  std::size_t every = 0;   // steps between checkpoints; 0: at the end only
  bool resume = false;
  bool fixed_machine = false;
  int kill_rank = -1;
  std::size_t kill_at_step = 0;
  std::string on_failure = "abort";  // or "shrink": the survivors of a dead rank go on without it
  std::string sync = "relax";        // or "engine": gradient_sync, overlapped with the backward pass
  std::size_t bucket_kib = 64;       // --sync engine: the arena's bucket size
};

/// Where a run stands in its data: the epoch in progress and the examples of it that all ranks
/// together have trained on. Saved in checkpoints, so that a resumed run, on any number of ranks,
/// goes on with the next batch.
struct position {
  std::int64_t epoch = 1;
  std::int64_t examples = 0;
};

int train(const settings& opt) {
  auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, flexpar::config::from_environment(),
                                              flexpar::thread_need::multiple);
  // --fixed-machine: automatic picks on flexpar's default machine instead of one it measures, so that
  // every run, idle or loaded, reduces in the same order (a resumed run equals an uninterrupted one).
  if (opt.fixed_machine) flexpar::set_cost_params(comm, flexpar::cost_params{});
  int rank = comm.rank(), size = comm.size();  // change when the survivors of a failure shrink
  if (opt.on_failure == "shrink" && !opt.checkpoint.empty())
    throw flexpar::usage_error(
        "fashion_mnist_mlp: --on-failure shrink goes on without the dead rank; --checkpoint is for restarting "
        "the job instead: pass one of them");

  // Data: every rank reads the files and keeps its shard of the training set and of the test set.
  // After a shrink the survivors take the shards of the new world at the end of that epoch.
  fm::training_data data = fm::load_training_data(opt, rank, size, "fashion_mnist_mlp");
  const fm::fashion_mnist_set& train_set = data.train;
  const fm::fashion_mnist_set& test_set = data.test;
  std::size_t steps_per_epoch = data.steps_per_epoch;
  const std::size_t px = train_set.pixels();
  std::vector<float> train_x, test_x;
  const auto normalize = [&] {
    train_x.resize(train_set.images.size());
    test_x.resize(test_set.images.size());
    fm::normalize_pixels(train_set.images, train_x);
    fm::normalize_pixels(test_set.images, test_x);
  };
  normalize();

  // Model: the same seed on every rank; start() makes every replica rank 0's anyway.
  fm::mlp model({px, 256, 128, 10}, opt.seed);
  std::vector<flexpar::relax::parameter> params;
  for (std::size_t l = 0; l < model.layers(); ++l) {
    std::string layer = "fc";
    layer.append(std::to_string(l + 1));
    params.push_back({std::string(layer).append(".weight"), model.weight(l), model.weight_grad(l)});
    params.push_back({std::string(layer).append(".bias"), model.bias(l), model.bias_grad(l)});
  }

  if ((opt.algorithm == "onebit_adam" || opt.algorithm == "qadam") && opt.optimizer != "adam") {
    std::string text = "fashion_mnist_mlp: ";
    text.append(opt.algorithm)
        .append(
            " applies its own Adam (options::adam): pass --optimizer adam with an Adam learning rate, e.g. --lr 0.001");
    throw flexpar::usage_error(text);
  }
  std::unique_ptr<flexpar::relax::optimizer> base;
  if (opt.optimizer == "sgd")
    base = std::make_unique<flexpar::relax::sgd>(
        flexpar::relax::sgd_options{.learning_rate = opt.lr, .momentum = opt.momentum});
  else
    base = std::make_unique<flexpar::relax::adam>(
        flexpar::relax::adam_options{.learning_rate = opt.lr, .epsilon = opt.adam_epsilon});
  fm::scheduled_optimizer optimizer(*base);

  flexpar::relax::options ropt;
  ropt.interval = opt.interval;
  ropt.peers = opt.peers;
  ropt.warmup_steps = opt.warmup;
  ropt.adam.learning_rate = opt.lr;
  ropt.adam.epsilon = opt.adam_epsilon;  // onebit_adam and qadam own their Adam (they ignore `optimizer`)
  std::unique_ptr<flexpar::relax::relaxation> algo;
  std::optional<flexpar::engine> eng;     // --sync engine
  fm::engine_sync* overlapped = nullptr;  // the backward pass's parameter source then
  if (opt.sync == "engine") {
    if (!opt.checkpoint.empty() || opt.on_failure != "abort" || opt.algorithm != "gradient_allreduce")
      throw flexpar::usage_error(
          "fashion_mnist_mlp: --sync engine averages gradients exactly (gradient_allreduce's rule) and "
          "neither checkpoints nor shrinks here: leave --algorithm, --checkpoint and --on-failure unset");
    eng.emplace(comm);
    auto e = std::make_unique<fm::engine_sync>(*eng, model, params, opt.bucket_kib * 1024);
    overlapped = e.get();
    algo = std::move(e);
  } else {
    algo = flexpar::relax::make(opt.algorithm, comm, ropt);
  }

  // The checkpoint's contents: weights and optimizer state once (equal on every rank), the position
  // and the settings a resumed run must share (seed, batch).
  position at;
  std::int64_t saved_seed = static_cast<std::int64_t>(opt.seed), saved_batch = static_cast<std::int64_t>(opt.batch);
  std::int64_t saved_by = size;  // the world that wrote the checkpoint (this one's, for its own saves)
  flexpar::checkpoint::state ck;
  std::optional<flexpar::checkpoint::async_saver> saver;
  if (!opt.checkpoint.empty()) {
    if (opt.algorithm != "gradient_allreduce" && opt.algorithm != "bytegrad")
      throw flexpar::usage_error(
          "fashion_mnist_mlp: --checkpoint saves one model and one optimizer state for all "
          "ranks, which needs replicas equal after every step: gradient_allreduce or bytegrad; " +
          opt.algorithm + " keeps per-rank state this sample does not save");
    for (std::size_t i = 0; i < params.size(); ++i) {
      ck.add_replicated(params[i].name, params[i].weight);
      for (const flexpar::relax::optimizer_state& piece : base->state(i, params[i].weight.size())) {
        std::string name = params[i].name + "." + opt.optimizer + "." + piece.name;
        if (!piece.floats.empty())
          ck.add_replicated(std::move(name), piece.floats);
        else
          ck.add_replicated(std::move(name), piece.counters);
      }
    }
    ck.add_integer("epoch", at.epoch).add_integer("examples_into_epoch", at.examples);
    ck.add_integer("seed", saved_seed).add_integer("batch_per_rank", saved_batch).add_integer("ranks", saved_by);
    saver.emplace(comm);
  }
  if (opt.resume && std::filesystem::exists(std::filesystem::path(opt.checkpoint) / "metadata.json")) {
    flexpar::checkpoint::load(comm, opt.checkpoint, ck);
    if (saved_seed != static_cast<std::int64_t>(opt.seed) || saved_batch != static_cast<std::int64_t>(opt.batch))
      throw flexpar::usage_error("fashion_mnist_mlp: the checkpoint in " + opt.checkpoint + " was saved with --seed " +
                                 std::to_string(saved_seed) + " --batch " + std::to_string(saved_batch) +
                                 "; this run has --seed " + std::to_string(opt.seed) + " --batch " +
                                 std::to_string(opt.batch));
    if (rank == 0)
      std::printf("resumed from %s (saved by %lld ranks): epoch %lld, %lld examples into it\n", opt.checkpoint.c_str(),
                  static_cast<long long>(saved_by), static_cast<long long>(at.epoch),
                  static_cast<long long>(at.examples));
    saved_by = size;
  } else if (opt.resume && rank == 0) {
    std::printf("no checkpoint in %s: starting at step 0\n", opt.checkpoint.c_str());
  }
  algo->start(params);

  if (rank == 0)
    std::printf(
        "fashion_mnist_mlp: %s on %d ranks, MLP 784-256-128-10 (%zu parameters), %zu images per rank, "
        "batch %zu per rank, %zu steps per epoch, %s lr %g (%s)\n",
        std::string(algo->name()).c_str(), size, model.parameter_count(), train_set.count, opt.batch, steps_per_epoch,
        opt.optimizer.c_str(), static_cast<double>(opt.lr), opt.schedule.c_str());

  std::vector<std::size_t> order(train_set.count);
  std::vector<float> batch_x(opt.batch * px);
  std::vector<std::uint8_t> batch_y(opt.batch);
  const std::size_t total_steps = steps_per_epoch * static_cast<std::size_t>(opt.epochs);
  // A resumed run goes on with the next batch of all ranks together (rounded down to a whole step
  // of this world when the saving world had another size).
  const std::size_t examples_per_step = opt.batch * static_cast<std::size_t>(size);
  const int first_epoch = static_cast<int>(at.epoch);
  const std::size_t first_step = static_cast<std::size_t>(at.examples) / examples_per_step;
  std::size_t step_index = (static_cast<std::size_t>(first_epoch) - 1) * steps_per_epoch + first_step;
  double train_seconds = 0;
  bool shrunk = false, reshard = false;
  std::vector<double> all_step_ms, all_comm_ms;
  using clock = std::chrono::steady_clock;

  for (int epoch = first_epoch; epoch <= opt.epochs; ++epoch) {
    std::seed_seq seq{opt.seed, static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(epoch)};
    std::mt19937_64 rng(seq);
    std::iota(order.begin(), order.end(), std::size_t{0});  // each epoch's order from (seed, rank, epoch) alone,
    std::shuffle(order.begin(), order.end(), rng);          // so that a resumed run shuffles as the first did
    const std::uint64_t bytes_before = algo->traffic_so_far().bytes_sent;
    std::vector<double> step_ms, comm_ms;
    fm::batch_result seen;
    const auto epoch_start = clock::now();
    for (std::size_t s = epoch == first_epoch ? first_step : 0; s < steps_per_epoch; ++s, ++step_index) {
      for (std::size_t i = 0; i < opt.batch; ++i) {
        const std::size_t k = order[s * opt.batch + i];
        std::copy_n(train_x.begin() + static_cast<std::ptrdiff_t>(k * px), px,
                    batch_x.begin() + static_cast<std::ptrdiff_t>(i * px));
        batch_y[i] = train_set.labels[k];
      }
      if (opt.schedule == "cosine") optimizer.set_factor(fm::schedule_factor(opt.schedule, step_index, total_steps));
      const auto t0 = clock::now();
      model.train_step(batch_x, batch_y, opt.batch, seen, overlapped);
      const auto t1 = clock::now();
      if (rank == opt.kill_rank && step_index + 1 == opt.kill_at_step) {
        std::printf("rank %d: killing itself (SIGKILL) at step %zu\n", rank, step_index + 1);
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
      // --on-failure shrink: a peer_failure (a rank died: the liveness monitor names it) makes the
      // survivors agree on a communicator without it, start the relaxation again on it (every replica
      // becomes the new rank 0's) and take this step again; they finish the epoch on their own shards
      // and take the new world's shards for the next one (the dead rank's data is not lost).
      // [snippet:shrink]
      for (;;) {
        try {
          algo->step(params, optimizer);
          break;
        } catch (const flexpar::peer_failure& e) {
          if (opt.on_failure != "shrink") throw;
          const auto failed_at = clock::now();
          const int old_rank = rank;
          algo.reset();  // what was built on the old communicator goes first
          comm = comm.shrink();
          rank = comm.rank();
          size = comm.size();
          algo = flexpar::relax::make(opt.algorithm, comm, ropt);
          algo->start(params);
          shrunk = reshard = true;
          std::printf("survivor %d: %s; went on as rank %d of %d after %.3f s\n", old_rank, e.what(), rank, size,
                      std::chrono::duration<double>(clock::now() - failed_at).count());
          std::fflush(stdout);
        }
      }
      // [/snippet:shrink]
      const auto t2 = clock::now();
      if (saver && opt.every != 0 && (step_index + 1) % opt.every == 0 && step_index + 1 != total_steps) {
        at = s + 1 == steps_per_epoch ? position{epoch + 1, 0}
                                      : position{epoch, static_cast<std::int64_t>((s + 1) * examples_per_step)};
        // snapshots and returns; the files are written while training goes on (a failed save is
        // thrown by the next one)
        (void)saver->save(opt.checkpoint, ck);
        if (rank == 0) std::printf("checkpoint at step %zu to %s\n", step_index + 1, opt.checkpoint.c_str());
      }
      step_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
      comm_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    train_seconds += std::chrono::duration<double>(clock::now() - epoch_start).count();
    if (reshard) {  // the shards of the survivors' world, before scoring on the test set
      data = fm::load_training_data(opt, rank, size, "fashion_mnist_mlp");
      normalize();
      steps_per_epoch = data.steps_per_epoch;
      order.resize(train_set.count);
      reshard = false;
      std::printf(
          "rank %d of %d: re-sharded the data for %d ranks: %zu training and %zu test images per rank, %zu "
          "steps per epoch\n",
          rank, size, size, train_set.count, test_set.count, steps_per_epoch);
      std::fflush(stdout);
    }
    all_step_ms.insert(all_step_ms.end(), step_ms.begin(), step_ms.end());
    all_comm_ms.insert(all_comm_ms.end(), comm_ms.begin(), comm_ms.end());

    // Each rank scores its own replica on its test shard (replicas differ between exchanges for
    // decentralized and local algorithms; the final line below scores the consensus model).
    const fm::batch_result train_r = fm::sum_over_ranks(comm, seen);
    const fm::batch_result test_r = fm::sum_over_ranks(comm, fm::evaluate(model, test_x, test_set));
    double sent = static_cast<double>(algo->traffic_so_far().bytes_sent - bytes_before), sent_sum = 0;
    MPI_Allreduce(&sent, &sent_sum, 1, MPI_DOUBLE, MPI_SUM, comm.mpi_comm());
    if (rank == 0)
      std::printf(
          "epoch %2d/%d  loss %.4f  train accuracy %.4f  test accuracy %.4f  step %.2f ms (comm %.2f ms)  "
          "sent %.1f MB/rank  time %.1f s\n",
          epoch, opt.epochs, train_r.loss_sum / static_cast<double>(train_r.examples),
          static_cast<double>(train_r.correct) / static_cast<double>(train_r.examples),
          static_cast<double>(test_r.correct) / static_cast<double>(test_r.examples), fm::median(step_ms),
          fm::median(comm_ms), sent_sum / size / 1e6, train_seconds);
    std::fflush(stdout);
  }

  algo->finish(params);
  if (saver) {
    at = position{opt.epochs + 1, 0};
    saver->save(opt.checkpoint, ck).wait();
    if (rank == 0) std::printf("checkpoint at the end (step %zu) to %s\n", step_index, opt.checkpoint.c_str());
  }

  // Consensus check: after finish() every replica must be rank 0's (bitwise).
  std::vector<float> weights;
  for (std::size_t l = 0; l < model.layers(); ++l) {
    weights.insert(weights.end(), model.weight(l).begin(), model.weight(l).end());
    weights.insert(weights.end(), model.bias(l).begin(), model.bias(l).end());
  }
  const int ranks_differ = fm::ranks_differing_from_root(weights, comm.mpi_comm());

  const fm::batch_result test_r = fm::sum_over_ranks(comm, fm::evaluate(model, test_x, test_set));
  const flexpar::relax::traffic t = algo->traffic_so_far();
  const double accuracy = static_cast<double>(test_r.correct) / static_cast<double>(test_r.examples);
  if (rank == 0) {
    if (ranks_differ != 0)
      std::printf("replicas differ after finish() on %d of %d ranks; the accuracy below is each rank's own replica\n",
                  ranks_differ, size);
    else
      std::printf("replicas identical on all %d ranks after finish()\n", size);
    std::printf(
        "summary algorithm=%s ranks=%d epochs=%d steps=%llu exchanges=%llu bytes_per_rank=%llu "
        "step_ms=%.3f comm_ms=%.3f train_s=%.2f test_accuracy=%.4f weights=%016llx\n",
        std::string(algo->name()).c_str(), size, opt.epochs, static_cast<unsigned long long>(t.steps),
        static_cast<unsigned long long>(t.exchanges), static_cast<unsigned long long>(t.bytes_sent),
        fm::median(all_step_ms), fm::median(all_comm_ms), train_seconds, accuracy,
        static_cast<unsigned long long>(fm::digest(weights)));
  }
  const int status = fm::final_status(rank, accuracy, opt.min_accuracy, ranks_differ);
  if (shrunk) {
    // MPI_Finalize waits for the dead rank (MPICH 4.0.2; doc/failures.md): a shrunk job ends here.
    std::printf("survivor rank %d of %d: finished, status %d\n", rank, size, status);
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(status);
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  settings opt;
  CLI::App app{"fashion_mnist_mlp: data-parallel MLP on Fashion-MNIST with a flexpar relaxation"};
  std::string names;
  for (std::string_view n : flexpar::relax::algorithm_names()) names.append(names.empty() ? "" : ", ").append(n);
  fm::add_relaxation_options(app, opt, names);
  fm::add_training_options(app, opt, "cosine (decay to 0 over the run; sgd only) or constant");
  app.add_option("--optimizer", opt.optimizer, "sgd or adam")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adam"}));
  auto* checkpoint = app.add_option("--checkpoint", opt.checkpoint,
                                    "save checkpoints to this directory (gradient_allreduce, bytegrad)");
  app.add_option("--every", opt.every, "steps between checkpoints (0: at the end only)")
      ->capture_default_str()
      ->needs(checkpoint);
  app.add_flag("--resume", opt.resume, "start from the checkpoint in --checkpoint's directory when it holds one")
      ->needs(checkpoint);
  app.add_flag("--fixed-machine", opt.fixed_machine,
               "choose algorithms on flexpar's default cost model, not a measured one: the same choices (and "
               "sums, bit for bit) in every run, whatever the load");
  app.add_option("--kill-rank", opt.kill_rank, "fault injection: this rank SIGKILLs itself at --kill-at-step");
  app.add_option("--kill-at-step", opt.kill_at_step, "fault injection: the step (from 1) of --kill-rank's death");
  app.add_option("--on-failure", opt.on_failure,
                 "abort: a dead rank ends the job (restart it from --checkpoint); shrink: the survivors go on "
                 "without it")
      ->capture_default_str()
      ->check(CLI::IsMember({"abort", "shrink"}));
  app.add_option("--sync", opt.sync,
                 "relax (the --algorithm relaxation, after the backward pass) or engine (gradient_sync over the "
                 "engine, its buckets reduced during the backward pass)")
      ->capture_default_str()
      ->check(CLI::IsMember({"relax", "engine"}));
  app.add_option("--bucket-kib", opt.bucket_kib, "--sync engine: KiB of gradients per bucket")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (opt.optimizer == "adam" && opt.schedule == "cosine") opt.schedule = "constant";  // Adam is scale-invariant

#ifdef FLEXPAR_SAMPLE_OPENBLAS
  openblas_set_num_threads(1);  // one BLAS thread per rank: ranks already fill the cores
#endif
  return fm::run_training(
      "fashion_mnist_mlp", argc, argv, MPI_THREAD_MULTIPLE, opt.data_dir, [&] { return train(opt); },
      [] { return std::string(); });
}
