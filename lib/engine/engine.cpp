// The engine: submission queue, background thread, coordinator, fusion, timeline.
// The protocol is described step by step in include/flexpar/engine/engine.hpp; the step numbers
// below refer to it.
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/engine/engine.hpp>
#include <flexpar/timeline.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "collective_calls.hpp"
#include "coordinator.hpp"
#include "protocol.hpp"
#include "response_cache.hpp"

namespace flexpar {

std::string_view name_of(collective_kind kind) noexcept {
  switch (kind) {
    case collective_kind::allreduce: return "allreduce";
    case collective_kind::allgather: return "allgather";
    case collective_kind::broadcast: return "broadcast";
    case collective_kind::reduce_scatter: return "reduce_scatter";
    case collective_kind::alltoall: return "alltoall";
  }
  return "?";
}

namespace detail {

/// The tensors one rank has submitted and not yet seen finish, by submission order. handle::wait
/// rethrows a tensor's error only once every tensor submitted before that wait has finished: the
/// caller who unwinds on the error frees the buffers of the tensors it submitted with it, which the
/// engine may otherwise still be running (the error of one tensor is decided while the others of
/// its batch are still pending, and a caller may even submit more before it looks).
class settle_tracker {
 public:
  /// Registers a submission; returns its number.
  std::uint64_t enter(const std::string& name) {
    std::lock_guard lock(mutex_);
    in_flight_.emplace(next_, name);
    return next_++;
  }
  /// A tensor finished (successfully or not).
  void leave(std::uint64_t seq) {
    {
      std::lock_guard lock(mutex_);
      in_flight_.erase(seq);
    }
    settled_.notify_all();
  }
  /// Submissions so far.
  [[nodiscard]] std::uint64_t submitted() {
    std::lock_guard lock(mutex_);
    return next_;
  }
  /// Blocks until every tensor numbered below `limit` has finished; false at `until`, with the
  /// names of those still in flight in `names`.
  bool wait_before(std::uint64_t limit, deadline until, std::string& names) {
    std::unique_lock lock(mutex_);
    if (settled_.wait_until(lock, until, [&] { return in_flight_.empty() || in_flight_.begin()->first >= limit; }))
      return true;
    for (auto it = in_flight_.begin(); it != in_flight_.end() && it->first < limit; ++it)
      names.append(names.empty() ? "\"" : ", \"").append(it->second).append("\"");
    return false;
  }
  /// The engine's background thread (which must never wait for tensors it runs itself).
  std::atomic<std::thread::id> background;

 private:
  std::mutex mutex_;
  std::condition_variable settled_;
  std::uint64_t next_ = 0;
  std::map<std::uint64_t, std::string> in_flight_;
};

struct engine_entry {
  std::string name;
  description desc;
  std::span<const std::byte> in;
  std::span<std::byte> out;
  completion_callback done;
  std::chrono::milliseconds default_timeout{0};

  // device tensors (desc.memory == cuda): device addresses, the producer's position, and once the
  // response is enqueued the marker of its end
  const void* device_in = nullptr;
  void* device_out = nullptr;
  std::size_t out_capacity = 0;  // elements
  device_marker ready, end;
  device_backend* backend = nullptr;
  bool enqueued = false;  // under mutex; finished_cv is notified when it turns true

  std::mutex mutex;
  std::condition_variable finished_cv;
  bool finished = false;
  std::exception_ptr error;
  std::size_t result_count = 0;
  // This rank's tensors not yet finished, for handle::wait (errors wait for them: settle_tracker).
  std::shared_ptr<settle_tracker> tracker;
  std::uint64_t seq = 0;  // this tensor's place in the tracker

