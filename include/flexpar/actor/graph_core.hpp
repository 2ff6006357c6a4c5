// flexpar/actor/graph_core.hpp — the type-erased state machine under every actor graph (registers, mailboxes,
// readiness).
//
// Nothing here is typed: `actor_graph` (actor_graph.hpp) builds the typed actors and ports on top,
// and the executors (executor.hpp, deterministic_scheduler.hpp) drive a `graph_core`. Every member
// is used under `graph_core::mutex` except where a comment says otherwise.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <flexpar/actor/regst.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/transport/transport.hpp>

namespace flexpar {

class timeline;

/// What one firing of an actor did with its output registers.
enum class fire_result : unsigned char {
  emit,  ///< publish every output register to the consumers (a body returning void means this)
  skip,  ///< consumed the inputs but publish nothing (e.g. accumulating); the registers stay free
  done,  ///< end of stream: publish nothing, the actor finishes and its consumers end after draining
  last,  ///< publish every output register, then end the stream as `done` (a source's last message)
};

/// An exception thrown inside an actor's body, as the caller of run()/step() sees it: the text names
/// the rank and the actor's label; the body's own exception is nested (std::rethrow_if_nested).
class actor_failure : public error {
 public:
  /// `label`: the actor that threw; `what`: the full message.
  actor_failure(std::string label, const std::string& what) : error(what), label_(std::move(label)) {}
  /// The label of the actor whose body threw.
  [[nodiscard]] const std::string& label() const noexcept { return label_; }

 private:
  std::string label_;
};

namespace detail {

/// Where an actor node runs and who fires it.
enum class node_kind : unsigned char {
  local,            ///< an actor of this rank, fired by an executor
  remote_sender,    ///< this rank's end of a cross-rank edge, producer side (driven by poll())
  remote_receiver,  ///< this rank's end of a cross-rank edge, consumer side (driven by poll())
  elsewhere,        ///< an actor placed on another rank: its ports exist for typing, it never runs here
};

/// Where an actor is in its life.
enum class node_state : unsigned char { idle, queued, running, finished };

/// One vertex of the graph, whatever its ports.
class actor_node {
 public:
  actor_node(std::string label, int rank, node_kind kind) : label_(std::move(label)), rank_(rank), kind_(kind) {}
  actor_node(const actor_node&) = delete;
  actor_node& operator=(const actor_node&) = delete;
  virtual ~actor_node() = default;

  /// The actor's label (errors, timeline, diagnostics).
  [[nodiscard]] const std::string& label() const noexcept { return label_; }
  /// The rank the actor is placed on.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Who runs this node.
  [[nodiscard]] node_kind kind() const noexcept { return kind_; }
  /// How many times the body ran (local actors).
  [[nodiscard]] std::uint64_t firings() const noexcept { return firings_; }

  /// Puts the actor on stream `s` (>= 0): actors of one stream never fire at the same time, as the
  /// kernels of one device stream or the actors of one OneFlow thread; -1 (the default): no stream.
  /// Set it before the graph starts.
  void set_stream(int s) noexcept { stream_ = s < 0 ? -1 : s; }
  /// The actor's stream, or -1.
  [[nodiscard]] int stream() const noexcept { return stream_; }
  /// Among the ready actors, a higher priority fires first; among equal priorities, the one ready
  /// first. Default 0. Set it before the graph starts.
  void set_priority(int p) noexcept { priority_ = p; }
  /// The actor's priority.
  [[nodiscard]] int priority() const noexcept { return priority_; }

  /// Runs the body once on the registers taken by graph_core::begin_fire (no lock held).
  virtual fire_result invoke(std::span<regst_base* const> inputs, std::span<regst_base* const> outputs) = 0;
  /// Cross-rank ends: progress the protocol (poll thread only, no lock held). True if anything moved.
  virtual bool poll(graph_core&, transport&) { return false; }
  /// What this node waits for (timeout diagnostics), under the lock.
  [[nodiscard]] virtual std::string waiting_for() const;

  std::vector<in_base*> inputs;    ///< input mailboxes, in port order
  std::vector<out_base*> outputs;  ///< output ports, in port order

 private:
  friend class graph_core;
  std::string label_;
  int rank_;
  node_kind kind_;
  node_state state_ = node_state::idle;
  std::uint64_t firings_ = 0;
  int stream_ = -1;
  int priority_ = 0;
  std::vector<regst_base*> fire_in_, fire_out_;  // the registers of the firing in progress
};

/// The shared state of one graph: nodes, the ready queue, completion and the first error.
class graph_core {
 public:
  graph_core(int rank, int size) : rank_(rank), size_(size) {}
  graph_core(const graph_core&) = delete;
  graph_core& operator=(const graph_core&) = delete;

  /// Takes ownership of a node; returns it.
  actor_node& add(std::unique_ptr<actor_node> node);
  /// Checks every port is connected and queues the actors that can fire. Once per graph.
  /// @throws usage_error naming the rank, the actor and the port that is not connected.
  void start();

