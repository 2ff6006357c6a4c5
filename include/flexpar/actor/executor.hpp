// flexpar/actor/executor.hpp — a small pool of worker threads that runs actor graphs (no thread per actor).
//
// The pool is an object the caller owns (no global pool). run() hands a graph to the workers,
// which fire ready actors until every actor of this rank has finished; the calling thread meanwhile
// drives the graph's cross-rank edges (and fires actors too, unless the pool was made with
// caller_fires = false) (so only the caller's thread touches the transport: MPI's
// THREAD_FUNNELED level is enough when run() is called from the main thread).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <flexpar/actor/actor_graph.hpp>

namespace flexpar {

/// Worker threads that fire the actors of one graph at a time.
class actor_executor {
 public:
  /// A pool of `threads` workers (>= 1). With cross-rank edges, run()'s caller drives them and, if
  /// `caller_fires`, also fires ready actors between its polls (no wake-up of a worker for a short
  /// firing); with `caller_fires` false it only drives the edges (a progress thread: no message waits
  /// behind a long body, as a pipeline stage's). @throws usage_error for 0 threads.
  explicit actor_executor(std::size_t threads, bool caller_fires = true);
  /// Joins the workers (after the graph running, if any, is over).
  ~actor_executor();
  actor_executor(const actor_executor&) = delete;
  actor_executor& operator=(const actor_executor&) = delete;

  /// Runs `g` until every actor of this rank has finished (sources returned fire_result::done and
  /// their streams drained). With a cross-rank graph this is collective over the graph's ranks.
  /// @throws actor_failure naming the actor (and rank) whose body threw; the body's exception is nested.
  /// @throws timeout_error at `until`, naming every unfinished actor and what it waits for. run()
  ///         returns only after the bodies running at that moment have returned.
  /// @throws usage_error if the graph already ran, a port is unconnected, or another run() of this
  ///         pool is in progress.
  void run(actor_graph& g, deadline until);

  /// Number of worker threads.
  [[nodiscard]] std::size_t threads() const noexcept { return workers_.size(); }

 private:
  void worker_loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  detail::graph_core* job_ = nullptr;
  std::uint64_t generation_ = 0;
  std::size_t busy_ = 0;  // workers inside job_
  bool shutdown_ = false;
  bool caller_fires_;
  std::vector<std::thread> workers_;
};

}  // namespace flexpar
