// flexpar_engine_bench — what a step of the engine and of gradient_sync costs above one bare allreduce
// of the same bytes, measured in one run, next to the bare allreduce of flexpar and of MPI.
//
// (a) N tensors of S bytes (default 1024 x 4 KiB) allreduced per step: through the engine in its
//     steady state (the frozen step plan), negotiated every step (step_plan off), unfused, and as
//     gradient_sync parameters whose gradients live in its arena (one bucket, reduced in place).
// (b) a GPT-shaped model of 25 M parameters in 160 tensors: gradient_sync over gradients in the
//     caller's buffers and in the arena, averaged (what training runs) and summed.
// (c) negotiation alone: K tiny (4-byte) tensors per step, in the steady state and negotiated with
//     the response cache and without; overhead per tensor = (step - one allreduce of K floats) / K.
// A step of gradient_sync is the sync alone (every gradient marked ready, then synchronize()): no
// backward pass runs, so what it costs above the bare allreduce is the sync's own overhead.
// Times are medians over the steps, slowest rank. After its timing every engine and sync runs one
// more step on inputs that differ by rank and element, checked against the exact sums (exit status 1
// if any is wrong). `# row` lines repeat each row for scripts (scripts/engine-bench).
//
//   mpiexec -n 2 flexpar_engine_bench [-n 1024] [-s 4096] [--steps 30] [--model-steps 10] [--only abc]
//                                     [--model-width 384 --model-blocks 13]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/engine/engine.hpp>
#include <flexpar/engine/gradient_sync.hpp>

#include "bench_cli.hpp"
#include "bench_timing.hpp"

namespace {

using flexpar::bench::median_of_slowest;

double time_steps(int steps, const std::function<void()>& step) {
  std::vector<double> samples;
  for (int i = 0; i < steps + 3; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    step();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (i >= 3) samples.push_back(us);  // the first steps negotiate in full, then freeze the plan
  }
  return median_of_slowest(std::move(samples));
}

/// The input of element i of tensor t on `rank`: small integers, so that every sum is exact.
float input(int rank, std::size_t t, std::size_t i) { return static_cast<float>((rank + 1) * ((t + i) % 5 + 1)); }
float summed(int size, std::size_t t, std::size_t i) {
  float want = 0.0f;
  for (int r = 0; r < size; ++r) want += input(r, t, i);
  return want;
}

/// Elements of `tensors` that differ from the exact sums, on every rank together.
long long count_wrong(const std::vector<std::span<float>>& tensors, int size) {
  long long wrong = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t)
    for (std::size_t i = 0; i < tensors[t].size(); ++i) wrong += tensors[t][i] != summed(size, t, i);
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  return wrong;
}

void fill_inputs(const std::vector<std::span<float>>& tensors, int rank) {
  for (std::size_t t = 0; t < tensors.size(); ++t)
    for (std::size_t i = 0; i < tensors[t].size(); ++i) tensors[t][i] = input(rank, t, i);
}

/// One step of allreduces through `eng`: submit all, wait all.
void engine_step(flexpar::engine& eng, const std::vector<std::span<float>>& tensors,
                 const std::vector<std::string>& names) {
  std::vector<flexpar::handle> handles;
  handles.reserve(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i)
    handles.push_back(eng.allreduce_async(names[i], tensors[i], flexpar::reduce_op::sum));
  for (auto& h : handles) h.wait();
}

/// One step of `sync` with no backward pass: every gradient ready, last layer first, then synchronize.
void sync_step(flexpar::gradient_sync& sync, const std::vector<std::string>& names) {
  for (std::size_t i = names.size(); i-- > 0;) sync.on_gradient_ready(names[i]);
  sync.synchronize();
}

/// A model's tensors: their names and sizes (elements).
struct model_shape {
  std::vector<std::string> names;
  std::vector<std::size_t> counts;
  void add(std::string name, std::size_t count) {
    names.push_back(std::move(name));
    counts.push_back(count);
  }
  [[nodiscard]] std::size_t total() const {
    std::size_t n = 0;
    for (std::size_t c : counts) n += c;
    return n;
  }
};

