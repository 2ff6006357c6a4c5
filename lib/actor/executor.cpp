// lib/actor/executor.cpp — the worker pool of actor graphs (include/flexpar/actor/executor.hpp).
#include <flexpar/actor/executor.hpp>

#include <algorithm>
#include <thread>

namespace flexpar {

actor_executor::actor_executor(std::size_t threads, bool caller_fires) : caller_fires_(caller_fires) {
  if (threads == 0) throw error_on<usage_error>(no_rank, "actor_executor", "a pool needs at least one worker thread");
  workers_.reserve(threads);
  for (std::size_t i = 0; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

actor_executor::~actor_executor() {
  {
    std::lock_guard lock(mutex_);
    shutdown_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void actor_executor::worker_loop() {
  std::uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return shutdown_ || (job_ != nullptr && generation_ != seen); });
    if (shutdown_) return;
    seen = generation_;
    detail::graph_core* job = job_;
    ++busy_;
    lock.unlock();
    job->work();
    lock.lock();
    --busy_;
    cv_.notify_all();
  }
}

void actor_executor::run(actor_graph& g, deadline until) {
  detail::graph_core& core = g.core();
  {
    std::lock_guard lock(mutex_);
    if (job_ != nullptr)
      throw error_on<usage_error>(no_rank, "actor_executor::run", "this pool is already running a graph");
  }
  core.caller_fires = caller_fires_ && core.has_remote();
  try {
    core.start();
  } catch (...) {  // a wiring mistake here: tell the peers, so that they stop now rather than at their deadlines
    if (core.has_remote()) core.abort_remote(deadline_after(std::chrono::milliseconds(100)));
    throw;
  }
  {
    std::lock_guard lock(mutex_);
    job_ = &core;
    ++generation_;
  }
  cv_.notify_all();

  bool timed_out = false;
  if (core.has_remote()) {
    // Drive the cross-rank edges from this thread until the graph is over: poll, fire what became
    // ready right here (a hand-off to a sleeping worker costs a wake-up per message), and yield the
    // core when nothing moved for a while (the workers and the peer ranks need it more); idle for
    // longer than the spin time, sleep between polls as a transport wait does (2 us doubling to
    // 256 us), so that a rank waiting for its neighbours leaves the core to those that compute.
    unsigned idle_polls = 0;
    clock::time_point idle_since = clock::now();
    std::chrono::microseconds pause{2};
    bool sleeping = false;
    for (;;) {
      bool moved = core.poll_remote();
      {
        std::unique_lock lock(core.mutex);
        if (core.caller_fires)
          for (int budget = 16; budget > 0 && core.fire_one(lock); --budget) moved = true;
        if (core.over()) break;
      }
      if (clock::now() >= until) {
        timed_out = true;
        break;
      }
      if (moved) {
        idle_polls = 0;
        sleeping = false;
        pause = std::chrono::microseconds{2};
        continue;
      }
      if (++idle_polls == 1) idle_since = clock::now();
      if (idle_polls < 64) continue;
      if (!sleeping && (idle_polls & 15u) == 0 && clock::now() - idle_since >= core.bus_spin) sleeping = true;
      if (sleeping) {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds{256});
      } else {
        std::this_thread::yield();  // as request::wait: spin a little, then share the core
      }
    }
  } else {
    std::unique_lock lock(core.mutex);
    timed_out = !core.done_cv.wait_until(lock, until, [&] { return core.over(); });
  }

  std::unique_lock lock(core.mutex);
  if (timed_out) {
    core.stop();
    core.done_cv.wait(lock, [&] { return core.over(); });  // the bodies running now return
  }
  const bool aborted = !core.complete();
  lock.unlock();
  // Stopped early (a failure here, a peer's abort, or the deadline): tell the peers, so that they
  // stop too instead of waiting for their own deadlines.
  if (aborted && core.has_remote()) core.abort_remote(deadline_after(std::chrono::milliseconds(100)));
  {
    std::unique_lock pool_lock(mutex_);
    cv_.wait(pool_lock, [&] { return busy_ == 0; });
    job_ = nullptr;
  }
  lock.lock();
  core.rethrow_failure();
  if (timed_out && !core.complete()) throw core.timeout("actor_executor::run");
}

}  // namespace flexpar