  // timeline
  clock::time_point submitted, responded, exec_begin, copied_in, reduced, copied_out;
};

namespace {

// ---- messages: one fixed-size first part, a second message only for long ones ------------------

constexpr std::size_t first_part = 4096;

void send_message(transport& t, int peer, tag_t tag, std::vector<std::byte>& payload, deadline until) {
  const std::uint64_t length = payload.size();
  std::vector<std::byte> head(sizeof length + std::min(payload.size(), first_part - sizeof length));
  std::memcpy(head.data(), &length, sizeof length);
  std::memcpy(head.data() + sizeof length, payload.data(), head.size() - sizeof length);
  request a = t.isend(peer, tag, head);
  request b;
  if (payload.size() > first_part - sizeof length)
    b = t.isend(peer, tag, std::span<const std::byte>(payload).subspan(first_part - sizeof length));
  a.wait(until);
  b.wait(until);
}

std::vector<std::byte> recv_message(transport& t, int peer, tag_t tag, deadline until) {
  std::vector<std::byte> head(first_part);
  const std::size_t got = t.recv(peer, tag, head, until);
  std::uint64_t length = 0;
  if (got < sizeof length) throw error("engine protocol error: a message of " + std::to_string(got) + " bytes");
  std::memcpy(&length, head.data(), sizeof length);
  std::vector<std::byte> payload(length);
  const std::size_t inline_part = std::min<std::size_t>(length, first_part - sizeof length);
  std::memcpy(payload.data(), head.data() + sizeof length, inline_part);
  if (length > inline_part) t.recv(peer, tag, std::span(payload).subspan(inline_part), until);
  return payload;
}

constexpr tag_t tag_report = 1, tag_response = 2, tag_timeline = 3;

}  // namespace

class engine_core {
 public:
  engine_core(communicator& parent, config cfg, log_sink log, device_backend* device)
      : comm_(std::move(*parent.split(0, parent.rank()))),
        cfg_(std::move(cfg)),
        log_(std::move(log)),
        device_(device),
        origin_(clock::now()) {
    if (!log_) {
      log_ = [rank = comm_.rank()](std::string_view line) {
        std::fprintf(stderr, "[flexpar rank %d] %.*s\n", rank, static_cast<int>(line.size()), line.data());
      };
    }
    if (!cfg_.timeline_path.empty()) {
      check_timeline_path();
      timeline_.emplace(comm_.rank(), origin_);
    }
    if (comm_.rank() == 0)
      coordinator_.emplace(comm_.size(), cache_, stall_inspector(cfg_.stall_warning, cfg_.stall_shutdown), log_,
                           timeline_ ? &*timeline_ : nullptr);
    thread_ = std::thread([this] { run(); });
    // Registered after comm_ (made above): at MPI_Finalize this engine stops, and writes its
    // timeline, before comm_ closes its transport (core/mpi_finalize.hpp).
    at_finalize_ = finalize_hook(comm_.at_finalize(), [this] { stop("MPI_Finalize shut the engine down"); });
  }

  ~engine_core() {
    at_finalize_ = {};
    stop("the engine shut down");
  }

  /// Collective: rank 0, which writes the timeline at the end, opens its file now (creating it when
  /// absent, keeping it otherwise), so that a path it cannot write is an error at the start on every
  /// rank, not a timeline silently missing at the end.
  /// @throws usage_error on every rank when rank 0 cannot open the file.
  void check_timeline_path() {
    std::int32_t error = 0;
    if (comm_.rank() == 0) {
      errno = 0;
      std::ofstream probe(cfg_.timeline_path, std::ios::app);
      if (!probe) error = errno != 0 ? errno : EACCES;
    }
    std::vector<std::int32_t> all(static_cast<std::size_t>(comm_.size()));
    bootstrap_allgather(comm_.transport(), std::as_bytes(std::span(&error, 1)), std::as_writable_bytes(std::span(all)),
                        comm_.default_deadline(), "engine: the timeline path check");
    if (all[0] != 0)
      throw usage_error("[rank " + std::to_string(comm_.rank()) + "] engine: the timeline file \"" +
                        cfg_.timeline_path +
                        "\" (FLEXPAR_TIMELINE) cannot be written on rank 0: " + std::strerror(all[0]));
  }

