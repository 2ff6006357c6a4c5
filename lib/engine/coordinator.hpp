// lib/engine/coordinator.hpp — rank 0's part of the protocol, steps 2–4 of
// include/flexpar/engine/engine.hpp: merges every rank's report into its table of tensors, decides
// for each tensor every rank now has (run it, or why not), asks the stall inspector about the others,
// and returns the response list every rank runs. No thread and no transport: the engine hands it the
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
#include "tensor_table.hpp"

namespace flexpar::detail {

class coordinator {
 public:
  /// `cache` is rank 0's response cache (reports name tensors by its slots); `log` receives the stall
  /// warnings; `marks` (may be null) gets a "READY rank r" mark per tensor and rank. `cache` and
  /// `marks` must outlive the coordinator.
  coordinator(int ranks, const response_cache& cache, stall_inspector stalls, log_sink log, timeline* marks);

  /// One cycle: `reports[r]` is rank r's report, `now` the time it is handled at. Complete tensors
  /// come first, in the order they were first seen, then the cache slots every rank reported this
  /// cycle (in rank 0's order; no table row: the steady state costs a count per slot), then the
  /// stalled ones that timed out.
  response_list coordinate(std::span<const report> reports, clock::time_point now);

 private:
  /// The cache slots every rank reported this cycle, in rank 0's order, for names without a row;
  /// marks them in ready_everywhere_ so that merge() skips them.
  std::vector<std::uint32_t> ready_by_slot(std::span<const report> reports, clock::time_point now);
  void merge(int rank, const report& in, clock::time_point now);
  table_row& row(const std::string& name, clock::time_point now);
  response decide(const std::string& name, const table_row& t) const;

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
  std::vector<bool> ready_everywhere_;       // per cache slot: answered by ready_by_slot this cycle
};

}  // namespace flexpar::detail
