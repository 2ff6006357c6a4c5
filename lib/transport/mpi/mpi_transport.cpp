// lib/transport/mpi/mpi_transport.cpp — the MPI transport: MPI_Isend_c on a flexpar-owned duplicate;
// receives matched with MPI_Improbe and completed with MPI_Imrecv_c (MPI 4 large counts throughout).
//
// Why a receive probes before it is posted. MPICH 4.0 reports the errors of MPI_Test (and of
// MPI_Wait, MPI_Testall, MPI_Request_get_status, ...) through MPI_COMM_WORLD's error handler, not
// through the handler of the request's communicator that flexpar sets to MPI_ERRORS_RETURN: with the
// default MPI_ERRORS_ARE_FATAL a message larger than its receive buffer (ranks that disagree about a
// count) aborted the job with MPICH's "Message truncated" before flexpar could report anything.
// Here a receive is posted only once its message has arrived (MPI_Improbe on the duplicate, whose
// handler returns): its size is known; a message too large is received into scratch space (so that
// its sender completes) and reported as a transport_error; and the receive posted is exactly the
// message's size, so nothing MPI_Test can report is a truncation. Receives of one (peer, tag) are
// served in the order they were posted (the FIFO contract of transport.hpp): a probe always serves
// the oldest receive waiting for that (peer, tag).
// Cost: ~0.7 us more per small message (8-byte ping-pong here: 1.3 us -> 2.0 us with the MPI calls
// alone); a large message's rendezvous starts when its receive is posted, as before. A receive not
// yet matched is cancelled by forgetting it: nothing to cancel in MPI.
//
// Destroying an unfinished request settles it (transport.hpp): a matched receive waits for its
// bytes, a send waits for its peer to take it (MPI cannot cancel a send that has started), both
// until one FLEXPAR_TIMEOUT after the first request of this transport was abandoned, so that the
// requests a failing collective leaves behind share one deadline.
//
// Liveness (transport/liveness.hpp): a request that has not completed asks the transport's view on
// every poll whether a rank it depends on has failed, and throws peer_failure naming it; its
// settling on destruction stops waiting then too (the failed peer will never take or give its bytes).
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/core/mpi_comm.hpp>
#include <flexpar/transport/liveness.hpp>
#include <flexpar/transport/mpi.hpp>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

namespace flexpar {
namespace {

/// A receive: waiting for its message, then posted (MPI_Imrecv_c) once the message is there.
struct posted_recv {
  std::span<std::byte> buffer;
  bool matched = false;
  MPI_Request handle = MPI_REQUEST_NULL;  // once matched
  std::size_t size = 0;                   // of the message, once matched
  std::unique_ptr<std::byte[]> overflow;  // the message, when it is larger than `buffer`
  bool truncated = false;                 // the message was larger than `buffer`
};

/// The communicator and the receives waiting for their message: shared by the transport and its
/// requests, so that a request outliving its transport can still be tested or abandoned.
class mpi_endpoint {
 public:
  mpi_endpoint(detail::owned_mpi_comm comm, std::chrono::milliseconds timeout)
      : comm_(std::move(comm)), timeout_(timeout) {}

  [[nodiscard]] MPI_Comm comm() const noexcept { return comm_.get(); }

  /// The liveness view the requests consult (null: none).
  void watch(std::shared_ptr<detail::liveness_view> view) noexcept { liveness_ = std::move(view); }
  [[nodiscard]] detail::liveness_view* liveness() const noexcept { return liveness_.get(); }
  [[nodiscard]] const std::shared_ptr<detail::liveness_view>& liveness_shared() const noexcept { return liveness_; }
  /// True when a failed rank keeps the request of `info` from completing.
  [[nodiscard]] bool blocked(const detail::request_info& info) const { return liveness_ && liveness_->blocks(info); }
  /// Throws peer_failure when a failed rank keeps the request of `info` from completing.
  void check_alive(const detail::request_info& info) const {
    if (blocked(info)) liveness_->throw_failure(info);
  }

  void post(int peer, tag_t tag, const std::shared_ptr<posted_recv>& r) {
    waiting_[{peer, tag}].push_back(r);
    try {
      match(peer, tag);
    } catch (...) {
      forget(peer, tag, r.get());  // e.g. MPI refused the peer: no request, so no receive either
      throw;
    }
  }