  /// The collective shutdown of the destructor (and of MPI_Finalize): the background thread
  /// negotiates it with every rank, runs what became ready meanwhile, writes the timeline and ends.
  /// Handles still pending then fail with "<reason> before every rank submitted this tensor".
  void stop(const std::string& reason) {
    {
      std::lock_guard lock(mutex_);
      if (shutdown_requested_ && !thread_.joinable()) return;
      shutdown_requested_ = true;
      shutdown_reason_ = reason;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  communicator& comm() noexcept { return comm_; }
  const config& settings() const noexcept { return cfg_; }
  device_backend* device() const noexcept { return device_; }

  handle submit(std::string name, collective_kind kind, dtype type, reduce_op op, int root,
                std::span<const std::byte> in, std::span<std::byte> out, std::size_t count, completion_callback done) {
    auto entry = std::make_shared<engine_entry>();
    entry->name = std::move(name);
    entry->desc = description{kind, type, op, root, count};
    entry->in = in;
    entry->out = out;
    entry->done = std::move(done);
    return enqueue(std::move(entry));
  }

  handle submit_device(std::string name, collective_kind kind, dtype type, reduce_op op, int root, const void* in,
                       void* out, std::size_t count, std::size_t out_capacity, device_marker ready,
                       completion_callback done) {
    if (!device_)
      throw usage_error("[rank " + std::to_string(comm_.rank()) + "] engine: " + std::string(name_of(kind)) + " \"" +
                        name +
                        "\" is a device tensor, but this engine has no device backend (build the engine with "
                        "one: flexpar::cuda::engine_backend)");
    auto entry = std::make_shared<engine_entry>();
    entry->name = std::move(name);
    entry->desc = description{kind, type, op, root, count, memory_kind::cuda};
    entry->device_in = in;
    entry->device_out = out;
    entry->out_capacity = out_capacity;
    entry->ready = std::move(ready);
    entry->backend = device_;
    entry->done = std::move(done);
    return enqueue(std::move(entry));
  }

  handle enqueue(std::shared_ptr<engine_entry> entry) {
    entry->default_timeout = cfg_.timeout;
    entry->submitted = clock::now();
    const collective_kind kind = entry->desc.kind;
    entry->tracker = tracker_;
    entry->seq = tracker_->enter(entry->name);
    handle h(entry);
    std::exception_ptr refuse;
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      if (shutdown_requested_)
        refuse = std::make_exception_ptr(usage_error("[rank " + std::to_string(comm_.rank()) +
                                                     "] engine: " + std::string(name_of(kind)) + " \"" + entry->name +
                                                     "\" submitted after " + shutdown_reason_));
      else if (failed_)
        refuse = failed_;
      else
        fresh_.push_back(entry);
      // Only the first submission while the thread sleeps wakes it; the rest join its batch.
      wake = fresh_.size() == 1 && sleeping_;
    }
    if (refuse) finish(*entry, refuse);
    if (wake) wake_.notify_all();
    return h;
  }

  int join() {
    std::unique_lock lock(mutex_);
    if (failed_) std::rethrow_exception(failed_);
    join_requested_ = true;
    join_done_ = false;
    wake_.notify_all();
    if (!join_cv_.wait_until(lock, deadline_after(cfg_.timeout), [&] { return join_done_ || failed_; }))
      // This rank stays joined (it keeps contributing the identity); the caller decides what next.
      throw timeout_error("[rank " + std::to_string(comm_.rank()) + "] engine::join: not every rank joined within " +
                          seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.timeout)) +
                          " (FLEXPAR_TIMEOUT)");
    if (!join_done_) std::rethrow_exception(failed_);
    return last_joined_;
  }

  engine::statistics stats() const {
    std::lock_guard lock(stats_mutex_);
    return stats_;
  }

  static void finish(engine_entry& e, std::exception_ptr error, std::size_t result_count = 0) {
    {
      std::lock_guard lock(e.mutex);
      if (e.finished) return;
      e.error = std::move(error);
      e.result_count = result_count;
      e.finished = true;
    }
    e.finished_cv.notify_all();
    e.tracker->leave(e.seq);
  }

 private:
  // ---- the background thread ---------------------------------------------------------------------

  void run() {
    tracker_->background.store(std::this_thread::get_id());
    try {
      clock::time_point next = clock::now();
      for (;;) {
        next += cfg_.cycle_time;
        if (const auto now = clock::now(); next < now) next = now;
        std::vector<std::shared_ptr<engine_entry>> fresh;
        bool shutting_down = false;
        {
          // A cycle starts at its time or at the first submission, whichever comes first, and
          // takes everything submitted until submissions pause for a twentieth of the cycle time
          // (a burst of gradients is fused into one batch, a lone tensor waits little).
          std::unique_lock lock(mutex_);
          sleeping_ = true;
          // While device responses are in flight, wake every poll interval to complete them.
          while (!wake_.wait_until(lock, in_flight_.empty() ? next : std::min(next, clock::now() + device_poll), [&] {
            return !fresh_.empty() || shutdown_requested_ || (join_requested_ && !joined_);
          })) {
            if (clock::now() >= next) break;
            lock.unlock();
            poll_device();
            lock.lock();
          }
          const auto quiet = cfg_.cycle_time / 20;
          for (std::size_t seen = fresh_.size(); seen > 0 && clock::now() < next;) {
            wake_.wait_until(lock, std::min(next, clock::now() + quiet), [&] { return shutdown_requested_; });
            if (fresh_.size() == seen || shutdown_requested_) break;
            seen = fresh_.size();
          }
          sleeping_ = false;
          fresh.assign(fresh_.begin(), fresh_.end());
          fresh_.clear();
          shutting_down = shutdown_requested_;
          if (join_requested_) joined_ = true;
        }
        if (cycle(fresh, shutting_down)) break;
        poll_device();
      }
      drain_device(std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.timeout));
      std::string reason;
      {
        std::lock_guard lock(mutex_);
        reason = shutdown_reason_;
      }
      fail_everything(std::make_exception_ptr(usage_error("[rank " + std::to_string(comm_.rank()) + "] " + reason +
                                                          " before every rank submitted this tensor")));
      if (timeline_)
        timeline_->gather_and_write(comm_.transport(), tag_timeline, 0, cfg_.timeline_path, comm_.default_deadline());
    } catch (...) {
      fail_everything(std::current_exception());
    }
  }

