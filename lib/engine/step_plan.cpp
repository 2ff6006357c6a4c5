// lib/engine/step_plan.cpp — the frozen step: the plan, a rank's slots, the round's agreement vector,
// and rank 0's recorder (step_plan.hpp).
#include "step_plan.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include <flexpar/core/error.hpp>
#include <flexpar/core/hash.hpp>

#include "response_cache.hpp"

namespace flexpar::detail {
namespace {

template <class T>
std::uint64_t hash_value(T value, std::uint64_t h) {
  char bytes[sizeof value];
  std::memcpy(bytes, &value, sizeof value);
  return fnv1a(std::string_view(bytes, sizeof value), h);
}

std::uint64_t hash_description(const description& d, std::uint64_t h) {
  h = hash_value(static_cast<std::uint8_t>(d.kind), h);
  h = hash_value(static_cast<std::uint8_t>(d.type), h);
  h = hash_value(static_cast<std::uint8_t>(d.op), h);
  h = hash_value(d.root, h);
  return hash_value(static_cast<std::uint8_t>(d.memory), h);
}

}  // namespace

// ---- the plan ------------------------------------------------------------------------------------

step_plan::step_plan(const response_cache& cache, std::span<const std::vector<std::uint32_t>> buckets, int rank)
    : rank_(rank) {
  bucket_begin_.push_back(0);
  std::size_t largest = 0;
  std::uint64_t h = fnv1a_basis;
  for (const std::vector<std::uint32_t>& bucket : buckets) {
    for (const std::uint32_t slot : bucket) {
      const cache_entry& c = cache.at(slot);
      response& r = tensors_.emplace_back();
      r.type = response_type::run_cached;
      r.slot = slot;
      r.name = c.name;
      r.desc = c.desc;
      r.counts = c.counts;
      r.desc.count = c.counts.at(static_cast<std::size_t>(rank));
      if (!index_.emplace(r.name, static_cast<std::uint32_t>(tensors_.size() - 1)).second)
        throw error_on<error>(rank, "engine protocol error", "the step plan names \"", r.name, "\" twice");
      bucket_of_.push_back(static_cast<std::uint32_t>(bucket_begin_.size() - 1));
      h = fnv1a(r.name, h);
      h = hash_description(r.desc, h);
      for (const std::uint64_t count : r.counts) h = hash_value(count, h);
    }
    largest = std::max(largest, bucket.size());
    bucket_begin_.push_back(static_cast<std::uint32_t>(tensors_.size()));
    h = hash_value(static_cast<std::uint64_t>(bucket.size()), h);
  }
  positions_.resize(largest);
  std::iota(positions_.begin(), positions_.end(), std::size_t{0});
  digest_ = h;
}

std::optional<std::uint32_t> step_plan::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? std::nullopt : std::optional(it->second);
}

std::span<const response> step_plan::bucket_tensors(std::uint32_t b) const {
  return std::span(tensors_).subspan(bucket_begin_[b], size_of_bucket(b));
}

std::span<const std::size_t> step_plan::positions(std::uint32_t b) const {
  return std::span(positions_).first(size_of_bucket(b));
}

bool step_plan::matches(std::uint32_t k, const description& d) const {
  const description& p = tensors_[k].desc;
  return p.kind == d.kind && p.type == d.type && p.op == d.op && p.root == d.root && p.memory == d.memory &&
         p.count == d.count;
}

// ---- a round's agreement vector ---------------------------------------------------------------------

std::vector<std::uint8_t> encode_round(const plan_round& mine, std::uint64_t digest) {
  const std::size_t b = mine.complete.size();
  std::vector<std::uint8_t> v(1 + 2 * b + 16, 0);
  v[0] = mine.leave ? 1 : 0;
  for (std::size_t k = 0; k < b; ++k) {
    v[1 + k] = mine.complete[k] ? 0 : 1;
    v[1 + b + k] = mine.started[k] ? 1 : 0;
  }
  for (int byte = 0; byte < 8; ++byte) {
    const auto x = static_cast<std::uint8_t>(digest >> (8 * byte));
    v[1 + 2 * b + static_cast<std::size_t>(byte)] = x;
    v[1 + 2 * b + 8 + static_cast<std::size_t>(byte)] = static_cast<std::uint8_t>(~x);
  }
  return v;
}

plan_verdict decode_round(std::span<const std::uint8_t> reduced, std::size_t buckets, std::uint64_t digest) {
  if (reduced.size() != 1 + 2 * buckets + 16)
    throw error_on<error>(no_rank, "engine protocol error", "a plan round of ", reduced.size(), " bytes for a plan of ",
                          buckets, " buckets");
  plan_verdict out;
  out.leave = reduced[0] != 0;
  out.complete_everywhere.resize(buckets);
  out.started_somewhere.resize(buckets);
  for (std::size_t k = 0; k < buckets; ++k) {
    out.complete_everywhere[k] = reduced[1 + k] == 0;
    out.started_somewhere[k] = reduced[1 + buckets + k] != 0;
  }
  for (int byte = 0; byte < 8; ++byte) {
    const auto x = static_cast<std::uint8_t>(digest >> (8 * byte));
    if (reduced[1 + 2 * buckets + static_cast<std::size_t>(byte)] != x ||
        reduced[1 + 2 * buckets + 8 + static_cast<std::size_t>(byte)] != static_cast<std::uint8_t>(~x))
      out.digest_differs = true;
  }
  return out;
}

