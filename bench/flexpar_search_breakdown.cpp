// flexpar_search_breakdown — where an executed step's time goes, next to the simulator's prediction
// (doc/search.md, "Simulated vs real"). Under mpiexec:
//
//   mpiexec -n 2 flexpar_search_breakdown [--steps 20] [--batch 64] [--width 256] [--repeats 3]
//
// For the MLP width -> 4 width -> 4 width -> width and four 1-D strategies of all ranks (data parallel,
// column parallel, Megatron, the one the search finds), it prints per strategy:
//   - the executor's step (execute_steps, the median of --steps, slowest rank), --repeats times;
//   - one instrumented step, the same ops as the executor (to, sbp::matmul, BLAS-transposed backward GEMMs,
//     the update's copy and pass, relu's copy and pass) with a clock lapped after each phase (the median of
//     --steps per phase, slowest rank);
//   - the simulator's task durations per phase and its step time, for the cluster as measure_cluster gives
//     it (link fitted to the boxings, a blocking executor) and as it was before (the ping-pong link, and
//     communication overlapping computation).
#include <cblas.h>
#include <mpi.h>

#include <flexpar/collective.hpp>
#include <flexpar/collective/automatic.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/sbp/dynamic.hpp>
#include <flexpar/search/execute.hpp>
#include <flexpar/search/mcmc.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using namespace flexpar::search;
using flexpar::sbp::nd_parallel;
using flexpar::sbp::parallel;
using tensor = flexpar::sbp::dynamic_tensor<float, 1>;

enum phase : std::size_t { fwd_boxing, fwd_gemm, relu, bwd_boxing, bwd_gemm, grad_allreduce, update, other, phases };
constexpr const char* phase_label[phases] = {"forward boxing",  "forward GEMM",         "relu (fwd + bwd)",
                                             "backward boxing", "backward GEMMs",       "gradient allreduce",
                                             "update",          "other (input, clones)"};

struct lap_clock {
  std::array<double, phases> seconds{};
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  void lap(phase p) {
    const auto now = std::chrono::steady_clock::now();
    seconds[p] += std::chrono::duration<double>(now - last).count();
    last = now;
  }
};

nd_parallel without_partial(nd_parallel s) {
  for (std::size_t d = 0; d < s.rank; ++d)
    if (s[d].is_partial()) s[d] = parallel::B();
  return s;
}

nd_parallel swap_split(nd_parallel s) {
  for (std::size_t d = 0; d < s.rank; ++d)
    if (s[d].is_split()) s[d] = parallel::S(1 - s[d].axis);
  return s;
}

/// op(a) op(b) of the local shards through the BLAS (the executor's backward GEMMs), the SBP from the
/// matmul table.
tensor shard_gemm(const tensor& a, bool ta, const tensor& b, bool tb) {
  const nd_parallel la = ta ? swap_split(a.layout()) : a.layout(), lb = tb ? swap_split(b.layout()) : b.layout();
  const auto sig = flexpar::sbp::nd_signature(
      [](const parallel& x, const parallel& y) { return flexpar::sbp::signature::matmul(x, y); }, la, lb);
  const std::size_t m = ta ? a.shape()[1] : a.shape()[0], n = tb ? b.shape()[0] : b.shape()[1];
  const auto ba = a.my_box(), bb = b.my_box();
  const std::size_t rows = ta ? ba.extent[1] : ba.extent[0], inner = ta ? ba.extent[0] : ba.extent[1];
  const std::size_t cols = tb ? bb.extent[0] : bb.extent[1];
  flexpar::aligned_vector<float> c(rows * cols, 0.0f);
  if (rows > 0 && cols > 0 && inner > 0)
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(cols), static_cast<int>(inner), 1.0f, a.to_local().data(),
                static_cast<int>(ba.extent[1]), b.to_local().data(), static_cast<int>(bb.extent[1]), 0.0f, c.data(),
                static_cast<int>(cols));
  return tensor::adopt(a.where(), {m, n}, sig.out, std::move(c));
}