  /// One cycle (steps 1–6). True once every rank is shutting down.
  bool cycle(std::vector<std::shared_ptr<engine_entry>>& fresh, bool shutting_down) {
    const clock::time_point cycle_begin = clock::now();
    // Step 1: the report.
    report mine;
    mine.joined = joined_;
    mine.shutting_down = shutting_down;
    for (auto& e : fresh) {
      if (pending_.contains(e->name)) {
        finish(*e, std::make_exception_ptr(usage_error(
                       "[rank " + std::to_string(comm_.rank()) + "] " + std::string(name_of(e->desc.kind)) + " \"" +
                       e->name + "\" was submitted again while the previous one is still in flight")));
        continue;
      }
      pending_.emplace(e->name, e);
      if (auto slot = cache_.slot_of(e->name, e->desc, comm_.rank()))
        mine.slots.push_back(*slot);
      else
        mine.full.push_back({e->name, e->desc});
    }
    {
      std::lock_guard lock(stats_mutex_);
      ++stats_.cycles;
      stats_.cache_hits += mine.slots.size();
      stats_.full_reports += mine.full.size();
    }

    // Steps 2–4 on the coordinator; the others send their report and receive the responses.
    std::vector<std::byte> responses;
    const deadline until = comm_.default_deadline();
    if (comm_.rank() == 0) {
      std::vector<report> reports(static_cast<std::size_t>(comm_.size()));
      reports[0] = std::move(mine);
      for (int r = 1; r < comm_.size(); ++r)
        reports[static_cast<std::size_t>(r)] = decode_report(recv_message(comm_.transport(), r, tag_report, until));
      responses = encode(coordinator_->coordinate(reports, clock::now()));
      for (int r = 1; r < comm_.size(); ++r) send_message(comm_.transport(), r, tag_response, responses, until);
    } else {
      std::vector<std::byte> bytes = encode(mine);
      send_message(comm_.transport(), 0, tag_report, bytes, until);
      responses = recv_message(comm_.transport(), 0, tag_response, until);
    }
    const clock::time_point responded = clock::now();
    if (timeline_ && cfg_.timeline_mark_cycles) timeline_->mark("cycles", "CYCLE", cycle_begin);

    // Steps 5 and 6.
    response_list list = decode_response_list(responses, cache_, comm_.size());
    execute(list.responses, responded);
    for (const auto& r : list.responses)
      if (r.type == response_type::run_full) cache_.remember(r);
    if (list.all_joined) {
      joined_ = false;
      {
        std::lock_guard lock(mutex_);
        join_requested_ = false;
        join_done_ = true;
        last_joined_ = list.last_joined;
      }
      join_cv_.notify_all();
    }
    return list.all_shutdown;
  }

  // ---- step 5: running the responses ----------------------------------------------------------

