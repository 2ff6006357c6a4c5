// flexpar/transport/liveness.hpp — which ranks of a job are alive: heartbeats on a side channel,
// so that a dead rank is known to every survivor within seconds whatever FLEXPAR_TIMEOUT says.
//
// A liveness_monitor is made once per communicator::from_mpi (collective: each rank's UDP address,
// pid and host are exchanged over the new transport) and shared by that transport and every
// transport split from it. Its thread, which never calls MPI or UCX, sends a datagram to every
// peer each config::heartbeat_interval and reads theirs; a peer is failed when
//  - it runs on this host (same kernel) and its process has exited (checked every tick), or
//  - no beat of it arrived for heartbeat_interval x heartbeat_misses (a dead host, a lost link, a
//    process stopped by SIGSTOP: a process that cannot beat is failed, whatever the reason), or
//  - a live peer's beat says so: every beat carries the failures its sender knows (gossip), so that
//    the survivors agree on the failed set within one beat of the first one to see it.
// Every beat also says for how long its sender has polled no flexpar request (the transports note
// each poll: note_poll). A rank that beats but is in no flexpar wait while the others wait for it is
// alive but elsewhere: frozen in its own code, or in another call. Not a failure (it may come back),
// but what a wait that ends at its deadline names (liveness_view::stall_text): every waiting
// survivor names the same rank, instead of the neighbour it happened to wait for.
// Failure is final: a rank failed stays failed. A rank that destroys its monitor says goodbye
// first and is not a failure. A rank told by a peer that it has itself been declared failed (it
// was silent too long) knows it too: its waits end as well, so that it cannot hang on the others.
//
// The transports ask their view (liveness_view, the monitor seen through one group's ranks) on
// every poll of a request that has not completed: once any member of the group has failed, the
// request throws peer_failure naming the failed ranks and why (strict mode, what collectives need:
// a rank waiting for a live peer that waits for a dead one would otherwise wait for its deadline).
// communicator::shrink() turns a view to peer-only mode, in which only requests to or from a
// failed peer fail, to agree over the old group on who is left.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <flexpar/core/config.hpp>
#include <flexpar/core/deadline.hpp>

namespace flexpar {

class transport;

namespace detail {

struct request_info;

/// Heartbeats among the ranks of one transport (its ranks are the monitor's ranks). Shared-owned by
/// the transports that use it; its thread stops (and says goodbye) when the last owner lets go.
class liveness_monitor {
 public:
  /// Why a rank is failed.
  enum class cause : std::uint8_t {
    exited = 1,    ///< its process on this host has exited
    silent = 2,    ///< no heartbeat for the configured interval x misses
    reported = 3,  ///< a live peer's heartbeat said so
  };

  /// Collective over `t`: exchanges every rank's heartbeat address, pid and host over `t` (the
  /// bootstrap exchange, with deadline `until`) and starts the thread. `interval` > 0.
  /// @throws error when the socket cannot be made; timeout_error when a rank does not take part.
  static std::shared_ptr<liveness_monitor> start(transport& t, std::chrono::milliseconds interval, int misses,
                                                 deadline until);

  liveness_monitor(const liveness_monitor&) = delete;
  liveness_monitor& operator=(const liveness_monitor&) = delete;
  /// Says goodbye to every live peer and stops the thread.
  ~liveness_monitor();

