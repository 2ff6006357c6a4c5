// lib/cuda/nccl_communicator.cpp — flexpar/cuda/nccl.hpp: the non-blocking NCCL communicator and its watchdog.
//
// Locking: `nccl_mutex` serializes every NCCL call on the communicator (the caller's enqueues and the
// watchdog's ncclCommGetAsyncError / ncclCommAbort); `queue_mutex` guards the operations in flight
// and the failure. Neither is held while the host waits for the GPU.
#include <flexpar/cuda/nccl.hpp>

#include <nccl.h>

#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>

namespace flexpar::cuda {

namespace {

ncclDataType_t nccl_type(dtype t) {
  switch (t) {
    case dtype::f32: return ncclFloat32;
    case dtype::f64: return ncclFloat64;
    case dtype::f16: return ncclFloat16;
    case dtype::bf16: return ncclBfloat16;
    case dtype::i8: return ncclInt8;
    case dtype::u8: return ncclUint8;
    case dtype::i32: return ncclInt32;
    case dtype::i64: return ncclInt64;
  }
  throw error_on<usage_error>(no_rank, "nccl", "unknown dtype");
}

ncclRedOp_t nccl_op(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::prod: return ncclProd;
    case reduce_op::min: return ncclMin;
    case reduce_op::max: return ncclMax;
    case reduce_op::avg: return ncclAvg;
  }
  throw error_on<usage_error>(no_rank, "nccl", "unknown reduce_op");
}

const char* result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult";
  }
}

std::string describe(std::string_view op, std::size_t count, dtype t) {
  std::string text(op);
  text += " of ";
  text += std::to_string(count);
  text += ' ';
  text += name_of(t);
  return text;
}

struct in_flight {
  event done;
  std::chrono::steady_clock::time_point issued;
  std::string what;
};

}  // namespace

struct nccl_communicator::state {
  int rank = 0;
  int size = 0;
  int device = 0;
  std::chrono::milliseconds timeout{0};
  std::chrono::milliseconds period{2};
  ncclComm_t comm = nullptr;
  bool aborted = false;  // comm was aborted (the handle is gone); guarded by nccl_mutex
  std::mutex nccl_mutex;
  flexpar::cuda::stream own;
  event ordered{false};  // the caller's stream position each operation starts after

  std::mutex queue_mutex;
  std::deque<in_flight> in_flight_ops;
  std::vector<event> spare_events;
  std::exception_ptr failure;
  std::atomic<bool> has_failed{false};

  int group_depth = 0;
  cudaStream_t group_caller = nullptr;
  std::string group_what;

  std::jthread watchdog;

  std::string prefix() const { return rank_prefix(rank).append("nccl "); }

  // Keeps the first failure, aborts the communicator (once) and returns the failure to throw.
  std::exception_ptr fail(std::exception_ptr e) {
    {
      std::lock_guard q(queue_mutex);
      if (!failure) failure = e;
      e = failure;
      has_failed = true;
    }
    std::lock_guard n(nccl_mutex);
    if (!aborted && comm != nullptr) {
      (void)ncclCommAbort(comm);
      aborted = true;
      comm = nullptr;
    }
    return e;
  }

  void throw_if_failed() {
    if (!has_failed) return;
    std::lock_guard q(queue_mutex);
    std::rethrow_exception(failure);
  }

  [[noreturn]] void fail_nccl(ncclResult_t code, std::string_view what, std::string_view how) {
    std::string text = prefix();
    text += what;
    text += ": ";
    text += how;
    text += result_name(code);
    text += " (";
    text += ncclGetErrorString(code);
    text += "); the communicator was aborted";
    std::rethrow_exception(fail(std::make_exception_ptr(transport_error("NCCL", static_cast<long>(code), text))));
  }

  [[noreturn]] void fail_timeout(std::string_view what, std::chrono::milliseconds waited) {
    std::string text = prefix();
    text += what;
    text += ": not finished after " + std::to_string(waited.count()) +
            " ms (a peer that died or never called it?); the communicator was aborted";
    std::rethrow_exception(fail(std::make_exception_ptr(timeout_error(text))));
  }