  /// Step 5 on every rank. Each allreduce gathers the later allreduces of the list that share its
  /// dtype, op and memory kind, in list order, while they fit the fusion buffer: one fused run per
  /// kind, whatever else the list interleaves (host and device gradients, two dtypes). Every rank
  /// walks the same list the same way, so the runs and their order agree.
  void execute(std::vector<response>& list, clock::time_point responded) {
    std::vector<bool> taken(list.size(), false);
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (taken[i]) continue;
      const response& r = list[i];
      if (r.type == response_type::error) {
        fail_one(r);
        continue;
      }
      std::vector<response> group{r};
      if (r.desc.kind == collective_kind::allreduce && cfg_.fusion_threshold > 0) {
        std::size_t bytes = r.counts[0] * size_of(r.desc.type);
        for (std::size_t j = i + 1; j < list.size(); ++j) {
          const response& q = list[j];
          if (taken[j] || q.type == response_type::error || q.desc.kind != collective_kind::allreduce ||
              q.desc.type != r.desc.type || q.desc.op != r.desc.op || q.desc.memory != r.desc.memory)
            continue;
          const std::size_t more = q.counts[0] * size_of(q.desc.type);
          if (bytes + more > cfg_.fusion_threshold) continue;
          bytes += more;
          group.push_back(q);
          taken[j] = true;
        }
      }
      run_group(group, responded);
    }
  }

  void fail_one(const response& r) {
    auto it = pending_.find(r.name);
    if (it == pending_.end()) return;
    std::exception_ptr e;
    const std::string text = "[rank " + std::to_string(comm_.rank()) + "] " + r.text;
    switch (r.error) {
      case error_kind::mismatch: e = std::make_exception_ptr(mismatch_error(text)); break;
      case error_kind::timeout: e = std::make_exception_ptr(timeout_error(text)); break;
      case error_kind::usage: e = std::make_exception_ptr(usage_error(text)); break;
    }
    complete(it->second, e, 0);
    pending_.erase(it);
  }

  /// Runs one response alone, or several fused allreduces through the fusion buffer.
  void run_group(std::span<response> group, clock::time_point responded) {
    const std::size_t me = static_cast<std::size_t>(comm_.rank());
    std::vector<std::shared_ptr<engine_entry>> entries;  // null where this rank has joined
    for (const response& r : group) {
      auto it = pending_.find(r.name);
      if (it == pending_.end()) {
        entries.push_back(nullptr);
      } else {
        it->second->responded = responded;
        entries.push_back(std::move(it->second));
        pending_.erase(it);
      }
    }
    if (group.front().desc.memory == memory_kind::cuda) return run_device_group(group, std::move(entries));
    const clock::time_point begin = clock::now();
    const response& first = group.front();
    const dtype type = first.desc.type;
    const std::size_t element = size_of(type);
    std::exception_ptr failure;
    std::size_t result_count = first.counts[me];
    clock::time_point copied_in = begin, reduced = begin;
    std::string algorithm_name;
    bool local = false;
    try {
      if (group.size() > 1 || (!entries[0] && first.desc.kind == collective_kind::allreduce)) {
        // Fused (or a joined rank's identity contribution): through the fusion buffer.
        std::size_t total = 0;
        for (const response& r : group) total += r.counts[me] * element;
        if (fusion_.size() < total)
          fusion_.resize(std::max(total, std::min(cfg_.fusion_threshold, std::size_t{64} << 20)));
        std::size_t at = 0;
        for (std::size_t k = 0; k < group.size(); ++k) {
          const std::size_t bytes = group[k].counts[me] * element;
          if (entries[k])
            std::memcpy(fusion_.data() + at, entries[k]->in.data(), bytes);
          else
            fill_identity(type, first.desc.op, fusion_.data() + at, group[k].counts[me]);
          at += bytes;
        }
        copied_in = clock::now();
        algorithm_name = run_allreduce(comm_, type, fusion_.data(), total / element, first.desc.op);
        reduced = clock::now();
        at = 0;
        for (std::size_t k = 0; k < group.size(); ++k) {
          const std::size_t bytes = group[k].counts[me] * element;
          if (entries[k]) std::memcpy(entries[k]->out.data(), fusion_.data() + at, bytes);
          at += bytes;
        }
        std::lock_guard lock(stats_mutex_);
        ++stats_.collectives;
        if (group.size() > 1) ++stats_.fused_collectives;
      } else {
        algorithm_name = run_single(first, entries[0].get(), result_count);
        copied_in = begin;
        reduced = clock::now();
        std::lock_guard lock(stats_mutex_);
        ++stats_.collectives;
      }
    } catch (const local_failure&) {
      failure = std::current_exception();
      local = true;
    } catch (...) {
      failure = std::current_exception();
    }
    const clock::time_point end = clock::now();
    std::vector<std::size_t> counts;
    for (std::size_t k = 0; k < group.size(); ++k) {
      counts.push_back(group.size() > 1 ? group[k].counts[me] : result_count);
      if (!entries[k]) continue;
      engine_entry& e = *entries[k];
      e.exec_begin = begin;
      e.copied_in = copied_in;
      e.reduced = reduced;
      e.copied_out = end;
      if (timeline_) record(e, group.size(), algorithm_name);
    }
    complete_all(entries, failure, counts);
    // A collective that failed (not just one handle's output) leaves the ranks out of step: stop.
    if (failure && !local) std::rethrow_exception(failure);
  }

  // ---- device responses (desc.memory == cuda) ----------------------------------------------------

  /// A device response in flight: its handles complete when the backend says its marker is done.
  struct device_flight {
    std::vector<std::shared_ptr<engine_entry>> entries;  // null where this rank has joined
    std::vector<std::size_t> result_counts;
    std::vector<std::exception_ptr> local;  // a failure of one handle (its output too small)
    device_marker end;
    std::string path;
  };

  /// How often the background thread asks whether device responses have finished.
  static constexpr std::chrono::microseconds device_poll{50};

  /// Hands one device response (a fused run of allreduces, or one collective) to the backend after
  /// every tensor's producer; its handles complete in poll_device(). A rank that has joined takes part
  /// with the identity (allreduce) or into scratch (broadcast). An output too small for the result
  /// makes the backend write into scratch and fails only that handle, so that the ranks stay in step.
  void run_device_group(std::span<response> group, std::vector<std::shared_ptr<engine_entry>> entries) {
    const std::size_t me = static_cast<std::size_t>(comm_.rank());
    const response& first = group.front();
    if (!device_)
      throw usage_error("[rank " + std::to_string(comm_.rank()) + "] engine: " + std::string(name_of(first.desc.kind)) +
                        " \"" + first.name +
                        "\" runs on device memory on the other ranks, but this rank's engine has no device backend");
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
            usage_error("[rank " + std::to_string(comm_.rank()) + "] " + std::string(name_of(first.desc.kind)) + " \"" +
                        e->name + "\": the output holds " + std::to_string(e->out_capacity) +
                        " elements but the result has " + std::to_string(result)));
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
      complete_all(entries, failure, flight.result_counts);
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
    {
      std::lock_guard lock(stats_mutex_);
      ++stats_.collectives;
      if (group.size() > 1) ++stats_.fused_collectives;
    }
    flight.entries = std::move(entries);
    in_flight_.push_back(std::move(flight));
  }

  /// Completes the device responses whose GPU work has finished (in order: a stream runs in order).
  void poll_device() {
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
      if (timeline_ && !failure) {
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
          record(*e, f.entries.size(), "cuda " + f.path);
        }
      }
      for (std::size_t k = 0; k < f.entries.size(); ++k) {
        if (!f.entries[k]) continue;
        const std::exception_ptr error = failure ? failure : f.local[k];
        complete_all(std::span(&f.entries[k], 1), error, std::span(&f.result_counts[k], 1));
      }
      in_flight_.pop_front();
      if (failure) std::rethrow_exception(failure);
    }
  }

  /// At the end: waits (at most `bound`) for the device responses in flight, so that no handle
  /// completes while the GPU may still write its output.
  void drain_device(std::chrono::milliseconds bound) {
    const deadline until = deadline_after(bound);
    while (!in_flight_.empty() && clock::now() < until) {
      poll_device();
      if (!in_flight_.empty()) std::this_thread::sleep_for(device_poll);
    }
  }

  /// A response that runs on its own, in place (no fusion-buffer copies).
  std::string run_single(const response& r, engine_entry* e, std::size_t& result_count) {
    const std::size_t me = static_cast<std::size_t>(comm_.rank());
    const std::size_t element = size_of(r.desc.type);
    const std::size_t count = r.counts[me];
    switch (r.desc.kind) {
      case collective_kind::allreduce:
        if (e->in.data() != e->out.data()) std::memcpy(e->out.data(), e->in.data(), count * element);
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

  [[noreturn]] void throw_too_small(const engine_entry& e, std::size_t room, std::size_t needed) const {
    // The collective ran (into scratch) so that the other ranks finish; only this handle fails.
    throw local_failure(usage_error("[rank " + std::to_string(comm_.rank()) + "] " + std::string(name_of(e.desc.kind)) +
                                    " \"" + e.name + "\": the output holds " + std::to_string(room) +
                                    " elements but the result has " + std::to_string(needed)));
  }

  /// An error of one handle that leaves the ranks in step (the collective itself completed).
  struct local_failure : usage_error {
    explicit local_failure(const usage_error& e) : usage_error(e) {}
  };

  std::byte* scratch(std::size_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }

  void record(const engine_entry& e, std::size_t fused, const std::string& algorithm_name) {
    timeline_->span(e.name, "NEGOTIATE", e.submitted, e.responded, {{"collective", std::string(name_of(e.desc.kind))}});
    timeline_->span(e.name, "QUEUE", e.responded, e.exec_begin);
    if (fused > 1 || e.copied_in != e.exec_begin)
      timeline_->span(e.name, "MEMCPY_IN_FUSION_BUFFER", e.exec_begin, e.copied_in);
    std::string upper(name_of(e.desc.kind));
    std::transform(upper.begin(), upper.end(), upper.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    timeline_->span(e.name, upper, e.copied_in, e.reduced,
                    {{"algorithm", algorithm_name},
                     {"tensors", std::to_string(fused)},
                     {"dtype", std::string(name_of(e.desc.type))},
                     {"count", std::to_string(e.desc.count)}});
    if (fused > 1 || e.copied_in != e.exec_begin)
      timeline_->span(e.name, "MEMCPY_OUT_FUSION_BUFFER", e.reduced, e.copied_out);
  }

  void complete(const std::shared_ptr<engine_entry>& e, std::exception_ptr error, std::size_t result_count) {
    complete_all(std::span(&e, 1), error, std::span(&result_count, 1));
  }

  /// Completes a group in two passes: every entry is marked finished before any waiter is woken,
  /// so that a thread waiting on the group's handles one after another wakes once, not once per
  /// handle (a futex round trip each).
  void complete_all(std::span<const std::shared_ptr<engine_entry>> entries, std::exception_ptr error,
                    std::span<const std::size_t> result_counts) {
    std::size_t done = 0;
    std::vector<bool> now_finished(entries.size(), false);
    for (std::size_t k = 0; k < entries.size(); ++k) {
      if (!entries[k]) continue;
      std::lock_guard lock(entries[k]->mutex);
      if (entries[k]->finished) continue;
      entries[k]->error = error;
      entries[k]->result_count = result_counts[k];
      entries[k]->finished = true;
      now_finished[k] = true;
      ++done;
    }
    for (const auto& e : entries)
      if (e) e->finished_cv.notify_all();
    for (std::size_t k = 0; k < entries.size(); ++k)
      if (now_finished[k]) entries[k]->tracker->leave(entries[k]->seq);
    {
      std::lock_guard lock(stats_mutex_);
      stats_.tensors_done += done;
    }
    for (const auto& e : entries)
      if (e && e->done) e->done(handle(e), error);
  }

  /// drain_device for a failing engine: a second error while waiting changes nothing.
  void drain_device_quietly() {
    try {
      drain_device(std::min<std::chrono::milliseconds>(
          std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.timeout), std::chrono::seconds(10)));
    } catch (...) {
    }
  }

  void fail_everything(std::exception_ptr error) {
    std::deque<std::shared_ptr<engine_entry>> fresh;
    {
      std::lock_guard lock(mutex_);
      if (!failed_) failed_ = error;
      fresh.swap(fresh_);
    }
    join_cv_.notify_all();
    drain_device_quietly();
    for (auto& f : in_flight_)
      for (const auto& e : f.entries)
        if (e) complete(e, error, 0);
    in_flight_.clear();
    for (auto& [name, e] : pending_) complete(e, error, 0);
    pending_.clear();
    for (auto& e : fresh) complete(e, error, 0);
  }

  communicator comm_;
  config cfg_;
  log_sink log_;
  device_backend* device_ = nullptr;
  std::shared_ptr<settle_tracker> tracker_ = std::make_shared<settle_tracker>();
  clock::time_point origin_;
  std::optional<timeline> timeline_;

  // shared with submitting threads (mutex_)
  std::mutex mutex_;
  std::condition_variable wake_, join_cv_;
  std::deque<std::shared_ptr<engine_entry>> fresh_;
  bool shutdown_requested_ = false;
  bool sleeping_ = false;  // the background thread waits for work (a submission must wake it)
  bool join_requested_ = false;
  bool join_done_ = false;
  int last_joined_ = -1;
  std::exception_ptr failed_;
  std::string shutdown_reason_ = "the engine shut down";

  mutable std::mutex stats_mutex_;
  engine::statistics stats_;

  // background thread only
  std::unordered_map<std::string, std::shared_ptr<engine_entry>> pending_;
  response_cache cache_{cfg_.cache_capacity};
  bool joined_ = false;
  std::vector<std::byte> fusion_, scratch_;
  std::deque<device_flight> in_flight_;  // device responses enqueued, not yet finished

  std::optional<coordinator> coordinator_;  // rank 0 only

  std::thread thread_;         // started after everything above exists
  finalize_hook at_finalize_;  // last: unregistered first, before the thread stops
};

}  // namespace detail