  /// My rank among the monitor's ranks.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks watched (mine included).
  [[nodiscard]] int size() const noexcept { return static_cast<int>(peers_.size()); }
  /// How many ranks are failed so far (never decreases); one relaxed load, for the transports' polls.
  [[nodiscard]] int failure_count() const noexcept { return failures_.load(std::memory_order_acquire); }
  /// True once `r` is failed (I am failed when a peer told me so).
  [[nodiscard]] bool failed(int r) const;
  /// Why `r` is failed ("its process (pid 1234 on this host) has exited", "no heartbeat for 2 s (...)",
  /// "its heartbeats stopped (seen by rank 1)"); empty if it is not.
  [[nodiscard]] std::string reason(int r) const;
  /// Marks `r` failed for `why` (as the thread does; e.g. a transport that saw its peer's endpoint fail).
  void declare_failed(int r, cause why, const std::string& detail);
  /// This process polls a flexpar request now (the transports' waits, on every poll). One relaxed
  /// store: an approximate count is enough, the thread only asks whether it moved.
  void note_poll() noexcept { polls_.store(polls_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  /// For a live rank `r` whose beats arrive: how long it had polled no flexpar request by its last
  /// beat, plus that beat's age; nullopt for me, a failed rank, or one whose beats are late.
  [[nodiscard]] std::optional<std::chrono::milliseconds> idle(int r) const;

 private:
  /// What the monitor knows of one rank.
  struct peer {
    std::uint32_t ip = 0;  // heartbeat address, network order
    std::uint16_t port = 0;
    std::int64_t pid = 0;
    bool same_host = false;  // same kernel: its pid can be checked here
    clock::time_point last_seen{};
    bool failed = false;
    bool left = false;             // said goodbye: not a failure
    cause origin = cause::silent;  // why the rank that saw it first failed it (what beats carry)
    int reporter = -1;             // who told this monitor (itself: it saw it first)
    std::string detail;
    std::uint32_t idle_ms = 0;  // its last beat: for how long it had polled no flexpar request
  };
  liveness_monitor(int rank, int fd, std::chrono::milliseconds interval, int misses);
  void run() noexcept;
  void beat(bool goodbye) noexcept;
  void receive() noexcept;
  void check(clock::time_point now) noexcept;
  void mark_failed(int r, cause origin, std::string detail, int reporter);

  int rank_;
  int fd_;
  int wake_fd_ = -1;
  std::uint64_t job_key_ = 0;
  std::chrono::milliseconds interval_;
  int misses_;
  mutable std::mutex mutex_;
  std::vector<peer> peers_;
  std::atomic<int> failures_{0};
  std::atomic<std::uint64_t> polls_{0};
  std::uint64_t polls_seen_ = 0;  // the thread's: polls_ at its last look, and when it last moved
  clock::time_point last_poll_ = clock::now();
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// A liveness_monitor seen through the ranks of one group (a transport, or one split from it):
/// `members[r]` is the monitor's rank of the group's rank r.
class liveness_view {
 public:
  /// A view of `monitor` over `members` (monitor ranks, in the group's rank order).
  liveness_view(std::shared_ptr<liveness_monitor> monitor, std::vector<int> members)
      : monitor_(std::move(monitor)), members_(std::move(members)) {}

  /// The group's ranks that are failed, ascending (empty: none).
  [[nodiscard]] std::vector<int> failed() const;
  /// True when a request of `info` cannot complete because of a failure: strict mode, any member
  /// failed (or I was declared failed); peer-only mode, its peer failed. The fast path is one load.
  [[nodiscard]] bool blocks(const request_info& info) const {
    monitor_->note_poll();
    return monitor_->failure_count() != 0 && check_blocks(info);
  }
  /// For a wait of `waited` that ended at its deadline: "; rank 2 is alive (its heartbeats arrive)
  /// but has been in no flexpar wait for 64 s: it is not in this call (stuck in its own code, or in
  /// another call)", over the group's live ranks idle for at least half of `waited` (at least 1 s);
  /// "" when none is.
  [[nodiscard]] std::string stall_text(std::chrono::milliseconds waited) const;
  /// A wait outside the transports (the shared-memory rounds) tells the monitor it is waiting.
  void note_wait() const noexcept { monitor_->note_poll(); }
  /// True once any member of the group has failed (one load while none has).
  [[nodiscard]] bool any_failed() const { return monitor_->failure_count() != 0 && !failed().empty(); }
  /// Throws peer_failure for a request of `info` that blocks(): the request, then "rank 2 failed:
  /// its process (pid 1234 on this host) has exited", one clause per failed member.
  [[noreturn]] void throw_failure(const request_info& info) const;
  /// Only requests to or from a failed peer fail from now on (communicator::shrink's agreement).
  void peer_only() noexcept { peer_only_.store(true, std::memory_order_release); }
  /// The monitor's rank of the group's rank `r`.
  [[nodiscard]] int member(int r) const { return members_.at(static_cast<std::size_t>(r)); }
  /// The monitor, for the views of groups split from this one.
  [[nodiscard]] const std::shared_ptr<liveness_monitor>& monitor() const noexcept { return monitor_; }
  /// "rank 2 failed: ...; rank 3 failed: ..." for the group's failed ranks (empty: none).
  [[nodiscard]] std::string failures_text() const { return failures_text(failed()); }

 private:
  std::string failures_text(const std::vector<int>& ranks) const;
  bool check_blocks(const request_info& info) const;

  std::shared_ptr<liveness_monitor> monitor_;
  std::vector<int> members_;
  std::atomic<bool> peer_only_{false};
};

/// Collective over `t`: a new monitor of t's ranks (liveness_monitor::start with cfg's interval and
/// misses, cfg.timeout as the deadline), seen through all of them; nullptr when
/// cfg.heartbeat_interval is zero (no heartbeats).
std::shared_ptr<liveness_view> start_watching(transport& t, const config& cfg);

/// Collective over `child`, a transport split from the one `parent` watches, where my rank was
/// `my_parent_rank`: the view of the same monitor through child's ranks (each rank's monitor rank
/// is exchanged over `child`, deadline `until`); nullptr when `parent` is null.
std::shared_ptr<liveness_view> watch_split(transport& child, const std::shared_ptr<liveness_view>& parent,
                                           int my_parent_rank, deadline until);

}  // namespace detail
}  // namespace flexpar