  // A non-blocking communicator answers ncclInProgress while it works on a call: poll its state until
  // it settles, with the deadline. Called with nccl_mutex held.
  void settle(ncclResult_t r, std::string_view what) {
    const auto start = std::chrono::steady_clock::now();
    while (r == ncclInProgress) {
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      if (waited > timeout) {
        nccl_mutex.unlock();  // fail() takes it to abort
        try {
          fail_timeout(what, waited);
        } catch (...) {
          nccl_mutex.lock();
          throw;
        }
      }
      std::this_thread::yield();
      if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
    }
    if (r != ncclSuccess) {
      nccl_mutex.unlock();
      try {
        fail_nccl(r, what, "");
      } catch (...) {
        nccl_mutex.lock();
        throw;
      }
    }
  }

  event take_event() {
    std::lock_guard q(queue_mutex);
    if (spare_events.empty()) return event(false);
    event e = std::move(spare_events.back());
    spare_events.pop_back();
    return e;
  }

  // The caller's stream waits for what was issued on `own` since `ordered`; the watchdog watches it.
  void signal_back(cudaStream_t caller, std::string what) {
    event done = take_event();
    done.record(own);
    stream_wait(caller, done);
    std::lock_guard q(queue_mutex);
    in_flight_ops.push_back({std::move(done), std::chrono::steady_clock::now(), std::move(what)});
  }

  void watch(const std::stop_token& stop) {
    (void)cudaSetDevice(device);
    while (!stop.stop_requested()) {
      std::this_thread::sleep_for(period);
      if (has_failed) continue;
      std::string stalled;
      std::chrono::milliseconds age{0};
      try {
        std::lock_guard q(queue_mutex);
        while (!in_flight_ops.empty() && in_flight_ops.front().done.done()) {
          spare_events.push_back(std::move(in_flight_ops.front().done));
          in_flight_ops.pop_front();
        }
        if (!in_flight_ops.empty()) {
          age = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                      in_flight_ops.front().issued);
          if (age > timeout) stalled = in_flight_ops.front().what;
        }
      } catch (const std::exception&) {
        fail(std::current_exception());  // a CUDA error of the work itself
        continue;
      }
      if (!stalled.empty()) {
        try {
          fail_timeout(stalled, age);
        } catch (...) {
        }
        continue;
      }
      ncclResult_t async = ncclSuccess;
      {
        std::lock_guard n(nccl_mutex);
        if (aborted || comm == nullptr) continue;
        if (ncclCommGetAsyncError(comm, &async) != ncclSuccess) async = ncclInternalError;
      }
      if (async != ncclSuccess && async != ncclInProgress) {
        try {
          fail_nccl(async, "communicator", "asynchronous error ");
        } catch (...) {
        }
      }
    }
  }
};

nccl_communicator::nccl_communicator(communicator& host, int device, nccl_options options) {
  const device_guard on(device);
  auto s = std::make_unique<state>();
  s->rank = host.rank();
  s->size = host.size();
  s->device = device;
  s->timeout = options.timeout.count() > 0 ? options.timeout : host.settings().timeout;
  s->period = options.watchdog_period;

  ncclUniqueId id{};
  if (s->rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) s->fail_nccl(r, "bootstrap (ncclGetUniqueId)", "");
  }
  std::array<std::uint8_t, sizeof(ncclUniqueId)> bytes{};
  std::memcpy(bytes.data(), &id, sizeof id);
  flexpar::broadcast(host, std::span<std::uint8_t>(bytes), 0);
  std::memcpy(&id, bytes.data(), sizeof id);

  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  {
    std::unique_lock n(s->nccl_mutex);
    const ncclResult_t r = ncclCommInitRankConfig(&s->comm, s->size, id, s->rank, &cfg);
    s->settle(r, "bootstrap (ncclCommInitRankConfig of " + std::to_string(s->size) + " ranks on device " +
                     std::to_string(device) + ")");
  }
  state* raw = s.get();
  s->watchdog = std::jthread([raw](std::stop_token stop) { raw->watch(stop); });
  s_ = std::move(s);
}

