// lib/engine/fused_executor.cpp — step 5: the fusion plan, the host runs (fused or alone) and the
// device runs.
#include "fused_executor.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <thread>

#include "collective_calls.hpp"

namespace flexpar::detail {
namespace {

/// An error of one handle that leaves the ranks in step (the collective itself completed).
struct local_failure : usage_error {
  explicit local_failure(const usage_error& e) : usage_error(e) {}
};

}  // namespace

std::vector<std::vector<std::size_t>> plan_fusion(std::span<const fusion_item> list, std::size_t fusion_threshold) {
  std::vector<std::vector<std::size_t>> runs;
  std::vector<bool> taken(list.size(), false);
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (taken[i]) continue;
    const fusion_item& r = list[i];
    std::vector<std::size_t>& run = runs.emplace_back(1, i);
    if (!r.fusable || fusion_threshold == 0) continue;
    std::size_t bytes = r.bytes;
    for (std::size_t j = i + 1; j < list.size(); ++j) {
      const fusion_item& q = list[j];
      if (taken[j] || !q.fusable || q.type != r.type || q.op != r.op || q.memory != r.memory) continue;
      if (bytes + q.bytes > fusion_threshold) continue;
      bytes += q.bytes;
      run.push_back(j);
      taken[j] = true;
    }
  }
  return runs;
}

fusion_item fusion_item_of(const response& r) {
  fusion_item x;
  x.fusable = r.type != response_type::error && r.desc.kind == collective_kind::allreduce;
  if (r.type == response_type::error) return x;
  x.type = r.desc.type;
  x.op = r.desc.op;
  x.memory = r.desc.memory;
  x.bytes = r.counts.empty() ? 0 : r.counts[0] * size_of(r.desc.type);
  return x;
}

std::vector<std::vector<std::size_t>> plan_fusion(std::span<const response> list, std::size_t fusion_threshold) {
  std::vector<fusion_item> items;
  items.reserve(list.size());
  for (const response& r : list) items.push_back(fusion_item_of(r));
  return plan_fusion(std::span<const fusion_item>(items), fusion_threshold);
}

fused_executor::fused_executor(communicator& comm, std::size_t fusion_threshold, device_backend* device,
                               timeline* trace, owner& to)
    : comm_(comm), fusion_threshold_(fusion_threshold), device_(device), trace_(trace), owner_(to) {}

void fused_executor::execute(std::span<const response> list, clock::time_point responded) {
  for (const std::vector<std::size_t>& run : plan_fusion(list, fusion_threshold_)) {
    if (list[run.front()].type == response_type::error) {
      fail_one(list[run.front()]);
      continue;
    }
    const response_run group{list, run};
    std::vector<std::shared_ptr<engine_entry>> entries;  // null where this rank has joined
    entries.reserve(group.size());
    for (std::size_t k = 0; k < group.size(); ++k) entries.push_back(owner_.take(group[k].name));
    this->run(group, std::move(entries), responded);
  }
}

void fused_executor::fail_one(const response& r) {
  const std::shared_ptr<engine_entry> entry = owner_.take(r.name, r.step);
  if (!entry) {
    owner_.note(r.text + " (this rank has no such tensor in flight)");
    return;
  }
  std::exception_ptr e;
  const std::string text = error_text(comm_.rank(), "", r.text);
  switch (r.error) {
    case error_kind::mismatch: e = std::make_exception_ptr(mismatch_error(text)); break;
    case error_kind::timeout: e = std::make_exception_ptr(timeout_error(text)); break;
    case error_kind::usage: e = std::make_exception_ptr(usage_error(text)); break;
  }
  const std::size_t no_result = 0;
  owner_.complete(std::span(&entry, 1), e, std::span(&no_result, 1));
}