/// A GPT of width `w`, `blocks` blocks, a 4096-token vocabulary and 512 positions, its tensors in the
/// registration order of a model definition (embeddings first). The default, width 384 and 13 blocks:
/// 160 tensors, 24.8 M parameters.
model_shape gpt(std::size_t w, std::size_t blocks) {
  model_shape m;
  const std::size_t vocab = 4096, positions = 512;
  m.add("wte", vocab * w);
  m.add("wpe", positions * w);
  for (std::size_t b = 0; b < blocks; ++b) {
    const std::string h = "h" + std::to_string(b) + ".";
    m.add(h + "ln1.weight", w);
    m.add(h + "ln1.bias", w);
    m.add(h + "attn.qkv.weight", w * 3 * w);
    m.add(h + "attn.qkv.bias", 3 * w);
    m.add(h + "attn.proj.weight", w * w);
    m.add(h + "attn.proj.bias", w);
    m.add(h + "ln2.weight", w);
    m.add(h + "ln2.bias", w);
    m.add(h + "mlp.fc.weight", w * 4 * w);
    m.add(h + "mlp.fc.bias", 4 * w);
    m.add(h + "mlp.proj.weight", 4 * w * w);
    m.add(h + "mlp.proj.bias", w);
  }
  m.add("ln_f.weight", w);
  m.add("ln_f.bias", w);
  return m;
}

/// One flexpar allreduce of a buffer of all the bytes, by `automatic` and by each algorithm it chooses
/// among on one node: the bare reference is the fastest of them (so that a step is never credited with
/// a choice `automatic` got wrong for the whole buffer).
struct bare_times {
  double automatic = 0, ring = 0, shared_memory = 0, best = 0;
  std::string chosen;
};
bare_times time_bare(flexpar::communicator& comm, std::vector<float>& big, int steps) {
  bare_times t;
  t.chosen = std::string(flexpar::name_of(flexpar::choose_allreduce(comm, big.size() * sizeof(float))));
  auto with = [&](flexpar::algorithm a) {
    return time_steps(steps, [&] { flexpar::allreduce(comm, std::span(big), flexpar::reduce_op::sum, a); });
  };
  t.automatic = with(flexpar::algorithm::automatic);
  t.ring = with(flexpar::algorithm::ring);
  t.best = std::min(t.automatic, t.ring);
  if (comm.topology().node_count() == 1 && comm.size() > 1) {
    t.shared_memory = with(flexpar::algorithm::shared_memory);
    t.best = std::min(t.best, t.shared_memory);
  }
  return t;
}
std::string bare_text(const bare_times& t) {
  char text[240];
  std::snprintf(text, sizeof text,
                "bare = the fastest flexpar::allreduce of all: %.1f us (automatic [%s] %.1f, ring %.1f, "
                "shared_memory %.1f)",
                t.best, t.chosen.c_str(), t.automatic, t.ring, t.shared_memory);
  return text;
}

/// One row: a step next to the bare allreduce it does the work of.
struct row {
  std::string id, what;
  double step_us = 0, bare_us = 0;
};

void print_rows(const std::vector<row>& rows) {
  std::printf("%-50s %12s %12s %10s\n", "#", "step(us)", "-bare(us)", "step/bare");
  for (const row& r : rows)
    std::printf("%-50s %12.1f %12.1f %9.2fx\n", r.what.c_str(), r.step_us, r.step_us - r.bare_us,
                r.step_us / r.bare_us);
}

