// lib/engine/stall_inspector.cpp — stalled tensors: warned about, then timed out (step 3).
#include "stall_inspector.hpp"

#include <flexpar/core/error.hpp>

namespace flexpar::detail {

stall_findings stall_inspector::inspect(tensor_table& table, const std::vector<bool>& joined,
                                        clock::time_point now) const {
  stall_findings found;
  for (auto& [key, t] : table) {
    const std::string& name = key.name;
    std::vector<int> missing = missing_ranks(t, joined);
    if (missing.empty()) continue;
    std::vector<int> have;
    for (std::size_t r = 0; r < t.by_rank.size(); ++r)
      if (t.by_rank[r]) have.push_back(static_cast<int>(r));
    if (have.empty()) continue;  // only skipped so far: no rank waits for it
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - t.first_seen);
    const std::string kind(name_of(t.by_rank[static_cast<std::size_t>(have.front())]->kind));
    if (shutdown_.count() > 0 && waited >= shutdown_) {
      std::string text = kind + " \"" + name + "\"" + step_text(key.step) + ": " + rank_set(missing) +
                         " did not submit it within " + seconds_text(shutdown_) + " (FLEXPAR_STALL_SHUTDOWN_S); " +
                         rank_set(have) + " had submitted it";
      found.timeouts.push_back({name, key.step, std::move(missing), std::move(text)});
    } else if (now - t.last_warning >= warning_) {
      t.last_warning = now;
      std::string text = "stall: " + kind + " \"" + name + "\"" + step_text(key.step) + " submitted by " +
                         rank_set(have) + " has waited " + seconds_text(waited) + " for " + rank_set(missing) +
                         " (FLEXPAR_STALL_WARNING_S)";
      found.warnings.push_back({name, key.step, std::move(missing), std::move(text)});
    }
  }
  return found;
}

}  // namespace flexpar::detail
