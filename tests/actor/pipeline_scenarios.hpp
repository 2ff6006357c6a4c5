// A pipeline of scalar-weight stages checked against the serial computation, exactly (small integers),
// with the memory counter of each schedule. Shared by the threads-as-ranks and the mpiexec tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <vector>

#include <flexpar/actor/deterministic_scheduler.hpp>
#include <flexpar/actor/pipeline.hpp>
#include <flexpar/collective.hpp>

namespace flexpar::testing_support {

/// Stage s multiplies by w_s = 1 + s % 2 and adds s; the loss of a micro-batch is the sum of the last
/// output, so d(loss)/d(out) = 1. Weight gradient of stage s: sum over micro-batches of
/// sum_k in_s[k] * d(out_s[k]).
inline float stage_weight(int s) { return static_cast<float>(1 + s % 2); }

inline std::vector<float> micro_batch_input(int mb, std::size_t width) {
  std::vector<float> x(width);
  for (std::size_t k = 0; k < width; ++k) x[k] = static_cast<float>((mb + static_cast<int>(k)) % 4);
  return x;
}

/// The serial oracle: losses per micro-batch and the weight gradient of every stage.
struct serial_result {
  std::vector<float> losses;
  std::vector<float> grads;
};
inline serial_result serial_pipeline(int stages, int m, std::size_t width) {
  serial_result r{std::vector<float>(static_cast<std::size_t>(m)),
                  std::vector<float>(static_cast<std::size_t>(stages))};
  for (int mb = 0; mb < m; ++mb) {
    std::vector<std::vector<float>> acts{micro_batch_input(mb, width)};
    for (int s = 0; s < stages; ++s) {
      std::vector<float> y(width);
      for (std::size_t k = 0; k < width; ++k) y[k] = acts.back()[k] * stage_weight(s) + static_cast<float>(s);
      acts.push_back(std::move(y));
    }
    r.losses[static_cast<std::size_t>(mb)] = std::accumulate(acts.back().begin(), acts.back().end(), 0.0f);
    std::vector<float> g(width, 1.0f);
    for (int s = stages - 1; s >= 0; --s) {
      for (std::size_t k = 0; k < width; ++k)
        r.grads[static_cast<std::size_t>(s)] += acts[static_cast<std::size_t>(s)][k] * g[k];
      for (auto& v : g) v *= stage_weight(s);
    }
  }
  return r;
}

/// A pipeline to check: stage j on rank placement[j], and its options.
struct pipeline_case {
  std::vector<int> placement;
  int m = 1;
  std::size_t width = 1;
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;
  std::vector<std::size_t> stash = {};  // empty: the schedule's
  std::size_t gradient_registers = 2;
  std::vector<int> streams = {};  // empty: by rank
};

/// How the steps' graphs run: the pipeline's pool, random interleavings (deterministic_scheduler
/// with a seed), or rounds of a unit-time machine (deterministic_scheduler::run_rounds).
enum class pipeline_drive { pool, random, rounds };

/// One step of `pipe` driven `how`, within a minute; with pipeline_drive::rounds its length in rounds
/// is appended to `rounds`.
inline pipeline_step_stats run_one_step(pipeline& pipe, pipeline_drive how, std::mt19937_64& rng,
                                        std::vector<std::size_t>* rounds = nullptr) {
  const deadline until = deadline_after(std::chrono::seconds(60));
  if (how == pipeline_drive::pool) return pipe.run_step(until);
  pipeline_step st = pipe.make_step();
  deterministic_scheduler d(st.graph());
  if (how == pipeline_drive::random)
    d.run_random(rng, until);
  else if (rounds)
    rounds->push_back(d.run_rounds(until));
  else
    d.run_rounds(until);
  return st.stats();
}

/// Runs `steps` steps of `c` and checks, on every rank holding stages: each step's losses and the
/// accumulated weight gradient of every local stage against the serial oracle (exactly: small
/// integers), and every stage's measured stash peak against its register count (at least 1, at most
/// the count). Returns this rank's stats of the last step and, for `rounds`, the rounds of each step.
struct pipeline_outcome {
  pipeline_step_stats last;
  std::vector<std::size_t> rounds;
};
inline pipeline_outcome pipeline_matches_serial(communicator& comm, const pipeline_case& c,
                                                pipeline_drive how = pipeline_drive::pool, std::uint64_t seed = 1,
                                                int steps = 2) {
  const int p = static_cast<int>(c.placement.size());
  std::vector<float> weight_grad(static_cast<std::size_t>(p), 0.0f);  // of this rank's stages
  pipeline_builder b(comm);
  for (int s = 0; s < p; ++s) {
    std::string label = "scale";
    label += std::to_string(s);
    b.stage(c.placement[static_cast<std::size_t>(s)],
            {label,
             [s](int, const std::vector<float>& x, std::vector<float>& y) {
               y.resize(x.size());
               for (std::size_t k = 0; k < x.size(); ++k) y[k] = x[k] * stage_weight(s) + static_cast<float>(s);
             },
             [s, &weight_grad](int, const std::vector<float>& x, const std::vector<float>&,
                               const std::vector<float>& gy, std::vector<float>& gx) {
               gx.resize(gy.size());
               for (std::size_t k = 0; k < gy.size(); ++k) {
                 weight_grad[static_cast<std::size_t>(s)] += x[k] * gy[k];
                 gx[k] = gy[k] * stage_weight(s);
               }
             }});
  }
  b.micro_batches(c.m).schedule(c.schedule).gradient_registers(c.gradient_registers);
  if (!c.stash.empty()) b.stash_registers(c.stash);
  if (!c.streams.empty()) b.streams(c.streams);
  const std::size_t width = c.width;
  b.input([width](int mb, std::vector<float>& x) { x = micro_batch_input(mb, width); });
  b.loss([](int, const std::vector<float>& y, std::vector<float>& gy) {
    gy.assign(y.size(), 1.0f);
    return std::accumulate(y.begin(), y.end(), 0.0f);
  });
  pipeline pipe = b.build();
  const serial_result expected = serial_pipeline(p, c.m, c.width);
  pipeline_outcome outcome;
  std::mt19937_64 rng(seed);
  for (int step = 0; step < steps; ++step) {
    const pipeline_step_stats stats = run_one_step(pipe, how, rng, &outcome.rounds);
    if (c.placement.back() == comm.rank()) {
      EXPECT_EQ(stats.losses, expected.losses) << "step " << step;
    }
    EXPECT_EQ(stats.stages.size(), pipe.local_stages().size());
    for (const pipeline_stage_stats& s : stats.stages) {
      EXPECT_EQ(s.stash_registers, pipe.stash()[static_cast<std::size_t>(s.stage)]);
      EXPECT_GE(s.peak_activations, 1u) << "stage " << s.stage;
      EXPECT_LE(s.peak_activations, s.stash_registers) << name_of(c.schedule) << " stage " << s.stage;
    }
    outcome.last = stats;
  }
  for (int s : pipe.local_stages()) {
    EXPECT_EQ(weight_grad[static_cast<std::size_t>(s)],
              static_cast<float>(steps) * expected.grads[static_cast<std::size_t>(s)])
        << "stage " << s;
  }
  return outcome;
}

/// Stages on meshes (3-D: pipeline x data or tensor parallelism inside each stage). Activations are
/// [rows, cols]; stage s computes y = x * w_s + s on the elements of its output box (its input box
/// covers it) and its backward writes gx = gy * w_s there (0 elsewhere: its part; a rank that is not
/// the owner of a broadcast output writes none). With `collective`, each stage's forward allreduces
/// the sum of its box over the stage's mesh (checked against the serial sum) and its backward its
/// weight-gradient part, so that every rank of the mesh holds the stage's whole gradient: collectives
/// inside the bodies, whose order must be the same on every rank of a mesh.
struct mesh_case {
  std::vector<stage_mesh> meshes;
  std::size_t rows = 4, cols = 3;
  int m = 4;
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;
  bool collective = false;
  int steps = 2;
};

inline void mesh_pipeline_matches_serial(communicator& comm, const mesh_case& c,
                                         pipeline_drive how = pipeline_drive::pool, std::uint64_t seed = 3) {
  const int p = static_cast<int>(c.meshes.size());
  const sbp::shape_t shape{c.rows, c.cols};
  const std::size_t n = c.rows * c.cols;
  // The serial oracle, per element: acts[mb][s] (input of stage s; acts[mb][p] the output) and
  // grads[mb][s] (gradient of stage s's output).
  std::vector<std::vector<std::vector<float>>> acts(static_cast<std::size_t>(c.m)),
      grads(static_cast<std::size_t>(c.m));
  for (int mb = 0; mb < c.m; ++mb) {
    auto& a = acts[static_cast<std::size_t>(mb)];
    a.push_back(micro_batch_input(mb, n));
    for (int s = 0; s < p; ++s) {
      std::vector<float> y(n);
      for (std::size_t e = 0; e < n; ++e) y[e] = a.back()[e] * stage_weight(s) + static_cast<float>(s);
      a.push_back(std::move(y));
    }
    auto& g = grads[static_cast<std::size_t>(mb)];
    g.assign(static_cast<std::size_t>(p), std::vector<float>(n));
    std::vector<float> gy(n, 1.0f);
    for (int s = p - 1; s >= 0; --s) {
      g[static_cast<std::size_t>(s)] = gy;
      for (auto& v : gy) v *= stage_weight(s);
    }
  }
  // Where this rank is, per stage.
  struct place {
    int index = -1;
    sbp::box in, out;
    bool owner = false;  // writes the gradient part of its output box
    std::optional<communicator> group;
  };
  std::vector<place> where(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s) {
    const stage_mesh& mesh = c.meshes[static_cast<std::size_t>(s)];
    place& pl = where[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i < mesh.ranks.size(); ++i)
      if (mesh.ranks[i] == comm.rank()) pl.index = static_cast<int>(i);
    if (c.collective) pl.group = comm.split(pl.index >= 0 ? 0 : -1, comm.rank());  // collective over comm
    if (pl.index < 0) continue;
    const std::vector<int> mshape =
        mesh.shape.empty() ? std::vector<int>{static_cast<int>(mesh.ranks.size())} : mesh.shape;
    const std::vector<int> coords = sbp::mesh_coords(static_cast<std::size_t>(pl.index), mshape);
    const bool one = mesh.ranks.size() == 1;
    pl.in = one ? sbp::box{{0, 0}, shape} : sbp::shard_box(shape, mesh.input, mshape, coords);
    pl.out = one ? sbp::box{{0, 0}, shape} : sbp::shard_box(shape, mesh.output, mshape, coords);
    for (std::size_t a = 0; a < 2; ++a) {  // the body computes its output box from its input box
      ASSERT_LE(pl.in.offset[a], pl.out.offset[a]) << "stage " << s << ": its input box must cover its output box";
      ASSERT_GE(pl.in.offset[a] + pl.in.extent[a], pl.out.offset[a] + pl.out.extent[a]) << "stage " << s;
    }
    pl.owner = true;
    for (std::size_t d = 0; !one && d < mshape.size(); ++d)
      if (mesh.output[d].is_broadcast() && coords[d] != 0) pl.owner = false;
  }
  auto at = [&](const sbp::box& b, std::size_t r, std::size_t col) {
    return (r - b.offset[0]) * b.extent[1] + (col - b.offset[1]);
  };
  std::vector<float> weight_grad(static_cast<std::size_t>(p), 0.0f);
  pipeline_builder b(comm);
  for (int s = 0; s < p; ++s) {
    place* pl = &where[static_cast<std::size_t>(s)];
    std::string label = "scale";
    label += std::to_string(s);
    b.stage(c.meshes[static_cast<std::size_t>(s)],
            {label,
             [s, pl, at, &acts, &c](int mb, const std::vector<float>& x, std::vector<float>& y) {
               y.assign(pl->out.elements(), 0.0f);
               float sum = 0.0f;
               for (std::size_t r = pl->out.offset[0]; r < pl->out.offset[0] + pl->out.extent[0]; ++r)
                 for (std::size_t col = pl->out.offset[1]; col < pl->out.offset[1] + pl->out.extent[1]; ++col) {
                   float& v = y[at(pl->out, r, col)];
                   v = x[at(pl->in, r, col)] * stage_weight(s) + static_cast<float>(s);
                   if (pl->owner) sum += v;
                 }
               if (c.collective) {  // the stage's whole output sum, from the owners' parts
                 allreduce(*pl->group, std::span<float>(&sum, 1), reduce_op::sum);
                 const auto& serial = acts[static_cast<std::size_t>(mb)][static_cast<std::size_t>(s + 1)];
                 if (sum != std::accumulate(serial.begin(), serial.end(), 0.0f))
                   throw std::runtime_error("the mesh's collective summed another micro-batch or stage");
               }
             },
             [s, pl, at, &weight_grad, &c](int, const std::vector<float>& x, const std::vector<float>&,
                                           const std::vector<float>& gy, std::vector<float>& gx) {
               gx.assign(pl->in.elements(), 0.0f);
               float part = 0.0f;
               if (pl->owner) {
                 for (std::size_t r = pl->out.offset[0]; r < pl->out.offset[0] + pl->out.extent[0]; ++r)
                   for (std::size_t col = pl->out.offset[1]; col < pl->out.offset[1] + pl->out.extent[1]; ++col) {
                     const float g = gy[at(pl->out, r, col)];
                     part += x[at(pl->in, r, col)] * g;
                     gx[at(pl->in, r, col)] = g * stage_weight(s);
                   }
               }
               if (c.collective) allreduce(*pl->group, std::span<float>(&part, 1), reduce_op::sum);
               weight_grad[static_cast<std::size_t>(s)] += part;
             }});
  }
  std::vector<sbp::shape_t> shapes(static_cast<std::size_t>(p - 1), shape);
  b.activation_shapes(shapes).micro_batches(c.m).schedule(c.schedule);
  const place* first = &where.front();
  const place* last = &where.back();
  const std::size_t cols = c.cols;
  b.input([first, at, cols, &acts](int mb, std::vector<float>& x) {
    const auto& whole = acts[static_cast<std::size_t>(mb)][0];
    x.assign(first->in.elements(), 0.0f);
    for (std::size_t r = first->in.offset[0]; r < first->in.offset[0] + first->in.extent[0]; ++r)
      for (std::size_t col = first->in.offset[1]; col < first->in.offset[1] + first->in.extent[1]; ++col)
        x[at(first->in, r, col)] = whole[r * cols + col];
  });
  // The loss is the sum of the output: each owner adds its box (d loss / d y = 1 there, 0 elsewhere).
  b.loss([last](int, const std::vector<float>& y, std::vector<float>& gy) {
    gy.assign(y.size(), last->owner ? 1.0f : 0.0f);
    return last->owner ? std::accumulate(y.begin(), y.end(), 0.0f) : 0.0f;
  });
  pipeline pipe = b.build();
  std::mt19937_64 rng(seed);
  for (int step = 0; step < c.steps; ++step) {
    const pipeline_step_stats stats = run_one_step(pipe, how, rng);
    if (last->index >= 0) {  // this rank's part of each micro-batch's loss
      ASSERT_EQ(stats.losses.size(), static_cast<std::size_t>(c.m));
      for (int mb = 0; mb < c.m; ++mb) {
        float want = 0.0f;
        const auto& y = acts[static_cast<std::size_t>(mb)][static_cast<std::size_t>(p)];
        for (std::size_t r = last->out.offset[0]; last->owner && r < last->out.offset[0] + last->out.extent[0]; ++r)
          for (std::size_t col = last->out.offset[1]; col < last->out.offset[1] + last->out.extent[1]; ++col)
            want += y[r * cols + col];
        EXPECT_EQ(stats.losses[static_cast<std::size_t>(mb)], want) << "step " << step << " micro-batch " << mb;
      }
    }
    for (const pipeline_stage_stats& st : stats.stages) EXPECT_LE(st.peak_activations, st.stash_registers);
  }
  // Every stage's weight-gradient part on this rank (with `collective`: the whole, on every rank).
  for (int s = 0; s < p; ++s) {
    const place& pl = where[static_cast<std::size_t>(s)];
    if (pl.index < 0) continue;
    float want = 0.0f;
    for (int mb = 0; mb < c.m; ++mb) {
      const auto& x = acts[static_cast<std::size_t>(mb)][static_cast<std::size_t>(s)];
      const auto& g = grads[static_cast<std::size_t>(mb)][static_cast<std::size_t>(s)];
      if (c.collective) {
        for (std::size_t e = 0; e < n; ++e) want += x[e] * g[e];
      } else if (pl.owner) {
        for (std::size_t r = pl.out.offset[0]; r < pl.out.offset[0] + pl.out.extent[0]; ++r)
          for (std::size_t col = pl.out.offset[1]; col < pl.out.offset[1] + pl.out.extent[1]; ++col)
            want += x[r * cols + col] * g[r * cols + col];
      }
    }
    EXPECT_EQ(weight_grad[static_cast<std::size_t>(s)], static_cast<float>(c.steps) * want) << "stage " << s;
  }
}

}  // namespace flexpar::testing_support