void print_machine_rows(const std::vector<row>& rows) {
  for (const row& r : rows) std::printf("# row %s step_us=%.1f bare_us=%.1f\n", r.id.c_str(), r.step_us, r.bare_us);
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  CLI::App app{"flexpar_engine_bench: a step of the engine and of gradient_sync above one bare allreduce"};
  int tensors = 1024, steps = 30, model_steps = 10, tiny = 256;
  std::size_t tensor_bytes = 4096;
  std::string only = "abc";
  app.add_option("-n,--tensors", tensors, "tensors per step for (a)");
  app.add_option("-s,--bytes", tensor_bytes, "bytes per tensor for (a)");
  app.add_option("-k,--tiny", tiny, "4-byte tensors per step for (c)");
  app.add_option("--steps", steps, "measured steps per row of (a) and (c)");
  app.add_option("--model-steps", model_steps, "measured steps per row of (b)");
  std::size_t model_width = 384, model_blocks = 13;
  app.add_option("--model-width", model_width, "width of (b)'s GPT");
  app.add_option("--model-blocks", model_blocks, "blocks of (b)'s GPT");
  app.add_option("--only", only, "sections to run: any of a, b, c");
  bool fused_only = false;
  app.add_flag("--fused-only", fused_only, "time (a)'s steady-state engine only (for a profiler)");
  if (const auto done = flexpar::bench::parse_or_finalize(app, argc, argv, rank)) return *done;
  int status = 0;
  try {
    flexpar::config base = flexpar::config::from_environment();
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, base, flexpar::thread_need::multiple);
    // One fit of the machine for every row: the engines' communicators inherit it, so that they and
    // the bare allreduces choose alike (each would otherwise measure its own at its first call).
    const flexpar::cost_params& machine = flexpar::machine_of(comm);
    auto negotiated_cfg = base, unfused_cfg = base, cache_off_cfg = base;
    negotiated_cfg.step_plan = false;
    unfused_cfg.fusion_threshold = 0;
    unfused_cfg.step_plan = false;
    cache_off_cfg.cache_capacity = 0;
    cache_off_cfg.step_plan = false;
    long long wrong = 0;  // of one more step of each engine and sync, after its timing
    if (rank == 0) {
      std::printf("# flexpar_engine_bench: %d ranks, median step time of the slowest rank, cycle %.3g ms\n", size,
                  static_cast<double>(base.cycle_time.count()) / 1000.0);
      std::printf("# machine: copy %.3g GB/s, shared-memory hand-off %.3g us\n", 1e-9 / machine.copy_beta,
                  1e6 * machine.shm_alpha);
    }

    if (only.find('a') != std::string::npos) {
      const std::size_t count = tensor_bytes / sizeof(float);
      std::vector<std::vector<float>> data(static_cast<std::size_t>(tensors), std::vector<float>(count, 1.0f));
      std::vector<std::span<float>> spans(data.begin(), data.end());
      std::vector<std::string> names;
      for (int i = 0; i < tensors; ++i) names.push_back("grad" + std::to_string(i));
      std::vector<float> big(count * static_cast<std::size_t>(tensors), 1.0f), big_out(big.size());
      const std::string fused(flexpar::name_of(flexpar::choose_fused_allreduce(comm, big.size() * sizeof(float))));
      auto with_engine = [&](const flexpar::config& cfg, int n) {
        flexpar::engine eng(comm, cfg);
        const double us = time_steps(n, [&] { engine_step(eng, spans, names); });
        fill_inputs(spans, rank);
        engine_step(eng, spans, names);
        wrong += count_wrong(spans, size);
        return std::pair(us, eng.stats());
      };
      const auto [planned, plan_stats] = with_engine(base, steps);
      if (fused_only) {
        if (rank == 0)
          std::printf(
              "engine steady state: %.1f us per step, %lld wrong; plan: %zu frozen, %zu buckets, %zu of %zu "
              "tensors\n",
              planned, wrong, plan_stats.plans_frozen, plan_stats.plan_buckets, plan_stats.planned_tensors,
              plan_stats.tensors_done);
        MPI_Finalize();
        return wrong != 0;
      }
      const double negotiated = with_engine(negotiated_cfg, steps).first;
      const double unfused = with_engine(unfused_cfg, std::max(3, steps / 3)).first;
      double arena = 0;
      {
        flexpar::engine eng(comm, base);
        flexpar::gradient_sync sync(eng, {.reduction = flexpar::gradient_reduction::sum});
        std::vector<std::vector<float>> weights(static_cast<std::size_t>(tensors), std::vector<float>(count));
        for (int i = 0; i < tensors; ++i)
          sync.register_parameter(names[static_cast<std::size_t>(i)], std::span(weights[static_cast<std::size_t>(i)]));
        std::vector<std::span<float>> grads;
        for (const std::string& n : names) grads.push_back(sync.gradient<float>(n));
        arena = time_steps(steps, [&] { sync_step(sync, names); });
        fill_inputs(grads, rank);
        sync_step(sync, names);
        wrong += count_wrong(grads, size);
      }
      const bare_times bare = time_bare(comm, big, steps);
      const double single = bare.best;
      const double mpi = time_steps(steps, [&] {
        MPI_Allreduce(big.data(), big_out.data(), static_cast<int>(big.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      });
      const std::vector<row> rows{{"a.plan", "engine, steady state (frozen plan)", planned, single},
                                  {"a.negotiated", "engine, negotiated every step (step_plan off)", negotiated, single},
                                  {"a.unfused", "engine, unfused (threshold 0)", unfused, single},
                                  {"a.arena", "gradient_sync, gradients in its arena (sum)", arena, single},
                                  {"a.mpi", "one MPI_Allreduce of all", mpi, single}};
      if (rank == 0) {
        std::printf("# (a) %d tensors x %zu bytes per step; %s; fused runs choose %s; the plan has %zu buckets\n",
                    tensors, tensor_bytes, bare_text(bare).c_str(), fused.c_str(), plan_stats.plan_buckets);
        print_rows(rows);
        print_machine_rows(rows);
        std::printf("# row a.bare step_us=%.1f bare_us=%.1f\n", single, single);
      }
    }

    if (only.find('b') != std::string::npos) {
      const model_shape m = gpt(model_width, model_blocks);
      std::vector<std::vector<float>> weights, own;
      for (std::size_t c : m.counts) {
        weights.emplace_back(c);
        own.emplace_back(c);
      }
      std::vector<std::span<float>> own_spans(own.begin(), own.end());
      auto with_sync = [&](bool in_arena, flexpar::gradient_reduction reduction, bool check) {
        flexpar::engine eng(comm, base);
        flexpar::gradient_sync sync(eng, {.reduction = reduction});
        for (std::size_t t = 0; t < m.names.size(); ++t) {
          if (in_arena)
            sync.register_parameter(m.names[t], std::span(weights[t]));
          else
            sync.register_parameter(m.names[t], std::span(weights[t]), std::span(own[t]));
        }
        std::vector<std::span<float>> grads = own_spans;
        if (in_arena)
          for (std::size_t t = 0; t < m.names.size(); ++t) grads[t] = sync.gradient<float>(m.names[t]);
        const double us = time_steps(model_steps, [&] { sync_step(sync, m.names); });
        if (check) {
          fill_inputs(grads, rank);
          sync_step(sync, m.names);
          wrong += count_wrong(grads, size);
        }
        return us;
      };
      const double copy_avg = with_sync(false, flexpar::gradient_reduction::average, false);
      const double copy_sum = with_sync(false, flexpar::gradient_reduction::sum, true);
      const double arena_avg = with_sync(true, flexpar::gradient_reduction::average, false);
      const double arena_sum = with_sync(true, flexpar::gradient_reduction::sum, true);
      std::vector<float> big(m.total(), 1.0f), big_out(m.total());
      const bare_times bare = time_bare(comm, big, model_steps);
      const double single = bare.best;
      const double mpi = time_steps(model_steps, [&] {
        MPI_Allreduce(big.data(), big_out.data(), static_cast<int>(big.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      });
      const std::vector<row> rows{{"b.copy_avg", "gradient_sync, own gradient buffers, average", copy_avg, single},
                                  {"b.copy_sum", "gradient_sync, own gradient buffers, sum", copy_sum, single},
                                  {"b.arena_avg", "gradient_sync, arena, average", arena_avg, single},
                                  {"b.arena_sum", "gradient_sync, arena, sum", arena_sum, single},
                                  {"b.mpi", "one MPI_Allreduce of all", mpi, single}};
      if (rank == 0) {
        std::printf("# (b) a GPT of %zu tensors, %.2f M parameters; %s\n", m.names.size(),
                    static_cast<double>(m.total()) / 1e6, bare_text(bare).c_str());
        print_rows(rows);
        print_machine_rows(rows);
        std::printf("# row b.bare step_us=%.1f bare_us=%.1f\n", single, single);
      }
    }

    if (only.find('c') != std::string::npos) {
      std::vector<std::vector<float>> small(static_cast<std::size_t>(tiny), std::vector<float>(1, 1.0f));
      std::vector<std::span<float>> spans(small.begin(), small.end());
      std::vector<std::string> names;
      for (int i = 0; i < tiny; ++i) names.push_back("bias" + std::to_string(i));
      std::vector<float> fused(static_cast<std::size_t>(tiny), 1.0f);
      auto with_engine = [&](const flexpar::config& cfg) {
        flexpar::engine eng(comm, cfg);
        const double us = time_steps(steps, [&] { engine_step(eng, spans, names); });
        fill_inputs(spans, rank);
        engine_step(eng, spans, names);
        wrong += count_wrong(spans, size);
        return us;
      };
      const double planned = with_engine(base), cached = with_engine(negotiated_cfg),
                   uncached = with_engine(cache_off_cfg);
      const double single =
          time_steps(steps, [&] { flexpar::allreduce(comm, std::span(fused), flexpar::reduce_op::sum); });
      if (rank == 0) {
        std::printf("# (c) %d tensors x 4 bytes per step\n", tiny);
        std::printf("%-50s %12s %16s\n", "#", "step(us)", "overhead/tensor");
        const std::vector<row> rows{{"c.plan", "engine, steady state (frozen plan)", planned, single},
                                    {"c.cached", "engine, negotiated, response cache on", cached, single},
                                    {"c.uncached", "engine, negotiated, response cache off", uncached, single}};
        for (const row& r : rows)
          std::printf("%-50s %12.1f %13.2f us\n", r.what.c_str(), r.step_us, (r.step_us - single) / tiny);
        std::printf("%-50s %12.1f\n", "one allreduce of all (reference)", single);
        print_machine_rows(rows);
      }
    }
    if (rank == 0)
      std::printf("# verified: one more step of each engine and sync against the exact sums, %lld wrong\n", wrong);
    if (wrong != 0) status = 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flexpar_engine_bench: %s\n", e.what());
    status = 1;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