nccl_communicator::~nccl_communicator() {
  if (!s_) return;
  s_->watchdog.request_stop();
  if (s_->watchdog.joinable()) s_->watchdog.join();
  std::unique_lock n(s_->nccl_mutex);
  if (s_->aborted || s_->comm == nullptr) return;
  const device_guard on(s_->device);
  try {
    // Finalize flushes what is in flight; a non-blocking communicator reports ncclInProgress meanwhile.
    s_->settle(ncclCommFinalize(s_->comm), "finalize");
    (void)ncclCommDestroy(s_->comm);
  } catch (...) {
    // settle() aborted it: nothing is left to destroy.
  }
}

nccl_communicator::nccl_communicator(nccl_communicator&&) noexcept = default;
nccl_communicator& nccl_communicator::operator=(nccl_communicator&& other) noexcept {
  if (this != &other) {
    nccl_communicator old(std::move(*this));
    s_ = std::move(other.s_);
  }
  return *this;
}

int nccl_communicator::rank() const noexcept { return s_->rank; }
int nccl_communicator::size() const noexcept { return s_->size; }
int nccl_communicator::device() const noexcept { return s_->device; }
cudaStream_t nccl_communicator::stream() const noexcept { return s_->own.get(); }
bool nccl_communicator::failed() const noexcept { return s_->has_failed; }

void nccl_communicator::check_same_size(std::string_view op, std::size_t expected, std::size_t got) const {
  if (expected == got) return;
  std::string text = s_->prefix();
  text += op;
  text += ": the buffers do not match: " + std::to_string(expected) + " elements expected, " + std::to_string(got) +
          " given";
  throw usage_error(text);
}

namespace {

// One operation: after the caller's work, on flexpar's stream, then back to the caller (or, inside a
// group, joined to the group's ordering).
template <class Issue>
void run_operation(auto& s, cudaStream_t caller, std::string what, Issue issue) {
  s.throw_if_failed();
  const device_guard on(s.device);
  std::unique_lock n(s.nccl_mutex);
  if (s.aborted) {
    n.unlock();
    s.throw_if_failed();
  }
  if (s.group_depth == 0 || s.group_caller == nullptr) {
    s.ordered.record(caller);
    stream_wait(s.own, s.ordered);
  }
  if (s.group_depth > 0) {
    if (s.group_caller != nullptr && s.group_caller != caller) {
      throw usage_error(s.prefix() + "group: every operation of one group must use the same caller stream");
    }
    s.group_caller = caller;
    if (!s.group_what.empty()) s.group_what += ", ";
    s.group_what += what;
    s.settle(issue(s.comm, s.own.get()), what);
    return;
  }
  s.settle(issue(s.comm, s.own.get()), what);
  n.unlock();
  s.signal_back(caller, std::move(what));
}

}  // namespace

void nccl_communicator::raw_allreduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                                      cudaStream_t caller) {
  std::string what = describe("allreduce", count, t);
  what += " (";
  what += name_of(op);
  what += ')';
  run_operation(*s_, caller, std::move(what), [&](ncclComm_t c, cudaStream_t st) {
    return ncclAllReduce(send, recv, count, nccl_type(t), nccl_op(op), c, st);
  });
}

void nccl_communicator::raw_allgather(const void* send, void* recv, std::size_t count, dtype t, cudaStream_t caller) {
  run_operation(*s_, caller, describe("allgather", count, t),
                [&](ncclComm_t c, cudaStream_t st) { return ncclAllGather(send, recv, count, nccl_type(t), c, st); });
}

