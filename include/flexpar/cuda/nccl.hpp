// flexpar/cuda/nccl.hpp — an NCCL communicator that cannot hang: bootstrapped over any flexpar communicator,
// non-blocking, watched by a thread that turns a dead peer or a stalled operation into an error.
//
// Part of flexpar::cuda, built with NCCL (FLEXPAR_HAVE_NCCL). nccl.h stays out of this header.
//
//   flexpar::communicator host = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
//   flexpar::cuda::nccl_communicator nccl(host, /*device=*/host.topology().local_rank());
//   nccl.allreduce(grad.span(), flexpar::reduce_op::sum, user_stream);   // ordered after user_stream
//   nccl.synchronize(user_stream, "step 7 gradients");   // watchdog: timeout/peer errors throw
//
// **Bootstrap.** Rank 0 makes the ncclUniqueId; it travels by flexpar::broadcast over the host
// communicator (MPI, UCX or the in-process transport), then every rank calls ncclCommInitRankConfig
// with `blocking = 0` and polls ncclCommGetAsyncError until the communicator is ready, with the host
// communicator's deadline: a rank that never joins is a timeout_error, not a hang.
//
// **Streams.** Each operation records an event on the caller's stream, makes flexpar's own stream wait
// for it, runs there, and makes the caller's stream wait for its end: the caller's earlier kernels
// (that produced the gradient) come first and its later kernels (the optimizer) come after, with no
// host synchronization.
//
// **Watchdog.** A thread owned by this object polls ncclCommGetAsyncError and the end event of every
// operation in flight. An asynchronous NCCL error (a peer died, a network failure), or an operation
// still unfinished `timeout` after it was issued, aborts the communicator (ncclCommAbort: the
// kernels stop, nothing hangs) and is kept as the communicator's error: synchronize() and every later
// call throw it, naming the rank, the operation and its tensor size.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>

#include <flexpar/core/dtype.hpp>
#include <flexpar/core/reduce_op.hpp>
#include <flexpar/cuda/runtime.hpp>

namespace flexpar {
class communicator;
}

namespace flexpar::cuda {

/// What an NCCL communicator can be asked beyond its ranks.
struct nccl_options {
  /// Deadline of the bootstrap and of every operation (from its issue to its end on the GPU);
  /// zero: the host communicator's settings().timeout.
  std::chrono::milliseconds timeout{0};
  /// How often the watchdog looks.
  std::chrono::milliseconds watchdog_period{2};
};

/// One NCCL communicator over the ranks of a host communicator, one GPU per rank. Move-only.
class nccl_communicator {
 public:
  /// Collective over `host`: every rank passes its own `device` (two ranks of one communicator may not
  /// share a GPU: NCCL refuses that with ncclInvalidUsage, reported as transport_error).
  /// @throws timeout_error when not every rank joins within the timeout; transport_error on an NCCL
  ///         or CUDA failure.
  nccl_communicator(communicator& host, int device, nccl_options options = {});
  /// Finalizes (flushing what is in flight, within the timeout) and destroys; aborts instead when the
  /// communicator already failed or finalizing times out. Never throws.
  ~nccl_communicator();
  nccl_communicator(nccl_communicator&&) noexcept;             ///< takes ownership
  nccl_communicator& operator=(nccl_communicator&&) noexcept;  ///< takes ownership
  nccl_communicator(const nccl_communicator&) = delete;        ///< not copyable

  [[nodiscard]] int rank() const noexcept;    ///< this rank (the host communicator's)
  [[nodiscard]] int size() const noexcept;    ///< ranks
  [[nodiscard]] int device() const noexcept;  ///< this rank's GPU
  /// flexpar's stream, on which the operations run (ordered after and before the caller's stream).
  [[nodiscard]] cudaStream_t stream() const noexcept;

