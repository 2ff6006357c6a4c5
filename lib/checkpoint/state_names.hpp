// lib/checkpoint/state_names.hpp — the first check of a save and of a load: a state names every
// tensor and integer once (a name is what ties an entry to its record in metadata.json).
#pragma once

#include <algorithm>
#include <string_view>
#include <vector>

#include <flexpar/checkpoint/state.hpp>
#include <flexpar/core/error.hpp>

namespace flexpar::checkpoint::detail {

/// @throws usage_error naming the first name `s` holds twice.
inline void check_unique_names(const state& s, int rank, std::string_view op) {
  std::vector<std::string_view> names;
  for (const entry& e : s.entries()) names.push_back(e.name);
  for (const integer_entry& i : s.integers()) names.push_back(i.name);
  std::sort(names.begin(), names.end());
  if (auto twice = std::adjacent_find(names.begin(), names.end()); twice != names.end())
    throw error_on<usage_error>(rank, op, "the state names \"", *twice, "\" twice");
}

}  // namespace flexpar::checkpoint::detail
