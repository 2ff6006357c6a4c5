// lib/transport/ucx/ucx_transport.cpp — the UCX transport: ucp tag send/receive on one worker per
// transport, worker addresses exchanged over a flexpar-owned MPI duplicate (point to point, with the
// configured deadline).
//
// ucp tags carry the sender's rank in the upper 32 bits and flexpar's tag in the lower 32, and every
// receive matches all 64 bits, so a receive takes exactly one (peer, tag) stream in send order.
//
// Messages to oneself never touch UCX: with UCX_TLS=shm or tcp the `self` transport may be absent,
// and a self endpoint would then fail or fall back to a socket. They are matched here instead, FIFO
// per tag, with one copy and the same outcomes as the UCX path (truncation, zero length).
//
// UCX reads its UCX_* environment variables as usual; FLEXPAR_P2P_UCX_* variables override them for
// flexpar's contexts only (MPI, when it runs over UCX itself, does not see them).
//
// Waits poll the worker for config::spin (latency), then arm the worker and sleep in poll() on
// its event file descriptor (UCP_FEATURE_WAKEUP) so that an idle rank leaves its core to others.
//
// Liveness (transport/liveness.hpp): a request that has not completed asks the transport's view on
// every poll whether a rank it depends on has failed and throws peer_failure naming it; abandoning
// and the teardown's barriers stop waiting for failed ranks.
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/core/check_ucx.hpp>
#include <flexpar/core/mpi_comm.hpp>
#include <flexpar/transport/liveness.hpp>
#include <flexpar/transport/ucx.hpp>

#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace flexpar {
namespace {

constexpr std::string_view transport_name = "ucx";
constexpr int tag_bits = 32;
constexpr ucp_tag_t full_tag_mask = ~ucp_tag_t{0};
// Longest single sleep on the event fd: a cap, so that an event a transport fails to signal costs
// at most this much latency instead of the whole remaining deadline.
constexpr std::chrono::milliseconds max_sleep{100};

ucp_tag_t make_ucp_tag(int sender, tag_t tag) {
  return (static_cast<ucp_tag_t>(static_cast<unsigned>(sender)) << tag_bits) | (tag & 0xffffffffu);
}

std::string status_text(ucs_status_t status) {
  return std::string(ucs_status_string(status)) + " (code " + std::to_string(static_cast<long>(status)) + ")";
}

/// A message to oneself, matched inside the transport.
struct self_op {
  message_direction direction = message_direction::send;
  std::span<std::byte> recv_buffer;
  std::span<const std::byte> send_buffer;
  bool done = false;
  ucs_status_t status = UCS_OK;
  std::size_t bytes = 0;
};

/// One peer's endpoint, and what its error handler recorded.
struct peer_slot {
  ucp_ep_h ep = nullptr;
  bool detects_failure = false;  // created in UCP_ERR_HANDLING_MODE_PEER
  ucs_status_t failure = UCS_OK;
};

/// Context, worker, endpoints and the self mailbox. Shared by the transport and its requests, so
/// that a request outliving its transport can still be tested or cancelled.
class ucx_shared {
 public:
  ucx_shared(int rank, int size, const config& cfg) : rank_(rank), spin_(cfg.spin), timeout_(cfg.timeout) {
    try {
      open(size);
    } catch (...) {
      release();  // the destructor does not run for a constructor that throws
      throw;
    }
  }