/// Runs one response alone, or several fused allreduces through the fusion buffer.
void fused_executor::run(response_run group, std::vector<std::shared_ptr<engine_entry>> entries,
                         clock::time_point responded) {
  const std::size_t me = static_cast<std::size_t>(comm_.rank());
  for (const auto& e : entries)
    if (e) e->responded = responded;
  if (group.front().desc.memory == memory_kind::cuda) return run_device_group(group, std::move(entries));
  const clock::time_point begin = clock::now();
  const response& first = group.front();
  std::exception_ptr failure;
  std::size_t result_count = first.counts[me];
  phase_times times{begin, begin};
  std::string algorithm_name;
  bool local = false;
  try {
    if (group.size() > 1 || (!entries[0] && first.desc.kind == collective_kind::allreduce)) {
      // Fused (or a joined rank's identity contribution): through the fusion buffer.
      algorithm_name = run_fused(group, entries, times);
    } else {
      algorithm_name = run_single(first, entries[0].get(), result_count);
      times.reduced = clock::now();
    }
    owner_.ran(group.size());
  } catch (const local_failure&) {
    failure = std::current_exception();
    local = true;
  } catch (...) {
    failure = std::current_exception();
  }
  const clock::time_point end = clock::now();
  std::vector<std::size_t> counts;
  counts.reserve(group.size());
  for (std::size_t k = 0; k < group.size(); ++k) {
    counts.push_back(group.size() > 1 ? group[k].counts[me] : result_count);
    if (!entries[k]) continue;
    engine_entry& e = *entries[k];
    e.exec_begin = begin;
    e.copied_in = times.copied_in;
    e.reduced = times.reduced;
    e.copied_out = end;
    if (trace_) record(e, group.size(), times.packed, algorithm_name);
  }
  owner_.complete(entries, failure, counts);
  // A collective that failed (not just one handle's output) leaves the ranks out of step: stop.
  if (failure && !local) std::rethrow_exception(failure);
}

/// Reduces the group with one allreduce: in place where the tensors lie back to back (each in place),
/// straight from and into them where the chosen algorithm takes pieces (shared_memory), otherwise
/// through the fusion buffer (the inputs, or the identity where this rank has joined, packed; the
/// results unpacked). The algorithm is chosen from the group alone (its bytes, one tensor or
/// several), so that every rank runs the same one however its tensors lie.
std::string fused_executor::run_fused(response_run group, std::span<const std::shared_ptr<engine_entry>> entries,
                                      phase_times& times) {
  const std::size_t me = static_cast<std::size_t>(comm_.rank());
  const response& first = group.front();
  const dtype type = first.desc.type;
  const std::size_t element = size_of(type);
  std::size_t total = 0;
  for (std::size_t k = 0; k < group.size(); ++k) total += group[k].counts[me] * element;
  if (comm_.size() == 1) {  // one rank: every tensor is its own result
    for (std::size_t k = 0; k < group.size(); ++k) {
      const std::size_t bytes = group[k].counts[me] * element;
      if (entries[k] && bytes != 0 && entries[k]->in.data() != entries[k]->out.data())
        std::memcpy(entries[k]->out.data(), entries[k]->in.data(), bytes);
    }
    times.reduced = clock::now();
    return "none (one rank)";
  }
  const algorithm a = group.size() > 1 ? choose_fused_allreduce(comm_, total) : choose_allreduce(comm_, total);
  if (std::all_of(entries.begin(), entries.end(), [](const auto& e) { return e != nullptr; })) {
    // Tensors that lie back to back, each in place, in the group's order (gradients in one flat
    // buffer: gradient_sync's arena) are the fusion buffer already. Their elements line up with a
    // packed run's, so ranks may differ in this.
    bool back_to_back = true;
    for (std::size_t k = 0; back_to_back && k < group.size(); ++k)
      back_to_back =
          entries[k]->in.data() == entries[k]->out.data() &&
          (k == 0 || entries[k]->out.data() == entries[k - 1]->out.data() + group[k - 1].counts[me] * element);
    if (back_to_back) {
      std::string name = run_allreduce(comm_, type, entries[0]->out.data(), total / element, first.desc.op, a);
      times.reduced = clock::now();
      return name;
    }
    if (a == algorithm::shared_memory) {
      std::vector<byte_piece> pieces;
      pieces.reserve(group.size());
      for (std::size_t k = 0; k < group.size(); ++k)
        pieces.push_back({entries[k]->in.data(), entries[k]->out.data(), group[k].counts[me]});
      std::string name = run_allreduce_pieces(comm_, type, pieces, first.desc.op);
      times.reduced = clock::now();
      return name;
    }
  }
  times.packed = true;
  if (fusion_.size() < total) fusion_.resize(std::max(total, std::min(fusion_threshold_, std::size_t{64} << 20)));
  std::size_t at = 0;
  for (std::size_t k = 0; k < group.size(); ++k) {
    const std::size_t bytes = group[k].counts[me] * element;
    if (entries[k]) {
      // data() of an empty span may be null, which memcpy may not be given even for 0 bytes
      if (bytes != 0) std::memcpy(fusion_.data() + at, entries[k]->in.data(), bytes);
    } else
      fill_identity(type, first.desc.op, fusion_.data() + at, group[k].counts[me]);
    at += bytes;
  }
  times.copied_in = clock::now();
  std::string algorithm_name = run_allreduce(comm_, type, fusion_.data(), total / element, first.desc.op, a);
  times.reduced = clock::now();
  at = 0;
  for (std::size_t k = 0; k < group.size(); ++k) {
    const std::size_t bytes = group[k].counts[me] * element;
    if (entries[k] && bytes != 0) std::memcpy(entries[k]->out.data(), fusion_.data() + at, bytes);
    at += bytes;
  }
  return algorithm_name;
}