// ---- a rank's slots -------------------------------------------------------------------------------

plan_slots::plan_slots(std::shared_ptr<const step_plan> plan)
    : plan_(std::move(plan)),
      slot_(plan_->tensors()),
      submitted_(plan_->tensors(), false),
      filled_(plan_->buckets(), 0) {}

plan_slots::placed plan_slots::place(const std::shared_ptr<engine_entry>& e, bool of_this_step) {
  const std::optional<std::uint32_t> k = plan_->find(e->name);
  if (!k || !plan_->matches(*k, e->desc) || slot_[*k]) return placed::not_in_plan;
  slot_[*k] = e;
  if (of_this_step) submitted_[*k] = true;
  e->plan_index = *k;
  const std::uint32_t b = plan_->bucket_of(*k);
  if (++filled_[b] < plan_->size_of_bucket(b)) return placed::in_slot;
  ++complete_buckets_;
  return placed::completes_bucket;
}

void plan_slots::mark(const engine_entry& e) {
  if (const std::optional<std::uint32_t> k = plan_->find(e.name); k && plan_->matches(*k, e.desc))
    submitted_[*k] = true;
}

std::uint32_t plan_slots::bucket_of(const engine_entry& e) const { return plan_->bucket_of(e.plan_index); }

std::span<const std::shared_ptr<engine_entry>> plan_slots::entries(std::uint32_t b) const {
  return std::span(slot_).subspan(plan_->first_of(b), plan_->size_of_bucket(b));
}

std::vector<std::uint32_t> plan_slots::end_step() {
  std::vector<std::uint32_t> missing;
  for (std::uint32_t k = 0; k < submitted_.size(); ++k)
    if (!submitted_[k]) missing.push_back(k);
  // A step that submitted nothing of the plan is not a step of it: a second end_step, or the end of
  // the step before the plan was frozen, which ran negotiated.
  if (missing.size() == submitted_.size()) missing.clear();
  std::fill(submitted_.begin(), submitted_.end(), false);
  return missing;
}

plan_round plan_slots::round(bool leave) const {
  plan_round r;
  r.leave = leave;
  r.complete.resize(filled_.size());
  r.started.resize(filled_.size());
  for (std::uint32_t b = 0; b < filled_.size(); ++b) {
    r.complete[b] = filled_[b] == plan_->size_of_bucket(b);
    r.started[b] = filled_[b] > 0;
  }
  return r;
}

std::vector<std::shared_ptr<engine_entry>> plan_slots::take(std::uint32_t b) {
  std::vector<std::shared_ptr<engine_entry>> out;
  out.reserve(plan_->size_of_bucket(b));
  for (std::uint32_t k = plan_->first_of(b); k < plan_->first_of(b) + plan_->size_of_bucket(b); ++k)
    out.push_back(std::move(slot_[k]));
  if (filled_[b] == plan_->size_of_bucket(b)) --complete_buckets_;
  filled_[b] = 0;
  return out;
}

std::vector<std::shared_ptr<engine_entry>> plan_slots::take_all() {
  std::vector<std::shared_ptr<engine_entry>> out;
  for (auto& e : slot_)
    if (e) out.push_back(std::move(e));
  std::fill(filled_.begin(), filled_.end(), 0);
  complete_buckets_ = 0;
  return out;
}

// ---- rank 0's recorder ----------------------------------------------------------------------------

std::optional<std::vector<std::vector<std::uint32_t>>> plan_recorder::observe(
    std::span<const fusion_item> list, std::span<const std::optional<std::uint32_t>> slots,
    std::span<const std::uint32_t> steps, bool quiet) {
  for (const std::vector<std::size_t>& run : plan_fusion(list, fusion_threshold_)) {
    // Another step, or a tensor of the step in progress again: the step is over, this run begins
    // the next one.
    const std::uint32_t its_step = steps[run.front()];
    const bool again = its_step != current_.step || std::any_of(run.begin(), run.end(), [&](std::size_t i) {
                         return slots[i] && *slots[i] < current_.has.size() && current_.has[*slots[i]];
                       });
    if (again) {
      std::sort(current_.sorted.begin(), current_.sorted.end());
      previous_ = std::move(current_);
      have_previous_ = !previous_.sorted.empty() || !previous_.clean;
      current_ = step{};
      current_.step = its_step;
    }
    std::vector<std::uint32_t>& bucket = current_.buckets.emplace_back();
    for (const std::size_t i : run) {
      if (!slots[i]) {
        current_.clean = false;
        continue;
      }
      bucket.push_back(*slots[i]);
      current_.sorted.push_back(*slots[i]);
      if (current_.has.size() <= *slots[i]) current_.has.resize(*slots[i] + 1, false);
      current_.has[*slots[i]] = true;
    }
  }
  if (!quiet || !have_previous_ || !current_.clean || !previous_.clean || current_.sorted.empty()) return std::nullopt;
  std::vector<std::uint32_t> now = current_.sorted;
  std::sort(now.begin(), now.end());
  if (now != previous_.sorted) return std::nullopt;
  std::vector<std::vector<std::uint32_t>> buckets = std::move(current_.buckets);
  reset();
  return buckets;
}

void plan_recorder::reset() {
  current_ = step{};
  previous_ = step{};
  have_previous_ = false;
}

}  // namespace flexpar::detail
