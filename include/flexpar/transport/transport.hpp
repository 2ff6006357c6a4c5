// flexpar/transport/transport.hpp — point-to-point bytes between the ranks of a group.
//
// The one type-erased boundary of flexpar (STYLE §5): algorithms above it are templates, the
// transports below it (MPI, UCX, in-process; NCCL later) are compiled in lib/ behind this interface.
//
// Contract of every transport:
//  - isend/irecv are non-blocking and return a `request`; the span must stay valid and untouched
//    until the request completes or is destroyed. Destroying an unfinished request settles it: a
//    receive not yet matched is cancelled; a matched receive, or a send (which MPI and UCX cannot
//    cancel once started: the peer may be reading the buffer), is waited for up to one timeout
//    (config::timeout, shared by the requests abandoned together), then released to the library.
//  - Matching is by (peer, tag). Two messages from the same sender with the same tag are received
//    in the order they were sent. There is no wildcard source or tag.
//  - A receive buffer may be larger than the message (request::bytes() tells the size received);
//    a message larger than the buffer is an error (transport_error), never a silent truncation.
//    An exact receive (irecv_exact) takes only a message of its buffer's size: a shorter one is a
//    mismatch_error.
//  - Zero-length messages are messages: they match and complete like any other.
//  - Every blocking wait has a deadline: past it, timeout_error names the rank, op, peer, tag and size.
//  - The MPI and UCX transports watch their ranks (transport/liveness.hpp, heartbeats): a request
//    that has not completed throws peer_failure, naming the failed ranks, once a rank of its group
//    has failed, whichever peer it waits for.
//  - Tags run from 0 to max_tag() - 1; max_tag() itself is reserved for flexpar's own bootstrap.
//  - A transport is used by one thread at a time unless the transport says otherwise.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <flexpar/core/config.hpp>
#include <flexpar/core/deadline.hpp>
#include <flexpar/core/error.hpp>

namespace flexpar {

/// Message tags. Transports narrow the range (MPI_TAG_UB); see transport::max_tag().
using tag_t = std::uint64_t;

/// Whether a request sends or receives (in error messages).
enum class message_direction : unsigned char { send, recv };

namespace detail {

class liveness_view;

/// What a request is about, kept for its error messages.
struct request_info {
  std::string_view transport_name;  // "mpi", "ucx", "inproc" (static strings)
  message_direction direction = message_direction::send;
  int rank = -1;  // our rank in the transport's group
  int peer = -1;
  tag_t tag = 0;
  std::size_t size = 0;  // bytes offered (send) or room for (recv)
  /// How long wait_until() polls before it starts sleeping between polls (config::spin).
  std::chrono::microseconds spin{100000};
};

/// "[rank 1] ucx: recv of 4096 bytes from rank 0 (tag 7)"
std::string describe(const request_info& info);

/// One outstanding operation of a transport; each transport derives its own.
class request_state {
 public:
  explicit request_state(const request_info& info) : info_(info) {}
  request_state(const request_state&) = delete;
  request_state& operator=(const request_state&) = delete;
  virtual ~request_state() = default;

  /// Makes progress; true once complete. Throws transport_error if the operation failed.
  virtual bool test() = 0;
  /// Blocks until complete or `until`; false at the deadline. The default polls test() with
  /// a back-off; transports that can sleep on an event override it.
  virtual bool wait_until(deadline until);
  /// Called when a request is destroyed before completing: cancel what can be cancelled.
  virtual void abandon() noexcept = 0;
  /// Bytes received (recv) or sent (send) once complete.
  [[nodiscard]] virtual std::size_t bytes() const noexcept { return info_.size; }
  /// For a wait that ended at its deadline after `waited`: what the transport knows of why (the
  /// heartbeats' "rank 2 is alive but in no flexpar wait for 61 s"), or "".
  [[nodiscard]] virtual std::string stall_text(std::chrono::milliseconds /*waited*/) const { return {}; }

  [[nodiscard]] const request_info& info() const noexcept { return info_; }

