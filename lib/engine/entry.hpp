// lib/engine/entry.hpp — one submitted tensor as the engine keeps it (engine_entry, behind every
// handle), and the order in which a rank's tensors settle (settle_tracker, for handle::wait).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include <flexpar/engine/engine.hpp>

#include "protocol.hpp"

namespace flexpar::detail {

/// The tensors one rank has submitted and not yet seen finish, by submission order. handle::wait
/// rethrows a tensor's error only once every tensor submitted before that wait has finished: the
/// caller who unwinds on the error frees the buffers of the tensors it submitted with it, which the
/// engine may otherwise still be running (the error of one tensor is decided while the others of
/// its batch are still pending, and a caller may even submit more before it looks).
class settle_tracker {
 public:
  /// Registers a submission called `name` (which must stay alive until leave()); returns its number.
  std::uint64_t enter(const std::string& name) {
    std::lock_guard lock(mutex_);
    in_flight_.push_back({&name, false});
    return first_ + in_flight_.size() - 1;
  }
  /// Tensors finished (successfully or not), by their numbers.
  void leave(std::span<const std::uint64_t> seqs) {
    {
      std::lock_guard lock(mutex_);
      for (const std::uint64_t seq : seqs) in_flight_[seq - first_].done = true;
      while (!in_flight_.empty() && in_flight_.front().done) {
        in_flight_.pop_front();
        ++first_;
      }
    }
    settled_.notify_all();
  }
  void leave(std::uint64_t seq) { leave(std::span(&seq, 1)); }
  /// Submissions so far.
  [[nodiscard]] std::uint64_t submitted() {
    std::lock_guard lock(mutex_);
    return first_ + in_flight_.size();
  }
  /// Blocks until every tensor numbered below `limit` has finished; false at `until`, with the
  /// names of those still in flight in `names`.
  bool wait_before(std::uint64_t limit, deadline until, std::string& names) {
    std::unique_lock lock(mutex_);
    // the front is always unfinished: finished ones are dropped from the front as they go
    if (settled_.wait_until(lock, until, [&] { return in_flight_.empty() || first_ >= limit; })) return true;
    for (std::uint64_t k = 0; k < in_flight_.size() && first_ + k < limit; ++k)
      if (!in_flight_[k].done) names.append(names.empty() ? "\"" : ", \"").append(*in_flight_[k].name).append("\"");
    return false;
  }
  /// The engine's background thread (which must never wait for tensors it runs itself).
  std::atomic<std::thread::id> background;

 private:
  struct submission {
    const std::string* name;  // the entry's own name: alive until it finished
    bool done;
  };
  std::mutex mutex_;
  std::condition_variable settled_;
  std::uint64_t first_ = 0;           // the number of in_flight_.front()
  std::deque<submission> in_flight_;  // from the oldest unfinished one on
};

struct engine_entry {
  std::string name;
  int rank = -1;  // of the submitting engine's communicator: the rank its errors name
  description desc;
  std::span<const std::byte> in;
  std::span<std::byte> out;
  completion_callback done;
  std::chrono::milliseconds default_timeout{0};

  // device tensors (desc.memory == cuda): device addresses, the producer's stream and its position
  // (captured at submission, or once for the whole bucket when it is placed in a frozen plan), and
  // once the response is enqueued the marker of its end
  const void* device_in = nullptr;
  void* device_out = nullptr;
  std::size_t out_capacity = 0;  // elements
  void* stream = nullptr;
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
  std::uint64_t seq = 0;         // this tensor's place in the tracker
  std::uint32_t plan_index = 0;  // its tensor in the frozen plan, once placed there (step_plan.hpp)

  // timeline
  clock::time_point submitted, responded, exec_begin, copied_in, reduced, copied_out;
};

}  // namespace flexpar::detail