  ucx_shared(const ucx_shared&) = delete;
  ucx_shared& operator=(const ucx_shared&) = delete;
  ~ucx_shared() { release(); }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] ucp_worker_h worker() const noexcept { return worker_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// The deadline of an abandoned request: one timeout after the first abandon of a series, so that
  /// the requests a failing collective leaves behind share one deadline.
  deadline settle_deadline() noexcept {
    const clock::time_point now = clock::now();
    if (settle_until_ <= now) settle_until_ = now + timeout_;
    return settle_until_;
  }
  [[nodiscard]] peer_slot& slot(int peer) { return slots_[static_cast<std::size_t>(peer)]; }

  /// The liveness view the requests consult (null: none).
  void watch(std::shared_ptr<detail::liveness_view> view) noexcept { liveness_ = std::move(view); }
  [[nodiscard]] const std::shared_ptr<detail::liveness_view>& liveness() const noexcept { return liveness_; }
  /// True when a failed rank keeps the request of `info` from completing.
  [[nodiscard]] bool blocked(const detail::request_info& info) const { return liveness_ && liveness_->blocks(info); }
  /// True when some rank of the group has failed.
  [[nodiscard]] bool any_failed() const { return liveness_ && !liveness_->failed().empty(); }

  /// Endpoints to every peer but ourselves. `same_node[p]` says whether peer p shares our node.
  void connect(const std::vector<std::vector<std::byte>>& addresses, const std::vector<bool>& same_node) {
    for (std::size_t p = 0; p < slots_.size(); ++p) {
      if (static_cast<int>(p) == rank_) continue;
      peer_slot& s = slots_[p];
      const auto* address = reinterpret_cast<const ucp_address_t*>(addresses[p].data());
      // PEER mode makes a dead peer fail our operations to it instead of leaving them to the
      // deadline. UCX 1.13's shared-memory transports cannot detect a dead peer, and asking for
      // PEER mode then routes the endpoint over TCP loopback (or, with UCX_TLS=shm, nowhere): so
      // peers on our node get NONE and keep shared memory; their failure surfaces as a timeout.
      if (!same_node[p]) {
        const ucs_status_t status = create_endpoint(address, UCP_ERR_HANDLING_MODE_PEER, s);
        if (status == UCS_OK) continue;
        if (status != UCS_ERR_UNREACHABLE) FLEXPAR_CHECK_UCX(rank_, status);
        // No transport to that peer can detect failures: connect without detection.
      }
      FLEXPAR_CHECK_UCX(rank_, create_endpoint(address, UCP_ERR_HANDLING_MODE_NONE, s));
    }
  }

  /// Closes every open endpoint and progresses until the closes finish or `until`; false when some
  /// did not finish in time. `force` releases endpoints without flushing where that is allowed
  /// (UCX requires PEER error handling for it); the others are flushed.
  bool close_endpoints(bool force, deadline until) noexcept {
    std::vector<void*> pending;
    for (peer_slot& s : slots_) {
      if (!s.ep) continue;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = force && s.detects_failure ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      void* close = ucp_ep_close_nbx(s.ep, &param);
      s.ep = nullptr;
      // An error here (e.g. the peer already failed) still releases the endpoint: nothing to wait for.
      if (close != nullptr && !UCS_PTR_IS_ERR(close)) pending.push_back(close);
    }
    bool finished = true;
    for (void* close : pending) {
      while (ucp_request_check_status(close) == UCS_INPROGRESS && clock::now() < until) progress_until_quiet();
      if (ucp_request_check_status(close) == UCS_INPROGRESS) finished = false;
      ucp_request_free(close);
    }
    return finished;
  }

  void progress_until_quiet() noexcept {
    while (ucp_worker_progress(worker_) != 0) {
    }
  }

  /// Blocks until `done()` or `until`; false at the deadline. Polls for the spin time, then sleeps
  /// on the worker's event fd. `done` must not progress the worker itself.
  template <class Done>
  bool wait(Done&& done, deadline until) {
    const auto spin_until = clock::now() + spin_;
    for (;;) {
      if (done()) return true;
      ucp_worker_progress(worker_);
      if (done()) return true;
      const auto now = clock::now();
      if (now >= until) return false;
      if (now < spin_until) continue;
      // Arming needs a drained worker; events that arrive after arming wake the fd.
      progress_until_quiet();
      if (done()) return true;
      const ucs_status_t armed = ucp_worker_arm(worker_);
      if (armed == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress them first
      FLEXPAR_CHECK_UCX(rank_, armed);
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now);
      pollfd fd{efd_, POLLIN, 0};
      if (::poll(&fd, 1, static_cast<int>(std::min(left, max_sleep).count())) < 0 && errno != EINTR) {
        const int code = errno;  // read once: building the text may change errno
        throw transport_error("UCX", code,
                              error_text(rank_, "", "poll() on the UCX worker's event fd failed: ",
                                         std::system_category().message(code)));
      }
    }
  }

  // ---- self messages ----------------------------------------------------------------------------

  void post_self(tag_t tag, const std::shared_ptr<self_op>& op) {
    const bool send = op->direction == message_direction::send;
    auto& partners = send ? self_recvs_[tag] : self_sends_[tag];
    if (partners.empty()) {
      (send ? self_sends_[tag] : self_recvs_[tag]).push_back(op);
      return;
    }
    std::shared_ptr<self_op> partner = std::move(partners.front());
    partners.pop_front();
    transfer(send ? *op : *partner, send ? *partner : *op);
  }

  void abandon_self(tag_t tag, const std::shared_ptr<self_op>& op) noexcept {
    if (op->done) return;
    auto& queue = op->direction == message_direction::send ? self_sends_[tag] : self_recvs_[tag];
    queue.erase(std::remove(queue.begin(), queue.end(), op), queue.end());
    op->done = true;
  }

 private:
  void open(int size) {
    // Prefix "FLEXPAR_P2P": UCX_* variables apply, FLEXPAR_P2P_UCX_* ones override them for flexpar
    // only. (Not "FLEXPAR": UCX would then claim FLEXPAR_UCX_* variables of flexpar's own.)
    ucp_config_t* raw_config = nullptr;
    FLEXPAR_CHECK_UCX(rank_, ucp_config_read("FLEXPAR_P2P", nullptr, &raw_config));
    const std::unique_ptr<ucp_config_t, void (*)(ucp_config_t*)> ucx_config(raw_config, &ucp_config_release);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.estimated_num_eps = static_cast<std::size_t>(size);
    FLEXPAR_CHECK_UCX(rank_, ucp_init(&params, ucx_config.get(), &context_));

    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // a transport is used by one thread at a time
    FLEXPAR_CHECK_UCX(rank_, ucp_worker_create(context_, &worker_params, &worker_));
    FLEXPAR_CHECK_UCX(rank_, ucp_worker_get_efd(worker_, &efd_));
    slots_.resize(static_cast<std::size_t>(size));
  }

  void release() noexcept {
    // Endpoints still open here belong to a transport whose constructor failed or whose orderly
    // close ran out of time: release them without waiting for peers.
    if (worker_) close_endpoints(true, deadline_after(std::chrono::seconds(1)));
    if (worker_) ucp_worker_destroy(worker_);
    if (context_) ucp_cleanup(context_);
    worker_ = nullptr;
    context_ = nullptr;
  }

  ucs_status_t create_endpoint(const ucp_address_t* address, ucp_err_handling_mode_t mode, peer_slot& s) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.address = address;
    params.err_mode = mode;
    if (mode == UCP_ERR_HANDLING_MODE_PEER) {
      params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      params.err_handler.cb = &on_endpoint_error;
      params.err_handler.arg = &s;
    }
    const ucs_status_t status = ucp_ep_create(worker_, &params, &s.ep);
    if (status == UCS_OK) s.detects_failure = mode == UCP_ERR_HANDLING_MODE_PEER;
    return status;
  }

