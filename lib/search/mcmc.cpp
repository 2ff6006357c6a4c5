// lib/search/mcmc.cpp — Metropolis–Hastings over SOAP configs (header: flexpar/search/mcmc.hpp).
#include <flexpar/core/error.hpp>
#include <flexpar/search/mcmc.hpp>

#include <chrono>
#include <cmath>

namespace flexpar::search {

mcmc_search::mcmc_search(simulator& sim, std::uint64_t seed, search_options options)
    : sim_(&sim), rng_(seed), options_(options) {
  if (options_.iterations == 0 && !(options_.seconds > 0))
    throw error_on<usage_error>(no_rank, "search::mcmc_search", "give a budget: iterations > 0 or seconds > 0");
}

search_result mcmc_search::run() {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(clock::now() - start).count(); };
  const graph& g = sim_->model();
  const cluster& cl = sim_->machine();
  std::vector<std::vector<soap_config>> space;
  for (std::size_t i = 0; i < g.ops.size(); ++i) {
    std::vector<soap_config> all = candidates(g.ops[i], cl), kept;
    for (const soap_config& c : all)
      if (!options_.allow || options_.allow(i, c)) kept.push_back(c);
    if (kept.empty())
      throw usage_error(error_text(no_rank, "search::mcmc_search", "op ")
                            .append(std::to_string(i))
                            .append(" '")
                            .append(g.ops[i].name)
                            .append("' has no config the options allow on this cluster"));
    space.push_back(std::move(kept));
  }
  auto allowed = [&](const strategy& s) {
    for (std::size_t i = 0; i < s.size(); ++i)
      if (options_.allow && !options_.allow(i, s[i])) return false;
    return true;
  };

  std::vector<std::vector<std::size_t>> neighbours(g.ops.size());  // producers and consumers
  for (std::size_t i = 0; i < g.ops.size(); ++i)
    for (std::size_t in : g.ops[i].inputs) {
      neighbours[i].push_back(in);
      neighbours[in].push_back(i);
    }

  search_result r;
  const strategy dp = data_parallel(g, cl);
  r.data_parallel_time = sim_->simulate(dp);
  if (!allowed(dp))
    throw error_on<usage_error>(no_rank, "search::mcmc_search", "options.allow rejects data parallelism");
  const strategy hand = expert(g, cl);
  r.expert_time = sim_->simulate(hand);
  std::vector<strategy> starts{dp};
  if (allowed(hand)) starts.push_back(hand);
  for (std::size_t k = 0; k < options_.random_starts; ++k) {
    strategy s;
    for (const auto& c : space) s.push_back(c[std::uniform_int_distribution<std::size_t>(0, c.size() - 1)(rng_)]);
    starts.push_back(std::move(s));
  }

  strategy best = dp;
  double best_time = r.data_parallel_time;
  std::uniform_int_distribution<std::size_t> pick_op(0, g.ops.size() - 1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  r.chains = starts.size();
  const std::size_t per_start = options_.iterations / starts.size();
  const double seconds_per_start = options_.seconds / static_cast<double>(starts.size());
  for (std::size_t k = 0; k < starts.size(); ++k) {
    double current = sim_->simulate(starts[k]);
    if (current < best_time) {
      best_time = current;
      best = starts[k];
    }
    const double chain_start = elapsed();
    for (std::size_t it = 0;; ++it) {
      if (options_.iterations > 0 && it >= per_start) break;
      if (options_.seconds > 0 && (it & 63) == 0 && elapsed() - chain_start >= seconds_per_start) break;
      ++r.steps;
      const std::size_t i = pick_op(rng_);
      const std::vector<soap_config>& choices = space[i];
      soap_config proposal = choices[std::uniform_int_distribution<std::size_t>(0, choices.size() - 1)(rng_)];
      if (!neighbours[i].empty() && unit(rng_) < options_.copy_probability) {  // adopt a neighbour's config
        const std::size_t n =
            neighbours[i][std::uniform_int_distribution<std::size_t>(0, neighbours[i].size() - 1)(rng_)];
        const soap_config& theirs = sim_->current()[n];
        if (valid(g.ops[i], theirs, cl) && (!options_.allow || options_.allow(i, theirs))) proposal = theirs;
      }
      const soap_config before = sim_->current()[i];
      if (proposal == before) continue;
      const double t = sim_->change(i, proposal);
      ++r.proposals;
      bool accept = t < current;
      if (!accept && std::isfinite(t)) {
        const double u = unit(rng_);
        accept = std::isfinite(current) ? u < std::exp(-options_.beta * (t - current) / current) : true;
      }
      if (accept) {
        current = t;
        ++r.accepted;
        if (t < best_time) {
          best_time = t;
          best = sim_->current();
        }
      } else {
        sim_->change(i, before);
      }
      if (progress_ && options_.report_every > 0 && r.proposals % options_.report_every == 0)
        progress_({r.proposals, current, best_time, r.data_parallel_time, elapsed()});
    }
  }
  r.beat_data_parallel = best_time < r.data_parallel_time;
  r.best = r.beat_data_parallel ? best : dp;
  r.best_time = sim_->simulate(r.best);
  r.seconds = elapsed();
  return r;
}

}  // namespace flexpar::search
