// pipeline_mlp: a 4-layer MLP trained with pipeline parallelism, one layer (stage) per rank, and the
// same model trained serially on rank 0 from the same seed; prints both losses per step.
//
//   mpiexec.mpich -n 4 ./pipeline_mlp --steps 20 --micro-batches 8 --schedule 1f1b --timeline pipe.json
//
// The data are synthetic (a fixed random teacher labels Gaussian inputs into 4 classes), generated
// from the seed on every rank. Both runs split each mini-batch into the same micro-batches and
// accumulate the gradients in micro-batch order (both schedules run a stage's backwards in that
// order): every float is computed by the same operations in the same order, so the losses agree bit
// for bit, and exit status 1 if any step's losses differ at all. With -n 1 only the serial run
// happens (exit status 1 if its loss does not fall from the first step to the last).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <flexpar/actor/pipeline.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/timeline.hpp>

namespace {

/// One fully connected layer y = act(x W + b), W [in x out] row-major; ReLU unless it is the last.
struct layer {
  std::size_t in = 0, out = 0;
  bool relu = true;
  std::vector<float> w, b, gw, gb;

  layer(std::size_t in_, std::size_t out_, bool relu_, std::uint64_t seed)
      : in(in_), out(out_), relu(relu_), w(in_ * out_), b(out_, 0.0f), gw(in_ * out_, 0.0f), gb(out_, 0.0f) {
    std::mt19937_64 rng(seed);
    const float limit = std::sqrt(6.0f / static_cast<float>(in));
    std::uniform_real_distribution<float> u(-limit, limit);
    for (auto& v : w) v = u(rng);
  }
  void forward(const std::vector<float>& x, std::vector<float>& y) const {
    const std::size_t rows = x.size() / in;
    y.assign(rows * out, 0.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t o = 0; o < out; ++o) y[r * out + o] = b[o];
      for (std::size_t i = 0; i < in; ++i) {
        const float xi = x[r * in + i];
        for (std::size_t o = 0; o < out; ++o) y[r * out + o] += xi * w[i * out + o];
      }
      if (relu)
        for (std::size_t o = 0; o < out; ++o) y[r * out + o] = std::max(0.0f, y[r * out + o]);
    }
  }
  /// Accumulates the weight gradients; writes the gradient of x.
  void backward(const std::vector<float>& x, const std::vector<float>& y, const std::vector<float>& gy,
                std::vector<float>& gx) {
    const std::size_t rows = x.size() / in;
    std::vector<float> dz(gy);
    if (relu)
      for (std::size_t k = 0; k < dz.size(); ++k) dz[k] = y[k] > 0.0f ? dz[k] : 0.0f;
    gx.assign(rows * in, 0.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t o = 0; o < out; ++o) gb[o] += dz[r * out + o];
      for (std::size_t i = 0; i < in; ++i) {
        float acc = 0.0f;
        for (std::size_t o = 0; o < out; ++o) {
          gw[i * out + o] += x[r * in + i] * dz[r * out + o];
          acc += dz[r * out + o] * w[i * out + o];
        }
        gx[r * in + i] = acc;
      }
    }
  }
  void sgd(float lr) {
    for (std::size_t k = 0; k < w.size(); ++k) w[k] -= lr * gw[k];
    for (std::size_t k = 0; k < b.size(); ++k) b[k] -= lr * gb[k];
    std::fill(gw.begin(), gw.end(), 0.0f);
    std::fill(gb.begin(), gb.end(), 0.0f);
  }
};

/// Synthetic classification data: x ~ N(0, 1), label = argmax of x T for a fixed random T.
struct dataset {
  std::size_t features, classes, examples;
  std::vector<float> x;
  std::vector<int> y;
  dataset(std::size_t f, std::size_t c, std::size_t n, std::uint64_t seed)
      : features(f), classes(c), examples(n), x(n * f), y(n) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> teacher(f * c);
    for (auto& v : teacher) v = normal(rng);
    for (auto& v : x) v = normal(rng);
    for (std::size_t e = 0; e < n; ++e) {
      float best = -1e30f;
      for (std::size_t k = 0; k < c; ++k) {
        float s = 0.0f;
        for (std::size_t i = 0; i < f; ++i) s += x[e * f + i] * teacher[i * c + k];
        if (s > best) {
          best = s;
          y[e] = static_cast<int>(k);
        }
      }
    }
  }
};

/// The rows of micro-batch `mb` of step `step`.
struct batching {
  std::size_t batch, micro, examples;
  std::size_t first_row(int step, int mb) const {
    return (static_cast<std::size_t>(step) * batch + static_cast<std::size_t>(mb) * micro) % examples;
  }
};