// ---- handle --------------------------------------------------------------------------------------

bool handle::test() const {
  if (!entry_) return true;
  std::lock_guard lock(entry_->mutex);
  return entry_->finished;
}

void handle::wait(deadline until) const {
  if (!entry_) return;
  std::exception_ptr error;
  {
    std::unique_lock lock(entry_->mutex);
    if (!entry_->finished_cv.wait_until(lock, until, [&] { return entry_->finished; }))
      throw timeout_error(std::string(name_of(entry_->desc.kind)) + " \"" + entry_->name +
                          "\" did not complete before its deadline");
    error = entry_->error;
  }
  if (!error) return;
  // The caller may unwind on this error and free the buffers of the tensors it submitted with this
  // one: rethrow it once every tensor this rank submitted before now has finished (not on the
  // background thread, a completion callback's, which runs them).
  detail::settle_tracker& tracker = *entry_->tracker;
  std::string in_flight;
  if (std::this_thread::get_id() != tracker.background.load() &&
      !tracker.wait_before(tracker.submitted(), until, in_flight)) {
    std::string text;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      text = e.what();
    }
    throw timeout_error(std::string(name_of(entry_->desc.kind)) + " \"" + entry_->name + "\" failed (" + text +
                        "), but tensors this rank submitted before are still in flight at the deadline (" + in_flight +
                        "): their buffers are still in use");
  }
  std::rethrow_exception(error);
}

