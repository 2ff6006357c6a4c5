// lib/engine/entry.hpp — one submitted tensor as the engine keeps it (engine_entry, behind every
// handle), and the order in which a rank's tensors settle (settle_tracker, for handle::wait).
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
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
  int rank = -1;  // of the submitting engine's communicator: the rank its errors name
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

}  // namespace flexpar::detail