  /// Posts the receives of (peer, tag) whose messages have arrived, oldest receive first.
  void match(int peer, tag_t tag) {
    auto it = waiting_.find({peer, tag});
    if (it == waiting_.end()) return;
    auto& queue = it->second;
    while (!queue.empty()) {
      int found = 0;
      MPI_Message message = MPI_MESSAGE_NULL;
      MPI_Status status;
      FLEXPAR_CHECK_MPI(MPI_Improbe(peer, static_cast<int>(tag), comm_.get(), &found, &message, &status));
      if (!found) break;
      MPI_Count count = 0;
      FLEXPAR_CHECK_MPI(MPI_Get_count_c(&status, MPI_BYTE, &count));
      const std::shared_ptr<posted_recv> r = std::move(queue.front());
      queue.pop_front();
      r->matched = true;
      r->size = static_cast<std::size_t>(count);
      std::byte* into = r->buffer.data();
      if (r->size > r->buffer.size()) {
        r->truncated = true;
        r->overflow = std::make_unique_for_overwrite<std::byte[]>(r->size);
        into = r->overflow.get();
      }
      FLEXPAR_CHECK_MPI(MPI_Imrecv_c(into, count, MPI_BYTE, &message, &r->handle));
    }
    if (queue.empty()) waiting_.erase(it);
  }

  /// match() for every (peer, tag) with a receive waiting. Every test of this transport's requests
  /// calls it: a receive is posted only when someone probes for its message, and a peer's
  /// rendezvous send waits for that, whichever of our requests we happen to be waiting on.
  void match_all() {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      const auto [peer, tag] = (it++)->first;  // match() may erase the entry: step past it first
      match(peer, tag);
    }
  }

  /// Drops a receive that is still waiting for its message.
  void forget(int peer, tag_t tag, const posted_recv* r) noexcept {
    auto it = waiting_.find({peer, tag});
    if (it == waiting_.end()) return;
    std::erase_if(it->second, [&](const auto& w) { return w.get() == r; });
    if (it->second.empty()) waiting_.erase(it);
  }

  /// The deadline of an abandoned request: one timeout after the first abandon of a series.
  deadline settle_deadline() noexcept {
    const clock::time_point now = clock::now();
    if (settle_until_ <= now) settle_until_ = now + timeout_;
    return settle_until_;
  }

