// The engine's steady state (a frozen step plan, include/flexpar/engine/engine.hpp "The steady
// state"): scenarios shared by the in-process and the mpiexec tests. Every step's inputs differ by
// rank, step, tensor and element and are small integers, so that every sum is exact in any order:
// each result is compared with the serial sum (the unfused oracle).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/engine/engine.hpp>

#include "engine_scenarios.hpp"

namespace flexpar::testing_support {

/// Tensors stepped through an engine: names, counts and this rank's buffers.
class stepped_tensors {
 public:
  /// `counts` (zero-length ones too) named "t0", "t1", ...
  explicit stepped_tensors(std::vector<std::size_t> counts) : counts_(std::move(counts)) {
    for (std::size_t i = 0; i < counts_.size(); ++i) {
      names_.push_back(tensor_name(static_cast<int>(i)));
      data_.emplace_back(counts_[i]);
    }
  }

  static float input(int rank, int step, std::size_t tensor, std::size_t i) {
    return static_cast<float>((rank + 1) * ((static_cast<std::size_t>(step) + 3 * tensor + i) % 7 + 1));
  }
  static float sum(int p, int step, std::size_t tensor, std::size_t i) {
    float s = 0;
    for (int r = 0; r < p; ++r) s += input(r, step, tensor, i);
    return s;
  }

  [[nodiscard]] std::size_t size() const noexcept { return counts_.size(); }
  [[nodiscard]] const std::string& name(std::size_t t) const { return names_[t]; }
  std::vector<float>& data(std::size_t t) { return data_[t]; }

