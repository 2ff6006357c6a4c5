// lib/engine/engine.cpp — the engine: submission queue, background thread, join, shutdown,
// timeline, and the cycle that composes its units (coordinator.hpp: steps 2–4 on rank 0;
// fused_executor.hpp: step 5; response_cache.hpp: step 6).
// The protocol is described step by step in include/flexpar/engine/engine.hpp; the step numbers
// below refer to it.
#include <flexpar/collective/automatic.hpp>
#include <flexpar/comm/thread_level.hpp>
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/engine/engine.hpp>
#include <flexpar/timeline.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "collective_calls.hpp"
#include "coordinator.hpp"
#include "entry.hpp"
#include "fused_executor.hpp"
#include "protocol.hpp"
#include "response_cache.hpp"
#include "step_plan.hpp"

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

namespace {

// ---- messages: one fixed-size first part, a second message only for long ones ------------------

constexpr std::size_t first_part = 4096;

/// A message's sends (its first part, and the rest of a long one), started: `head` and the payload
/// must outlive them (moving an outgoing keeps `head`'s bytes where they are).
struct outgoing {
  std::vector<std::byte> head;
  request first, rest;
};

outgoing start_message(transport& t, int peer, tag_t tag, std::vector<std::byte>& payload) {
  const std::uint64_t length = payload.size();
  outgoing out;
  out.head.resize(sizeof length + std::min(payload.size(), first_part - sizeof length));
  std::memcpy(out.head.data(), &length, sizeof length);
  std::memcpy(out.head.data() + sizeof length, payload.data(), out.head.size() - sizeof length);
  out.first = t.isend(peer, tag, out.head);
  if (payload.size() > first_part - sizeof length)
    out.rest = t.isend(peer, tag, std::span<const std::byte>(payload).subspan(first_part - sizeof length));
  return out;
}

void send_message(transport& t, int peer, tag_t tag, std::vector<std::byte>& payload, deadline until) {
  outgoing out = start_message(t, peer, tag, payload);
  out.first.wait(until);
  out.rest.wait(until);
}

/// A message's first part, being received (empty until expect_message).
struct incoming {
  std::vector<std::byte> head;
  request first;
};

incoming expect_message(transport& t, int peer, tag_t tag) {
  incoming in;
  in.head.resize(first_part);
  in.first = t.irecv(peer, tag, in.head);
  return in;
}

/// The whole message whose first part `in` receives (the rest, if any, before `until`).
std::vector<std::byte> finish_message(transport& t, int peer, tag_t tag, incoming& in, deadline until) {
  in.first.wait(until);
  const std::size_t got = in.first.bytes();
  std::uint64_t length = 0;
  if (got < sizeof length) throw error_on<error>(t.rank(), "engine protocol error", "a message of ", got, " bytes");
  std::memcpy(&length, in.head.data(), sizeof length);
  std::vector<std::byte> payload(length);
  const std::size_t inline_part = std::min<std::size_t>(length, first_part - sizeof length);
  std::memcpy(payload.data(), in.head.data() + sizeof length, inline_part);
  if (length > inline_part) t.recv(peer, tag, std::span(payload).subspan(inline_part), until);
  return payload;
}

constexpr tag_t tag_report = 1, tag_response = 2, tag_timeline = 3, tag_wake_vote = 4, tag_wake_verdict = 5;

}  // namespace

class engine_core final : private fused_executor::owner {
 public:
  engine_core(communicator& parent, config cfg, log_sink log, device_backend* device)
      : comm_(std::move(*parent.split(0, parent.rank()))),
        cfg_(std::move(cfg)),
        log_(std::move(log)),
        device_(device),
        origin_(clock::now()),
        timeline_(open_timeline()) {
    if (!log_) {
      log_ = [rank = comm_.rank()](std::string_view line) {
        std::fprintf(stderr, "[flexpar rank %d] %.*s\n", rank, static_cast<int>(line.size()), line.data());
      };
    }
    if (comm_.rank() == 0)
      coordinator_.emplace(comm_.size(), cache_, stall_inspector(cfg_.stall_warning, cfg_.stall_shutdown), log_,
                           timeline_ ? &*timeline_ : nullptr,
                           cfg_.step_plan ? std::optional(plan_recorder(cfg_.fusion_threshold)) : std::nullopt);
    if (coordinator_) coordinator_->order_buckets_by(&addresses_);
    // The same ranks, the same links: the machine `automatic` knows on the parent (configured with
    // set_cost_params, or measured) is this communicator's too; every rank has it or none does.
    if (const auto& parent_state = parent.collective_state(); parent_state && parent_state->machine)
      set_cost_params(comm_, *parent_state->machine);
    thread_ = std::thread([this] { run(); });
    // Registered after comm_ (made above): at MPI_Finalize this engine stops, and writes its
    // timeline, before comm_ closes its transport (core/mpi_finalize.hpp).
    at_finalize_ = finalize_hook(comm_.at_finalize(), [this] { stop("MPI_Finalize shut the engine down"); });
  }