/// Hands one device response (a fused run of allreduces, or one collective) to the backend after
/// every tensor's producer; its handles complete in poll_device(). A rank that has joined takes part
/// with the identity (allreduce) or into scratch (broadcast). An output too small for the result
/// makes the backend write into scratch and fails only that handle, so that the ranks stay in step.
void fused_executor::run_device_group(response_run group, std::vector<std::shared_ptr<engine_entry>> entries) {
  const std::size_t me = static_cast<std::size_t>(comm_.rank());
  const response& first = group.front();
  if (!device_)
    throw error_on<usage_error>(comm_.rank(), "engine", name_of(first.desc.kind), " \"", first.name,
                                "\" runs on device memory on the other ranks, but this rank's engine has no device "
                                "backend");
  device_flight flight;
  std::vector<device_item> items;
  const std::size_t p = static_cast<std::size_t>(comm_.size());
  for (std::size_t k = 0; k < group.size(); ++k) {
    const std::size_t count = group[k].counts[me];
    std::size_t result = count;
    if (first.desc.kind == collective_kind::allgather) {
      result = 0;
      for (auto c : group[k].counts) result += c;
    } else if (first.desc.kind == collective_kind::reduce_scatter) {
      result = count / p + (me < count % p ? 1 : 0);
    }
    flight.result_counts.push_back(group.size() > 1 ? count : result);
    flight.local.emplace_back();
    const auto& e = entries[k];
    if (!e) {
      items.push_back({nullptr, nullptr, count, nullptr});
      continue;
    }
    void* out = e->device_out;
    if (first.desc.kind != collective_kind::allreduce && first.desc.kind != collective_kind::broadcast &&
        e->out_capacity < result) {
      flight.local.back() = std::make_exception_ptr(
          error_on<usage_error>(comm_.rank(), "", name_of(first.desc.kind), " \"", e->name, "\": the output holds ",
                                e->out_capacity, " elements but the result has ", result));
      out = nullptr;  // the backend writes into scratch
    }
    items.push_back({static_cast<const std::byte*>(e->device_in), static_cast<std::byte*>(out), count, e->ready});
  }
  const clock::time_point begin = clock::now();
  try {
    flight.end = device_->run(first.desc.kind, first.desc.type, first.desc.op, first.desc.root, items, first.counts,
                              flight.path);
  } catch (...) {
    const std::exception_ptr failure = std::current_exception();
    owner_.complete(entries, failure, flight.result_counts);
    throw;  // the ranks are out of step: the engine stops
  }
  for (const auto& e : entries) {
    if (!e) continue;
    {
      std::lock_guard lock(e->mutex);
      e->end = flight.end;
      e->enqueued = true;
      e->exec_begin = begin;
    }
    e->finished_cv.notify_all();
  }
  owner_.ran(group.size());
  flight.entries = std::move(entries);
  in_flight_.push_back(std::move(flight));
}

void fused_executor::poll_device() {
  while (!in_flight_.empty()) {
    device_flight& f = in_flight_.front();
    bool finished = false;
    std::exception_ptr failure;
    try {
      finished = device_->done(f.end);
    } catch (...) {
      failure = std::current_exception();
      finished = true;
    }
    if (!finished) return;
    const clock::time_point now = clock::now();
    if (trace_ && !failure) {
      const device_phases ph = device_->phases(f.end);
      auto before = [&](clock::time_point t, float ms) {
        return t - std::chrono::duration_cast<clock::duration>(std::chrono::duration<double, std::milli>(ms));
      };
      for (const auto& e : f.entries) {
        if (!e) continue;
        e->copied_out = now;
        e->reduced = before(now, ph.copy_out);
        e->copied_in = before(e->reduced, ph.collective);
        e->exec_begin = std::min(e->exec_begin, before(e->copied_in, ph.copy_in));
        record(*e, f.entries.size(), f.entries.size() > 1 || e->copied_in != e->exec_begin, "cuda " + f.path);
      }
    }
    for (std::size_t k = 0; k < f.entries.size(); ++k) {
      if (!f.entries[k]) continue;
      const std::exception_ptr error = failure ? failure : f.local[k];
      owner_.complete(std::span(&f.entries[k], 1), error, std::span(&f.result_counts[k], 1));
    }
    in_flight_.pop_front();
    if (failure) std::rethrow_exception(failure);
  }
}

