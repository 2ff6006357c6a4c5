// gpt_text: a small decoder-only transformer (GPT) trained on real text — the fortunes of Debian's
// fortunes-min package, one token per byte — built from SBP ops (samples/support/gpt_model.hpp), in
// any combination of pipeline, data and tensor parallelism, and the same model trained on one rank
// from the same seed as the oracle.
//
//   mpiexec.mpich -n 1 ./gpt_text --steps 300                    # serial: the loss curve and sample text
//   mpiexec.mpich -n 2 ./gpt_text --steps 20 --data 2            # data parallel
//   mpiexec.mpich -n 2 ./gpt_text --steps 20 --tensor 2          # Megatron tensor parallel
//   mpiexec.mpich -n 2 ./gpt_text --steps 20 --pipeline 2        # pipeline (1F1B, 4 micro-batches)
//   mpiexec.mpich -n 8 ./gpt_text --steps 20 --pipeline 2 --data 2 --tensor 2
//   mpiexec.mpich -n 4 ./gpt_text --strategy gpt4.json           # a strategy flexpar_gpt_search found
//
// With more than one rank, rank 0 also trains the same model on a 1 x 1 mesh (the serial run) and
// compares the two: the losses step by step, and every weight after the last step, element by element,
// relative to the largest element of its tensor (the splits add partial sums in another order, so
// they agree to float rounding, not bit for bit); the data-parallel replicas of each weight must agree
// bit for bit. Exit status 1 when a loss differs by more than --loss-tolerance (relative), a weight by
// more than --weight-tolerance, or two replicas in any bit. --optimizer sgd makes the weights follow the
// gradients' scale (Adam normalizes it away). Alone (-n 1) the loss must fall. Both end by generating
// text from the trained weights (gathered to rank 0).
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <flexpar/core/uncaught.hpp>
#include "support/gpt_model.hpp"

namespace {

/// initial_weights' order: "embedding", "positions", then "block L q|k|v|o|1|2".
std::string weight_name(std::size_t k) {
  if (k < 2) return k == 0 ? "embedding" : "positions";
  static constexpr const char* part[] = {"q", "k", "v", "o", "1", "2"};
  return "block " + std::to_string((k - 2) / 6) + " " + part[(k - 2) % 6];
}

/// The largest difference between two runs' weights, relative to the largest element of its tensor.
struct weight_difference {
  double relative = 0;
  std::string where;
};

weight_difference compare_weights(const gpt::full_weights& a, const gpt::full_weights& b) {
  weight_difference worst;
  for (std::size_t k = 0; k < a.w.size(); ++k) {
    if (a.w[k].size() != b.w[k].size()) return {INFINITY, weight_name(k) + " (sizes differ)"};
    double scale = 0, diff = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < a.w[k].size(); ++i) {
      scale = std::max(scale, std::fabs(double(a.w[k][i])));
      const double d = std::fabs(double(a.w[k][i]) - double(b.w[k][i]));
      if (!(d <= diff)) diff = d, at = i;  // a NaN counts as the largest
    }
    const double rel = diff / std::max(scale, 1e-30);
    if (!(rel <= worst.relative))
      worst = {rel, weight_name(k) + " [" + std::to_string(at) + "]: " + std::to_string(a.w[k][at]) + " vs " +
                        std::to_string(b.w[k][at])};
  }
  return worst;
}