void handle::wait() const {
  if (entry_) wait(deadline_after(entry_->default_timeout));
}

std::size_t handle::result_count() const {
  if (!entry_) return 0;
  std::lock_guard lock(entry_->mutex);
  return entry_->finished && entry_->desc.kind != collective_kind::allreduce ? entry_->result_count
                                                                             : entry_->desc.count;
}

memory_kind handle::memory() const { return entry_ ? entry_->desc.memory : memory_kind::host; }

void handle::order_after(void* stream) const {
  if (!entry_) return;
  if (entry_->desc.memory != memory_kind::cuda)
    throw usage_error("handle::order_after: " + std::string(name_of(entry_->desc.kind)) + " \"" + entry_->name +
                      "\" is a host tensor; wait() for it");
  std::unique_lock lock(entry_->mutex);
  if (!entry_->finished_cv.wait_until(lock, deadline_after(entry_->default_timeout),
                                      [&] { return entry_->enqueued || entry_->finished; }))
    throw timeout_error(std::string(name_of(entry_->desc.kind)) + " \"" + entry_->name +
                        "\" was not enqueued on the device before its deadline");
  if (!entry_->enqueued && entry_->error) std::rethrow_exception(entry_->error);
  const device_marker end = entry_->end;
  lock.unlock();
  if (end) entry_->backend->order_after(end, stream);
}