  /// Writes step `step`'s inputs and submits every tensor but those in `skip`, in an order of this
  /// rank's and step's own; then end_step() when `end`. Returns the handles (empty where skipped).
  std::vector<handle> submit(engine& eng, int step, const std::set<std::size_t>& skip = {}, bool end = true) {
    std::vector<std::size_t> order(size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::mt19937_64 mine(static_cast<std::uint64_t>(1000 * eng.rank() + step));
    std::shuffle(order.begin(), order.end(), mine);
    std::vector<handle> handles(size());
    for (std::size_t t : order) {
      if (skip.contains(t)) continue;
      for (std::size_t i = 0; i < counts_[t]; ++i) data_[t][i] = input(eng.rank(), step, t, i);
      handles[t] = eng.allreduce_async(names_[t], std::span(data_[t]), reduce_op::sum);
    }
    if (end) eng.end_step();
    return handles;
  }

  /// Waits for tensor t and compares it with the serial sum of step `step`.
  void expect_summed(const handle& h, std::size_t t, int p, int step) {
    h.wait();
    for (std::size_t i = 0; i < counts_[t]; ++i)
      ASSERT_EQ(data_[t][i], sum(p, step, t, i)) << "step " << step << " tensor " << names_[t] << " element " << i;
  }

  /// One whole step: submit, wait, compare every tensor.
  void step(engine& eng, int step) {
    const std::vector<handle> handles = submit(eng, step);
    for (std::size_t t = 0; t < size(); ++t) expect_summed(handles[t], t, eng.size(), step);
  }

  /// Steps 0 .. warm_steps - 1 (below): every rank has frozen the plan afterwards.
  void warm_up(engine& eng);

 private:
  std::vector<std::size_t> counts_;
  std::vector<std::string> names_;
  std::vector<std::vector<float>> data_;
};

/// Tensor counts of a small model: zero-length, one element, odd sizes, more than a fusion buffer's
/// worth together.
inline std::vector<std::size_t> plan_counts() { return {0, 1, 3, 1000, 17, 4096, 5, 250, 0, 777, 64, 2}; }

/// Steps enough for every rank to have frozen the plan (it freezes after two steps that ran the same
/// tensors by cache slot: the third at the latest, and each rank installs it before the handles of
/// the next step complete).
constexpr int warm_steps = 5;

inline void stepped_tensors::warm_up(engine& eng) {
  for (int s = 0; s < warm_steps; ++s) step(eng, s);
}

/// Steady state: from the third step on the ranks replay a frozen plan; results exact in every step
/// although every rank submits in its own order, different in every step.
inline void plan_replays_in_any_order(communicator& comm, const config& cfg) {
  engine eng(comm, cfg);
  stepped_tensors m(plan_counts());
  const int steps = 12;
  for (int step = 0; step < steps; ++step) m.step(eng, step);
  const engine::statistics s = eng.stats();
  barrier(comm);  // every rank has read its counters before one shuts its engine down (a drop too)
  EXPECT_EQ(s.plans_frozen, 1u);
  EXPECT_EQ(s.plans_dropped, 0u);
  EXPECT_GT(s.plan_buckets, 0u);
  EXPECT_GE(s.planned_tensors, (steps - warm_steps) * m.size());
  EXPECT_EQ(s.full_reports, m.size()) << "only the first step is reported in full";
}

/// A tensor the plan does not have (a parameter added between steps): every rank drops the plan, the
/// step is negotiated and exact, and the new step freezes again with it.
inline void a_new_tensor_drops_the_plan_and_freezes_again(communicator& comm, const config& cfg) {
  engine eng(comm, cfg);
  stepped_tensors m(plan_counts());
  m.warm_up(eng);
  ASSERT_EQ(eng.stats().plans_frozen, 1u);
  std::vector<float> extra(33);
  for (int step = warm_steps; step < 2 * warm_steps + 2; ++step) {
    std::fill(extra.begin(), extra.end(), static_cast<float>(comm.rank() + step));
    handle h = eng.allreduce_async("added", std::span(extra), reduce_op::sum);
    m.step(eng, step);
    h.wait();
    const int p = comm.size();
    EXPECT_EQ(extra[32], static_cast<float>(p * (p - 1) / 2 + p * step)) << "step " << step;
  }
  const engine::statistics s = eng.stats();
  barrier(comm);  // every rank has read its counters before one shuts its engine down (a drop too)
  EXPECT_EQ(s.plans_dropped, 1u);
  EXPECT_EQ(s.plans_frozen, 2u) << "the step with the added tensor is frozen in turn";
}

/// After the freeze, rank 1 submits tensor t3 with another count: every rank's t3 fails with the
/// mismatch naming both counts and their ranks; every other tensor of the step is exact.
inline void a_changed_count_is_a_mismatch_naming_both_sides(communicator& comm, const config& cfg) {
  ASSERT_GE(comm.size(), 2);
  engine eng(comm, cfg);
  stepped_tensors m(plan_counts());
  m.warm_up(eng);
  const std::size_t t3 = 3;
  const int step = warm_steps;
  std::vector<handle> handles = m.submit(eng, step, {t3}, false);
  std::vector<float> other(comm.rank() == 1 ? 999 : 1000);
  handles[t3] = eng.allreduce_async(m.name(t3), std::span(other), reduce_op::sum);
  eng.end_step();
  for (std::size_t t = 0; t < m.size(); ++t)
    if (t != t3) m.expect_summed(handles[t], t, comm.size(), step);
  const std::string text = what_of(handles[t3]);
  EXPECT_NE(text.find("allreduce \"t3\": count 1000 on "), std::string::npos) << text;
  EXPECT_NE(text.find(" but 999 on rank {1}"), std::string::npos) << text;
  EXPECT_THROW(handles[t3].wait(), mismatch_error);
  m.step(eng, step + 1);  // and the engine goes on
}

/// After the freeze, the last rank's step ends (end_step) without tensor t3: the ranks that submitted
/// it get a mismatch_error naming that rank at once; the last rank's log names it too; every other
/// tensor is exact, and the next step, whole again, runs.
inline void a_rank_that_skips_a_tensor_is_named_at_once(communicator& comm, const config& cfg) {
  ASSERT_GE(comm.size(), 2);
  std::mutex lines_mutex;
  std::vector<std::string> lines;
  engine eng(comm, cfg, [&](std::string_view line) {
    std::lock_guard lock(lines_mutex);
    lines.emplace_back(line);
  });
  stepped_tensors m(plan_counts());
  m.warm_up(eng);
  const int p = comm.size(), last = p - 1;
  const std::size_t t3 = 3;
  const int step = warm_steps;
  const auto start = clock::now();
  const std::vector<handle> handles =
      m.submit(eng, step, comm.rank() == last ? std::set<std::size_t>{t3} : std::set<std::size_t>{});
  for (std::size_t t = 0; t < m.size(); ++t)
    if (t != t3) m.expect_summed(handles[t], t, p, step);
  const std::string skipper = "rank {" + std::to_string(last) + "} ended the step without it (engine::end_step)";
  const std::string which = "allreduce \"t3\" (step " + std::to_string(step) + "): submitted by rank";
  if (comm.rank() != last) {
    const std::string text = what_of(handles[t3]);
    EXPECT_NE(text.find(which), std::string::npos) << text;
    EXPECT_NE(text.find(skipper), std::string::npos) << text;
    EXPECT_THROW(handles[t3].wait(), mismatch_error);
    EXPECT_LT(clock::now() - start, std::chrono::milliseconds(500) + cfg.plan_patience / 2)
        << "named at the end of the step, not after the plan's patience";
  }
  m.step(eng, step + 1);
  if (comm.rank() == last) {
    std::lock_guard lock(lines_mutex);
    const bool named = std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
      return l.find(which) != std::string::npos && l.find(skipper) != std::string::npos;
    });
    EXPECT_TRUE(named) << "the rank that skipped t3 is told, in its log (" << lines.size() << " lines)";
  }
}

/// After the freeze, no rank submits tensor t3 any more (its parameter is frozen): with end_step the
/// others run at once, without it after the plan's patience; never an error, every result exact; the
/// steps without t3 are frozen in turn.
inline void a_tensor_no_rank_submits_is_left_out(communicator& comm, const config& cfg, bool end) {
  engine eng(comm, cfg);
  stepped_tensors m(plan_counts());
  m.warm_up(eng);
  const std::size_t t3 = 3;
  for (int step = warm_steps; step < 2 * warm_steps + 2; ++step) {
    const auto start = clock::now();
    const std::vector<handle> handles = m.submit(eng, step, {t3}, end);
    for (std::size_t t = 0; t < m.size(); ++t)
      if (t != t3) m.expect_summed(handles[t], t, comm.size(), step);
    if (step == warm_steps && end) {
      EXPECT_LT(clock::now() - start, std::chrono::milliseconds(500) + cfg.plan_patience / 2)
          << "end_step drops the plan at once";
    }
  }
  const engine::statistics s = eng.stats();
  barrier(comm);  // every rank has read its counters before one shuts its engine down (a drop too)
  EXPECT_EQ(s.plans_dropped, 1u);
  EXPECT_EQ(s.plans_frozen, 2u);
}