std::string printable(const std::string& s) {
  std::string out;
  for (char ch : s) out.push_back((ch == '\n' || (ch >= 32 && ch < 127)) ? ch : '?');
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::set_terminate(flexpar::report_uncaught_and_abort);  // a rank's uncaught error: one whole line
  CLI::App app{"a GPT trained on the fortunes corpus, pipeline x data x tensor parallel, against the 1-rank run"};
  gpt::config c;
  gpt::layout lay;
  lay.micro_batches = 4;
  int steps = 20, report = 1, pipeline = 1;
  std::string schedule = "1f1b", strategy_file;
  std::size_t sample_bytes = 200;
  gpt::optimizer opt;
  std::string rule = "adam";
  double loss_tolerance = 1e-5, weight_tolerance = -1;  // -1: by the optimizer (below)
  std::uint64_t seed = 7;
  std::string corpus = "/usr/share/games/fortunes/fortunes";
  app.add_option("--steps", steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--pipeline", pipeline, "pipeline stages (the layers split evenly; a data x tensor mesh each)")
      ->check(CLI::PositiveNumber);
  app.add_option("--data", lay.data, "data-parallel ranks (the batch's sequences split)")->check(CLI::PositiveNumber);
  app.add_option("--tensor", lay.tensor, "tensor-parallel ranks (heads, MLP columns, vocabulary split)")
      ->check(CLI::PositiveNumber);
  app.add_option("--micro-batches", lay.micro_batches, "micro-batches per step (with --pipeline)")
      ->check(CLI::PositiveNumber);
  app.add_option("--schedule", schedule, "gpipe or 1f1b (with --pipeline)")->check(CLI::IsMember({"gpipe", "1f1b"}));
  app.add_option("--strategy", strategy_file,
                 "run this strategy (JSON from flexpar_gpt_search: stages' blocks, data, tensor, m, schedule)");
  app.add_option("--batch", c.batch, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--seq", c.seq, "bytes per sequence")->check(CLI::Range(2, 4096));
  app.add_option("--width", c.width, "model width")->check(CLI::PositiveNumber);
  app.add_option("--heads", c.heads, "attention heads")->check(CLI::PositiveNumber);
  app.add_option("--layers", c.layers, "transformer blocks")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", rule, "adam, or sgd (w -= lr g: the weights follow the gradients' scale)")
      ->check(CLI::IsMember({"adam", "sgd"}));
  app.add_option("--lr", opt.lr, "the learning rate");
  app.add_option("--loss-tolerance", loss_tolerance, "largest relative loss difference from the serial run");
  app.add_option("--weight-tolerance", weight_tolerance,
                 "largest weight difference from the serial run, relative to its tensor's largest element "
                 "(default: 2e-4 under Adam, 1e-5 under SGD)");
  app.add_option("--seed", seed, "seed of the weights and the batches");
  app.add_option("--report", report, "print the loss every this many steps")->check(CLI::PositiveNumber);
  app.add_option("--sample", sample_bytes, "bytes of text to generate at the end (0: none)");
  app.add_option("--corpus", corpus, "the text to train on (Debian: apt-get install fortunes-min)");
  CLI11_PARSE(app, argc, argv);
  opt.kind = rule == "sgd" ? gpt::optimizer::rule::sgd : gpt::optimizer::rule::adam;
  // Adam amplifies rounding: a weight whose gradient is near zero steps by lr times the sign of a
  // rounding-sized number (5e-5 measured after 50 steps of the default model), SGD by lr times it.
  if (weight_tolerance < 0) weight_tolerance = opt.kind == gpt::optimizer::rule::sgd ? 1e-5 : 2e-4;
  lay.schedule = schedule == "gpipe" ? flexpar::pipeline_schedule::gpipe : flexpar::pipeline_schedule::one_f_one_b;
  lay.blocks = flexpar::search::balanced_blocks(static_cast<int>(c.layers), pipeline);
  if (pipeline == 1) {  // no pipeline: one batch per step, no schedule
    lay.micro_batches = 1;
    lay.schedule = flexpar::pipeline_schedule::one_f_one_b;
  }
  if (!strategy_file.empty()) {
    std::ifstream f(strategy_file);
    std::stringstream json;
    json << f.rdbuf();
    try {
      lay = flexpar::search::pipeline_strategy_from_json(json.str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gpt_text: --strategy %s: %s\n", strategy_file.c_str(), e.what());
      return 2;
    }
  }

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // pipeline stages box on a worker thread
  int status = 0;
  {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    const int rank = comm.rank();
    std::ifstream in(corpus, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto m = static_cast<std::size_t>(lay.micro_batches);
    auto fail = [&](const std::string& why) {
      if (rank == 0) std::fprintf(stderr, "gpt_text: %s\n", why.c_str());
      status = 2;
    };
    if (text.size() < 4 * c.seq)
      fail("cannot read a corpus of at least 4 sequences at " + corpus + " (Debian: apt-get install fortunes-min)");
    else if (comm.size() > 1 && comm.size() != lay.ranks())
      fail("run with --pipeline x --data x --tensor ranks (" + std::to_string(lay.ranks()) + "), not " +
           std::to_string(comm.size()));
    else if (c.batch % (m * static_cast<std::size_t>(lay.data)) != 0)
      fail("--batch must be a multiple of --micro-batches x --data (whole sequences per data rank)");
    else if (c.width % c.heads != 0 || c.heads % static_cast<std::size_t>(lay.tensor) != 0 ||
             c.vocab % static_cast<std::size_t>(lay.tensor) != 0)
      fail("--heads must divide --width, and --tensor must divide --heads and the 256 byte values");
    else if (!flexpar::search::pipeline_space{lay.ranks(),
                                              static_cast<int>(c.layers),
                                              static_cast<int>(c.batch),
                                              static_cast<int>(c.heads),
                                              static_cast<int>(c.vocab),
                                              {lay.micro_batches}}
                  .valid(lay))
      fail("the layout " + lay.describe() + " does not fit: a block or more per stage, " + std::to_string(c.layers) +
           " blocks in all, and no micro-batches without a pipeline");
    if (status == 0) {
      const gpt::full_weights init = gpt::initial_weights(c, seed);
      const bool parallel = comm.size() > 1;
      flexpar::sbp::placement<2> one(comm, std::array<int, 2>{1, 1}, std::vector<int>{0});  // the serial run's mesh
      std::vector<float> serial_losses;
      gpt::full_weights serial_trained = init, trained = init;
      if (one.contains_me()) {
        gpt::stage_model m = gpt::make_stage(one, c, init, 0, c.layers, true, true);
        gpt::optimizer serial_opt = opt;
        for (int step = 0; step < steps; ++step)
          serial_losses.push_back(gpt::train_step(m, serial_opt, c, one, gpt::make_batch(text, c, step, seed)));
        trained = serial_trained = gpt::gather(m, c, 0);
      }
      gpt::run_result run;
      if (parallel)  // generate from the parallel run's weights
        run = gpt::train(comm, c, lay, init, text, steps, opt, seed, &trained);
      const std::vector<float>& parallel_losses = run.losses;
      if (rank == 0) {
        double worst = 0;
        for (int s = 0; s < steps; ++s) {
          const float a = serial_losses[static_cast<std::size_t>(s)];
          if (parallel) {
            const float b = parallel_losses[static_cast<std::size_t>(s)];
            worst = std::max(worst, std::fabs(double(a) - b) / std::max(1e-12, std::fabs(double(a))));
            if (s % report == 0 || s + 1 == steps)
              std::printf("step %4d  serial loss %.6f  parallel loss %.6f\n", s, double(a), double(b));
          } else if (s % report == 0 || s + 1 == steps) {
            std::printf("step %4d  loss %.6f\n", s, double(a));
          }
        }
        if (parallel) {
          const weight_difference w = compare_weights(serial_trained, trained);
          const bool match =
              worst <= loss_tolerance && w.relative <= weight_tolerance && run.replica_disagreements == 0;
          std::printf(
              "gpt (%zu layers, width %zu, %zu heads), pipeline %d x data %d x tensor %d (%s, m = %d, %s) vs serial: "
              "max relative loss difference %.3g (tolerance %.3g), max relative weight difference %.3g at %s "
              "(tolerance %.3g), %zu weight elements differ between data-parallel replicas -> %s\n",
              c.layers, c.width, c.heads, lay.stages(), lay.data, lay.tensor,
              lay.stages() > 1 ? std::string(flexpar::name_of(lay.schedule)).c_str() : "no pipeline", lay.micro_batches,
              rule.c_str(), worst, loss_tolerance, w.relative, w.where.c_str(), weight_tolerance,
              run.replica_disagreements, match ? "match to float rounding" : "MISMATCH");
          if (!match) status = 1;
        } else if (steps > 1) {
          const bool fell = serial_losses.back() < serial_losses.front();
          std::printf("loss %s: %.4f at step 0, %.4f at step %d (uniform over 256 bytes: %.4f)\n",
                      fell ? "fell" : "DID NOT FALL", double(serial_losses.front()), double(serial_losses.back()),
                      steps - 1, std::log(256.0));
          if (!fell) status = 1;
        }
        if (sample_bytes > 0) {
          gpt::stage_model m = gpt::make_stage(one, c, trained, 0, c.layers, true, true);
          const std::string prompt = text.substr(0, c.seq);
          std::printf("--- generated after \"%s\":\n%s\n---\n", printable(prompt).c_str(),
                      printable(gpt::generate(m, c, one, prompt, sample_bytes, seed)).c_str());
        }
      }
    }
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return status;
}