void micro_batch_input(const dataset& d, const batching& bt, int step, int mb, std::vector<float>& x) {
  x.resize(bt.micro * d.features);
  for (std::size_t r = 0; r < bt.micro; ++r) {
    const std::size_t e = (bt.first_row(step, mb) + r) % d.examples;
    std::copy_n(d.x.begin() + static_cast<std::ptrdiff_t>(e * d.features), d.features,
                x.begin() + static_cast<std::ptrdiff_t>(r * d.features));
  }
}

/// Softmax cross-entropy of the logits of micro-batch `mb`, as its share of the mini-batch mean
/// (divided by the batch size); writes d(loss)/d(logits).
float micro_batch_loss(const dataset& d, const batching& bt, int step, int mb, const std::vector<float>& logits,
                       std::vector<float>& grad) {
  const std::size_t c = d.classes;
  grad.assign(logits.size(), 0.0f);
  float loss = 0.0f;
  for (std::size_t r = 0; r < bt.micro; ++r) {
    const std::size_t e = (bt.first_row(step, mb) + r) % d.examples;
    const float* z = &logits[r * c];
    const float zmax = *std::max_element(z, z + c);
    float sum = 0.0f;
    for (std::size_t k = 0; k < c; ++k) sum += std::exp(z[k] - zmax);
    for (std::size_t k = 0; k < c; ++k) {
      const float pk = std::exp(z[k] - zmax) / sum;
      grad[r * c + k] = (pk - (static_cast<int>(k) == d.y[e] ? 1.0f : 0.0f)) / static_cast<float>(bt.batch);
    }
    loss += (std::log(sum) + zmax - z[d.y[e]]) / static_cast<float>(bt.batch);
  }
  return loss;
}