  static void on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* s = static_cast<peer_slot*>(arg);
    if (s->failure == UCS_OK) s->failure = status;
  }

  static void transfer(self_op& send, self_op& recv) {
    // As over UCX: the receive reports the truncation, the send completes.
    send.done = recv.done = true;
    send.bytes = send.send_buffer.size();
    if (send.send_buffer.size() > recv.recv_buffer.size()) {
      recv.status = UCS_ERR_MESSAGE_TRUNCATED;
      return;
    }
    if (!send.send_buffer.empty())
      std::memcpy(recv.recv_buffer.data(), send.send_buffer.data(), send.send_buffer.size());
    recv.bytes = send.send_buffer.size();
  }

  int rank_;
  std::shared_ptr<detail::liveness_view> liveness_;
  std::chrono::microseconds spin_;
  std::chrono::milliseconds timeout_;
  deadline settle_until_{};
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::vector<peer_slot> slots_;  // sized once: the error handlers hold pointers into it
  std::map<tag_t, std::deque<std::shared_ptr<self_op>>> self_sends_;  // posted, not yet received
  std::map<tag_t, std::deque<std::shared_ptr<self_op>>> self_recvs_;  // posted, not yet matched
};

/// An operation to or from another rank: a ucp request (or none when it completed immediately).
class ucx_request final : public detail::request_state {
 public:
  ucx_request(const detail::request_info& info, std::shared_ptr<ucx_shared> shared, void* handle)
      : request_state(info), shared_(std::move(shared)), handle_(handle) {}

