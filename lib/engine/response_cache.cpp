// lib/engine/response_cache.cpp — the response cache (step 6).
#include "response_cache.hpp"

#include <flexpar/core/error.hpp>

namespace flexpar::detail {

std::optional<std::uint32_t> response_cache::slot_of(const std::string& name, const description& d, int rank) const {
  auto it = slot_by_name_.find(name);
  if (it == slot_by_name_.end()) return std::nullopt;
  const cache_entry& c = entries_[it->second];
  const bool same = c.desc.kind == d.kind && c.desc.type == d.type && c.desc.op == d.op && c.desc.root == d.root &&
                    c.desc.memory == d.memory && c.counts[static_cast<std::size_t>(rank)] == d.count;
  return same ? std::optional(it->second) : std::nullopt;
}

void response_cache::remember(const response& r) {
  if (capacity_ == 0) return;
  cache_entry c{r.name, r.desc, r.counts};
  if (auto it = slot_by_name_.find(r.name); it != slot_by_name_.end()) {
    entries_[it->second] = std::move(c);
  } else if (entries_.size() < capacity_) {
    slot_by_name_.emplace(r.name, static_cast<std::uint32_t>(entries_.size()));
    entries_.push_back(std::move(c));
  }
}

const cache_entry& response_cache::at(std::uint32_t slot) const {
  if (slot >= entries_.size()) throw error_on<error>(no_rank, "engine protocol error", "cache slot ", slot, " unknown");
  return entries_[slot];
}

}  // namespace flexpar::detail
