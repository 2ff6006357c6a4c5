// lib/zero/comm_queue.hpp — the boxings of a sharded_data_parallel, run in the order they were asked
// for, on one background thread (or on the caller's, when it has none).
//
// Every rank submits the same boxings in the same order (the model's order), so running them FIFO on
// one thread keeps the collectives matched without any negotiation, as a CUDA stream keeps kernels in
// order. A task that throws fails every task queued after it with its text (they would otherwise
// start collectives that the failed one's peers are not in). The destructor runs the tasks still
// queued before it joins: every rank queued the same ones, so dropping them could leave a peer in a
// collective that this rank never joins (after a failure they fail fast instead; a collective ends
// at its deadline or when a peer is found dead).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace flexpar::zero::detail {

class comm_queue {
 public:
  /// One task's completion.
  struct ticket_state {
    bool done = false;
    std::exception_ptr error;
  };
  using ticket = std::shared_ptr<ticket_state>;

  /// `threaded`: run tasks on a background thread; otherwise submit() runs each at once.
  explicit comm_queue(bool threaded);
  ~comm_queue();
  comm_queue(const comm_queue&) = delete;
  comm_queue& operator=(const comm_queue&) = delete;

  /// Queues `task`; its ticket completes when it has run (or failed, or was dropped after a failure).
  ticket submit(std::function<void()> task);
  /// Waits for `t` (null: nothing to wait for); rethrows the exception its task ended with.
  void wait(const ticket& t);
  /// Waits until every task submitted so far has run; rethrows the first failure among them.
  void drain();

 private:
  void run_one(std::function<void()>& task, const ticket& t);
  void loop();

  struct item {
    std::function<void()> task;
    ticket done;
  };
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<item> queue_;
  ticket last_;
  std::exception_ptr failed_;  // the first failure: later tasks are not run
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace flexpar::zero::detail