  ucx_request(const ucx_request&) = delete;
  ucx_request& operator=(const ucx_request&) = delete;
  ~ucx_request() override {
    if (handle_) ucp_request_free(handle_);
  }

  bool test() override {
    if (!settled()) ucp_worker_progress(shared_->worker());
    return check(settled());
  }

  bool wait_until(deadline until) override {
    return check(shared_->wait([this] { return settled(); }, until));
  }

  void abandon() noexcept override {
    if (!handle_) return;
    // A receive is cancelled (one already matched to a message finishes instead); a send cannot be
    // (ucp_request_cancel takes receives only), and its peer may be reading the buffer right now.
    // Either way: progress until UCX lets go of the buffer, up to the deadline; past it the request
    // is released to UCX, which frees it when it ends.
    if (info_.direction == message_direction::recv) ucp_request_cancel(shared_->worker(), handle_);
    const deadline until = shared_->settle_deadline();
    try {
      while (ucp_request_check_status(handle_) == UCS_INPROGRESS && clock::now() < until && !shared_->blocked(info_))
        ucp_worker_progress(shared_->worker());
    } catch (...) {
    }
    ucp_request_free(handle_);
    handle_ = nullptr;
  }

  [[nodiscard]] std::size_t bytes() const noexcept override {
    return info_.direction == message_direction::recv ? received_ : info_.size;
  }
  [[nodiscard]] std::string stall_text(std::chrono::milliseconds waited) const override {
    return shared_->liveness() ? shared_->liveness()->stall_text(waited) : std::string();
  }

 private:
  /// True once the operation finished (well or not), or its peer failed. Never progresses.
  bool settled() {
    if (!handle_) return true;
    ucs_status_t status = UCS_OK;
    if (info_.direction == message_direction::recv) {
      ucp_tag_recv_info_t tag_info{};
      status = ucp_tag_recv_request_test(handle_, &tag_info);
      if (status == UCS_OK) received_ = tag_info.length;
    } else {
      status = ucp_request_check_status(handle_);
    }
    if (status == UCS_INPROGRESS) {
      // Receives are not tied to an endpoint, so UCX cannot fail them when the sender dies.
      const ucs_status_t failure = shared_->slot(info_.peer).failure;
      if (info_.direction == message_direction::recv && failure != UCS_OK) {
        peer_failed_ = failure;
        return true;
      }
      if (shared_->blocked(info_)) {
        liveness_failed_ = true;
        return true;
      }
      return false;
    }
    status_ = status;
    ucp_request_free(handle_);
    handle_ = nullptr;
    return true;
  }

