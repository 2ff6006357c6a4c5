// flexpar/actor/deterministic_scheduler.hpp — a single-threaded scheduler that fires one actor at a
// time, chosen by the test.
//
// For tests (the CAF deterministic fixture's idea): the caller sees which actors are ready, fires
// one (`step`), and can assert the register counts and mailboxes between any two firings. A seeded
// explorer (`run_random`) picks uniformly among the ready actors with the caller's RNG, so one seed
// is one reproducible interleaving, and a loop over seeds explores many. The same graph code runs
// under actor_executor; only the choice of the next firing differs.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <flexpar/actor/actor_graph.hpp>

namespace flexpar {

/// Fires the actors of one graph on the calling thread, one firing per step.
class deterministic_scheduler {
 public:
  /// Starts `g` (checks its ports, queues what can fire). @throws usage_error as actor_executor::run.
  explicit deterministic_scheduler(actor_graph& g) : core_(g.core()) { core_.start(); }

  /// True if `a` can fire now (all inputs hold a message, all outputs have a free register).
  [[nodiscard]] bool ready(const detail::actor_node& a) const {
    for (const detail::actor_node* n : core_.ready())
      if (n == &a) return true;
    return false;
  }
  /// Labels of the actors that can fire now, in the order they became ready.
  [[nodiscard]] std::vector<std::string> ready_labels() const {
    std::vector<std::string> labels;
    for (const detail::actor_node* n : core_.ready()) labels.push_back(n->label());
    return labels;
  }
  /// Fires `a` once.
  /// @throws usage_error if `a` is not ready (the text says what it waits for).
  /// @throws actor_failure if its body throws (the graph is stopped afterwards).
  void step(detail::actor_node& a) {
    auto& queue = core_.ready();
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (*it == &a) {
        queue.erase(it);
        fire(a);
        return;
      }
    }
    throw error_on<usage_error>(core_.rank(), "deterministic_scheduler::step", "actor '", a.label(),
                                "' is not ready; it waits for ", a.waiting_for());
  }
  /// Fires one ready actor chosen uniformly with `rng` (among those in turn on a stream with a fixed
  /// order); with cross-rank edges, polls them first.
  /// Returns false if nothing could fire (complete, or waiting on another rank).
  bool step_random(std::mt19937_64& rng) {
    if (core_.has_remote()) {
      core_.poll_remote();
      if (core_.failed()) abort_and_rethrow();
    }
    auto& queue = core_.ready();
    std::vector<std::size_t> can;  // ready, and next on its stream where the stream has a fixed order
    for (std::size_t i = 0; i < queue.size(); ++i)
      if (core_.in_turn(*queue[i])) can.push_back(i);
    if (can.empty()) return false;
    std::uniform_int_distribution<std::size_t> pick(0, can.size() - 1);
    const auto it = queue.begin() + static_cast<std::ptrdiff_t>(can[pick(rng)]);
    detail::actor_node& a = **it;
    queue.erase(it);
    fire(a);
    return true;
  }
  /// Steps randomly until every actor of this rank has finished.
  /// @throws actor_failure from a body; timeout_error at `until` (naming what each actor waits for).
  void run_random(std::mt19937_64& rng, deadline until) {
    while (!core_.complete()) {
      if (!step_random(rng)) {
        if (!core_.has_remote()) break;
        std::this_thread::yield();
      }
      if (clock::now() >= until) break;
    }
    if (!core_.complete()) {
      const timeout_error e = core_.timeout("deterministic_scheduler::run_random");
      if (core_.has_remote()) core_.abort_remote(deadline_after(std::chrono::milliseconds(100)));
      throw e;
    }
  }
  /// One round of a machine whose every firing takes one time unit: each stream fires the ready
  /// actor that goes first (graph_core::goes_before: as the executor picks) and every ready actor without a stream
  /// fires, all chosen before any fires (what a firing makes ready waits for the next round).
  /// With cross-rank edges, polls them first. Returns the number of actors fired.
  std::size_t step_round() {
    if (core_.has_remote()) {
      core_.poll_remote();
      if (core_.failed()) abort_and_rethrow();
    }
    std::vector<detail::actor_node*> chosen;
    for (detail::actor_node* n : core_.ready()) {
      if (!core_.in_turn(*n)) continue;
      auto same = std::find_if(chosen.begin(), chosen.end(), [&](const detail::actor_node* c) {
        return n->stream() >= 0 && c->stream() == n->stream();
      });
      if (same == chosen.end())
        chosen.push_back(n);
      else if (detail::graph_core::goes_before(*n, **same))
        *same = n;
    }
    auto& queue = core_.ready();
    for (detail::actor_node* n : chosen) {
      queue.erase(std::find(queue.begin(), queue.end(), n));
      fire(*n);
    }
    return chosen.size();
  }
  /// Rounds (step_round) until every actor of this rank has finished; returns the rounds that fired
  /// something: the length of the schedule in time units when every firing takes one.
  /// @throws actor_failure from a body; timeout_error at `until`, or at once when a one-rank graph
  ///         can fire nothing and is not complete (naming what each actor waits for).
  std::size_t run_rounds(deadline until) {
    std::size_t rounds = 0;
    while (!core_.complete()) {
      if (step_round() > 0) {
        ++rounds;
      } else {
        if (!core_.has_remote()) break;
        std::this_thread::yield();
      }
      if (clock::now() >= until) break;
    }
    if (!core_.complete()) {
      const timeout_error e = core_.timeout("deterministic_scheduler::run_rounds");
      if (core_.has_remote()) core_.abort_remote(deadline_after(std::chrono::milliseconds(100)));
      throw e;
    }
    return rounds;
  }
  /// Every actor of this rank has finished.
  [[nodiscard]] bool complete() const noexcept { return core_.complete(); }
  /// Firings so far.
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }

 private:
  void fire(detail::actor_node& a) {
    std::unique_lock lock(core_.mutex);
    core_.begin_fire(a);
    lock.unlock();
    fire_result result = fire_result::emit;
    std::exception_ptr e = core_.invoke(a, result);
    lock.lock();
    ++steps_;
    if (e) {
      core_.fail(a, std::move(e));
      lock.unlock();
      abort_and_rethrow();
    }
    core_.end_fire(a, result);
  }
  [[noreturn]] void abort_and_rethrow() {
    if (core_.has_remote()) core_.abort_remote(deadline_after(std::chrono::milliseconds(100)));
    core_.rethrow_failure();
    throw error_on<usage_error>(core_.rank(), "deterministic_scheduler", "no failure to rethrow");  // unreachable
  }

  detail::graph_core& core_;
  std::uint64_t steps_ = 0;
};

}  // namespace flexpar