 private:
  detail::owned_mpi_comm comm_;
  std::shared_ptr<detail::liveness_view> liveness_;
  std::chrono::milliseconds timeout_;
  deadline settle_until_{};
  std::map<std::pair<int, tag_t>, std::deque<std::shared_ptr<posted_recv>>> waiting_;
};

bool mpi_finalized() noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

/// Waits for `handle` until `until`, or until a failed rank keeps it from completing (`endpoint`'s
/// liveness view, for a request of `info`), without throwing; releases it to MPI if it is still
/// pending then.
void settle(MPI_Request& handle, deadline until, const mpi_endpoint& endpoint,
            const detail::request_info& info) noexcept {
  if (handle == MPI_REQUEST_NULL || mpi_finalized()) return;
  try {
    for (std::chrono::microseconds pause{2};; pause = std::min(pause * 2, std::chrono::microseconds{1000})) {
      int done = 0;
      if (MPI_Test(&handle, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) return;  // failed: nothing in flight
      if (clock::now() >= until || endpoint.blocked(info)) break;
      std::this_thread::sleep_for(pause);
    }
  } catch (...) {
  }
  MPI_Request_free(&handle);
}

class mpi_send final : public detail::request_state {
 public:
  mpi_send(const detail::request_info& info, std::shared_ptr<mpi_endpoint> endpoint, MPI_Request handle)
      : request_state(info), endpoint_(std::move(endpoint)), handle_(handle) {}

  bool test() override {
    endpoint_->match_all();  // the peer may wait for one of our receives before it takes this send
    int done = 0;
    FLEXPAR_CHECK_MPI(MPI_Test(&handle_, &done, MPI_STATUS_IGNORE));
    if (done) return true;
    endpoint_->check_alive(info_);
    return false;
  }

  void abandon() noexcept override {
    // The peer may be reading from the buffer right now (MPI cannot cancel a send that has started):
    // wait for it to finish, up to the deadline.
    if (handle_ != MPI_REQUEST_NULL && !mpi_finalized())
      settle(handle_, endpoint_->settle_deadline(), *endpoint_, info_);
  }
  [[nodiscard]] std::string stall_text(std::chrono::milliseconds waited) const override {
    return endpoint_->liveness() ? endpoint_->liveness()->stall_text(waited) : std::string();
  }

 private:
  std::shared_ptr<mpi_endpoint> endpoint_;
  MPI_Request handle_;
};

class mpi_recv final : public detail::request_state {
 public:
  mpi_recv(const detail::request_info& info, std::shared_ptr<mpi_endpoint> endpoint, std::shared_ptr<posted_recv> r)
      : request_state(info), endpoint_(std::move(endpoint)), recv_(std::move(r)) {}

  bool test() override {
    endpoint_->match_all();  // this receive, and the others a peer may be waiting for
    int done = 0;
    if (recv_->matched) FLEXPAR_CHECK_MPI(MPI_Test(&recv_->handle, &done, MPI_STATUS_IGNORE));
    if (!done) {
      endpoint_->check_alive(info_);
      return false;
    }
    if (recv_->truncated) {
      recv_->overflow.reset();
      throw transport_error("MPI", MPI_ERR_TRUNCATE,
                            detail::describe(info_) + " failed: Message truncated: the message has " +
                                std::to_string(recv_->size) + " bytes (MPI_ERR_TRUNCATE)");
    }
    return true;
  }

  void abandon() noexcept override {
    if (mpi_finalized()) return;
    if (!recv_->matched) {
      // Its message may be here already: take it, so that its sender completes.
      try {
        endpoint_->match(info_.peer, info_.tag);
      } catch (const error&) {
      }
      if (!recv_->matched) {
        endpoint_->forget(info_.peer, info_.tag, recv_.get());
        return;
      }
    }
    // Matched: the bytes are on their way into the buffer; wait for them, up to the deadline.
    settle(recv_->handle, endpoint_->settle_deadline(), *endpoint_, info_);
  }

  [[nodiscard]] std::size_t bytes() const noexcept override { return recv_->size; }
  [[nodiscard]] std::string stall_text(std::chrono::milliseconds waited) const override {
    return endpoint_->liveness() ? endpoint_->liveness()->stall_text(waited) : std::string();
  }

 private:
  std::shared_ptr<mpi_endpoint> endpoint_;
  std::shared_ptr<posted_recv> recv_;
};

class mpi_transport final : public transport {
 public:
  mpi_transport(detail::owned_mpi_comm comm, const config& cfg) : config_(cfg) {
    FLEXPAR_CHECK_MPI(MPI_Comm_rank(comm.get(), &rank_));
    FLEXPAR_CHECK_MPI(MPI_Comm_size(comm.get(), &size_));
    int* tag_ub = nullptr;
    int found = 0;
    FLEXPAR_CHECK_MPI(MPI_Comm_get_attr(comm.get(), MPI_TAG_UB, &tag_ub, &found));
    max_tag_ = found && tag_ub ? static_cast<tag_t>(*tag_ub) : 32767;  // MPI guarantees at least 32767
    endpoint_ = std::make_shared<mpi_endpoint>(std::move(comm), cfg.timeout);
  }

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return size_; }
  [[nodiscard]] transport_kind kind() const noexcept override { return transport_kind::mpi; }
  [[nodiscard]] tag_t max_tag() const noexcept override { return max_tag_; }

  [[nodiscard]] std::unique_ptr<transport> split(int color, int key) override {
    check_open("split");
    // MPI_Comm_split blocks until every rank is in it: first make sure they all are.
    detail::bootstrap_barrier(*this, "split", deadline_after(config_.timeout));
    detail::owned_mpi_comm sub = detail::split_for_flexpar(endpoint_->comm(), color, key);
    if (sub.get() == MPI_COMM_NULL) return nullptr;
    auto child = std::make_unique<mpi_transport>(std::move(sub), config_);
    child->watch(detail::watch_split(*child, endpoint_->liveness_shared(), rank_, deadline_after(config_.timeout)));
    return child;
  }

  [[nodiscard]] detail::liveness_view* liveness() const noexcept override { return endpoint_->liveness(); }

  /// Makes the requests consult `view` (make_mpi_transport, split).
  void watch(std::shared_ptr<detail::liveness_view> view) noexcept { endpoint_->watch(std::move(view)); }

 protected:
  // The peer is not checked here on purpose: MPI checks it and says so in its own words.
  request do_isend(int peer, tag_t tag, std::span<const std::byte> data) override {
    MPI_Request handle = MPI_REQUEST_NULL;
    FLEXPAR_CHECK_MPI(MPI_Isend_c(data.data(), static_cast<MPI_Count>(data.size()), MPI_BYTE, peer,
                                  static_cast<int>(tag), endpoint_->comm(), &handle));
    return request(
        std::make_unique<mpi_send>(info(message_direction::send, peer, tag, data.size()), endpoint_, handle));
  }

  request do_irecv(int peer, tag_t tag, std::span<std::byte> data) override {
    // MPI_Improbe checks the peer (a wrong one fails here, in MPI's words, as a send's does).
    auto r = std::make_shared<posted_recv>();
    r->buffer = data;
    endpoint_->post(peer, tag, r);
    return request(
        std::make_unique<mpi_recv>(info(message_direction::recv, peer, tag, data.size()), endpoint_, std::move(r)));
  }

 private:
  [[nodiscard]] detail::request_info info(message_direction d, int peer, tag_t tag, std::size_t size) const {
    return {"mpi", d, rank_, peer, tag, size, config_.spin};
  }

  config config_;
  int rank_ = 0;
  int size_ = 0;
  tag_t max_tag_ = 0;
  std::shared_ptr<mpi_endpoint> endpoint_;
};

}  // namespace

std::unique_ptr<transport> make_mpi_transport(MPI_Comm comm, const config& cfg) {
  auto t = std::make_unique<mpi_transport>(
      detail::duplicate_for_flexpar(comm, deadline_after(cfg.timeout), "make_mpi_transport"), cfg);
  t->watch(detail::start_watching(*t, cfg));
  return t;
}

}  // namespace flexpar