  bool check(bool done) const {
    if (!done) return false;
    if (liveness_failed_) shared_->liveness()->throw_failure(info_);
    if (peer_failed_ != UCS_OK)
      throw peer_failure(detail::describe(info_) + " failed: rank " + std::to_string(info_.peer) +
                         " is unreachable: " + status_text(peer_failed_));
    if (status_ != UCS_OK) {
      const ucs_status_t failure = shared_->slot(info_.peer).failure;
      if (failure != UCS_OK)
        throw peer_failure(detail::describe(info_) + " failed: rank " + std::to_string(info_.peer) +
                           " is unreachable: " + status_text(failure) + "; the operation: " + status_text(status_));
      throw transport_error("UCX", static_cast<long>(status_),
                            detail::describe(info_) + " failed: " + status_text(status_));
    }
    return true;
  }

  std::shared_ptr<ucx_shared> shared_;
  void* handle_;  // nullptr once released (a send may complete immediately and have none)
  std::size_t received_ = 0;
  ucs_status_t status_ = UCS_OK;
  ucs_status_t peer_failed_ = UCS_OK;
  bool liveness_failed_ = false;  // a failed rank keeps this request from completing
};

/// An operation to or from oneself, matched by the transport.
class self_request final : public detail::request_state {
 public:
  self_request(const detail::request_info& info, std::shared_ptr<ucx_shared> shared, std::shared_ptr<self_op> op)
      : request_state(info), shared_(std::move(shared)), op_(std::move(op)) {}

  bool test() override {
    // Progress anyway: others may be waiting on our sends while we poll our own messages.
    if (!op_->done) ucp_worker_progress(shared_->worker());
    return check();
  }
  bool wait_until(deadline until) override {
    if (!shared_->wait([this] { return op_->done; }, until)) return false;
    return check();
  }
  void abandon() noexcept override { shared_->abandon_self(info_.tag, op_); }
  [[nodiscard]] std::size_t bytes() const noexcept override { return op_->bytes; }

 private:
  bool check() const {
    if (!op_->done) return false;
    if (op_->status != UCS_OK)
      throw transport_error("UCX", static_cast<long>(op_->status),
                            detail::describe(info_) + " failed: " + status_text(op_->status));
    return true;
  }

  std::shared_ptr<ucx_shared> shared_;
  std::shared_ptr<self_op> op_;
};

class ucx_transport final : public transport {
 public:
  /// Collective over `comm`.
  ucx_transport(detail::owned_mpi_comm comm, const config& cfg) : comm_(std::move(comm)), config_(cfg) {
    FLEXPAR_CHECK_MPI(MPI_Comm_rank(comm_.get(), &rank_));
    FLEXPAR_CHECK_MPI(MPI_Comm_size(comm_.get(), &size_));
    shared_ = std::make_shared<ucx_shared>(rank_, size_, cfg);
    shared_->connect(exchange_addresses(), same_node());
  }

  ucx_transport(const ucx_transport&) = delete;
  ucx_transport& operator=(const ucx_transport&) = delete;