/// One instrumented step per call; returns the seconds per phase on this rank.
std::array<double, phases> timed_step(flexpar::sbp::placement<1>& mesh, const graph& g, const strategy& s,
                                      const std::vector<float>& input, std::vector<std::optional<tensor>>& w) {
  const std::size_t n = g.ops.size();
  std::vector<sbp_signature> sig;
  for (std::size_t i = 0; i < n; ++i) sig.push_back(signature_of(g.ops[i], s[i]));
  lap_clock clock;
  std::vector<std::optional<tensor>> in(n), out(n);
  tensor x = tensor::from_full(mesh, {g.ops[0].batch, g.ops[0].in_channels}, sig[0].input, input);
  clock.lap(other);
  for (std::size_t i = 0; i < n; ++i) {
    in[i] = to(std::move(x), sig[i].input);
    clock.lap(fwd_boxing);
    if (g.ops[i].kind == op_kind::linear) {
      out[i] = flexpar::sbp::matmul(*in[i], *w[i]);
      clock.lap(fwd_gemm);
    } else {
      flexpar::aligned_vector<float> v(in[i]->to_local().begin(), in[i]->to_local().end());
      for (float& e : v) e = e > 0 ? e : 0.0f;
      out[i] = tensor::adopt(in[i]->where(), in[i]->shape(), in[i]->layout(), std::move(v));
      clock.lap(relu);
    }
    x = out[i]->clone();
    clock.lap(other);
  }
  tensor dy = to(out[n - 1]->clone(), without_partial(out[n - 1]->layout()));
  clock.lap(bwd_boxing);
  for (std::size_t i = n; i-- > 0;) {
    dy = to(std::move(dy), without_partial(sig[i].output));
    clock.lap(bwd_boxing);
    if (g.ops[i].kind == op_kind::linear) {
      tensor dw_local = shard_gemm(*in[i], true, dy, false);
      clock.lap(bwd_gemm);
      tensor dw = to(std::move(dw_local), sig[i].weight);
      clock.lap(grad_allreduce);
      tensor dx = shard_gemm(dy, false, *w[i], true);
      clock.lap(bwd_gemm);
      flexpar::aligned_vector<float> updated(w[i]->to_local().begin(), w[i]->to_local().end());
      const auto grad = dw.to_local();
      for (std::size_t k = 0; k < updated.size(); ++k) updated[k] -= grad[k] / 1024.0f;
      w[i] = tensor::adopt(w[i]->where(), w[i]->shape(), w[i]->layout(), std::move(updated));
      dy = std::move(dx);
      clock.lap(update);
    } else {
      dy = to(std::move(dy), out[i]->layout());
      clock.lap(bwd_boxing);
      flexpar::aligned_vector<float> v(dy.to_local().begin(), dy.to_local().end());
      const auto o = out[i]->to_local();
      for (std::size_t k = 0; k < v.size(); ++k)
        if (!(o[k] > 0)) v[k] = 0.0f;
      dy = tensor::adopt(dy.where(), dy.shape(), dy.layout(), std::move(v));
      clock.lap(relu);
    }
  }
  return clock.seconds;
}

