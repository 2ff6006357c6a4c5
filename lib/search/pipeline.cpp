// lib/search/pipeline.cpp — the timed pipeline schedule, 3-D strategies of a layered model, their
// estimate and the search over them (header: flexpar/search/pipeline.hpp).
#include <flexpar/core/error.hpp>
#include <flexpar/search/mcmc.hpp>
#include <flexpar/search/pipeline.hpp>
#include <flexpar/search/simulator.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <tuple>

namespace flexpar::search {

namespace {
constexpr double unknown = std::numeric_limits<double>::infinity();
}  // namespace

pipeline_timeline simulate_pipeline(const std::vector<stage_timing>& stages, int micro_batches,
                                    pipeline_schedule schedule, std::vector<std::size_t> stash,
                                    int gradient_registers) {
  const auto S = stages.size();
  if (S == 0 || micro_batches < 1 || gradient_registers < 1)
    throw error_on<usage_error>(no_rank, "search::simulate_pipeline",
                                "it needs a stage, m >= 1 and gradient_registers >= 1");
  const auto m = static_cast<std::size_t>(micro_batches);
  if (stash.empty())
    for (std::size_t j = 0; j < S; ++j)
      stash.push_back(stash_registers(schedule, static_cast<int>(S), static_cast<int>(j), micro_batches));
  if (stash.size() != S || std::find(stash.begin(), stash.end(), std::size_t{0}) != stash.end())
    throw error_on<usage_error>(no_rank, "search::simulate_pipeline", "one stash count >= 1 per stage");
  std::vector<int> device(S);
  int devices = 0;
  for (std::size_t j = 0; j < S; ++j) {
    device[j] = stages[j].device >= 0 ? stages[j].device : static_cast<int>(j);
    devices = std::max(devices, device[j] + 1);
  }
  // end times of F_j(mb), start and end times of B_j(mb); unknown until fired
  std::vector<std::vector<double>> f_end(S, std::vector<double>(m, unknown)), b_start = f_end, b_end = f_end;
  std::vector<std::size_t> next_f(S, 0), next_b(S, 0), held(S, 0);
  pipeline_timeline out;
  out.busy.assign(static_cast<std::size_t>(devices), 0.0);
  out.peak_stash.assign(S, 0);
  std::vector<double> free_at(static_cast<std::size_t>(devices), 0.0);
  const auto G = static_cast<std::size_t>(gradient_registers);

  // When F_j / B_j of their next micro-batch are ready (unknown: a dependency has not fired).
  auto forward_ready = [&](std::size_t j) {
    const std::size_t mb = next_f[j];
    if (mb >= m) return unknown;
    double t = mb > 0 ? f_end[j][mb - 1] : 0.0;
    if (j > 0) t = std::max(t, f_end[j - 1][mb] + stages[j - 1].send);
    if (mb >= stash[j]) t = std::max(t, b_end[j][mb - stash[j]]);  // a register frees when B ends
    return t;
  };
  auto backward_ready = [&](std::size_t j) {
    const std::size_t mb = next_b[j];
    if (mb >= m) return unknown;
    double t = std::max(f_end[j][mb], mb > 0 ? b_end[j][mb - 1] : 0.0);
    if (j + 1 < S) t = std::max(t, b_end[j + 1][mb] + stages[j].send);
    if (j > 0 && mb >= G) t = std::max(t, b_start[j - 1][mb - G]);  // the receiver took an earlier one
    return t;
  };
  const bool backwards_first = schedule == pipeline_schedule::one_f_one_b;
  for (std::size_t fired = 0; fired < 2 * S * m; ++fired) {
    // Per device: the firing it would start next and when; then the earliest of all devices.
    double best_start = unknown;
    std::size_t best_stage = 0;
    bool best_backward = false;
    for (int d = 0; d < devices; ++d) {
      double earliest = unknown;
      for (std::size_t j = 0; j < S; ++j)
        if (device[j] == d) earliest = std::min({earliest, forward_ready(j), backward_ready(j)});
      if (earliest == unknown) continue;
      const double start = std::max(free_at[static_cast<std::size_t>(d)], earliest);
      // among the firings ready by then: the schedule's kind first, then the one ready first
      double pick_ready = unknown;
      std::size_t pick_stage = 0;
      bool pick_backward = false;
      for (std::size_t j = 0; j < S; ++j) {
        if (device[j] != d) continue;
        for (bool backward : {false, true}) {
          const double r = backward ? backward_ready(j) : forward_ready(j);
          if (r > start) continue;
          const bool better = pick_ready == unknown ||
                              (backward == backwards_first && pick_backward != backwards_first) ||
                              (backward == pick_backward && r < pick_ready);
          if (better) {
            pick_ready = r;
            pick_stage = j;
            pick_backward = backward;
          }
        }
      }
      if (start < best_start) {
        best_start = start;
        best_stage = pick_stage;
        best_backward = pick_backward;
      }
    }
    if (best_start == unknown)
      throw error_on<usage_error>(no_rank, "search::simulate_pipeline",
                                  "no firing can start (a stash or gradient count too small?)");
    const std::size_t j = best_stage;
    const auto d = static_cast<std::size_t>(device[j]);
    const double duration = best_backward ? stages[j].backward : stages[j].forward;
    const double end = best_start + duration;
    if (best_backward) {
      b_start[j][next_b[j]] = best_start;
      b_end[j][next_b[j]++] = end;
      --held[j];
    } else {
      f_end[j][next_f[j]++] = end;
      out.peak_stash[j] = std::max(out.peak_stash[j], ++held[j]);
    }
    free_at[d] = end;
    out.busy[d] += duration;
    out.seconds = std::max(out.seconds, end);
  }
  const double mean_busy = std::accumulate(out.busy.begin(), out.busy.end(), 0.0) / double(devices);
  out.bubble = out.seconds > 0 ? 1.0 - mean_busy / out.seconds : 0.0;
  return out;
}

std::string pipeline_strategy::describe() const {
  std::string s = std::to_string(stages());
  s.append(" x ").append(std::to_string(data)).append(" x ").append(std::to_string(tensor));
  s.append(" (pipeline x data x tensor), m = ").append(std::to_string(micro_batches)).append(", ");
  s.append(name_of(schedule)).append(", blocks ");
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    if (k > 0) s.push_back('+');
    s.append(std::to_string(blocks[k]));
  }
  return s;
}

