// pipeline_mlp: a 4-layer MLP trained with pipeline parallelism, and the same model trained serially
// on rank 0 from the same seed; prints both losses per step. Layer (stage) s runs on the mesh of
// group s mod P, each mesh --data D x --tensor T ranks (P = ranks / (D T)): 3-D parallelism. With
// D = T = 1, layer s is on rank s mod n: one per rank with 4 ranks, two per rank (interleaved) with 2.
//
//   mpiexec.mpich -n 4 ./pipeline_mlp --steps 20 --micro-batches 8 --schedule 1f1b --timeline pipe.json
//   mpiexec.mpich -n 2 ./pipeline_mlp --steps 20 --micro-batches 8 --schedule 1f1b    # interleaved
//   mpiexec.mpich -n 8 ./pipeline_mlp --steps 20 --micro-batches 8 --data 2 --tensor 2  # 2 x 2 x 2
//
// The data are synthetic (a fixed random teacher labels Gaussian inputs into 4 classes), generated
// from the seed on every rank. Both runs split each mini-batch into the same micro-batches and
// accumulate the gradients in micro-batch order (the schedules run a stage's backwards in that
// order): with one rank per stage every float is computed by the same operations in the same order,
// so the losses agree bit for bit (exit status 1 on any difference). Data or tensor parallel stages
// add rows' gradients and columns' parts in another order: equal to float rounding (< 1e-4
// relative, else exit status 1). With -n 1 only the serial run happens (exit status 1 if its loss
// does not fall from the first step to the last).
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <flexpar/actor/pipeline_sbp.hpp>
#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/uncaught.hpp>
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
  void forward(const std::vector<float>& x, std::vector<float>& y) const { forward(x, y, 0, out); }
  /// y = act(x W + b) on output columns [c0, c1) only (tensor parallelism: this rank's column split);
  /// every element is computed as forward() computes it.
  void forward(const std::vector<float>& x, std::vector<float>& y, std::size_t c0, std::size_t c1) const {
    const std::size_t rows = x.size() / in, cols = c1 - c0;
    y.assign(rows * cols, 0.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      float* yr = &y[r * cols];
      for (std::size_t o = c0; o < c1; ++o) yr[o - c0] = b[o];
      for (std::size_t i = 0; i < in; ++i) {
        const float xi = x[r * in + i];
        for (std::size_t o = c0; o < c1; ++o) yr[o - c0] += xi * w[i * out + o];
      }
      if (relu)
        for (std::size_t o = 0; o < cols; ++o) yr[o] = std::max(0.0f, yr[o]);
    }
  }
  /// Accumulates the weight gradients; writes the gradient of x.
  void backward(const std::vector<float>& x, const std::vector<float>& y, const std::vector<float>& gy,
                std::vector<float>& gx) {
    backward(x, y, gy, gx, 0, out);
  }
  /// The backward of forward(x, y, c0, c1): the weight gradients of columns [c0, c1), and this split's
  /// part of the gradient of x (the parts of all column splits add up to it).
  void backward(const std::vector<float>& x, const std::vector<float>& y, const std::vector<float>& gy,
                std::vector<float>& gx, std::size_t c0, std::size_t c1) {
    const std::size_t rows = x.size() / in, cols = c1 - c0;
    std::vector<float> dz(gy);
    if (relu)
      for (std::size_t k = 0; k < dz.size(); ++k) dz[k] = y[k] > 0.0f ? dz[k] : 0.0f;
    gx.assign(rows * in, 0.0f);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* dr = &dz[r * cols];
      for (std::size_t o = c0; o < c1; ++o) gb[o] += dr[o - c0];
      for (std::size_t i = 0; i < in; ++i) {
        float acc = 0.0f;
        for (std::size_t o = c0; o < c1; ++o) {
          gw[i * out + o] += x[r * in + i] * dr[o - c0];
          acc += dr[o - c0] * w[i * out + o];
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
/// (divided by the batch size); writes d(loss)/d(logits). `logits` holds rows [row0, row0 + rows) of
/// the micro-batch (all of them by default: data parallelism gives each rank its rows).
float micro_batch_loss(const dataset& d, const batching& bt, int step, int mb, const std::vector<float>& logits,
                       std::vector<float>& grad, std::size_t row0 = 0) {
  const std::size_t c = d.classes, rows = logits.size() / c;
  grad.assign(logits.size(), 0.0f);
  float loss = 0.0f;
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t e = (bt.first_row(step, mb) + row0 + r) % d.examples;
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

/// The same loss with the classes split over the ranks of `tensor` (Megatron's vocabulary-parallel
/// cross-entropy): `logits` holds classes [c0, c0 + cols) of its rows; the row maximum, the sum of
/// exponentials and the label's logit are allreduced over `tensor`. Every rank gets the rows' loss.
float split_classes_loss(const dataset& d, const batching& bt, int step, int mb, const std::vector<float>& logits,
                         std::vector<float>& grad, std::size_t row0, std::size_t rows, std::size_t c0,
                         flexpar::communicator& tensor) {
  const std::size_t cols = rows == 0 ? 0 : logits.size() / rows;
  std::vector<float> zmax(rows, -1e30f), sum(rows, 0.0f), label(rows, 0.0f);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t k = 0; k < cols; ++k) zmax[r] = std::max(zmax[r], logits[r * cols + k]);
  flexpar::allreduce(tensor, std::span<float>(zmax), flexpar::reduce_op::max);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t e = (bt.first_row(step, mb) + row0 + r) % d.examples;
    for (std::size_t k = 0; k < cols; ++k) sum[r] += std::exp(logits[r * cols + k] - zmax[r]);
    const auto y = static_cast<std::size_t>(d.y[e]);
    if (y >= c0 && y < c0 + cols) label[r] = logits[r * cols + (y - c0)];
  }
  flexpar::allreduce(tensor, std::span<float>(sum), flexpar::reduce_op::sum);
  flexpar::allreduce(tensor, std::span<float>(label), flexpar::reduce_op::sum);
  grad.assign(logits.size(), 0.0f);
  float loss = 0.0f;
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t e = (bt.first_row(step, mb) + row0 + r) % d.examples;
    for (std::size_t k = 0; k < cols; ++k) {
      const float pk = std::exp(logits[r * cols + k] - zmax[r]) / sum[r];
      grad[r * cols + k] = (pk - (static_cast<int>(c0 + k) == d.y[e] ? 1.0f : 0.0f)) / static_cast<float>(bt.batch);
    }
    loss += (std::log(sum[r]) + zmax[r] - label[r]) / static_cast<float>(bt.batch);
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
  std::set_terminate(flexpar::report_uncaught_and_abort);  // a rank's uncaught error: one whole line
  CLI::App app{"pipeline-parallel MLP (x data x tensor parallel stages) vs the serial run of the same model and seed"};
  int steps = 20, micro_batches = 8, data_ranks = 1, tensor_ranks = 1;
  std::size_t batch = 64;
  std::string schedule_name = "1f1b", timeline_path;
  float lr = 0.5f;
  std::uint64_t seed = 42;
  app.add_option("--steps", steps, "training steps")->check(CLI::PositiveNumber);
  app.add_option("--micro-batches", micro_batches, "micro-batches per mini-batch")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "mini-batch size (a multiple of the micro-batch count)")->check(CLI::PositiveNumber);
  app.add_option("--schedule", schedule_name, "gpipe or 1f1b")->check(CLI::IsMember({"gpipe", "1f1b"}));
  app.add_option("--data", data_ranks, "data-parallel ranks inside each stage (rows split)")
      ->check(CLI::PositiveNumber);
  app.add_option("--tensor", tensor_ranks, "tensor-parallel ranks inside each stage (columns split)")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "learning rate");
  app.add_option("--seed", seed, "seed of the weights and the data");
  app.add_option("--timeline", timeline_path, "write a Chrome-trace JSON with one track per stage here");
  CLI11_PARSE(app, argc, argv);

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);  // the loss's collectives run on a worker
  int status = 0;
  {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    const int rank = comm.rank();
    const std::vector<std::size_t> widths{16, 32, 32, 32, 4};  // 4 layers: 4 stages
    const int stages = static_cast<int>(widths.size()) - 1;
    const int per_group = data_ranks * tensor_ranks;  // ranks of one stage's mesh
    const int groups = comm.size() == 1 ? 1 : comm.size() / per_group;
    if (comm.size() > 1 && (comm.size() % per_group != 0 || stages % groups != 0)) {
      if (rank == 0)
        std::fprintf(stderr,
                     "pipeline_mlp: run with 1 rank (serial) or P x data x tensor ranks, P dividing the %d stages "
                     "(here %d ranks, --data %d --tensor %d)\n",
                     stages, comm.size(), data_ranks, tensor_ranks);
      status = 2;
    } else if (batch % static_cast<std::size_t>(micro_batches) != 0 ||
               static_cast<int>(batch / static_cast<std::size_t>(micro_batches)) < data_ranks) {
      if (rank == 0)
        std::fprintf(stderr, "pipeline_mlp: --batch must be a multiple of --micro-batches, with >= --data rows each\n");
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
      if (comm.size() > 1) {
        // Stage s = layer s on the mesh of group s mod P: ranks g D T ... (g + 1) D T - 1, a D x T mesh
        // whose data axis splits the rows and whose tensor axis splits each layer's output columns.
        std::vector<layer> model = make_model(widths, seed);  // each rank uses its stages' columns
        const int group = rank / per_group, d = (rank % per_group) / tensor_ranks, t = rank % tensor_ranks;
        const flexpar::sbp::part rows = flexpar::sbp::balanced_part(bt.micro, data_ranks, d);
        auto columns = [&](int s) {
          return flexpar::sbp::balanced_part(widths[static_cast<std::size_t>(s) + 1], tensor_ranks, t);
        };
        int step = 0;
        flexpar::timeline trace(rank);
        // [snippet:pipeline_builder]
        // One D x T placement per group (every rank builds each: collective): axis 0 splits the rows
        // (data), axis 1 the columns (tensor); a stage takes (S(0), B) and gives (S(0), S(1)).
        namespace sbp = flexpar::sbp;
        using rows_whole = sbp::sbp<sbp::split<0>, sbp::broadcast>;
        using rows_columns = sbp::sbp<sbp::split<0>, sbp::split<1>>;
        std::vector<sbp::placement<2>> meshes;
        for (int g = 0; g < groups; ++g) {
          std::vector<int> ranks;
          for (int k = 0; k < per_group; ++k) ranks.push_back(g * per_group + k);
          meshes.emplace_back(comm, std::array<int, 2>{data_ranks, tensor_ranks}, ranks);
        }
        sbp::placement<2>& mine_mesh = meshes[static_cast<std::size_t>(group)];
        flexpar::pipeline_builder builder(comm);
        std::vector<sbp::shape_t> shapes;
        for (int s = 0; s < stages; ++s) {
          std::string label = "fc";
          label += std::to_string(s + 1);
          layer* mine = &model[static_cast<std::size_t>(s)];
          const sbp::part cols = columns(s);
          builder.stage(flexpar::stage_on<rows_whole, rows_columns>(meshes[static_cast<std::size_t>(s % groups)]),
                        {label,
                         [mine, cols](int, const std::vector<float>& x, std::vector<float>& y) {
                           mine->forward(x, y, cols.offset, cols.offset + cols.count);
                         },
                         [mine, cols](int, const std::vector<float>& x, const std::vector<float>& y,
                                      const std::vector<float>& gy, std::vector<float>& gx) {
                           mine->backward(x, y, gy, gx, cols.offset, cols.offset + cols.count);
                         }});
          if (s + 1 < stages) shapes.push_back({bt.micro, widths[static_cast<std::size_t>(s) + 1]});
        }
        builder.activation_shapes(shapes)
            .micro_batches(micro_batches)
            .schedule(schedule_name == "gpipe" ? flexpar::pipeline_schedule::gpipe
                                               : flexpar::pipeline_schedule::one_f_one_b)
            .input([&](int mb, std::vector<float>& x) {  // this rank's rows of the micro-batch
              std::vector<float> all;
              micro_batch_input(data, bt, step, mb, all);
              x.assign(all.begin() + static_cast<std::ptrdiff_t>(rows.offset * data.features),
                       all.begin() + static_cast<std::ptrdiff_t>((rows.offset + rows.count) * data.features));
            })
            .loss([&](int mb, const std::vector<float>& logits, std::vector<float>& g) {
              if (tensor_ranks == 1) return micro_batch_loss(data, bt, step, mb, logits, g, rows.offset);
              const float loss = split_classes_loss(data, bt, step, mb, logits, g, rows.offset, rows.count,
                                                    columns(stages - 1).offset, mine_mesh.axis(1));
              return t == 0 ? loss : 0.0f;  // every tensor rank has the rows' loss: count it once
            });
        if (!timeline_path.empty()) builder.record(trace);
        flexpar::pipeline pipe = builder.build();
        // [/snippet:pipeline_builder]
        std::vector<std::size_t> peak(pipe.local_stages().size());
        for (step = 0; step < steps; ++step) {
          const auto stats = pipe.run_step(comm.default_deadline());
          for (std::size_t k = 0; k < peak.size(); ++k) peak[k] = std::max(peak[k], stats.stages[k].peak_activations);
          for (int s : pipe.local_stages()) {
            layer& l = model[static_cast<std::size_t>(s)];
            if (data_ranks > 1) {  // data parallelism: the rows' gradients of the stage's data axis
              flexpar::allreduce(mine_mesh.axis(0), std::span<float>(l.gw), flexpar::reduce_op::sum);
              flexpar::allreduce(mine_mesh.axis(0), std::span<float>(l.gb), flexpar::reduce_op::sum);
            }
            l.sgd(lr);
          }
          float loss = 0.0f, total = 0.0f;
          for (float v : stats.losses) loss += v;  // micro-batch order, as the serial run
          MPI_Reduce(&loss, &total, 1, MPI_FLOAT, MPI_SUM, 0, comm.mpi_comm());
          pipeline_losses.push_back(total);
        }
        for (std::size_t k = 0; k < peak.size(); ++k) {
          const int s = pipe.local_stages()[k];
          std::printf("rank %d: stage %d peak activations in flight %zu of %zu registers (%s, m = %d)\n", rank, s,
                      peak[k], pipe.stash()[static_cast<std::size_t>(s)], schedule_name.c_str(), micro_batches);
        }
        std::fflush(stdout);
        if (!timeline_path.empty())
          trace.gather_and_write(comm.transport(), 2, 0, timeline_path, comm.default_deadline());
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
          // One rank per stage: the same floats in the same order, so exactly equal. Data or tensor
          // parallel stages add the rows' gradients or the columns' parts in another order: equal to
          // float rounding.
          const bool exact = per_group == 1;
          const bool match = exact ? worst == 0 : worst < 1e-4;
          std::printf(
              "pipeline (%d stages on %d group(s) of %d x %d, %s, m = %d) vs serial: max relative loss difference "
              "%.3g -> %s\n",
              stages, groups, data_ranks, tensor_ranks, schedule_name.c_str(), micro_batches, worst,
              match ? (exact ? "match" : "match to float rounding") : "MISMATCH");
          if (!match) status = 1;
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