  ~ucx_transport() override { teardown(); }

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }
  [[nodiscard]] transport_kind kind() const noexcept override { return transport_kind::ucx; }
  [[nodiscard]] tag_t max_tag() const noexcept override { return (tag_t{1} << tag_bits) - 1; }

  [[nodiscard]] std::unique_ptr<transport> split(int color, int key) override {
    check_open("split");
    // MPI_Comm_split blocks until every rank is in it: first make sure they all are (over UCX).
    detail::bootstrap_barrier(*this, "split", deadline_after(config_.timeout));
    detail::owned_mpi_comm sub = detail::split_for_flexpar(comm_.get(), color, key);
    if (sub.get() == MPI_COMM_NULL) return nullptr;
    auto child = std::make_unique<ucx_transport>(std::move(sub), config_);
    child->watch(detail::watch_split(*child, shared_->liveness(), rank_, deadline_after(config_.timeout)));
    return child;
  }

  [[nodiscard]] detail::liveness_view* liveness() const noexcept override { return shared_->liveness().get(); }

  /// Makes the requests consult `view` (make_ucx_transport, split).
  void watch(std::shared_ptr<detail::liveness_view> view) noexcept { shared_->watch(std::move(view)); }

 protected:
  /// At MPI_Finalize (through the communicator): the orderly teardown while MPI still works.
  void do_close() noexcept override { teardown(); }

  request do_isend(int peer, tag_t tag, std::span<const std::byte> data) override {
    check_peer("isend", peer);
    const detail::request_info info = describe_op(message_direction::send, peer, tag, data.size());
    if (peer == rank_) {
      auto op = std::make_shared<self_op>();
      op->direction = message_direction::send;
      op->send_buffer = data;
      shared_->post_self(tag, op);
      return request(std::make_unique<self_request>(info, shared_, std::move(op)));
    }
    ucp_request_param_t param{};  // contiguous bytes, no callback: completion is polled
    void* handle = ucp_tag_send_nbx(shared_->slot(peer).ep, data.data(), data.size(), make_ucp_tag(rank_, tag), &param);
    if (UCS_PTR_IS_ERR(handle))
      detail::throw_ucx_failure(rank_, UCS_PTR_STATUS(handle), call_text("ucp_tag_send_nbx", info).c_str(),
                                std::source_location::current());
    return request(std::make_unique<ucx_request>(info, shared_, handle));
  }

  request do_irecv(int peer, tag_t tag, std::span<std::byte> data) override {
    check_peer("irecv", peer);
    const detail::request_info info = describe_op(message_direction::recv, peer, tag, data.size());
    if (peer == rank_) {
      auto op = std::make_shared<self_op>();
      op->direction = message_direction::recv;
      op->recv_buffer = data;
      shared_->post_self(tag, op);
      return request(std::make_unique<self_request>(info, shared_, std::move(op)));
    }
    // Always a request, never an immediate completion: UCX 1.13 does not fill recv_info.tag_info
    // when a receive completes immediately, so the received length comes from the request.
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    void* handle =
        ucp_tag_recv_nbx(shared_->worker(), data.data(), data.size(), make_ucp_tag(peer, tag), full_tag_mask, &param);
    if (UCS_PTR_IS_ERR(handle))
      detail::throw_ucx_failure(rank_, UCS_PTR_STATUS(handle), call_text("ucp_tag_recv_nbx", info).c_str(),
                                std::source_location::current());
    return request(std::make_unique<ucx_request>(info, shared_, handle));
  }

 private:
  [[nodiscard]] detail::request_info describe_op(message_direction d, int peer, tag_t tag, std::size_t size) const {
    return {transport_name, d, rank_, peer, tag, size, config_.spin};
  }

  static std::string call_text(std::string_view call, const detail::request_info& info) {
    return std::string(call) + "(peer " + std::to_string(info.peer) + ", tag " + std::to_string(info.tag) + ", " +
           std::to_string(info.size) + " bytes)";
  }

  /// Every rank's worker address, by rank (collective over comm_, with the configured deadline: a
  /// rank whose UCX failed to open is named, not waited for).
  std::vector<std::vector<std::byte>> exchange_addresses() {
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
    FLEXPAR_CHECK_UCX(rank_, ucp_worker_query(shared_->worker(), &attr));
    std::vector<std::byte> mine(reinterpret_cast<const std::byte*>(attr.address),
                                reinterpret_cast<const std::byte*>(attr.address) + attr.address_length);
    ucp_worker_release_address(shared_->worker(), attr.address);
    return detail::exchange_for_flexpar(comm_.get(), mine, deadline_after(config_.timeout),
                                        "ucx: the worker address exchange");
  }

  /// Which ranks of comm_ share our node (MPI_Comm_split_type SHARED). Collective over comm_.
  std::vector<bool> same_node() {
    MPI_Comm node = MPI_COMM_NULL;
    FLEXPAR_CHECK_MPI(MPI_Comm_split_type(comm_.get(), MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    detail::owned_mpi_comm owned(node);
    MPI_Group node_group = MPI_GROUP_NULL, all_group = MPI_GROUP_NULL;
    FLEXPAR_CHECK_MPI(MPI_Comm_group(owned.get(), &node_group));
    int node_size = 0;
    int translated = MPI_Group_size(node_group, &node_size);
    std::vector<int> node_ranks, comm_ranks;
    if (translated == MPI_SUCCESS) {
      node_ranks.resize(static_cast<std::size_t>(node_size));
      comm_ranks.resize(node_ranks.size());
      for (int i = 0; i < node_size; ++i) node_ranks[static_cast<std::size_t>(i)] = i;
      translated = MPI_Comm_group(comm_.get(), &all_group);
    }
    if (translated == MPI_SUCCESS)
      translated = MPI_Group_translate_ranks(node_group, node_size, node_ranks.data(), all_group, comm_ranks.data());
    // Free both groups before reporting a failure of any step above.
    const int freed_all = all_group != MPI_GROUP_NULL ? MPI_Group_free(&all_group) : MPI_SUCCESS;
    const int freed_node = MPI_Group_free(&node_group);
    FLEXPAR_CHECK_MPI(translated);
    FLEXPAR_CHECK_MPI(freed_all);
    FLEXPAR_CHECK_MPI(freed_node);
    std::vector<bool> same(static_cast<std::size_t>(size_), false);
    for (int r : comm_ranks) same[static_cast<std::size_t>(r)] = true;
    return same;
  }

  /// Waits for every rank at a barrier on comm_ while progressing the worker (peers may need our
  /// progress to finish what they are waiting for). False when MPI failed or `until` passed.
  bool barrier(deadline until) noexcept {
    MPI_Request barrier = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(comm_.get(), &barrier) != MPI_SUCCESS) return false;
    for (unsigned spins = 0;; ++spins) {
      shared_->progress_until_quiet();
      int done = 0;
      if (MPI_Test(&barrier, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
      if (done) return true;
      if (clock::now() >= until) return false;  // the barrier stays pending; MPI_Comm_free lets it finish
      // After a short spin, leave the core to the ranks we wait for (often more ranks than cores).
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  /// Orderly shutdown: (1) a barrier, so that no rank closes while others still send to it; (2)
  /// flush-close every endpoint; (3) a barrier, so that no rank destroys its worker while a peer's
  /// flush still needs it. Each step is bounded by the configured timeout; past it (a peer died or
  /// never came) the endpoints are forced closed instead.
  void teardown() noexcept {
    if (std::exchange(torn_down_, true)) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    const deadline until = deadline_after(config_.timeout);
    // With a failed rank there is no barrier to meet: close without waiting for it.
    const bool failed = shared_->any_failed();
    const bool together = !finalized && !failed && barrier(until);
    if (!together && !finalized && !failed)
      std::fprintf(stderr, "%s\n",
                   error_text(rank_, "ucx", "not every rank reached the transport's teardown; closing anyway").c_str());
    const bool closed = together && shared_->close_endpoints(false, until);
    if (!closed) shared_->close_endpoints(true, deadline_after(std::chrono::seconds(1)));
    if (together) barrier(until);
  }

  detail::owned_mpi_comm comm_;
  config config_;
  int rank_ = 0;
  int size_ = 0;
  std::shared_ptr<ucx_shared> shared_;
  bool torn_down_ = false;
};

}  // namespace

bool ucx_available() noexcept { return true; }

std::unique_ptr<transport> make_ucx_transport(MPI_Comm comm, const config& cfg) {
  auto t = std::make_unique<ucx_transport>(
      detail::duplicate_for_flexpar(comm, deadline_after(cfg.timeout), "make_ucx_transport"), cfg);
  t->watch(detail::start_watching(*t, cfg));
  return t;
}

}  // namespace flexpar