pipeline_estimate estimate(const pipeline_strategy& s, const stage_cost_fn& cost, std::uint64_t memory_limit) {
  if (s.blocks.empty() || s.micro_batches < 1 || std::find(s.blocks.begin(), s.blocks.end(), 0) != s.blocks.end())
    throw error_on<usage_error>(no_rank, "search::estimate",
                                "a strategy needs a stage, a block or more per stage and m >= 1");
  const int S = s.stages();
  std::vector<stage_timing> timings;
  pipeline_estimate e;
  double per_step = 0;
  for (int j = 0; j < S; ++j) {
    const stage_cost c =
        cost({S, s.data, s.tensor, s.micro_batches, s.blocks[static_cast<std::size_t>(j)], j == 0, j == S - 1});
    timings.push_back({c.forward, c.backward, c.send, -1});
    per_step = std::max(per_step, c.step);
    const std::size_t k = stash_registers(s.schedule, S, j, s.micro_batches);
    e.peak_memory = std::max(e.peak_memory, c.weight_bytes + k * c.activation_bytes);
  }
  const pipeline_timeline t = simulate_pipeline(timings, s.micro_batches, s.schedule);
  e.pipeline_seconds = t.seconds;
  e.bubble = t.bubble;
  e.fits = memory_limit == 0 || e.peak_memory <= memory_limit;
  e.seconds = e.fits ? t.seconds + per_step : std::numeric_limits<double>::infinity();
  return e;
}

