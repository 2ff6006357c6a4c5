// lib/cuda/ipc_group.hpp — internal to lib/cuda: the device intra-node path (device_path::ipc of
// flexpar/cuda/collective.hpp), the device twin of the host shared-memory collectives.
//
// The ranks of one node (processes, or threads of one process) that may share a GPU or hold one each
// exchange, once, CUDA IPC handles of a staging buffer and of a ring of interprocess events; each
// rank maps the peers' staging buffers into its address space (threads of one process use the raw
// pointers). Round counters live in a host shared-memory segment, one cache line per rank.
//
// A collective runs in rounds of at most `round_bytes` per rank; each rank's staging holds two
// rounds (round g in slot g % 2). A round is a script of named steps separated by barriers; a
// barrier is
//   signal:  record my event for this barrier on my stream and publish my counter (host mode: wait for
//            my GPU work of the step first, then publish)
//   await:   wait (host, with the deadline) until every peer's counter has reached the barrier, then
//            make my stream wait for the peer's event (events mode; in host mode the peer's work is done)
// so the host orders only the enqueueing of the steps and the GPU orders their execution: in events mode
// no host thread waits for the GPU. Every script reads the peers' slots of round g before it signals a
// barrier of round g + 1, and writes its slot of round g + 2 only after awaiting that barrier of every
// peer: two slots make a barrier at the end of a call unnecessary.
//
//   allreduce, one shot   copy the round into my slot | ready | reduce the round out of every slot,
//                         in rank order, into my data                       (one barrier, (p+3)b moved)
//   allreduce, two steps  copy the parts the peers reduce into my slot | ready | reduce my part out of
//                         every rank's copy (mine in place) into my data and my slot | reduced | copy
//                         the peers' reduced parts into my data       (two barriers, ~4b(p-1)/p + 2b)
//   reduce_scatter        copy the peers' blocks into my slot | ready | reduce my block out of every
//                         rank's copy into recv
//   allgather             copy send into my slot and my block of recv | ready | copy the peers' blocks
//   broadcast             the root copies into its slot | ready | the others copy out of it
//   alltoall              copy the blocks for the peers into my slot, mine straight into recv | ready |
//                         copy my block out of every peer's slot
//
// Every element of a reduction is computed by one rank, or by every rank with the same operations in
// the same order (one shot), so every rank ends bitwise identical. Each call leaves a note (op, dtype,
// count, reduction, root) beside its counter before its first barrier; after it, each rank compares
// every peer's note with its own and throws mismatch_error naming both sides on every rank before any
// peer memory is read. While a rank waits for a peer it checks, every 200 ms, that the peer's process
// still exists (peer_failure at once, not at the deadline).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <flexpar/core/dtype.hpp>
#include <flexpar/core/reduce_op.hpp>
#include <flexpar/cuda/collective.hpp>

namespace flexpar {
class communicator;
}

namespace flexpar::cuda::detail {

/// The collectives among the ranks of one node on device memory, through CUDA IPC.
class ipc_group {
 public:
  /// Collective over `host` (every rank on one node; `device` current on the caller's thread).
  /// Returns nullptr on every rank when the path cannot exist on some rank (several nodes, no IPC
  /// between the devices, no shared memory): the ranks agree.
  static std::unique_ptr<ipc_group> create(communicator& host, int device, const device_options& options);
  ~ipc_group();
  ipc_group(const ipc_group&) = delete;
  ipc_group& operator=(const ipc_group&) = delete;

  /// In place: `data` (count elements of t) reduced over every rank.
  void allreduce(dtype t, void* data, std::size_t count, reduce_op op, cudaStream_t caller);
  /// `recv` (count) = block rank() of the reduction of every rank's `send` (p * count).
  void reduce_scatter(dtype t, const void* send, void* recv, std::size_t count, reduce_op op, cudaStream_t caller);
  /// `recv` (p * count) = every rank's `send` (count) in rank order.
  void allgather(dtype t, const void* send, void* recv, std::size_t count, cudaStream_t caller);
  /// `data` (count) on every rank = `data` of `root`.
  void broadcast(dtype t, void* data, std::size_t count, int root, cudaStream_t caller);
  /// Block q of `recv` (p * count) = block rank() of rank q's `send` (p * count).
  void alltoall(dtype t, const void* send, void* recv, std::size_t count, cudaStream_t caller);

  /// Bytes of one round (each rank's staging holds two).
  [[nodiscard]] std::size_t round_bytes() const noexcept;
  /// Predicted seconds of `op` of `bytes` (the whole buffer, as device_communicator::choose takes it)
  /// on this path; for allreduce, of the script it will run.
  [[nodiscard]] double cost(std::string_view op, double bytes) const;
  /// Whether an allreduce of `bytes` runs the one-step script.
  [[nodiscard]] bool one_shot(std::size_t bytes) const;
  /// The most ranks of this group that share one GPU (they share its memory bandwidth).
  [[nodiscard]] int ranks_per_device() const noexcept;
  /// True when some rank's GPU is another rank's peer device (its reads cross a link).
  [[nodiscard]] bool crosses_devices() const noexcept;
  /// The barriers' mode.
  [[nodiscard]] ipc_sync sync() const noexcept;

  struct state;

 private:
  explicit ipc_group(std::unique_ptr<state> s);
  std::unique_ptr<state> s_;
};

}  // namespace flexpar::cuda::detail
