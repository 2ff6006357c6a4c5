// lib/engine/stall_inspector.hpp — the stall half of step 3 (include/flexpar/engine/engine.hpp):
// tensors that some ranks submitted and others have not. Past `stall_warning` the coordinator logs
// them with the ranks missing (again every `stall_warning`); past `stall_shutdown` they get the
// response "timeout" on the ranks that submitted them, so that no rank waits forever for a tensor a
// peer will never submit.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "tensor_table.hpp"

namespace flexpar::detail {

/// A stalled tensor: its name, the ranks it waits for, and the text to log or to answer with.
struct stall_notice {
  std::string name;
  std::uint32_t step = 0;
  std::vector<int> missing;
  std::string text;
};

struct stall_findings {
  std::vector<stall_notice> warnings;  // log now
  std::vector<stall_notice> timeouts;  // answer "timeout" and drop from the table
};

class stall_inspector {
 public:
  /// `shutdown` 0: tensors never time out.
  stall_inspector(std::chrono::milliseconds warning, std::chrono::milliseconds shutdown)
      : warning_(warning), shutdown_(shutdown) {}

  /// Looks at every tensor of `table` that a rank lacks (`joined` ranks lack none) at `now`. A warned
  /// tensor's row remembers when, so that the next warning comes a `warning` interval later; the
  /// table keeps its rows (the caller drops the timed-out ones).
  stall_findings inspect(tensor_table& table, const std::vector<bool>& joined, clock::time_point now) const;

  /// The warning interval (stall_warning).
  [[nodiscard]] std::chrono::milliseconds warning() const noexcept { return warning_; }

 private:
  std::chrono::milliseconds warning_, shutdown_;
};

}  // namespace flexpar::detail