/// After the freeze, rank 1 withholds tensor t3 without ending its step: after the plan's patience
/// the ranks negotiate, and the others' t3 times out (FLEXPAR_STALL_SHUTDOWN_S) naming rank 1; every
/// other tensor is exact; no hang.
inline void a_withheld_tensor_times_out_after_the_patience(communicator& comm, const config& cfg) {
  ASSERT_GE(comm.size(), 2);
  engine eng(comm, cfg);
  stepped_tensors m(plan_counts());
  m.warm_up(eng);
  const std::size_t t3 = 3;
  const int step = warm_steps;
  const auto start = clock::now();
  const std::vector<handle> handles =
      m.submit(eng, step, comm.rank() == 1 ? std::set<std::size_t>{t3} : std::set<std::size_t>{}, false);
  for (std::size_t t = 0; t < m.size(); ++t)
    if (t != t3) m.expect_summed(handles[t], t, comm.size(), step);
  if (comm.rank() != 1) {
    const std::string text = what_of(handles[t3]);
    EXPECT_NE(text.find("allreduce \"t3\" (step " + std::to_string(step) + "): rank {1} did not submit it within"),
              std::string::npos)
        << text;
    EXPECT_THROW(handles[t3].wait(), timeout_error);
    EXPECT_GE(clock::now() - start, cfg.stall_shutdown);
  }
  // Rank 1 comes back once the others have their timeout (its next t3 would otherwise pair with theirs).
  barrier(comm);
  m.step(eng, step + 1);
}

/// Quiet (lib/engine/engine.cpp): once nothing is outstanding, no rank's engine runs a cycle or a
/// round (it makes no call into the transport), negotiating or under a plan; a rank that comes back
/// long after the others, later than config::timeout, still meets them (the wait after quiet has no
/// deadline but stall_shutdown): rank 0 late (the others wait for its answer) and the last rank late
/// (rank 0 counts it as reporting nothing until it comes). `cfg.timeout` must be short (the test
/// sleeps past it).
inline void quiet_engines_sleep_and_wait_past_the_timeout(communicator& comm, const config& cfg) {
  std::vector<float> v(37);
  stepped_tensors m(plan_counts());
  engine eng(comm, cfg);  // after the buffers: on an error, its shutdown still finds them
  const int p = comm.size();
  const auto past_timeout = p > 1 ? cfg.timeout * 2 : cfg.timeout * 0;  // one rank has nobody to wait for
  const deadline patient = deadline_after(std::chrono::seconds(60));    // handle::wait's own is cfg.timeout
  const auto idle = [&](std::string_view where) {
    // Every rank's last list (or round) said quiet; give the threads time to reach their sleep.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const engine::statistics before = eng.stats();
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    const engine::statistics after = eng.stats();
    EXPECT_EQ(after.cycles, before.cycles) << where << ": cycles ran while nothing was outstanding";
    EXPECT_EQ(after.plan_rounds, before.plan_rounds) << where << ": rounds ran while nothing was outstanding";
  };
  for (int late : {0, p - 1}) {
    std::fill(v.begin(), v.end(), static_cast<float>(comm.rank() + 1));
    eng.allreduce_async("before", std::span(v), reduce_op::sum).wait();
    ASSERT_EQ(v[0], static_cast<float>(p * (p + 1) / 2));
    idle("negotiating");
    if (comm.rank() == late) std::this_thread::sleep_for(past_timeout);
    std::fill(v.begin(), v.end(), static_cast<float>(comm.rank() + 1));
    eng.allreduce_async("late", std::span(v), reduce_op::sum).wait(patient);
    ASSERT_EQ(v[36], static_cast<float>(p * (p + 1) / 2)) << "late rank " << late;
  }
  // Under a plan: quiet between steps, and a late rank's step still meets the others'.
  m.warm_up(eng);
  ASSERT_GE(eng.stats().plans_frozen, 1u);
  const std::size_t dropped = eng.stats().plans_dropped;
  int step = warm_steps;
  for (int late : {0, p - 1}) {
    idle("under a plan");
    if (comm.rank() == late) std::this_thread::sleep_for(past_timeout);
    const std::vector<handle> handles = m.submit(eng, step);
    for (std::size_t t = 0; t < m.size(); ++t) {
      handles[t].wait(patient);
      m.expect_summed(handles[t], t, p, step);
    }
    ++step;
  }
  EXPECT_EQ(eng.stats().plans_dropped, dropped) << "quiet dropped the plan";
  m.step(eng, step);
}

}  // namespace flexpar::testing_support