stage_cost_fn simulated_stage_costs(std::function<graph(const stage_shape&)> stage_graph, cluster whole,
                                    std::function<double(const stage_shape&)> activation_bytes, std::uint64_t seed,
                                    std::size_t iterations) {
  using key = std::tuple<int, int, int, int, bool, bool>;  // devices, stages, m, blocks, first, last
  auto memo = std::make_shared<std::map<key, stage_cost>>();
  return [=](const stage_shape& s) {
    const int devices = s.data * s.tensor;
    const key k{devices, s.stages, s.micro_batches, s.blocks, s.first, s.last};
    if (auto it = memo->find(k); it != memo->end()) return it->second;
    cluster part = whole;
    if (devices <= whole.devices_per_node) {
      part.nodes = 1;
      part.devices_per_node = devices;
    } else {
      if (devices % whole.devices_per_node != 0)
        throw error_on<usage_error>(no_rank, "search::simulated_stage_costs", "a stage of ", devices,
                                    " devices is not whole nodes of ", whole.devices_per_node);
      part.nodes = devices / whole.devices_per_node;
    }
    simulator sim(stage_graph(s), part);
    search_options options;
    options.iterations = iterations;
    mcmc_search mcmc(sim, seed, options);
    const search_result r = mcmc.run();
    stage_cost c;
    if (!std::isfinite(r.best_time)) {
      c.forward = c.backward = std::numeric_limits<double>::infinity();
    } else if (s.stages == 1) {  // no pipeline: the simulated step itself (communication overlapping compute)
      c.forward = r.best_time;
    } else {
      for (std::size_t i = 0; i < sim.model().ops.size(); ++i) {
        const op_times t = sim.times_of(i);
        c.forward += t.forward + t.input_boxing;
        c.backward += t.backward + t.backward_boxing;
        c.step += t.gradient_allreduce + t.update;
      }
    }
    const double bytes = activation_bytes(s);
    const link& l = devices >= whole.devices_per_node && whole.nodes > 1 ? whole.inter : whole.intra;
    c.send = s.last ? 0.0 : l.latency + bytes / l.bandwidth;
    c.activation_bytes = static_cast<std::uint64_t>(2 * bytes);
    memo->emplace(k, c);
    return c;
  };
}

std::vector<int> balanced_blocks(int blocks, int stages) {
  std::vector<int> out(static_cast<std::size_t>(stages), blocks / stages);
  for (int k = 0; k < blocks % stages; ++k) ++out[static_cast<std::size_t>(k)];
  return out;
}

bool pipeline_space::valid(const pipeline_strategy& s) const {
  if (s.stages() < 1 || s.data < 1 || s.tensor < 1 || s.micro_batches < 1 || s.ranks() != ranks) return false;
  if (std::accumulate(s.blocks.begin(), s.blocks.end(), 0) != blocks) return false;
  if (std::find_if(s.blocks.begin(), s.blocks.end(), [](int b) { return b < 1; }) != s.blocks.end()) return false;
  if (batch % (s.data * s.micro_batches) != 0) return false;
  if (heads % s.tensor != 0 || vocabulary % s.tensor != 0) return false;
  // without a pipeline the step is one batch, and there is no schedule to choose (1F1B by convention)
  return s.stages() > 1 || (s.micro_batches == 1 && s.schedule == pipeline_schedule::one_f_one_b);
}

std::vector<pipeline_strategy> pipeline_space::pure() const {
  std::vector<pipeline_strategy> out;
  pipeline_strategy dp{ranks, 1, 1, pipeline_schedule::one_f_one_b, {blocks}};
  pipeline_strategy tp{1, ranks, 1, pipeline_schedule::one_f_one_b, {blocks}};
  if (valid(dp)) out.push_back(dp);
  if (valid(tp)) out.push_back(tp);
  for (auto it = micro_batch_choices.rbegin(); it != micro_batch_choices.rend(); ++it) {
    pipeline_strategy pp{1, 1, *it, pipeline_schedule::one_f_one_b, balanced_blocks(blocks, ranks)};
    if (ranks > 1 && valid(pp)) {
      out.push_back(pp);
      break;
    }
  }
  return out;
}

pipeline_search::pipeline_search(pipeline_space space, stage_cost_fn cost, std::uint64_t seed,
                                 std::uint64_t memory_limit)
    : space_(std::move(space)), cost_(std::move(cost)), rng_(seed), memory_limit_(memory_limit) {}

pipeline_estimate pipeline_search::estimate_of(const pipeline_strategy& s) { return estimate(s, cost_, memory_limit_); }