 protected:
  request_info info_;
};

}  // namespace detail

/// Handle of a non-blocking send or receive. Move-only. Destroying an incomplete request settles it
/// (the contract above): once the destructor returns, the transfer no longer uses the buffer unless
/// it outlasted the timeout (a peer that never came), in which case the library still may.
class request {
 public:
  request() = default;  ///< An empty request: already complete, bytes() == 0.
  /// A request for an operation a transport has started (transports build these in do_isend/do_irecv).
  explicit request(std::unique_ptr<detail::request_state> state) : state_(std::move(state)) {}
  /// Takes over `other`'s operation; `other` becomes empty.
  request(request&&) noexcept = default;
  /// Abandons (cancels where possible) this request's operation, then takes over `other`'s.
  request& operator=(request&& other) noexcept {
    if (this != &other) {
      abandon();
      state_ = std::move(other.state_);
      bytes_ = other.bytes_;
      exact_ = other.exact_;
    }
    return *this;
  }
  ~request() { abandon(); }

  /// True once the operation completed (and releases its resources). Never blocks.
  /// @throws transport_error if the operation failed.
  bool test() {
    if (!state_) return true;
    if (!state_->test()) return false;
    finish();
    return true;
  }

  /// Blocks until the operation completes.
  /// @throws timeout_error at `until`, naming the rank, the op, the peer, the tag and the size.
  void wait(deadline until);

  /// Bytes the completed operation moved (for a receive: the size of the message received).
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }
  /// True while the operation has not been seen to complete (test() or wait() not yet true).
  [[nodiscard]] bool pending() const noexcept { return state_ != nullptr; }

  /// Makes a receive exact (transport::irecv_exact): a message of another size than its buffer is
  /// then a mismatch_error when test() or wait() sees it complete, not a shorter receive.
  void make_exact() noexcept { exact_ = true; }

 private:
  void finish() {
    bytes_ = state_->bytes();
    if (exact_ && bytes_ != state_->info().size) throw_inexact();
    state_.reset();
  }
  [[noreturn]] void throw_inexact();
  void abandon() noexcept {
    if (state_) state_->abandon();
    state_.reset();
  }

  std::unique_ptr<detail::request_state> state_;
  std::size_t bytes_ = 0;
  bool exact_ = false;
};

/// Waits for every request in `requests` (all share one deadline).
/// @throws timeout_error for the first request still pending at `until`.
void wait_all(std::span<request> requests, deadline until);

class transport;
namespace detail {
void bootstrap_allgather(transport& t, std::span<const std::byte> mine, std::span<std::byte> all, deadline until,
                         std::string_view what);
}

/// The point-to-point interface. Implementations: make_mpi_transport, make_ucx_transport,
/// inproc_world::make_transport.
class transport {
 public:
  transport() = default;
  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;
  virtual ~transport() = default;

  /// My rank in this transport's group, 0 <= rank() < size().
  [[nodiscard]] virtual int rank() const noexcept = 0;
  /// Number of ranks in this transport's group.
  [[nodiscard]] virtual int size() const noexcept = 0;
  /// Which transport this is.
  [[nodiscard]] virtual transport_kind kind() const noexcept = 0;
  /// One past the largest tag available to callers; max_tag() itself is reserved for flexpar.
  [[nodiscard]] virtual tag_t max_tag() const noexcept = 0;

  /// Starts sending `data` to `peer` under `tag`.
  /// @pre 0 <= tag < max_tag(); 0 <= peer < size() (checked: usage_error, or the library's own error).
  [[nodiscard]] request isend(int peer, tag_t tag, std::span<const std::byte> data) {
    check_open("isend");
    check_tag("isend", tag);
    return do_isend(peer, tag, data);
  }
  /// Starts receiving a message from `peer` with `tag` into `data` (which may be larger than it).
  [[nodiscard]] request irecv(int peer, tag_t tag, std::span<std::byte> data) {
    check_open("irecv");
    check_tag("irecv", tag);
    return do_irecv(peer, tag, data);
  }
  /// irecv of a message of exactly data.size() bytes: a shorter one is a mismatch_error naming the
  /// peer and both sizes when the request completes (a longer one is the transport_error of any
  /// receive). What the collectives post: their peers' messages have sizes both sides compute, so
  /// another size means the ranks disagree about the call.
  [[nodiscard]] request irecv_exact(int peer, tag_t tag, std::span<std::byte> data) {
    request r = irecv(peer, tag, data);
    r.make_exact();
    return r;
  }