/// The simulator's task durations per phase (summed over the ops, no overlap).
std::array<double, phases> simulated_phases(simulator& sim) {
  std::array<double, phases> t{};
  const graph& g = sim.model();
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    const op_times o = sim.times_of(i);
    const bool linear = g.ops[i].kind == op_kind::linear;
    t[fwd_boxing] += o.input_boxing;
    t[bwd_boxing] += o.backward_boxing;
    t[linear ? fwd_gemm : relu] += o.forward;
    t[linear ? bwd_gemm : relu] += o.backward;
    t[grad_allreduce] += o.gradient_allreduce;
    t[update] += o.update;
  }
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<float> small_values(std::size_t n, std::size_t salt) {
  std::mt19937 rng(static_cast<std::uint32_t>(salt));
  std::vector<float> v(n);
  for (float& e : v) e = static_cast<float>(static_cast<int>(rng() % 3) - 1) / 64.0f;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t steps = 20, batch = 64, width = 256, repeats = 3;
  for (int k = 1; k + 1 < argc; k += 2) {
    const std::size_t v = std::strtoull(argv[k + 1], nullptr, 10);
    if (std::strcmp(argv[k], "--steps") == 0) steps = std::max<std::size_t>(v, 1);
    if (std::strcmp(argv[k], "--batch") == 0) batch = v;
    if (std::strcmp(argv[k], "--width") == 0) width = v;
    if (std::strcmp(argv[k], "--repeats") == 0) repeats = std::max<std::size_t>(v, 1);
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    const int p = comm.size();
    const bool root = comm.rank() == 0;
    const cluster now = measure_cluster(comm, 512);
    cluster before = now;  // the previous model: the ping-pong link, communication beside computation
    const flexpar::cost_params& m = flexpar::machine_of(comm);
    before.intra = {m.alpha, 1.0 / m.beta};
    before.inter = before.intra;
    before.overlap = true;
    const graph g = reference::mlp(batch, {width, 4 * width, 4 * width, width});
    auto one_d = [p](std::size_t, const soap_config& c) {
      return c.devices() == p && c.first_device == 0 && (c.sample > 1) + (c.attribute > 1) + (c.parameter > 1) <= 1;
    };
    std::vector<std::vector<soap_config>> space;
    for (std::size_t i = 0; i < g.ops.size(); ++i) {
      space.emplace_back();
      for (const soap_config& c : candidates(g.ops[i], now))
        if (one_d(i, c)) space.back().push_back(c);
    }
    const kernel_profile profile = kernel_profile::measure(comm, g, space);
    simulator sim_now(g, now, profile), sim_before(g, before, profile);
    search_options o;
    o.iterations = 2000;
    o.allow = one_d;
    const strategy found = mcmc_search(sim_now, 1, o).run().best;
    strategy megatron, column;
    for (std::size_t i = 0; i < g.ops.size(); ++i) {
      const bool linear = g.ops[i].kind == op_kind::linear;
      megatron.push_back(linear && (i / 2) % 2 == 1 ? soap_config{1, p, 1, 0} : soap_config{1, 1, p, 0});
      column.push_back(soap_config{1, 1, p, 0});
    }
    for (std::size_t i = 1; i < g.ops.size(); i += 2)
      if (megatron[i - 1].attribute > 1) megatron[i] = soap_config{p, 1, 1, 0};
    const std::pair<const char*, strategy> cases[] = {{"data parallel", data_parallel(g, now)},
                                                      {"column parallel", column},
                                                      {"megatron", megatron},
                                                      {"searched", found}};
    std::vector<std::vector<float>> w0;
    for (const op& op_ : g.ops)
      w0.push_back(op_.kind == op_kind::linear ? small_values(op_.in_channels * op_.out_channels, w0.size())
                                               : std::vector<float>{});
    const std::vector<float> x = small_values(batch * width, 7);
    if (root)
      std::printf(
          "%d ranks; measured: %.2f GFLOP/s, memory %.2f GB/s; link fitted to the boxings: alpha %.2f us, "
          "%.3f GB/s; ping-pong: alpha %.2f us, %.3f GB/s\n",
          p, now.flops / 1e9, now.memory_bandwidth / 1e9, now.intra.latency * 1e6, now.intra.bandwidth / 1e9,
          before.intra.latency * 1e6, before.intra.bandwidth / 1e9);
    for (const auto& [name, s] : cases) {
      if (!executable(g, s, p)) continue;
      const double t_now = sim_now.simulate(s), t_before = sim_before.simulate(s);
      std::vector<double> executor;
      for (std::size_t r = 0; r < repeats; ++r)
        executor.push_back(execute_steps(comm, g, s, x, w0, 1.0f / 1024, steps).median_step_seconds);
      flexpar::sbp::placement<1> mesh(comm, {p});
      std::vector<std::optional<tensor>> w(g.ops.size());
      for (std::size_t i = 0; i < g.ops.size(); ++i)
        if (g.ops[i].kind == op_kind::linear)
          w[i] = tensor::from_full(mesh, {g.ops[i].in_channels, g.ops[i].out_channels},
                                   signature_of(g.ops[i], s[i]).weight, w0[i]);
      std::array<std::vector<double>, phases> per_phase;
      std::vector<double> totals;
      for (std::size_t k = 0; k < steps; ++k) {
        std::array<double, phases> t = timed_step(mesh, g, s, x, w);
        flexpar::allreduce(comm, std::span<double>(t), flexpar::reduce_op::max);
        double total = 0;
        for (std::size_t q = 0; q < phases; ++q) {
          per_phase[q].push_back(t[q]);
          total += t[q];
        }
        totals.push_back(total);
      }
      if (!root) continue;
      std::string runs;
      for (double e : executor) runs.append(runs.empty() ? "" : ", ").append(std::to_string(e * 1e3).substr(0, 6));
      const double measured = median(executor);
      std::printf(
          "\n%s: simulated %.3f ms (before: %.3f ms); executor %s ms, median %.3f ms: error %+.0f%% (before "
          "%+.0f%%)\n",
          name, t_now * 1e3, t_before * 1e3, runs.c_str(), measured * 1e3, 100 * (t_now - measured) / measured,
          100 * (t_before - measured) / measured);
      sim_now.simulate(s);
      const std::array<double, phases> sim_p = simulated_phases(sim_now);
      sim_before.simulate(s);
      const std::array<double, phases> old_p = simulated_phases(sim_before);
      std::printf("| phase | simulated ms | before ms | instrumented step ms (median of %zu) |\n|---|---|---|---|\n",
                  steps);
      double sum_now = 0, sum_old = 0;
      for (std::size_t q = 0; q < phases; ++q) {
        sum_now += sim_p[q];
        sum_old += old_p[q];
        std::printf("| %s | %.3f | %.3f | %.3f |\n", phase_label[q], sim_p[q] * 1e3, old_p[q] * 1e3,
                    median(per_phase[q]) * 1e3);
      }
      std::printf("| sum of phases (step: no overlap) | %.3f | %.3f | %.3f |\n", sum_now * 1e3, sum_old * 1e3,
                  median(totals) * 1e3);
    }
  }
  MPI_Finalize();
  return 0;
}