pipeline_strategy pipeline_search::propose(const pipeline_strategy& s) {
  pipeline_strategy n = s;
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); };
  switch (pick(0, 4)) {
    case 0: {  // the number of stages: a divisor of the ranks that leaves data x tensor a whole split
      std::vector<int> options;
      for (int p = 1; p <= std::min(space_.ranks, space_.blocks); ++p)
        if (space_.ranks % p == 0) options.push_back(p);
      const int p = options[static_cast<std::size_t>(pick(0, static_cast<int>(options.size()) - 1))];
      const int rest = space_.ranks / p;
      n.blocks = balanced_blocks(space_.blocks, p);
      n.tensor = std::gcd(n.tensor, rest);
      n.data = rest / n.tensor;
      if (p == 1) {  // no pipeline: one batch, and no schedule to choose
        n.micro_batches = 1;
        n.schedule = pipeline_schedule::one_f_one_b;
      } else if (s.stages() == 1) {  // into a pipeline: m with it (at m = 1 a pipeline is all bubble, so
        // stages alone are rarely taken, and a search starting without a pipeline stayed without one)
        n.micro_batches = space_.micro_batch_choices[static_cast<std::size_t>(
            pick(0, static_cast<int>(space_.micro_batch_choices.size()) - 1))];
      }
      break;
    }
    case 1: {  // one block across a stage boundary
      if (n.stages() < 2) break;
      const int k = pick(0, n.stages() - 2);
      auto& left = n.blocks[static_cast<std::size_t>(k)];
      auto& right = n.blocks[static_cast<std::size_t>(k) + 1];
      if (pick(0, 1) == 0) {
        ++left;
        --right;
      } else {
        --left;
        ++right;
      }
      break;
    }
    case 2: {  // the data x tensor split of the stage meshes
      const int rest = n.data * n.tensor;
      std::vector<int> options;
      for (int t = 1; t <= rest; ++t)
        if (rest % t == 0) options.push_back(t);
      n.tensor = options[static_cast<std::size_t>(pick(0, static_cast<int>(options.size()) - 1))];
      n.data = rest / n.tensor;
      break;
    }
    case 3:  // micro-batches
      if (n.stages() > 1)
        n.micro_batches = space_.micro_batch_choices[static_cast<std::size_t>(
            pick(0, static_cast<int>(space_.micro_batch_choices.size()) - 1))];
      break;
    default:
      if (n.stages() > 1)
        n.schedule = n.schedule == pipeline_schedule::gpipe ? pipeline_schedule::one_f_one_b : pipeline_schedule::gpipe;
  }
  return n;
}

pipeline_strategy pipeline_search::run(int proposals, double beta) {
  const std::vector<pipeline_strategy> starts = space_.pure();
  if (starts.empty())
    throw error_on<usage_error>(no_rank, "search::pipeline_search", "no pure strategy is valid for this space");
  pipeline_strategy current = starts.front();
  double t_current = estimate_of(current).seconds;
  for (const pipeline_strategy& s : starts) {
    const double t = estimate_of(s).seconds;
    if (t < t_current) {
      current = s;
      t_current = t;
    }
  }
  pipeline_strategy best = current;
  double t_best = t_current;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int k = 0; k < proposals; ++k) {
    const pipeline_strategy next = propose(current);
    if (!space_.valid(next)) continue;
    const double t = estimate_of(next).seconds;
    if (!std::isfinite(t)) continue;
    if (t < t_current || (std::isfinite(t_current) && u(rng_) < std::exp(-beta * (t - t_current) / t_current))) {
      current = next;
      t_current = t;
      if (t < t_best) {
        best = next;
        t_best = t;
      }
    }
  }
  return best;
}

std::string to_json(const pipeline_strategy& s) {
  const nlohmann::json j{{"data", s.data},
                         {"tensor", s.tensor},
                         {"micro_batches", s.micro_batches},
                         {"schedule", std::string(name_of(s.schedule))},
                         {"blocks", s.blocks}};
  return j.dump(2);
}

pipeline_strategy pipeline_strategy_from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw usage_error(error_text(no_rank, "search::pipeline_strategy_from_json", "not JSON: ").append(e.what()));
  }
  pipeline_strategy s;
  try {
    s.data = j.at("data").get<int>();
    s.tensor = j.at("tensor").get<int>();
    s.micro_batches = j.at("micro_batches").get<int>();
    const std::string schedule = j.at("schedule").get<std::string>();
    if (schedule != "gpipe" && schedule != "1f1b")
      throw error_on<usage_error>(no_rank, "search::pipeline_strategy_from_json", "schedule \"", schedule,
                                  "\" is not gpipe or 1f1b");
    s.schedule = schedule == "gpipe" ? pipeline_schedule::gpipe : pipeline_schedule::one_f_one_b;
    s.blocks = j.at("blocks").get<std::vector<int>>();
  } catch (const nlohmann::json::exception& e) {
    throw error_on<usage_error>(
        no_rank, "search::pipeline_strategy_from_json",
        "expected {\"data\", \"tensor\", \"micro_batches\", \"schedule\", \"blocks\": [...]}: ", e.what());
  }
  return s;
}

}  // namespace flexpar::search
