// lib/transport/mpi/mpi_transport.cpp — the MPI transport: MPI_Isend_c and MPI_Irecv_c on a
// flexpar-owned duplicate (MPI 4 large counts throughout).
//
// Receives are posted at once (MPI_Irecv_c), before their message arrives. That is what keeps the
// wire busy: MPICH 4.0 over UCX/TCP serves a rendezvous message whose receive is posted only after
// its request-to-send has arrived (the "unexpected" path) at about half the link's rate when both
// directions carry data, erratically by message size (scripts/fakehosts, 1 Gbit/s links, 16 MiB
// each way in chunks of 64 KiB to 8 MiB: 140 ms posted ahead at every size, 140-284 ms probed first,
// MPI_Improbe or MPI_Iprobe alike). A ring that posts its receives when their messages are there
// ran at 0.67x MPI_Allreduce on such links.
//
// Why the tests of a receive switch MPI_COMM_WORLD's handler. MPICH 4.0 reports the errors of
// MPI_Test (and of MPI_Wait, MPI_Testall, MPI_Testsome, MPI_Testany, MPI_Request_get_status) through
// MPI_COMM_WORLD's error handler, not through the handler of the request's communicator that flexpar
// sets to MPI_ERRORS_RETURN: under the default MPI_ERRORS_ARE_FATAL a message larger than its
// receive buffer aborted the job with MPICH's "Message truncated" before flexpar could report
// anything. Every MPI_Test of a receive therefore runs under a world_errors_return: MPI_COMM_WORLD's
// handler is MPI_ERRORS_RETURN for the duration of the call and restored afterwards, under one lock
// for the process (the handler is the process's: two threads switching it at once could leave it
// switched). A truncation is then a transport_error on the receiving rank; the sender completes (MPI
// consumed its message). Cost: four MPI handle calls and an uncontended lock per test of a receive,
// well under what probing each message cost (an 8-byte ping-pong: doc/transport.md). A thread of the
// program calling MPI outside flexpar during that window would see an error returned where the world's
// handler would have acted; flexpar's own calls hold the lock.
//
// Destroying an unfinished request settles it (transport.hpp): a receive is cancelled (MPI_Cancel;
// one already matched gets its bytes), a send waits for its peer to take it (MPI cannot cancel a send
// that has started), both until one FLEXPAR_TIMEOUT after the first request of this transport was
// abandoned, so that the requests a failing collective leaves behind share one deadline.
//
// Liveness (transport/liveness.hpp): a request that has not completed asks the transport's view on
// every poll whether a rank it depends on has failed, and throws peer_failure naming it; its
// settling on destruction stops waiting then too (the failed peer will never take or give its bytes).
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/core/mpi_comm.hpp>
#include <flexpar/transport/liveness.hpp>
#include <flexpar/transport/mpi.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace flexpar {
namespace {

/// The communicator and its liveness view: shared by the transport and its requests, so that a
/// request outliving its transport can still be tested or abandoned.
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
};

/// MPI_COMM_WORLD's error handler is MPI_ERRORS_RETURN while this lives (the file header: MPICH
/// raises MPI_Test's errors through it), then the one it had; one at a time in the process.
class world_errors_return {
 public:
  world_errors_return() : lock_(switching()) {
    if (MPI_Comm_get_errhandler(MPI_COMM_WORLD, &saved_) != MPI_SUCCESS) {
      saved_ = MPI_ERRHANDLER_NULL;  // no world (MPI sessions only): nothing to switch
      return;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  ~world_errors_return() {
    if (saved_ == MPI_ERRHANDLER_NULL) return;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, saved_);
    MPI_Errhandler_free(&saved_);
  }
  world_errors_return(const world_errors_return&) = delete;
  world_errors_return& operator=(const world_errors_return&) = delete;

 private:
  // One lock per process because the handler it guards is one per process.
  static std::mutex& switching() {
    static std::mutex m;
    return m;
  }
  std::lock_guard<std::mutex> lock_;
  MPI_Errhandler saved_ = MPI_ERRHANDLER_NULL;
};

/// MPI_Test of a receive, its errors returned (world_errors_return) rather than raised.
int test_receive(MPI_Request& handle, int& done, MPI_Status& status) noexcept {
  const world_errors_return returning;
  return MPI_Test(&handle, &done, &status);
}

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
      MPI_Status status;
      if (test_receive(handle, done, status) != MPI_SUCCESS || done) return;  // failed: nothing in flight
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
  mpi_recv(const detail::request_info& info, std::shared_ptr<mpi_endpoint> endpoint, MPI_Request handle)
      : request_state(info), endpoint_(std::move(endpoint)), handle_(handle) {}

  bool test() override {
    int done = 0;
    MPI_Status status;
    if (const int code = test_receive(handle_, done, status); code != MPI_SUCCESS) {
      int error_class = MPI_ERR_OTHER;
      MPI_Error_class(code, &error_class);
      if (error_class == MPI_ERR_TRUNCATE)
        throw transport_error("MPI", code,
                              detail::describe(info_) +
                                  " failed: Message truncated: the message is longer than the receive's buffer "
                                  "(MPI_ERR_TRUNCATE)");
      detail::throw_mpi_failure(code, "MPI_Test", std::source_location::current());
    }
    if (!done) {
      endpoint_->check_alive(info_);
      return false;
    }
    MPI_Count count = 0;
    FLEXPAR_CHECK_MPI(MPI_Get_count_c(&status, MPI_BYTE, &count));
    size_ = static_cast<std::size_t>(count);
    return true;
  }

  void abandon() noexcept override {
    if (handle_ == MPI_REQUEST_NULL || mpi_finalized()) return;
    // Not yet matched: the cancel completes it at once. Matched: its bytes are on their way into the
    // buffer; wait for them, up to the deadline.
    MPI_Cancel(&handle_);
    settle(handle_, endpoint_->settle_deadline(), *endpoint_, info_);
  }

  [[nodiscard]] std::size_t bytes() const noexcept override { return size_; }
  [[nodiscard]] std::string stall_text(std::chrono::milliseconds waited) const override {
    return endpoint_->liveness() ? endpoint_->liveness()->stall_text(waited) : std::string();
  }

 private:
  std::shared_ptr<mpi_endpoint> endpoint_;
  MPI_Request handle_;
  std::size_t size_ = 0;
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
    MPI_Request handle = MPI_REQUEST_NULL;
    FLEXPAR_CHECK_MPI(MPI_Irecv_c(data.data(), static_cast<MPI_Count>(data.size()), MPI_BYTE, peer,
                                  static_cast<int>(tag), endpoint_->comm(), &handle));
    return request(
        std::make_unique<mpi_recv>(info(message_direction::recv, peer, tag, data.size()), endpoint_, handle));
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
