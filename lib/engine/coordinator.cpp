// lib/engine/coordinator.cpp — steps 2–4 on rank 0: the table, the decisions, the response list.
#include "coordinator.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include <flexpar/core/error.hpp>

namespace flexpar::detail {
namespace {

/// Compares one field across the ranks that have the tensor; a difference is a mismatch text naming
/// each value and its ranks ("allreduce \"w\": count 4 on ranks {0,2} but 8 on rank {1}").
template <class ValueOf, class Print>
std::optional<std::string> differs(const std::string& name, const table_row& t, std::span<const int> present,
                                   std::string_view field, ValueOf value_of, Print print) {
  const description& first = *t.by_rank[static_cast<std::size_t>(present.front())];
  std::vector<std::pair<decltype(value_of(first)), std::vector<int>>> groups;
  for (int k : present) {
    const auto v = value_of(*t.by_rank[static_cast<std::size_t>(k)]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
    if (it == groups.end())
      groups.push_back({v, {k}});
    else
      it->second.push_back(k);
  }
  if (groups.size() == 1) return std::nullopt;
  std::string text = std::string(name_of(first.kind)) + " \"" + name + "\": " + std::string(field) + " ";
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (g > 0) text += g + 1 == groups.size() ? " but " : ", ";
    text += print(groups[g].first) + " on " + rank_set(groups[g].second);
  }
  return text;
}

/// The first field that the ranks holding the tensor disagree on, as a mismatch text.
std::optional<std::string> mismatch_of(const std::string& name, const table_row& t, std::span<const int> present) {
  const description& first = *t.by_rank[static_cast<std::size_t>(present.front())];
  if (auto m = differs(
          name, t, present, "collective", [](const description& d) { return d.kind; },
          [](collective_kind k) { return std::string(name_of(k)); })) {
    // A different collective under one name: name the tensor without a collective in front.
    return "tensor \"" + name + "\": " + m->substr(m->find(": ") + 2);
  }
  if (auto m = differs(
          name, t, present, "dtype", [](const description& d) { return d.type; },
          [](dtype x) { return std::string(name_of(x)); }))
    return m;
  if (auto m = differs(
          name, t, present, "memory", [](const description& d) { return d.memory; },
          [](memory_kind k) { return std::string(name_of(k)); }))
    return m;
  if (first.kind != collective_kind::allgather)
    if (auto m = differs(
            name, t, present, "count", [](const description& d) { return d.count; },
            [](std::uint64_t c) { return std::to_string(c); }))
      return m;
  if (first.kind == collective_kind::allreduce || first.kind == collective_kind::reduce_scatter)
    if (auto m = differs(
            name, t, present, "op", [](const description& d) { return d.op; },
            [](reduce_op o) { return std::string(name_of(o)); }))
      return m;
  if (first.kind == collective_kind::broadcast)
    return differs(
        name, t, present, "root", [](const description& d) { return d.root; },
        [](std::int32_t root) { return std::to_string(root); });
  return std::nullopt;
}

/// What makes a tensor the ranks agree on impossible to run (a usage error), if anything.
std::optional<std::string> misuse_of(const std::string& name, const table_row& t, const description& first,
                                     bool any_joined, int p) {
  if (first.kind == collective_kind::broadcast) {
    if (first.root < 0 || first.root >= p)
      return "broadcast \"" + name + "\": root " + std::to_string(first.root) + " is outside the " + std::to_string(p) +
             " ranks";
    if (!t.by_rank[static_cast<std::size_t>(first.root)])
      return "broadcast \"" + name + "\": its root, rank " + std::to_string(first.root) +
             ", has joined and has no data to send";
  }
  if (any_joined && first.kind != collective_kind::allreduce && first.kind != collective_kind::broadcast)
    return std::string(name_of(first.kind)) + " \"" + name +
           "\" cannot run while a rank has joined (only allreduce and broadcast can)";
  if (first.kind == collective_kind::alltoall && first.count % static_cast<std::uint64_t>(p) != 0)
    return "alltoall \"" + name + "\": count " + std::to_string(first.count) + " is not divisible by the " +
           std::to_string(p) + " ranks";
  return std::nullopt;
}

response error_response(const tensor_key& key, error_kind kind, std::string text) {
  response r;
  r.type = response_type::error;
  r.name = key.name;
  r.step = key.step;
  r.error = kind;
  r.text = std::move(text);
  return r;
}

}  // namespace

coordinator::coordinator(int ranks, const response_cache& cache, stall_inspector stalls, log_sink log, timeline* marks,
                         std::optional<plan_recorder> recorder)
    : ranks_(ranks),
      cache_(cache),
      stalls_(stalls),
      log_(std::move(log)),
      marks_(marks),
      joined_ranks_(static_cast<std::size_t>(ranks), false),
      shutdown_ranks_(static_cast<std::size_t>(ranks), false),
      recorder_(std::move(recorder)) {}

response_list coordinator::coordinate(std::span<const report> reports, clock::time_point now, bool all_reported) {
  // Step 2: merge the reports into the table.
  bool all_shutdown = true;
  const std::vector<std::uint32_t> ready = ready_by_slot(reports, now);
  for (int r = 0; r < ranks_; ++r) {
    merge(r, reports[static_cast<std::size_t>(r)], now);
    all_shutdown = all_shutdown && shutdown_ranks_[static_cast<std::size_t>(r)];
  }
  const bool all_joined = std::all_of(joined_ranks_.begin(), joined_ranks_.end(), [](bool j) { return j; });

  // Step 3: complete tensors, in the order they were first seen; stalls.
  std::vector<std::pair<std::uint64_t, tensor_key>> complete;
  for (const auto& [key, t] : table_)
    if (missing_ranks(t, joined_ranks_).empty()) complete.emplace_back(t.order, key);
  std::sort(complete.begin(), complete.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  stall_findings stalled = stalls_.inspect(table_, joined_ranks_, now);
  for (const stall_notice& w : stalled.warnings) log_(w.text);
  for (const stall_notice& s : stalled.timeouts) table_.erase(tensor_key(s.name, s.step));
  // Rows of skips alone, still lacking a rank, nobody waits for: they keep a late submission of that
  // step from pairing with the next step's (the step tells them apart) for a warning interval.
  std::erase_if(table_, [&](const auto& row) {
    return skips_only(row.second) && !missing_ranks(row.second, joined_ranks_).empty() &&
           now - row.second.first_seen >= stalls_.warning();
  });

  response_list out;
  out.all_joined = all_joined;
  out.all_shutdown = all_shutdown;
  out.last_joined = all_joined ? last_joined_rank_ : -1;
  for (auto& [order, key] : complete) {
    if (std::optional<response> r = decide(key, table_.at(key))) out.responses.push_back(std::move(*r));
    table_.erase(key);
  }
  for (const std::uint32_t slot : ready) {
    response& r = out.responses.emplace_back();
    r.type = response_type::run_cached;
    r.step = slot_step_[slot];
    r.slot = slot;
  }
  for (stall_notice& s : stalled.timeouts)
    out.responses.push_back(error_response(tensor_key(s.name, s.step), error_kind::timeout, std::move(s.text)));
  if (all_joined) std::fill(joined_ranks_.begin(), joined_ranks_.end(), false);
  // Nothing pending anywhere: every tensor a rank reported has been answered, and no rank is joined
  // or leaving. The ranks go quiet after these responses; a plan proposed now is frozen at the same
  // point of every rank's submissions.
  out.quiet = std::all_of(table_.begin(), table_.end(), [](const auto& row) { return skips_only(row.second); }) &&
              !out.all_shutdown && std::none_of(joined_ranks_.begin(), joined_ranks_.end(), [](bool j) { return j; }) &&
              std::none_of(shutdown_ranks_.begin(), shutdown_ranks_.end(), [](bool d) { return d; }) &&
              std::none_of(reports.begin(), reports.end(), [](const report& r) { return r.joined; });
  if (recorder_ && all_reported) record(out);
  return out;
}

void coordinator::record(response_list& out) {
  std::vector<fusion_item> items;
  std::vector<std::optional<std::uint32_t>> slots;
  std::vector<std::uint32_t> steps;
  items.reserve(out.responses.size());
  slots.reserve(out.responses.size());
  for (const response& r : out.responses) {
    steps.push_back(r.step);
    if (r.type != response_type::run_cached) {
      items.push_back(fusion_item_of(r));
      slots.emplace_back();
      continue;
    }
    const cache_entry& c = cache_.at(r.slot);
    fusion_item x;
    x.fusable = c.desc.kind == collective_kind::allreduce;
    x.type = c.desc.type;
    x.op = c.desc.op;
    x.memory = c.desc.memory;
    x.bytes = c.counts[0] * size_of(c.desc.type);
    items.push_back(x);
    slots.emplace_back(r.slot);
  }
  if (auto plan = recorder_->observe(items, slots, steps, out.quiet)) {
    if (addresses_)
      for (std::vector<std::uint32_t>& bucket : *plan)
        std::stable_sort(bucket.begin(), bucket.end(), [&](std::uint32_t a, std::uint32_t b) {
          const auto at = [&](std::uint32_t slot) {
            return slot < addresses_->size() ? reinterpret_cast<std::uintptr_t>((*addresses_)[slot]) : 0;
          };
          return at(a) < at(b);
        });
    out.plan = std::move(*plan);
  }
}

std::vector<std::uint32_t> coordinator::ready_by_slot(std::span<const report> reports, clock::time_point now) {
  std::vector<std::uint32_t> ready;
  ready_everywhere_.assign(cache_.size(), false);
  // Only while no rank has joined: a joined rank's missing report is its identity contribution,
  // which decide() handles.
  if (std::any_of(joined_ranks_.begin(), joined_ranks_.end(), [](bool j) { return j; }) ||
      std::any_of(reports.begin(), reports.end(), [](const report& r) { return r.joined; }))
    return ready;
  slot_reports_.assign(cache_.size(), 0);
  slot_step_.assign(cache_.size(), 0);
  slot_steps_differ_.assign(cache_.size(), false);
  for (const report& r : reports)
    for (std::size_t i = 0; i < r.slots.size(); ++i) {
      const std::uint32_t slot = r.slots[i];
      if (slot >= slot_reports_.size()) continue;
      const std::uint32_t step = r.slot_steps.empty() ? 0 : r.slot_steps[i];
      if (slot_reports_[slot]++ == 0)
        slot_step_[slot] = step;
      else if (slot_step_[slot] != step)
        slot_steps_differ_[slot] = true;  // of two steps: the table compares them
    }
  for (const std::uint32_t slot : reports[0].slots) {
    if (slot >= slot_reports_.size() || slot_reports_[slot] != static_cast<std::uint32_t>(ranks_) ||
        slot_steps_differ_[slot])
      continue;
    const cache_entry& c = cache_.at(slot);
    if (table_.contains(tensor_key(c.name, slot_step_[slot]))) continue;  // reported in full, or in an earlier cycle
    ready_everywhere_[slot] = true;
    ready.push_back(slot);
    if (marks_)
      for (int rank = 0; rank < ranks_; ++rank) marks_->mark(c.name, "READY rank " + std::to_string(rank), now);
  }
  return ready;
}

void coordinator::merge(int rank, const report& in, clock::time_point now) {
  const auto r = static_cast<std::size_t>(rank);
  if (in.joined && !joined_ranks_[r]) {
    joined_ranks_[r] = true;
    last_joined_rank_ = rank;
  }
  shutdown_ranks_[r] = in.shutting_down;
  for (const skipped_tensor& x : in.skipped) row(tensor_key(cache_.at(x.slot).name, x.step), now).skipped[r] = true;
  for (std::size_t i = 0; i < in.slots.size(); ++i) {
    const std::uint32_t slot = in.slots[i];
    if (slot < ready_everywhere_.size() && ready_everywhere_[slot]) continue;  // answered by ready_by_slot
    const cache_entry& c = cache_.at(slot);
    description d = c.desc;
    d.count = c.counts[r];
    d.step = in.slot_steps.empty() ? 0 : in.slot_steps[i];
    table_row& t = row(tensor_key(c.name, d.step), now);
    t.by_rank[r] = d;
    t.by_slot[r] = true;
    t.slot = slot;
    if (marks_) marks_->mark(c.name, "READY rank " + std::to_string(rank), now);
  }
  for (const reported_tensor& f : in.full) {
    row(tensor_key(f.name, f.desc.step), now).by_rank[r] = f.desc;
    if (marks_) marks_->mark(f.name, "READY rank " + std::to_string(rank), now);
  }
}

table_row& coordinator::row(const tensor_key& key, clock::time_point now) {
  auto [it, inserted] = table_.try_emplace(key);
  if (inserted) {
    it->second.by_rank.resize(static_cast<std::size_t>(ranks_));
    it->second.by_slot.assign(static_cast<std::size_t>(ranks_), false);
    it->second.skipped.assign(static_cast<std::size_t>(ranks_), false);
    it->second.first_seen = it->second.last_warning = now;
    it->second.order = next_order_++;
  }
  return it->second;
}

/// Step 3 for one complete tensor: run it, or say why not (nothing: every rank skipped it).
std::optional<response> coordinator::decide(const tensor_key& key, const table_row& t) const {
  const std::string& name = key.name;
  std::vector<int> present, skipping;
  bool any_joined = false;
  for (int k = 0; k < ranks_; ++k) {
    if (t.by_rank[static_cast<std::size_t>(k)])
      present.push_back(k);
    else if (t.skipped[static_cast<std::size_t>(k)])
      skipping.push_back(k);
    else
      any_joined = true;
  }
  if (!skipping.empty()) {
    if (present.empty()) return std::nullopt;  // no rank has it this step (a frozen parameter)
    const description& d = *t.by_rank[static_cast<std::size_t>(present.front())];
    return error_response(key, error_kind::mismatch,
                          std::string(name_of(d.kind)) + " \"" + name + "\"" + step_text(key.step) + ": submitted by " +
                              rank_set(present) + " but " + rank_set(skipping) +
                              " ended the step without it (engine::end_step): the ranks' steps differ");
  }
  response r;
  r.name = name;
  r.step = key.step;
  // Steady state: every rank reported the cache slot, so the descriptions are the cached one and
  // agree by construction; nothing to compare.
  if (!any_joined && t.slot && std::all_of(t.by_slot.begin(), t.by_slot.end(), [](bool b) { return b; })) {
    r.type = response_type::run_cached;
    r.slot = *t.slot;
    return r;
  }
  const description& first = *t.by_rank[static_cast<std::size_t>(present.front())];
  if (auto text = mismatch_of(name, t, present)) return error_response(key, error_kind::mismatch, std::move(*text));
  if (auto text = misuse_of(name, t, first, any_joined, ranks_))
    return error_response(key, error_kind::usage, std::move(*text));
  // Run it: by slot when every rank that has it reported the same slot.
  const bool by_slot = t.slot && std::all_of(present.begin(), present.end(),
                                             [&](int k) { return t.by_slot[static_cast<std::size_t>(k)]; });
  r.desc = first;
  r.counts.resize(static_cast<std::size_t>(ranks_));
  for (int k = 0; k < ranks_; ++k) {
    const auto& d = t.by_rank[static_cast<std::size_t>(k)];
    r.counts[static_cast<std::size_t>(k)] = d ? d->count : first.count;
  }
  r.type = by_slot ? response_type::run_cached : response_type::run_full;
  if (by_slot) r.slot = *t.slot;
  return r;
}

}  // namespace flexpar::detail
