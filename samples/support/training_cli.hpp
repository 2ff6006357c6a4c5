// samples/support/training_cli.hpp — what the Fashion-MNIST samples (CPU and GPU) share around their
// training loops: the settings and command-line options of the run, the cosine schedule, and a main
// that initializes MPI, skips (exit 77) when the data set or a device is missing, and turns an error
// on one rank into an MPI_Abort (the other ranks may be waiting in a collective).
#pragma once

#include <mpi.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "fashion_mnist.hpp"

namespace flexpar::samples {

/// The settings every Fashion-MNIST training run has.
struct training_settings {
  int epochs = 10;
  std::size_t batch = 64;  ///< per rank
  float lr = 0.05f;
  float momentum = 0.9f;
  std::string schedule = "cosine";
  std::uint64_t seed = 1;
  std::size_t train_limit = 0;
  std::size_t test_limit = 0;
  double min_accuracy = 0;
  std::string data_dir = fashion_mnist_default_dir().string();
};

/// The settings of a relaxation (relax::make, cuda::make_relaxation) the samples take.
struct relaxation_settings {
  std::string algorithm = "gradient_allreduce";
  int interval = 1;
  std::string peers = "shift_one";
  int warmup = 100;
  float adam_epsilon = 1e-8f;
};

/// Adds --algorithm (`names`: the algorithms this sample runs), --interval, --peers, --warmup and
/// --adam-epsilon to `app`.
inline void add_relaxation_options(CLI::App& app, relaxation_settings& r, const std::string& names) {
  app.add_option("--algorithm", r.algorithm, names)->capture_default_str();
  app.add_option("--interval", r.interval, "communication interval k (decentralized, local_sgd)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--peers", r.peers, "decentralized peers: all, shift_one, ring")->capture_default_str();
  app.add_option("--adam-epsilon", r.adam_epsilon, "Adam's epsilon (adam, onebit_adam, qadam)")->capture_default_str();
  app.add_option("--warmup", r.warmup, "onebit_adam, qadam: full-precision Adam steps first")->capture_default_str();
}

/// Adds the options of training_settings to `app` (defaults shown by --help). `schedule_help`
/// describes --schedule for this sample.
inline void add_training_options(CLI::App& app, training_settings& t, const std::string& schedule_help) {
  app.add_option("--epochs", t.epochs, "passes over the training set")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", t.batch, "examples per step per rank")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--lr", t.lr, "learning rate (peak of the schedule)")->capture_default_str();
  app.add_option("--momentum", t.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--schedule", t.schedule, schedule_help)
      ->capture_default_str()
      ->check(CLI::IsMember({"cosine", "constant"}));
  app.add_option("--seed", t.seed, "initial weights and shuffling")->capture_default_str();
  app.add_option("--train-limit", t.train_limit, "use only the first N training images (0 = all)")
      ->capture_default_str();
  app.add_option("--test-limit", t.test_limit, "use only the first N test images (0 = all)")->capture_default_str();
  app.add_option("--min-accuracy", t.min_accuracy, "exit with status 1 if the final test accuracy is below this")
      ->capture_default_str();
  app.add_option("--data-dir", t.data_dir, "folder of the four IDX .gz files (or FLEXPAR_FASHION_MNIST_DIR)")
      ->capture_default_str();
}

/// The learning-rate factor of step `step` of `total`: 0.5 (1 + cos(pi step / total)) for "cosine", 1 otherwise.
inline float schedule_factor(const std::string& schedule, std::size_t step, std::size_t total) {
  if (schedule != "cosine") return 1.0f;
  return 0.5f * (1.0f + std::cos(3.14159265f * static_cast<float>(step) / static_cast<float>(total)));
}

/// This rank's shards of the training and test sets, and the steps every rank takes per epoch.
struct training_data {
  fashion_mnist_set train, test;
  std::size_t steps_per_epoch = 0;
};

/// Reads the data set (every rank reads the files) and keeps this rank's shards; every rank takes the
/// same number of steps (the collectives need it): the smallest shard's.
/// @throws std::runtime_error when the shards hold no full batch.
inline training_data load_training_data(const training_settings& t, int rank, int size, const std::string& program) {
  fashion_mnist_set train_all = load_fashion_mnist(fashion_mnist_split::train, t.data_dir);
  fashion_mnist_set test_all = load_fashion_mnist(fashion_mnist_split::test, t.data_dir);
  if (t.train_limit != 0) train_all = train_all.first(t.train_limit);
  if (t.test_limit != 0) test_all = test_all.first(t.test_limit);
  training_data d{train_all.shard(rank, size), test_all.shard(rank, size),
                  train_all.count / static_cast<std::size_t>(size) / t.batch};
  if (d.steps_per_epoch == 0)
    throw std::runtime_error(program + ": " + std::to_string(train_all.count) + " training images over " +
                             std::to_string(size) + " ranks give no full batch of " + std::to_string(t.batch));
  return d;
}

/// The median of `v` (0 for none).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

/// Collective over `comm`: on how many ranks `mine` differs (bitwise) from rank 0's copy.
inline int ranks_differing_from_root(const std::vector<float>& mine, MPI_Comm comm = MPI_COMM_WORLD) {
  std::vector<float> root = mine;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, comm);
  int differ = std::memcmp(mine.data(), root.data(), mine.size() * sizeof(float)) == 0 ? 0 : 1, ranks = 0;
  MPI_Allreduce(&differ, &ranks, 1, MPI_INT, MPI_SUM, comm);
  return ranks;
}

/// Prints the final test accuracy (rank 0) and returns the exit status: 1 when it is below
/// `min_accuracy` (saying so) or when `ranks_differ` ranks hold other weights than rank 0, else 0.
inline int final_status(int rank, double accuracy, double min_accuracy, int ranks_differ) {
  if (rank == 0) std::printf("final test accuracy %.4f\n", accuracy);
  if (accuracy < min_accuracy) {
    if (rank == 0)
      std::printf("FAILED: final test accuracy %.4f is below --min-accuracy %.4f\n", accuracy, min_accuracy);
    return 1;
  }
  return ranks_differ != 0 ? 1 : 0;
}

/// MPI_Init_thread at `thread_level`, then train() on every rank unless the data set in `data_dir` is
/// missing or `missing()` names something else that is (both: exit 77 on every rank); an exception
/// on a rank is printed with the rank and aborts the job. Returns the exit status.
template <class Train, class Missing>
int run_training(const char* program, int argc, char** argv, int thread_level, const std::string& data_dir,
                 Train&& train, Missing&& missing) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, thread_level, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int status = 0;
  const std::string absent = fashion_mnist_present(data_dir)
                                 ? std::string(missing())
                                 : "Fashion-MNIST in " + data_dir + " (install dataset-fashion-mnist)";
  if (!absent.empty()) {
    if (rank == 0) std::fprintf(stderr, "%s: no %s; skipping\n", program, absent.c_str());
    status = 77;
  } else {
    try {
      status = train();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: rank %d: %s\n", program, rank, e.what());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
  return status;
}

}  // namespace flexpar::samples