  /// Collective over this transport's ranks: a new transport over the ranks that passed the same
  /// `color`, ordered by (key, rank); nullptr for ranks that passed a negative color.
  /// Messages on the new transport never match messages on this one.
  [[nodiscard]] virtual std::unique_ptr<transport> split(int color, int key) = 0;

  /// Shuts the transport down for good while MPI still works: MPI_Finalize does this through the
  /// communicator (core/mpi_finalize.hpp) to the transports still alive then. Afterwards isend, irecv
  /// and split throw usage_error; requests already made keep what they hold.
  void close() noexcept {
    if (closed_) return;
    closed_ = true;
    do_close();
  }
  /// True once close() ran.
  [[nodiscard]] bool closed() const noexcept { return closed_; }

  /// Which of this transport's ranks are alive, by heartbeats (transport/liveness.hpp): the view its
  /// requests consult, or nullptr where there is none (in-process, FLEXPAR_HEARTBEAT_MS=0).
  [[nodiscard]] virtual detail::liveness_view* liveness() const noexcept { return nullptr; }

  /// Sends `data` to `peer` under `tag` and waits for completion (isend + wait).
  /// @throws timeout_error at `until`.
  void send(int peer, tag_t tag, std::span<const std::byte> data, deadline until) {
    isend(peer, tag, data).wait(until);
  }
  /// Receives a message from `peer` with `tag` into `data` and waits for it (irecv + wait); returns
  /// the size of the message received. @throws timeout_error at `until`.
  std::size_t recv(int peer, tag_t tag, std::span<std::byte> data, deadline until) {
    request r = irecv(peer, tag, data);
    r.wait(until);
    return r.bytes();
  }
  /// irecv_exact + wait. @throws mismatch_error for a message of another size; timeout_error at `until`.
  void recv_exact(int peer, tag_t tag, std::span<std::byte> data, deadline until) {
    irecv_exact(peer, tag, data).wait(until);
  }

 protected:
  /// The transport's own send; the tag is already checked (max_tag() arrives only from flexpar's
  /// bootstrap). Peers are checked here (check_peer), or left to the library where it checks them.
  virtual request do_isend(int peer, tag_t tag, std::span<const std::byte> data) = 0;
  /// The transport's own receive; the same contract as do_isend.
  virtual request do_irecv(int peer, tag_t tag, std::span<std::byte> data) = 0;

  /// Throws usage_error unless 0 <= peer < size().
  void check_peer(std::string_view op, int peer) const;
  /// Throws usage_error once the transport is closed (split calls it; isend and irecv do already).
  void check_open(std::string_view op) const {
    if (closed_) throw_closed(op);
  }
  /// What close() releases; nothing by default.
  virtual void do_close() noexcept {}

 private:
  void check_tag(std::string_view op, tag_t tag) const;
  [[noreturn]] void throw_closed(std::string_view op) const;
  bool closed_ = false;
  friend void detail::bootstrap_allgather(transport&, std::span<const std::byte>, std::span<std::byte>, deadline,
                                          std::string_view);
};

namespace detail {
/// Every rank sends `mine` (same size on all ranks) to every other; `all` receives size() blocks in
/// rank order. Uses the reserved tag; for bootstrapping (split, topology) before collectives exist.
/// Costs p - 1 messages each way per rank. @throws timeout_error at `until`, naming `what` and every
/// rank whose block did not arrive.
void bootstrap_allgather(transport& t, std::span<const std::byte> mine, std::span<std::byte> all, deadline until,
                         std::string_view what = "bootstrap exchange");

/// Returns once every rank of `t` has called it (an exchange of empty messages: bootstrap_allgather).
/// Transports call it before a blocking MPI call that every rank must enter (MPI_Comm_split has no
/// non-blocking form), so that a rank that never comes is a timeout_error naming it, not a hang.
void bootstrap_barrier(transport& t, std::string_view what, deadline until);
}  // namespace detail

}  // namespace flexpar