std::vector<layer> make_model(const std::vector<std::size_t>& widths, std::uint64_t seed) {
  std::vector<layer> layers;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l)
    layers.emplace_back(widths[l], widths[l + 1], l + 2 < widths.size(), seed + l);
  return layers;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipeline-parallel MLP vs the serial run of the same model and seed"};
  int steps = 20, micro_batches = 8;
  std::size_t batch = 64;
  std::string schedule_name = "1f1b", timeline_path;
  float lr = 0.5f;
  std::uint64_t seed = 42;
  app.add_option("--steps", steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--micro-batches", micro_batches, "micro-batches per mini-batch")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "mini-batch size (a multiple of the micro-batch count)")->check(CLI::PositiveNumber);
  app.add_option("--schedule", schedule_name, "gpipe or 1f1b")->check(CLI::IsMember({"gpipe", "1f1b"}));
  app.add_option("--lr", lr, "learning rate");
  app.add_option("--seed", seed, "seed of the weights and the data");
  app.add_option("--timeline", timeline_path, "write a Chrome-trace JSON with one track per stage here");
  CLI11_PARSE(app, argc, argv);

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int status = 0;
  {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    const int rank = comm.rank();
    const std::vector<std::size_t> widths{16, 32, 32, 32, 4};  // 4 layers: 4 stages
    const int stages = static_cast<int>(widths.size()) - 1;
    if (comm.size() != 1 && comm.size() != stages) {
      if (rank == 0)
        std::fprintf(stderr, "pipeline_mlp: run with 1 rank (serial) or %d ranks (one stage each)\n", stages);
      status = 2;
    } else if (batch % static_cast<std::size_t>(micro_batches) != 0) {
      if (rank == 0) std::fprintf(stderr, "pipeline_mlp: --batch must be a multiple of --micro-batches\n");
      status = 2;
    } else {
      const dataset data(widths.front(), widths.back(), 1024, seed ^ 0x5eedULL);
      const batching bt{batch, batch / static_cast<std::size_t>(micro_batches), data.examples};

      // The serial reference on rank 0: every layer, micro-batch by micro-batch, in order.
      std::vector<float> serial_losses;
      if (rank == 0) {
        std::vector<layer> model = make_model(widths, seed);
        for (int step = 0; step < steps; ++step) {
          float loss = 0.0f;
          for (int mb = 0; mb < micro_batches; ++mb) {
            std::vector<std::vector<float>> acts(1);
            micro_batch_input(data, bt, step, mb, acts[0]);
            for (const layer& l : model) {
              acts.emplace_back();
              l.forward(acts[acts.size() - 2], acts.back());
            }
            std::vector<float> g, gx;
            loss += micro_batch_loss(data, bt, step, mb, acts.back(), g);
            for (std::size_t l = model.size(); l-- > 0;) {
              model[l].backward(acts[l], acts[l + 1], g, gx);
              g.swap(gx);
            }
          }
          for (layer& l : model) l.sgd(lr);
          serial_losses.push_back(loss);
        }
      }

      std::vector<float> pipeline_losses;
      if (comm.size() == stages) {
        // Stage s = layer s on rank s; every rank builds the same description.
        std::vector<layer> model = make_model(widths, seed);  // each rank uses only its own layer
        int step = 0;
        flexpar::timeline trace(rank);
        // [snippet:pipeline_builder]
        flexpar::pipeline_builder builder(comm);
        for (int s = 0; s < stages; ++s) {
          std::string label = "fc";
          label += std::to_string(s + 1);
          layer* mine = &model[static_cast<std::size_t>(s)];
          builder.stage(
              s, {label, [mine](int, const std::vector<float>& x, std::vector<float>& y) { mine->forward(x, y); },
                  [mine](int, const std::vector<float>& x, const std::vector<float>& y, const std::vector<float>& gy,
                         std::vector<float>& gx) { mine->backward(x, y, gy, gx); }});
        }
        builder.micro_batches(micro_batches)
            .schedule(schedule_name == "gpipe" ? flexpar::pipeline_schedule::gpipe
                                               : flexpar::pipeline_schedule::one_f_one_b)
            .input([&](int mb, std::vector<float>& x) { micro_batch_input(data, bt, step, mb, x); })
            .loss([&](int mb, const std::vector<float>& logits, std::vector<float>& g) {
              return micro_batch_loss(data, bt, step, mb, logits, g);
            });
        if (!timeline_path.empty()) builder.record(trace);
        flexpar::pipeline pipe = builder.build();
        // [/snippet:pipeline_builder]
        std::size_t peak = 0;
        for (step = 0; step < steps; ++step) {
          const auto stats = pipe.run_step(comm.default_deadline());
          peak = std::max(peak, stats.peak_activations);
          model[static_cast<std::size_t>(pipe.stage())].sgd(lr);
          if (pipe.stage() == stages - 1) {
            float loss = 0.0f;
            for (float l : stats.losses) loss += l;  // micro-batch order, as the serial run
            pipeline_losses.push_back(loss);
          }
        }
        std::printf("rank %d: stage %d peak activations in flight %zu (%s, m = %d)\n", rank, pipe.stage(), peak,
                    schedule_name.c_str(), micro_batches);
        std::fflush(stdout);
        // The last stage's losses go to rank 0, which compares them with the serial run.
        auto& t = comm.transport();
        if (rank == stages - 1) {
          t.send(0, 1, std::as_bytes(std::span(pipeline_losses)), comm.default_deadline());
        } else if (rank == 0) {
          pipeline_losses.resize(static_cast<std::size_t>(steps));
          t.recv(stages - 1, 1, std::as_writable_bytes(std::span(pipeline_losses)), comm.default_deadline());
        }
        if (!timeline_path.empty()) trace.gather_and_write(t, 2, 0, timeline_path, comm.default_deadline());
      }

      if (rank == 0) {
        double worst = 0;
        for (int s = 0; s < steps; ++s) {
          const float a = serial_losses[static_cast<std::size_t>(s)];
          if (pipeline_losses.empty()) {
            std::printf("step %3d  serial loss %.7f\n", s, static_cast<double>(a));
            continue;
          }
          const float b = pipeline_losses[static_cast<std::size_t>(s)];
          const double rel = std::abs(static_cast<double>(a) - b) / std::max(1e-12, std::abs(static_cast<double>(a)));
          worst = std::max(worst, rel);
          std::printf("step %3d  serial loss %.7f  pipeline loss %.7f\n", s, static_cast<double>(a),
                      static_cast<double>(b));
        }
        if (!pipeline_losses.empty()) {
          std::printf("pipeline (%d stages, %s, m = %d) vs serial: max relative loss difference %.3g -> %s\n", stages,
                      schedule_name.c_str(), micro_batches, worst, worst == 0 ? "match" : "MISMATCH");
          if (worst != 0) status = 1;
        } else if (steps > 1) {  // serial alone: training must at least lower the loss
          const bool fell = serial_losses.back() < serial_losses.front();
          std::printf("serial loss %s: %.7f at step 0, %.7f at step %d\n", fell ? "fell" : "DID NOT FALL",
                      static_cast<double>(serial_losses.front()), static_cast<double>(serial_losses.back()), steps - 1);
          if (!fell) status = 1;
        }
        if (!timeline_path.empty() && !pipeline_losses.empty())
          std::printf("timeline written to %s\n", timeline_path.c_str());
      }
    }
  }
  MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return status;
}