void nccl_communicator::raw_reduce_scatter(const void* send, void* recv, std::size_t count, dtype t, reduce_op op,
                                           cudaStream_t caller) {
  run_operation(*s_, caller, describe("reduce_scatter", count, t), [&](ncclComm_t c, cudaStream_t st) {
    return ncclReduceScatter(send, recv, count, nccl_type(t), nccl_op(op), c, st);
  });
}

void nccl_communicator::raw_broadcast(void* data, std::size_t count, dtype t, int root, cudaStream_t caller) {
  if (root < 0 || root >= s_->size)
    throw usage_error(s_->prefix() + "broadcast: root " + std::to_string(root) + " is outside the communicator of " +
                      std::to_string(s_->size) + " ranks");
  run_operation(*s_, caller, describe("broadcast", count, t), [&](ncclComm_t c, cudaStream_t st) {
    return ncclBroadcast(data, data, count, nccl_type(t), root, c, st);
  });
}

void nccl_communicator::raw_send(const void* data, std::size_t count, dtype t, int peer, cudaStream_t caller) {
  if (peer < 0 || peer >= s_->size)
    throw usage_error(s_->prefix() + "send: peer " + std::to_string(peer) + " is outside the communicator of " +
                      std::to_string(s_->size) + " ranks");
  run_operation(*s_, caller, describe("send to " + std::to_string(peer), count, t),
                [&](ncclComm_t c, cudaStream_t st) { return ncclSend(data, count, nccl_type(t), peer, c, st); });
}

void nccl_communicator::raw_recv(void* data, std::size_t count, dtype t, int peer, cudaStream_t caller) {
  if (peer < 0 || peer >= s_->size)
    throw usage_error(s_->prefix() + "recv: peer " + std::to_string(peer) + " is outside the communicator of " +
                      std::to_string(s_->size) + " ranks");
  run_operation(*s_, caller, describe("recv from " + std::to_string(peer), count, t),
                [&](ncclComm_t c, cudaStream_t st) { return ncclRecv(data, count, nccl_type(t), peer, c, st); });
}

nccl_communicator::group_scope::group_scope(nccl_communicator& c) : c_(c), uncaught_(std::uncaught_exceptions()) {
  c_.s_->throw_if_failed();
  std::lock_guard n(c_.s_->nccl_mutex);
  const ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) {
    c_.s_->nccl_mutex.unlock();
    try {
      c_.s_->fail_nccl(r, "ncclGroupStart", "");
    } catch (...) {
      c_.s_->nccl_mutex.lock();
      throw;
    }
  }
  if (c_.s_->group_depth++ == 0) {
    c_.s_->group_caller = nullptr;
    c_.s_->group_what.clear();
  }
}

nccl_communicator::group_scope::~group_scope() noexcept(false) {
  state& s = *c_.s_;
  const device_guard on(s.device);
  std::unique_lock n(s.nccl_mutex);
  const bool outermost = --s.group_depth == 0;
  std::string what = "group {" + s.group_what + "}";
  if (s.aborted) {
    (void)ncclGroupEnd();  // closes this thread's group (NCCL counts them per thread); the failure is kept
    return;
  }
  try {
    s.settle(ncclGroupEnd(), what);
  } catch (...) {
    if (std::uncaught_exceptions() > uncaught_) return;  // already unwinding: the first error wins
    throw;
  }
  if (outermost && s.group_caller != nullptr) {
    const cudaStream_t caller = s.group_caller;
    s.group_caller = nullptr;
    n.unlock();
    s.signal_back(caller, std::move(what));
  }
}

void nccl_communicator::synchronize(cudaStream_t caller, std::string_view what) {
  state& s = *s_;
  s.throw_if_failed();
  event mark(false);
  mark.record(caller);
  const auto start = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    s.throw_if_failed();
    if (mark.done()) return;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    if (waited > s.timeout) s.fail_timeout(what, waited);
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void nccl_communicator::abort(std::string_view why) {
  std::string text = s_->prefix();
  text += "aborted: ";
  text += why;
  s_->fail(std::make_exception_ptr(peer_failure(text)));
}

}  // namespace flexpar::cuda