  // ---- used by executors (lock held unless said) ----
  /// Takes a queued actor's input messages and free output registers; it is running afterwards.
  void begin_fire(actor_node& n);
  /// Runs the body of a begun actor (no lock held); records the firing on the timeline if any.
  /// Returns the exception the body threw, if any.
  std::exception_ptr invoke(actor_node& n, fire_result& result) noexcept;
  /// Publishes or drops the outputs (by `result`), returns the inputs, requeues the actor.
  void end_fire(actor_node& n, fire_result result);
  /// The body of `n` threw `e`: stop the graph, remember the first error and its label.
  void fail(actor_node& n, std::exception_ptr e);
  /// Fixes the order in which the actors of stream `s` fire: exactly `order` (an actor may appear
  /// many times), as a compiled plan fixes the order of a device's operations; once the order is
  /// spent, nothing more of the stream fires. Before start().
  void set_stream_order(int s, std::vector<actor_node*> order);
  /// `n`'s stream is free and, where the stream has an order, `n` is next in it.
  [[nodiscard]] bool in_turn(const actor_node& n) const noexcept;
  /// Of two ready actors, `a` goes first: a higher priority (equal: neither; the one ready first goes).
  [[nodiscard]] static bool goes_before(const actor_node& a, const actor_node& b) noexcept;
  /// The ready actor to fire next: the highest priority that is in_turn() (equal: the first ready),
  /// or ready().end() if none can fire now.
  [[nodiscard]] std::deque<actor_node*>::iterator next_ready() noexcept;
  /// One whole firing of the next_ready() actor (takes and releases the lock).
  /// False if the graph stopped or nothing can fire.
  bool fire_one(std::unique_lock<std::mutex>& lock);
  /// Worker loop of a pool thread: fire ready actors until the graph completes or stops.
  void work();
  /// Progresses every cross-rank end once (the poll thread; no lock held). True if anything moved.
  /// A failure of the protocol or a peer's abort (peer_failure) stops the graph and is kept as its
  /// error (rethrow_failure() throws it as it is).
  bool poll_remote();
  /// The graph stopped before completing: tell the peer of every unfinished cross-rank end (the poll
  /// thread; no lock held), waiting at most until `until` for those small messages to leave.
  void abort_remote(deadline until);
  /// An error was recorded (a body threw, or a cross-rank end failed).
  [[nodiscard]] bool failed() const noexcept { return error_ != nullptr; }

  /// Every node of this rank finished.
  [[nodiscard]] bool complete() const noexcept { return unfinished_ == 0; }
  /// An actor failed (or a deadline passed) and no body is running any more.
  [[nodiscard]] bool stopped() const noexcept { return stopping_ && running_ == 0; }
  /// Complete or stopped: the executor may return.
  [[nodiscard]] bool over() const noexcept { return complete() || stopped(); }
  /// Stops the graph: no new firing starts (a deadline passed). Wakes every waiter.
  void stop();
  /// Throws the recorded failure as actor_failure (with the body's exception nested), if any.
  void rethrow_failure() const;
  /// A timeout_error naming every unfinished actor of this rank and what it waits for.
  [[nodiscard]] timeout_error timeout(std::string_view op) const;
  /// The ready queue (deterministic scheduler).
  [[nodiscard]] std::deque<actor_node*>& ready() noexcept { return ready_; }
  /// True if some node is a cross-rank end (the executor must poll).
  [[nodiscard]] bool has_remote() const noexcept { return !remote_.empty(); }

  // ---- used by the cross-rank ends (lock held) ----
  /// A free register of `o`, now in use, or nullptr.
  regst_base* acquire(out_base& o);
  /// Gives back a register acquired and never published.
  void unacquire(regst_base& r);
  /// Publishes `r` (acquired from its owner) to every consumer of its owner.
  void publish(regst_base& r);
  /// `o` publishes nothing more; its consumers end after draining.
  void end_output(out_base& o);
  /// The oldest message of `i`, removed from the mailbox but still held (return it with release()).
  regst_base* take(in_base& i);
  /// True if `i` is empty and its producer ended.
  [[nodiscard]] static bool drained(const in_base& i) noexcept;
  /// One consumer returns `r`; the register is free when all have.
  void release(regst_base& r);
  /// `n` finished: its outputs end, its mailboxes close and give back what they hold.
  void finish(actor_node& n);

  /// The lock of everything above.
  std::mutex mutex;
  /// Pool threads wait here for ready actors.
  std::condition_variable work_cv;
  /// The caller of run() waits here for completion.
  std::condition_variable done_cv;

  /// This rank and the graph's world size.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The private transport of cross-rank edges (null on a one-rank graph); shared by the graphs
  /// that run one after another on it (actor_graph(comm, bus)).
  std::shared_ptr<transport> bus;
  /// Deadline length of the cross-rank ends' internal waits.
  clock::duration bus_timeout = std::chrono::seconds(300);
  /// How long the executor polls an idle graph before it sleeps between polls (config::spin).
  std::chrono::microseconds bus_spin{100000};
  /// Records every firing as a span on the actor's track, if set (not owned).
  timeline* trace = nullptr;
  /// The caller of run() fires ready actors between its polls (cross-rank graphs): pool workers are
  /// woken only when more than one actor is ready.
  bool caller_fires = false;

 private:
  void check(actor_node& n);
  void end_stream(actor_node& n);  // n's stream is free again

  int rank_, size_;
  std::vector<std::unique_ptr<actor_node>> nodes_;
  std::vector<actor_node*> remote_;
  std::deque<actor_node*> ready_;  // queued actors, oldest first
  std::vector<char> stream_busy_;  // by stream: an actor of it is firing
  struct stream_plan {
    std::vector<actor_node*> order;
    std::size_t next = 0;
  };
  std::vector<stream_plan> stream_plans_;  // by stream: a fixed order (empty: none)
  std::size_t unfinished_ = 0;
  std::size_t running_ = 0;
  bool started_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::string error_label_;
  bool error_is_remote_ = false;  // from a cross-rank end: rethrown as it is
};

}  // namespace detail
}  // namespace flexpar
