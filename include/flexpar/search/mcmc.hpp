// flexpar/search/mcmc.hpp — FlexFlow's strategy search: Metropolis–Hastings over per-op SOAP configs,
// scored by the simulator's step time (delta simulation per proposal).
//
//   1. candidates: data parallelism, the expert strategy (config.hpp), `random_starts` random ones
//   2. from each candidate in turn (the budget split evenly): propose "op i gets a random valid config"
//      or, with probability copy_probability, "op i adopts the config of a producer or consumer" (moves a
//      whole region of the graph onto one mesh in a few steps, where single random changes only add boxing);
//      accept when faster, else with probability exp(-beta * (t_new - t_cur) / t_cur)
//   3. return the fastest strategy seen if it beats data parallelism, else data parallelism itself
// The RNG is a std::mt19937_64 owned by the search object: one seed, one answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>

#include <flexpar/search/config.hpp>
#include <flexpar/search/simulator.hpp>

namespace flexpar::search {

/// Search budget and knobs.
struct search_options {
  /// Steps in all (0: no limit, then seconds must be > 0), divided evenly among the chains (one per
  /// starting strategy: data parallelism, the expert, random_starts random ones; the remainder is
  /// dropped). A step draws a config for a random op; a draw equal to the op's current config is
  /// skipped, so the proposals evaluated are at most this many (search_result::proposals).
  std::size_t iterations = 20000;
  double seconds = 0;             ///< wall-clock budget (0: no limit)
  double beta = 50;               ///< Metropolis inverse temperature on the relative time difference
  double copy_probability = 0.3;  ///< share of proposals that copy a neighbour's config
  std::size_t random_starts = 1;  ///< random initial candidates besides data parallel and expert
  std::size_t report_every = 0;   ///< call the progress callback every this many proposals (0: never)
  /// When set, only configs it accepts are proposed and only candidates it fully accepts start a chain
  /// (e.g. `executable` strategies); data parallelism must pass it.
  std::function<bool(std::size_t op, const soap_config&)> allow;
};

/// What the progress callback sees.
struct search_progress {
  std::size_t iteration = 0;  ///< proposals so far
  double current = 0;         ///< step time of the chain's state
  double best = 0;            ///< best step time so far
  double data_parallel = 0;   ///< step time of data parallelism
  double elapsed = 0;         ///< seconds since the search began
};

/// The answer.
struct search_result {
  strategy best;                    ///< the returned strategy (data parallelism unless it was beaten)
  double best_time = 0;             ///< its simulated step time
  double data_parallel_time = 0;    ///< data parallelism's simulated step time
  double expert_time = 0;           ///< the expert strategy's simulated step time
  bool beat_data_parallel = false;  ///< false: `best` is data parallelism
  std::size_t steps = 0;            ///< steps taken (what search_options::iterations counts)
  std::size_t chains = 0;           ///< chains run (one per starting strategy)
  std::size_t proposals = 0;        ///< proposals evaluated (steps that drew a config other than the op's)
  std::size_t accepted = 0;         ///< proposals accepted
  double seconds = 0;               ///< wall-clock time of the search
};

/// The MCMC search (header comment). Owns its RNG.
class mcmc_search {
 public:
  /// A search over `sim`'s graph and cluster with RNG seed `seed`.
  mcmc_search(simulator& sim, std::uint64_t seed, search_options options = {});
  /// Called every options.report_every proposals.
  void on_progress(std::function<void(const search_progress&)> f) { progress_ = std::move(f); }
  /// Runs the search. The simulator is left holding the returned strategy.
  search_result run();

 private:
  simulator* sim_;
  std::mt19937_64 rng_;
  search_options options_;
  std::function<void(const search_progress&)> progress_;
};

}  // namespace flexpar::search