  ~engine_core() {
    at_finalize_ = {};
    stop("the engine shut down");
  }

  /// Collective: the timeline, when configured (after check_timeline_path).
  std::optional<timeline> open_timeline() {
    if (cfg_.timeline_path.empty()) return std::nullopt;
    check_timeline_path();
    return std::optional<timeline>(std::in_place, comm_.rank(), origin_);
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
      throw error_on<usage_error>(comm_.rank(), "engine", "the timeline file \"", cfg_.timeline_path,
                                  "\" (FLEXPAR_TIMELINE) cannot be written on rank 0: ", std::strerror(all[0]));
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
                       void* out, std::size_t count, std::size_t out_capacity, void* stream, completion_callback done) {
    if (!device_)
      throw error_on<usage_error>(comm_.rank(), "engine", name_of(kind), " \"", name,
                                  "\" is a device tensor, but this engine has no device backend (build the engine "
                                  "with one: flexpar::cuda::engine_backend)");
    auto entry = std::make_shared<engine_entry>();
    entry->name = std::move(name);
    entry->desc = description{kind, type, op, root, count, memory_kind::cuda};
    entry->device_in = in;
    entry->device_out = out;
    entry->out_capacity = out_capacity;
    entry->stream = stream;
    entry->backend = device_;
    entry->done = std::move(done);
    return enqueue(std::move(entry));
  }