  /// `recv` = reduction of every rank's `send` (ncclAllReduce; avg is ncclAvg). In place when they alias.
  template <class U, element T>
  requires std::is_same_v<std::remove_const_t<U>, T>
  void allreduce(device_span<U> send, device_span<T> recv, reduce_op op, cudaStream_t caller) {
    check_same_size("allreduce", send.size(), recv.size());
    raw_allreduce(send.data(), recv.data(), send.size(), dtype_of<T>, op, caller);
  }
  /// In-place allreduce.
  template <element T>
  void allreduce(device_span<T> data, reduce_op op, cudaStream_t caller) {
    raw_allreduce(data.data(), data.data(), data.size(), dtype_of<T>, op, caller);
  }
  /// `recv` (size() * send.size() elements) = every rank's `send`, in rank order (ncclAllGather).
  template <class U, element T>
  requires std::is_same_v<std::remove_const_t<U>, T>
  void allgather(device_span<U> send, device_span<T> recv, cudaStream_t caller) {
    check_same_size("allgather (recv = size() * send)", send.size() * static_cast<std::size_t>(size()), recv.size());
    raw_allgather(send.data(), recv.data(), send.size(), dtype_of<T>, caller);
  }
  /// `recv` = block rank() of the reduction of every rank's `send` (size() * recv.size() elements).
  template <class U, element T>
  requires std::is_same_v<std::remove_const_t<U>, T>
  void reduce_scatter(device_span<U> send, device_span<T> recv, reduce_op op, cudaStream_t caller) {
    check_same_size("reduce_scatter (send = size() * recv)", recv.size() * static_cast<std::size_t>(size()),
                    send.size());
    raw_reduce_scatter(send.data(), recv.data(), recv.size(), dtype_of<T>, op, caller);
  }
  /// `data` on every rank = `data` of `root` (ncclBroadcast).
  template <element T>
  void broadcast(device_span<T> data, int root, cudaStream_t caller) {
    raw_broadcast(data.data(), data.size(), dtype_of<T>, root, caller);
  }

  /// Point-to-point inside a group(): flexpar's own algorithms (e.g. the device ring) are scripts of
  /// these. Outside a group each is its own operation.
  template <class T>
  requires element<std::remove_const_t<T>>
  void send(device_span<T> data, int peer, cudaStream_t caller) {
    raw_send(data.data(), data.size(), dtype_of<std::remove_const_t<T>>, peer, caller);
  }
  /// See send().
  template <element T>
  void recv(device_span<T> data, int peer, cudaStream_t caller) {
    raw_recv(data.data(), data.size(), dtype_of<T>, peer, caller);
  }

  /// ncclGroupStart while it lives, ncclGroupEnd (polled, with the deadline) when it ends: the sends
  /// and receives issued meanwhile proceed together (no deadlock between a send and its peer's).
  class group_scope {
   public:
    explicit group_scope(nccl_communicator& c);           ///< ncclGroupStart
    ~group_scope() noexcept(false);                       ///< ncclGroupEnd; throws its failure unless unwinding
    group_scope(const group_scope&) = delete;             ///< not copyable
    group_scope& operator=(const group_scope&) = delete;  ///< not copyable

   private:
    nccl_communicator& c_;
    int uncaught_;
  };
  /// A group of point-to-point operations (see group_scope).
  [[nodiscard]] group_scope group() { return group_scope(*this); }

  /// Waits (on the host) until every operation issued on `caller` so far has finished, with the
  /// timeout; throws the communicator's error (watchdog: async NCCL error or stalled operation) or
  /// timeout_error naming `what`.
  void synchronize(cudaStream_t caller, std::string_view what);

  /// Aborts the communicator now (ncclCommAbort): every operation in flight ends, later calls throw.
  void abort(std::string_view why);
  /// True once the communicator failed or was aborted.
  [[nodiscard]] bool failed() const noexcept;

 private:
  struct state;
  void check_same_size(std::string_view op, std::size_t expected, std::size_t got) const;
  void raw_allreduce(const void* send, void* recv, std::size_t count, dtype t, reduce_op op, cudaStream_t caller);
  void raw_allgather(const void* send, void* recv, std::size_t count, dtype t, cudaStream_t caller);
  void raw_reduce_scatter(const void* send, void* recv, std::size_t count, dtype t, reduce_op op, cudaStream_t caller);
  void raw_broadcast(void* data, std::size_t count, dtype t, int root, cudaStream_t caller);
  void raw_send(const void* data, std::size_t count, dtype t, int peer, cudaStream_t caller);
  void raw_recv(void* data, std::size_t count, dtype t, int peer, cudaStream_t caller);
  std::unique_ptr<state> s_;
};

}  // namespace flexpar::cuda