const std::string& handle::name() const {
  static const std::string none;
  return entry_ ? entry_->name : none;
}

// ---- engine --------------------------------------------------------------------------------------

engine::engine(communicator& comm, std::optional<config> cfg, log_sink log, device_backend* device) {
  if (comm.finalized())
    throw usage_error("[rank " + std::to_string(comm.rank()) +
                      "] engine: made after MPI_Finalize shut its communicator down (destroy flexpar's objects "
                      "before calling MPI_Finalize)");
  if (comm.mpi_comm() != MPI_COMM_NULL && comm.transport().kind() == transport_kind::mpi) {
    int provided = MPI_THREAD_SINGLE;
    FLEXPAR_CHECK_MPI(MPI_Query_thread(&provided));
    if (provided < MPI_THREAD_MULTIPLE)
      throw usage_error(
          "engine: its background thread calls MPI while your threads may too, so it needs "
          "MPI_THREAD_MULTIPLE; initialize MPI with MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, "
          "&provided) (or use FLEXPAR_TRANSPORT=ucx)");
  }
  core_ = std::make_unique<detail::engine_core>(comm, cfg ? *cfg : comm.settings(), std::move(log), device);
}

engine::~engine() = default;

handle engine::submit(std::string name, collective_kind kind, dtype type, reduce_op op, int root,
                      std::span<const std::byte> in, std::span<std::byte> out, std::size_t count,
                      completion_callback done) {
  return core_->submit(std::move(name), kind, type, op, root, in, out, count, std::move(done));
}

void engine::check_bytes(std::string_view op, const std::string& name, std::size_t bytes, dtype type,
                         std::size_t count) {
  if (bytes < count * size_of(type))
    throw usage_error("engine: " + std::string(op) + " \"" + name + "\": a buffer of " + std::to_string(bytes) +
                      " bytes cannot hold " + std::to_string(count) + " " + std::string(name_of(type)) + " elements");
}

handle engine::submit_device(std::string name, collective_kind kind, dtype type, reduce_op op, int root, const void* in,
                             void* out, std::size_t count, std::size_t out_capacity, device_marker ready,
                             completion_callback done) {
  return core_->submit_device(std::move(name), kind, type, op, root, in, out, count, out_capacity, std::move(ready),
                              std::move(done));
}

device_backend* engine::device() const noexcept { return core_->device(); }

int engine::join() { return core_->join(); }
int engine::rank() const noexcept { return core_->comm().rank(); }
int engine::size() const noexcept { return core_->comm().size(); }
const config& engine::settings() const noexcept { return core_->settings(); }
engine::statistics engine::stats() const { return core_->stats(); }

}  // namespace flexpar