  handle enqueue(std::shared_ptr<engine_entry> entry) {
    entry->rank = comm_.rank();
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
      entry->desc.step = steps_ended_;
      if (shutdown_requested_) {
        refuse = std::make_exception_ptr(error_on<usage_error>(comm_.rank(), "engine", name_of(kind), " \"",
                                                               entry->name, "\" submitted after ", shutdown_reason_));
      } else if (failed_) {
        refuse = failed_;
      } else if (plan_) {
        // The steady state: the tensor goes into its slot of the frozen plan; the thread wakes when a
        // bucket is complete, or when something the plan does not have came (it drops the plan then).
        const plan_slots::placed placed = plan_->place(entry);
        if (placed == plan_slots::placed::completes_bucket) capture_bucket(plan_->bucket_of(*entry));
        if (placed == plan_slots::placed::not_in_plan) {
          capture(*entry);
          fresh_.push_back(entry);
        }
        if (placed != plan_slots::placed::in_slot) {
          plan_news_ = true;
          wake = sleeping_;
        }
        if (quiet_sleep_) wake = true;  // the step's first submission ends quiet (plan_slots::begun)
      } else {
        if (dropped_) dropped_->mark(*entry);
        capture(*entry);
        fresh_.push_back(entry);
        // Only the first submission while the thread sleeps wakes it; the rest join its batch.
        wake = fresh_.size() == 1 && sleeping_;
      }
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
      throw error_on<timeout_error>(comm_.rank(), "engine::join", "not every rank joined within ",
                                    seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.timeout)),
                                    " (FLEXPAR_TIMEOUT)");
    if (!join_done_) std::rethrow_exception(failed_);
    return last_joined_;
  }

  void end_step() {
    bool wake = false;
    {
      std::lock_guard lock(mutex_);
      const std::uint32_t step = steps_ended_++;
      // A step the plan was dropped in (by another rank, perhaps) still says which of its tensors it
      // lacked: the ranks waiting for them learn it as they would have under the plan.
      std::optional<plan_slots>& marks = plan_ ? plan_ : dropped_;
      if (!marks) return;
      const std::vector<std::uint32_t> missing = marks->end_step();
      // A tensor of the plan this step did not submit: the plan no longer holds. The ranks that did
      // submit it learn from this rank's next report that it ended its step without it.
      for (const std::uint32_t k : missing) skipped_.push_back({marks->plan().tensor(k).slot, step});
      if (!plan_) {
        dropped_.reset();
        wake = sleeping_ && !missing.empty();  // a quiet thread reports the skip now
      } else if (!missing.empty()) {
        leave_plan_ = true;
        plan_news_ = true;
        wake = sleeping_;
      }
    }
    if (wake) wake_.notify_all();
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
        bool planned = false;
        {
          std::unique_lock lock(mutex_);
          sleeping_ = true;
          planned = plan_.has_value();
          if (quiet_) {
            // Quiet (below): no cycle, no round, no timer until something happens here.
            quiet_sleep_ = true;
            wait_quietly(lock, [&] {
              return (planned ? plan_news_ || plan_->begun() || join_requested_
                              : !skipped_.empty() || (join_requested_ && !joined_)) ||
                     !fresh_.empty() || shutdown_requested_;
            });
            quiet_sleep_ = false;
            next = clock::now() + cfg_.cycle_time;
          }
          if (planned) {
            // The steady state: a round as soon as something changed here, at once again while a
            // bucket complete here waits for the other ranks, and at least once per cycle.
            wait_for_work(lock, next, [&] {
              return plan_news_ || plan_->waiting() || !fresh_.empty() || shutdown_requested_ || join_requested_;
            });
          } else {
            // A cycle starts at its time or at the first submission, whichever comes first, and
            // takes everything submitted until submissions pause for a twentieth of the cycle time
            // (a burst of gradients is fused into one batch, a lone tensor waits little).
            wait_for_work(lock, next,
                          [&] { return !fresh_.empty() || shutdown_requested_ || (join_requested_ && !joined_); });
            const auto quiet = cfg_.cycle_time / 20;
            for (std::size_t seen = fresh_.size(); seen > 0 && clock::now() < next;) {
              wake_.wait_until(lock, std::min(next, clock::now() + quiet), [&] { return shutdown_requested_; });
              if (fresh_.size() == seen || shutdown_requested_) break;
              seen = fresh_.size();
            }
            take_fresh(fresh, shutting_down);
          }
          sleeping_ = false;
        }
        if (planned && plan_cycle(fresh, shutting_down)) {
          executor_.poll_device();
          continue;
        }
        if (cycle(fresh, shutting_down)) break;
        executor_.poll_device();
      }
      executor_.drain_device(std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.timeout));
      std::string reason;
      {
        std::lock_guard lock(mutex_);
        reason = shutdown_reason_;
      }
      fail_everything(std::make_exception_ptr(
          error_on<usage_error>(comm_.rank(), "", reason, " before every rank submitted this tensor")));
      if (timeline_)
        timeline_->gather_and_write(comm_.transport(), tag_timeline, 0, cfg_.timeline_path, comm_.default_deadline());
    } catch (...) {
      fail_everything(std::current_exception());
    }
  }

  /// Sleeps (under `lock`) until `ready()`, with no timer; while device responses are in flight, wakes
  /// every poll interval to complete them.
  template <class Ready>
  void wait_quietly(std::unique_lock<std::mutex>& lock, Ready ready) {
    while (!ready()) {
      if (!executor_.device_in_flight()) {
        wake_.wait(lock, [&] { return ready() || executor_.device_in_flight(); });
      } else if (!wake_.wait_for(lock, fused_executor::device_poll, ready)) {
        lock.unlock();
        executor_.poll_device();
        lock.lock();
      }
    }
  }

  // ---- quiet -------------------------------------------------------------------------------------
  // A cycle (or a round) after which nothing is outstanding on any rank (every tensor reported was
  // answered, no rank joined or shutting down) says so, and every rank's thread then sleeps until
  // something happens here: a submission, a skip, a join, a shutdown. A quiet engine makes no call
  // into MPI or UCX: between steps it costs no core, and at MPI_Finalize it is not inside MPI (the
  // MPI standard requires every other thread to be out of MPI then; MPICH stops locking as
  // MPI_Finalize begins, before it calls flexpar's hook).
  // Negotiating, rank 0 keeps a receive posted for each quiet rank's next report and counts the
  // rank as reporting nothing until it comes: its cycles, stall warnings and timeouts go on as if
  // the quiet ranks sent empty reports. A rank back from quiet sends its report and waits for rank
  // 0's answer with no deadline (rank 0 may be quiet itself: it answers once it has something).
  // Under a plan, the first round after quiet gathers the votes on rank 0 the same way. Such a wait
  // fails at once on a dead peer (the heartbeats), logs every stall_warning, and after
  // stall_shutdown ends the engine with a timeout_error naming whom it waited for.

  /// Waits, with no deadline of its own, for `requests` (each with the peer in `peers`) after quiet.
  /// @throws timeout_error after config::stall_shutdown; peer_failure from the transport.
  void await_after_quiet(std::span<request* const> requests, std::span<const int> peers, std::string_view what) {
    const clock::time_point begin = clock::now();
    clock::time_point warn_at = begin + cfg_.stall_warning;
    const clock::time_point give_up =
        cfg_.stall_shutdown.count() > 0 ? begin + cfg_.stall_shutdown : clock::time_point::max();
    for (std::size_t i = 0; i < requests.size(); ++i) {
      for (;;) {
        try {
          requests[i]->wait(std::min(warn_at, give_up));
          break;
        } catch (const timeout_error&) {
        }
        std::vector<int> missing;
        for (std::size_t k = i; k < requests.size(); ++k)
          if (!requests[k]->test() && std::find(missing.begin(), missing.end(), peers[k]) == missing.end())
            missing.push_back(peers[k]);
        std::sort(missing.begin(), missing.end());
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - begin);
        const std::string text =
            comm_.rank() == 0
                ? error_text(no_rank, "engine", what, " has waited ", seconds_text(waited), " for ", rank_set(missing),
                             ": quiet since every tensor ran, nothing submitted there since")
                : error_text(no_rank, "engine", what, " has waited ", seconds_text(waited),
                             " for rank 0's answer, which comes once every rank has submitted (all were quiet)");
        if (clock::now() >= give_up)
          throw error_on<timeout_error>(comm_.rank(), "", text, " (FLEXPAR_STALL_SHUTDOWN_S)");
        log_(text);
        warn_at += cfg_.stall_warning;
      }
    }
  }

  /// Sleeps (under `lock`) until `ready()` or the cycle's time `next`; while device responses are in
  /// flight, wakes every poll interval to complete them.
  template <class Ready>
  void wait_for_work(std::unique_lock<std::mutex>& lock, clock::time_point next, Ready ready) {
    while (!wake_.wait_until(
        lock, executor_.device_in_flight() ? std::min(next, clock::now() + fused_executor::device_poll) : next,
        ready)) {
      if (clock::now() >= next) break;
      lock.unlock();
      executor_.poll_device();
      lock.lock();
    }
  }

  /// Under mutex_: what this rank negotiates in the next cycle (the submissions since the last one).
  void take_fresh(std::vector<std::shared_ptr<engine_entry>>& fresh, bool& shutting_down) {
    fresh.insert(fresh.end(), fresh_.begin(), fresh_.end());
    fresh_.clear();
    shutting_down = shutdown_requested_;
    if (join_requested_) joined_ = true;
  }

  // ---- the steady state (include/flexpar/engine/engine.hpp, "The steady state") -----------------

  /// Under mutex_: a device tensor's producer position, unless it has one.
  void capture(engine_entry& e) {
    if (e.desc.memory == memory_kind::cuda && !e.ready) e.ready = device_->capture(e.stream);
  }

  /// Under mutex_: bucket b of the plan is complete here. Its device tensors' producers are captured
  /// now, once per stream: every tensor of the bucket was produced before this point of its stream.
  void capture_bucket(std::uint32_t b) {
    std::vector<std::pair<void*, device_marker>> by_stream;
    for (const std::shared_ptr<engine_entry>& e : plan_->entries(b)) {
      if (e->desc.memory != memory_kind::cuda || e->ready) continue;
      auto it = std::find_if(by_stream.begin(), by_stream.end(), [&](const auto& m) { return m.first == e->stream; });
      if (it == by_stream.end()) it = by_stream.insert(by_stream.end(), {e->stream, device_->capture(e->stream)});
      e->ready = it->second;
    }
  }

  /// One round of the steady state: every rank says which buckets are complete here (one small
  /// allreduce), and the buckets complete everywhere run in plan order. Returns false when the plan
  /// is dropped: `fresh` then holds what this rank negotiates in the cycle that follows at once.
  bool plan_cycle(std::vector<std::shared_ptr<engine_entry>>& fresh, bool& shutting_down) {
    const clock::time_point begin = clock::now();
    std::shared_ptr<const step_plan> plan;
    std::vector<std::uint8_t> vote;
    {
      std::lock_guard lock(mutex_);
      plan = plan_->shared();
      // this rank leaves on a tensor the plan does not have, at the end of a step that missed one, on
      // a bucket that waited too long for a rank, on join and on shutdown
      const bool leave = leave_plan_ || !fresh_.empty() || shutdown_requested_ || join_requested_;
      vote = encode_round(plan_->round(leave), plan->digest());
      plan_news_ = false;
    }
    if (std::exchange(quiet_, false))
      vote_after_quiet(vote);
    else
      run_allreduce(comm_, dtype::u8, reinterpret_cast<std::byte*>(vote.data()), vote.size(), reduce_op::max);
    const plan_verdict verdict = decode_round(vote, plan->buckets(), plan->digest());
    if (timeline_ && cfg_.timeline_mark_cycles) timeline_->mark("cycles", "PLAN ROUND", begin);
    {
      std::lock_guard lock(stats_mutex_);
      ++stats_.plan_rounds;
    }
    if (verdict.digest_differs)
      throw error_on<error>(comm_.rank(), "engine protocol error",
                            "the ranks hold different step plans (do all ranks run the same flexpar?)");
    if (verdict.leave) {
      // Every rank drops the plan in this round: what is in the slots is negotiated as it would have
      // been without a plan, from the cycle that follows.
      {
        std::lock_guard lock(mutex_);
        for (std::shared_ptr<engine_entry>& e : plan_->take_all()) {
          capture(*e);
          fresh.push_back(std::move(e));
        }
        dropped_ = std::move(plan_);
        plan_.reset();
        leave_plan_ = false;
        take_fresh(fresh, shutting_down);
      }
      std::lock_guard lock(stats_mutex_);
      ++stats_.plans_dropped;
      stats_.plan_buckets = 0;
      return false;
    }
    // Quiet once the buckets complete everywhere ran: none begun anywhere is left waiting.
    quiet_ = true;
    for (std::uint32_t b = 0; b < plan->buckets(); ++b)
      if (verdict.started_somewhere[b] && !verdict.complete_everywhere[b]) quiet_ = false;
    const clock::time_point agreed = clock::now();
    std::size_t ran = 0;
    for (std::uint32_t b = 0; b < plan->buckets(); ++b) {
      if (!verdict.complete_everywhere[b]) continue;
      std::vector<std::shared_ptr<engine_entry>> entries;
      {
        std::lock_guard lock(mutex_);
        entries = plan_->take(b);
      }
      ran += entries.size();
      executor_.run(response_run{plan->bucket_tensors(b), plan->positions(b)}, std::move(entries), agreed);
    }
    if (ran != 0) {
      std::lock_guard lock(stats_mutex_);
      stats_.planned_tensors += ran;
    }
    // A bucket some rank has begun and not every rank completed, for longer than the patience: a rank
    // skipped a tensor or will submit it much later. Leave at the next round, and let the negotiation
    // (and its stall warnings) take over.
    const clock::time_point now = clock::now();
    waiting_since_.resize(plan->buckets(), clock::time_point::max());
    bool impatient = false;
    for (std::uint32_t b = 0; b < plan->buckets(); ++b) {
      if (verdict.complete_everywhere[b] || !verdict.started_somewhere[b]) {
        waiting_since_[b] = clock::time_point::max();
      } else if (waiting_since_[b] == clock::time_point::max()) {
        waiting_since_[b] = now;
      } else if (now - waiting_since_[b] > cfg_.plan_patience) {
        impatient = true;
      }
    }
    if (impatient) {
      std::lock_guard lock(mutex_);
      leave_plan_ = plan_news_ = true;
    }
    return true;
  }

  /// The round's max-allreduce after quiet: the votes gathered on rank 0 (waiting for every rank with
  /// no deadline, await_after_quiet), their maximum sent back.
  void vote_after_quiet(std::vector<std::uint8_t>& vote) {
    transport& t = comm_.transport();
    const auto bytes = [](std::vector<std::uint8_t>& v) { return std::as_writable_bytes(std::span(v)); };
    if (comm_.rank() == 0) {
      std::vector<std::vector<std::uint8_t>> votes(static_cast<std::size_t>(comm_.size()) - 1,
                                                   std::vector<std::uint8_t>(vote.size()));
      std::vector<request> in;
      std::vector<request*> waits;
      std::vector<int> peers;
      for (int r = 1; r < comm_.size(); ++r) {
        in.push_back(t.irecv_exact(r, tag_wake_vote, bytes(votes[static_cast<std::size_t>(r - 1)])));
        peers.push_back(r);
      }
      for (request& r : in) waits.push_back(&r);
      await_after_quiet(waits, peers, "this rank, back from quiet,");
      for (const std::vector<std::uint8_t>& v : votes)
        for (std::size_t i = 0; i < vote.size(); ++i) vote[i] = std::max(vote[i], v[i]);
      std::vector<request> out;
      for (int r = 1; r < comm_.size(); ++r)
        out.push_back(t.isend(r, tag_wake_verdict, std::as_bytes(std::span(vote))));
      wait_all(out, comm_.default_deadline());
    } else {
      std::vector<std::uint8_t> verdict(vote.size());
      request answer = t.irecv_exact(0, tag_wake_verdict, bytes(verdict));
      request sent = t.isend(0, tag_wake_vote, std::as_bytes(std::span(vote)));
      const std::array<request*, 2> waits{&sent, &answer};
      const std::array<int, 2> peers{0, 0};
      await_after_quiet(waits, peers, "this rank, back from quiet,");
      vote.swap(verdict);
    }
  }

  /// After a cycle whose responses ran: the ranks freeze the plan rank 0 proposed in it. Nothing is
  /// pending anywhere then (every tensor a rank reported has been answered and run), so every rank
  /// switches at the same point of its submissions; what this rank submitted since its last report
  /// goes into the plan's slots. A step that already ended here (end_step came first) is held to the
  /// plan as end_step would have held it: the submissions waiting here are all of it.
  void install_plan(std::span<const std::vector<std::uint32_t>> buckets) {
    if (!pending_.empty())
      throw error_on<error>(comm_.rank(), "engine protocol error", "a step plan proposed while ", pending_.size(),
                            " tensors are pending here");
    auto plan = std::make_shared<const step_plan>(cache_, buckets, comm_.rank());
    waiting_since_.assign(plan->buckets(), clock::time_point::max());
    {
      std::lock_guard lock(mutex_);
      plan_.emplace(plan);
      dropped_.reset();
      const std::uint32_t current = steps_ended_;
      std::vector<bool> ended_had(plan->tensors(), false);
      bool ended = false;  // submissions of the step that ended before this wait here
      std::deque<std::shared_ptr<engine_entry>> others;
      for (std::shared_ptr<engine_entry>& e : fresh_) {
        if (e->desc.step + 1 == current) {
          ended = true;
          if (const std::optional<std::uint32_t> k = plan->find(e->name)) ended_had[*k] = true;
        }
        const plan_slots::placed placed = plan_->place(e, e->desc.step == current);
        if (placed == plan_slots::placed::not_in_plan) others.push_back(std::move(e));
        if (placed == plan_slots::placed::completes_bucket) capture_bucket(plan_->bucket_of(*e));
      }
      fresh_.swap(others);
      if (ended)
        for (std::uint32_t k = 0; k < plan->tensors(); ++k)
          if (!ended_had[k]) {
            skipped_.push_back({plan->tensor(k).slot, current - 1});
            leave_plan_ = true;
          }
      plan_news_ = true;
    }
    std::lock_guard lock(stats_mutex_);
    ++stats_.plans_frozen;
    stats_.plan_buckets = plan->buckets();
  }

  /// One cycle (steps 1–6). True once every rank is shutting down.
  bool cycle(std::vector<std::shared_ptr<engine_entry>>& fresh, bool shutting_down) {
    const clock::time_point cycle_begin = clock::now();
    // Step 1: the report.
    report mine;
    mine.joined = joined_;
    mine.shutting_down = shutting_down;
    {
      std::lock_guard lock(mutex_);
      mine.skipped.swap(skipped_);
    }
    for (auto& e : fresh) {
      if (pending_.contains(e->name)) {
        finish(*e, std::make_exception_ptr(
                       error_on<usage_error>(comm_.rank(), "", name_of(e->desc.kind), " \"", e->name,
                                             "\" was submitted again while the previous one is still in flight")));
        continue;
      }
      pending_.emplace(e->name, e);
      if (auto slot = cache_.slot_of(e->name, e->desc, comm_.rank())) {
        mine.slots.push_back(*slot);
        mine.slot_steps.push_back(e->desc.step);
        if (coordinator_) {  // rank 0: where its tensors lie, for the plan's order within a bucket
          if (addresses_.size() <= *slot) addresses_.resize(*slot + 1, nullptr);
          addresses_[*slot] = e->desc.memory == memory_kind::cuda ? e->device_in : e->in.data();
        }
      } else {
        mine.full.push_back({e->name, e->desc});
      }
    }
    {
      std::lock_guard lock(stats_mutex_);
      ++stats_.cycles;
      stats_.cache_hits += mine.slots.size();
      stats_.full_reports += mine.full.size();
    }

    // Steps 2–4 on the coordinator; the others send their report and receive the responses.
    // Rank 0 takes the report of a quiet rank when it has come, and counts it as empty until then
    // ("quiet" above); a rank back from quiet waits for rank 0's answer with no deadline.
    std::vector<std::byte> responses;
    transport& t = comm_.transport();
    if (comm_.rank() == 0) {
      const bool after_quiet = std::exchange(quiet_, false);
      const auto n = static_cast<std::size_t>(comm_.size());
      std::vector<report> reports(n);
      reports[0] = std::move(mine);
      std::vector<incoming> in(n);
      std::vector<bool> took_part(n, true);
      absent_.resize(n);
      for (std::size_t r = 1; r < n; ++r)
        if (!absent_[r]) in[r] = expect_message(t, static_cast<int>(r), tag_report);
      // A quiet rank takes part once its report has come. Back from quiet with tensors pending here,
      // give the quiet ranks up to a cycle to come (in a training step they are submitting the same
      // tensors now): a cycle without them would leave those tensors for the next one, a cycle later.
      // Only then: a rank still absent after that is elsewhere, and is taken at a later cycle.
      const clock::time_point wait_until =
          after_quiet && !pending_.empty() ? clock::now() + cfg_.cycle_time : clock::time_point::min();
      for (std::size_t r = 1; r < n; ++r) {
        if (!absent_[r]) continue;
        while (!absent_[r]->first.test() && clock::now() < wait_until) std::this_thread::yield();
        if (absent_[r]->first.pending()) {
          took_part[r] = false;
          continue;
        }
        in[r] = std::move(*absent_[r]);
        absent_[r].reset();
      }
      const deadline until = comm_.default_deadline();
      for (std::size_t r = 1; r < n; ++r)
        if (took_part[r]) reports[r] = decode_report(finish_message(t, static_cast<int>(r), tag_report, in[r], until));
      const bool everyone = std::all_of(took_part.begin(), took_part.end(), [](bool b) { return b; });
      response_list list = coordinator_->coordinate(reports, clock::now(), everyone);
      responses = encode(list);
      for (std::size_t r = 1; r < n; ++r)
        if (took_part[r]) send_message(t, static_cast<int>(r), tag_response, responses, until);
      // A plan's rounds do not use reports: while it holds, no rank is absent.
      if (list.quiet && list.plan.empty())
        for (std::size_t r = 1; r < n; ++r)
          if (took_part[r]) absent_[r] = expect_message(t, static_cast<int>(r), tag_report);
    } else {
      std::vector<std::byte> bytes = encode(mine);
      incoming answer = expect_message(t, 0, tag_response);
      outgoing sent = start_message(t, 0, tag_report, bytes);
      if (std::exchange(quiet_, false)) {
        const std::array<request*, 3> requests{&sent.first, &sent.rest, &answer.first};
        const std::array<int, 3> peers{0, 0, 0};
        await_after_quiet(requests, peers, "this rank, back from quiet,");
      }
      const deadline until = comm_.default_deadline();
      sent.first.wait(until);
      sent.rest.wait(until);
      responses = finish_message(t, 0, tag_response, answer, until);
    }
    const clock::time_point responded = clock::now();
    if (timeline_ && cfg_.timeline_mark_cycles) timeline_->mark("cycles", "CYCLE", cycle_begin);

    // Steps 5 and 6.
    response_list list = decode_response_list(responses, cache_, comm_.size());
    executor_.execute(list.responses, responded);
    for (const auto& r : list.responses)
      if (r.type == response_type::run_full) cache_.remember(r);
    if (!list.plan.empty()) install_plan(list.plan);
    quiet_ = list.quiet;  // rank 0 set it from the same list
    if (list.all_joined) {
      joined_ = false;
      {
        std::lock_guard lock(mutex_);
        join_requested_ = false;
        join_done_ = true;
        last_joined_ = list.last_joined;
        steps_ended_ = 0;  // the ranks ran different numbers of steps before joining: count anew together
      }
      join_cv_.notify_all();
    }
    return list.all_shutdown;
  }

  // ---- what the fused executor (step 5) needs from the engine ---------------------------------

  std::shared_ptr<engine_entry> take(const std::string& name, std::optional<std::uint32_t> step) override {
    auto it = pending_.find(name);
    if (it == pending_.end() || (step && it->second->desc.step != *step)) return nullptr;
    std::shared_ptr<engine_entry> e = std::move(it->second);
    pending_.erase(it);
    return e;
  }

  void complete(std::span<const std::shared_ptr<engine_entry>> entries, std::exception_ptr error,
                std::span<const std::size_t> result_counts) override {
    complete_all(entries, std::move(error), result_counts);
  }

  void note(const std::string& text) override { log_(text); }

  void ran(std::size_t tensors) override {
    std::lock_guard lock(stats_mutex_);
    ++stats_.collectives;
    if (tensors > 1) ++stats_.fused_collectives;
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
    std::vector<std::uint64_t> settled;
    settled.reserve(done);
    for (std::size_t k = 0; k < entries.size(); ++k)
      if (now_finished[k]) settled.push_back(entries[k]->seq);
    if (!settled.empty()) tracker_->leave(settled);
    {
      std::lock_guard lock(stats_mutex_);
      stats_.tensors_done += done;
    }
    for (const auto& e : entries)
      if (e && e->done) e->done(handle(e), error);
  }

  void fail_everything(std::exception_ptr error) {
    std::deque<std::shared_ptr<engine_entry>> fresh;
    {
      std::lock_guard lock(mutex_);
      if (!failed_) failed_ = error;
      fresh.swap(fresh_);
      if (plan_) {
        for (std::shared_ptr<engine_entry>& e : plan_->take_all()) fresh.push_back(std::move(e));
        plan_.reset();
      }
    }
    join_cv_.notify_all();
    executor_.abandon(
        error, std::min<std::chrono::milliseconds>(std::chrono::duration_cast<std::chrono::milliseconds>(cfg_.timeout),
                                                   std::chrono::seconds(10)));
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
  bool sleeping_ = false;     // the background thread waits for work (a submission must wake it)
  bool quiet_sleep_ = false;  // it sleeps quiet ("quiet" below): under a plan, any submission wakes it
  bool join_requested_ = false;
  bool join_done_ = false;
  int last_joined_ = -1;
  std::exception_ptr failed_;
  std::string shutdown_reason_ = "the engine shut down";
  std::optional<plan_slots> plan_;       // the frozen step, while the ranks replay it
  std::optional<plan_slots> dropped_;    // the plan dropped in the current step, until it ends (its marks)
  bool plan_news_ = false;               // since the last round: a bucket completed, or a reason to leave
  bool leave_plan_ = false;              // this rank drops the plan at its next round
  std::vector<skipped_tensor> skipped_;  // plan tensors a step of this rank ended without, for its next report
  std::uint32_t steps_ended_ = 0;        // end_step() calls: the step of the next submission

  mutable std::mutex stats_mutex_;
  engine::statistics stats_;

  // background thread only
  std::unordered_map<std::string, std::shared_ptr<engine_entry>> pending_;
  response_cache cache_{cfg_.cache_capacity};
  bool joined_ = false;
  bool quiet_ = false;  // the last cycle or round left nothing outstanding anywhere ("quiet" above)
  std::vector<std::optional<incoming>> absent_;   // rank 0: the report of each quiet rank, expected
  std::vector<clock::time_point> waiting_since_;  // per bucket of the plan: begun somewhere, not yet run
  std::vector<const void*> addresses_;            // rank 0: where its tensor of each cache slot last lay
  fused_executor executor_{comm_, cfg_.fusion_threshold, device_, timeline_ ? &*timeline_ : nullptr, *this};

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
      throw error_on<timeout_error>(entry_->rank, name_of(entry_->desc.kind), "\"", entry_->name,
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
    throw error_on<timeout_error>(entry_->rank, name_of(entry_->desc.kind), "\"", entry_->name, "\" failed (", text,
                                  "), but tensors this rank submitted before are still in flight at the deadline (",
                                  in_flight, "): their buffers are still in use");
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
    throw error_on<usage_error>(entry_->rank, "handle::order_after", name_of(entry_->desc.kind), " \"", entry_->name,
                                "\" is a host tensor; wait() for it");
  std::unique_lock lock(entry_->mutex);
  if (!entry_->finished_cv.wait_until(lock, deadline_after(entry_->default_timeout),
                                      [&] { return entry_->enqueued || entry_->finished; }))
    throw error_on<timeout_error>(entry_->rank, name_of(entry_->desc.kind), "\"", entry_->name,
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
    throw error_on<usage_error>(comm.rank(), "engine",
                                "made after MPI_Finalize shut its communicator down (destroy flexpar's objects before "
                                "calling MPI_Finalize)");
  require_thread_multiple(comm, "engine", "its background thread", "use FLEXPAR_TRANSPORT=ucx");
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
    throw error_on<usage_error>(no_rank, "engine", op, " \"", name, "\": a buffer of ", bytes, " bytes cannot hold ",
                                count, " ", name_of(type), " elements");
}

handle engine::submit_device(std::string name, collective_kind kind, dtype type, reduce_op op, int root, const void* in,
                             void* out, std::size_t count, std::size_t out_capacity, void* stream,
                             completion_callback done) {
  return core_->submit_device(std::move(name), kind, type, op, root, in, out, count, out_capacity, stream,
                              std::move(done));
}

void engine::end_step() { core_->end_step(); }

device_backend* engine::device() const noexcept { return core_->device(); }

int engine::join() { return core_->join(); }
int engine::rank() const noexcept { return core_->comm().rank(); }
int engine::size() const noexcept { return core_->comm().size(); }
const config& engine::settings() const noexcept { return core_->settings(); }
engine::statistics engine::stats() const { return core_->stats(); }

}  // namespace flexpar
