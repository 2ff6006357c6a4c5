// lib/engine/coordinator.hpp — rank 0's part of the protocol, steps 2–4 of
// include/flexpar/engine/engine.hpp: merges every rank's report into its table of tensors, decides
// for each tensor every rank now has (run it, or why not), asks the stall inspector about the others,
// and returns the response list every rank runs; with a plan recorder, it also proposes the frozen
// plan of a step that repeated (step_plan.hpp). No thread and no transport: the engine hands it the
// decoded reports and the time, and sends what it returns.
#pragma once

#include <span>
#include <string>
#include <vector>

#include <flexpar/engine/engine.hpp>
#include <flexpar/timeline.hpp>

#include "protocol.hpp"
#include "response_cache.hpp"
#include "stall_inspector.hpp"
#include "step_plan.hpp"
#include "tensor_table.hpp"

namespace flexpar::detail {

class coordinator {
 public:
  /// `cache` is rank 0's response cache (reports name tensors by its slots); `log` receives the stall
  /// warnings; `marks` (may be null) gets a "READY rank r" mark per tensor and rank; `recorder` (may
  /// be absent: no plans) watches the response lists for a step to freeze. `cache` and `marks` must
  /// outlive the coordinator.
  coordinator(int ranks, const response_cache& cache, stall_inspector stalls, log_sink log, timeline* marks,
              std::optional<plan_recorder> recorder = std::nullopt);

  /// Where rank 0's own submissions lie, by cache slot (its engine keeps it up to date; null where
  /// unknown): a proposed plan puts each bucket's tensors in this order, so that tensors that lie
  /// back to back on rank 0 (and on every rank laid out alike) are reduced where they lie.
  void order_buckets_by(const std::vector<const void*>* addresses) noexcept { addresses_ = addresses; }

  /// One cycle: `reports[r]` is rank r's report, `now` the time it is handled at. Complete tensors
  /// come first, in the order they were first seen, then the cache slots every rank reported this
  /// cycle (in rank 0's order; no table row: the steady state costs a count per slot), then the
  /// stalled ones that timed out. A tensor that some ranks submitted and the others ended their step
  /// without (report::skipped) is a mismatch naming both; one that every rank skipped is dropped.
  /// The list says whether nothing is pending anywhere once it ran (response_list::quiet), and
  /// carries a plan to freeze when the recorder proposes one then.
  /// `all_reported` false: some ranks were quiet and sent no report (theirs are empty); the recorder
  /// then neither watches nor proposes (a plan must reach every rank).
  response_list coordinate(std::span<const report> reports, clock::time_point now, bool all_reported = true);

 private:
  /// The cache slots every rank reported this cycle, in rank 0's order, for names without a row;
  /// marks them in ready_everywhere_ so that merge() skips them.
  std::vector<std::uint32_t> ready_by_slot(std::span<const report> reports, clock::time_point now);
  void merge(int rank, const report& in, clock::time_point now);
  table_row& row(const tensor_key& key, clock::time_point now);
  std::optional<response> decide(const tensor_key& key, const table_row& t) const;
  /// The recorder's turn: `out` as it is sent, its responses by slot resolved in the cache.
  void record(response_list& out);

  int ranks_;
  const response_cache& cache_;
  stall_inspector stalls_;
  log_sink log_;
  timeline* marks_;
  tensor_table table_;  // the run order comes from table_row::order
  std::vector<bool> joined_ranks_, shutdown_ranks_;
  int last_joined_rank_ = -1;
  std::uint64_t next_order_ = 0;
  std::vector<std::uint32_t> slot_reports_;  // per cache slot: ranks that reported it this cycle
  std::vector<std::uint32_t> slot_step_;     // per cache slot: the step the first of them reported
  std::vector<bool> slot_steps_differ_;      // per cache slot: reported in two steps this cycle
  std::vector<bool> ready_everywhere_;       // per cache slot: answered by ready_by_slot this cycle
  std::optional<plan_recorder> recorder_;
  const std::vector<const void*>* addresses_ = nullptr;
};

}  // namespace flexpar::detail
