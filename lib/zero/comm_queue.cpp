#include "comm_queue.hpp"

#include <utility>

namespace flexpar::zero::detail {

comm_queue::comm_queue(bool threaded) {
  if (threaded) thread_ = std::thread([this] { loop(); });
}

comm_queue::~comm_queue() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();  // runs what is queued (or fails it fast after a failure)
}

void comm_queue::run_one(std::function<void()>& task, const ticket& t) {
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    error = failed_;
  }
  if (!error) {
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
  }
  task = nullptr;  // what the task captured (tensors) is released before the ticket completes
  std::lock_guard lock(mutex_);
  if (error && !failed_) failed_ = error;
  t->error = error;
  t->done = true;
  changed_.notify_all();
}

comm_queue::ticket comm_queue::submit(std::function<void()> task) {
  auto t = std::make_shared<ticket_state>();
  if (!thread_.joinable()) {
    run_one(task, t);
    return t;
  }
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({std::move(task), t});
    last_ = t;
  }
  changed_.notify_all();
  return t;
}

void comm_queue::wait(const ticket& t) {
  if (!t) return;
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return t->done; });
  if (t->error) std::rethrow_exception(t->error);
}

void comm_queue::drain() {
  ticket last;
  {
    std::lock_guard lock(mutex_);
    last = last_;
  }
  wait(last);  // FIFO: the last one done means all are
  std::lock_guard lock(mutex_);
  if (failed_) std::rethrow_exception(failed_);
}

void comm_queue::loop() {
  for (;;) {
    item it;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every task has run
      it = std::move(queue_.front());
      queue_.pop_front();
    }
    run_one(it.task, it.done);
  }
}

}  // namespace flexpar::zero::detail