void fused_executor::drain_device(std::chrono::milliseconds bound) {
  const deadline until = deadline_after(bound);
  while (!in_flight_.empty() && clock::now() < until) {
    poll_device();
    if (!in_flight_.empty()) std::this_thread::sleep_for(device_poll);
  }
}

/// A response that runs on its own, in place (no fusion-buffer copies).
std::string fused_executor::run_single(const response& r, engine_entry* e, std::size_t& result_count) {
  const std::size_t me = static_cast<std::size_t>(comm_.rank());
  const std::size_t element = size_of(r.desc.type);
  const std::size_t count = r.counts[me];
  switch (r.desc.kind) {
    case collective_kind::allreduce:
      if (count != 0 && e->in.data() != e->out.data()) std::memcpy(e->out.data(), e->in.data(), count * element);
      return run_allreduce(comm_, r.desc.type, e->out.data(), count, r.desc.op);
    case collective_kind::broadcast: {
      std::byte* data = e ? e->out.data() : scratch(count * element);
      return run_broadcast(comm_, r.desc.type, data, count, r.desc.root);
    }
    case collective_kind::allgather: {
      std::size_t total = 0;
      for (auto c : r.counts) total += c;
      result_count = total;
      const bool fits = e->out.size() >= total * element;
      std::byte* out = fits ? e->out.data() : scratch(total * element);
      std::vector<std::size_t> counts(r.counts.begin(), r.counts.end());
      std::string name = run_allgather(comm_, r.desc.type, e->in.data(), out, counts);
      if (!fits) throw_too_small(*e, e->out.size() / element, total);
      return name;
    }
    case collective_kind::reduce_scatter: {
      const std::size_t p = static_cast<std::size_t>(comm_.size());
      const std::size_t mine = count / p + (me < count % p ? 1 : 0);
      result_count = mine;
      const bool fits = e->out.size() >= mine * element;
      std::byte* out = fits ? e->out.data() : scratch(mine * element);
      std::string name = run_reduce_scatter(comm_, r.desc.type, e->in.data(), out, count, r.desc.op);
      if (!fits) throw_too_small(*e, e->out.size() / element, mine);
      return name;
    }
    case collective_kind::alltoall: {
      const bool fits = e->out.size() >= count * element;
      std::byte* out = fits ? e->out.data() : scratch(count * element);
      std::string name = run_alltoall(comm_, r.desc.type, e->in.data(), out, count);
      if (!fits) throw_too_small(*e, e->out.size() / element, count);
      return name;
    }
  }
  return {};
}

void fused_executor::throw_too_small(const engine_entry& e, std::size_t room, std::size_t needed) const {
  // The collective ran (into scratch) so that the other ranks finish; only this handle fails.
  throw local_failure(error_on<usage_error>(comm_.rank(), "", name_of(e.desc.kind), " \"", e.name,
                                            "\": the output holds ", room, " elements but the result has ", needed));
}

std::byte* fused_executor::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void fused_executor::record(const engine_entry& e, std::size_t fused, bool packed, const std::string& algorithm_name) {
  trace_->span(e.name, "NEGOTIATE", e.submitted, e.responded, {{"collective", std::string(name_of(e.desc.kind))}});
  trace_->span(e.name, "QUEUE", e.responded, e.exec_begin);
  if (packed) trace_->span(e.name, "MEMCPY_IN_FUSION_BUFFER", e.exec_begin, e.copied_in);
  std::string upper(name_of(e.desc.kind));
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  trace_->span(e.name, upper, e.copied_in, e.reduced,
               {{"algorithm", algorithm_name},
                {"tensors", std::to_string(fused)},
                {"dtype", std::string(name_of(e.desc.type))},
                {"count", std::to_string(e.desc.count)}});
  if (packed) trace_->span(e.name, "MEMCPY_OUT_FUSION_BUFFER", e.reduced, e.copied_out);
}

void fused_executor::abandon(std::exception_ptr error, std::chrono::milliseconds bound) {
  try {
    drain_device(bound);
  } catch (...) {
  }
  for (auto& f : in_flight_) {
    const std::vector<std::size_t> no_results(f.entries.size(), 0);
    owner_.complete(f.entries, error, no_results);
  }
  in_flight_.clear();
}

}  // namespace flexpar::detail
