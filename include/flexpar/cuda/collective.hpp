// flexpar/cuda/collective.hpp — collectives on device memory: NCCL where it is built and cheapest,
// CUDA IPC among the ranks of one node, otherwise staged through pinned host memory and flexpar's host
// collectives — never a device pointer handed to a transport that cannot read it.
//
// Part of flexpar::cuda.
//
//   flexpar::cuda::device_communicator gpu(host, device);
//   gpu.allreduce(grad.span(), flexpar::reduce_op::avg, user_stream);   // the cheapest path, by cost
//   gpu.synchronize(user_stream, "gradients");
//
// The paths (doc/gpu.md has their costs and measurements):
//   - `device_path::nccl`: ncclAllReduce / AllGather / ReduceScatter / Broadcast; alltoall as grouped
//     ncclSend/ncclRecv. Cost: the ring cost on the device link (`device_link`).
//   - `device_path::ring`: flexpar's ring allreduce over ncclSend/ncclRecv with cuda::reduce_into per
//     step (the script flexpar's compressed device paths build on); the ring cost plus a launch and a
//     pass of the reduction per step.
//   - `device_path::ipc`: every rank on one node (sharing a GPU or not, processes or threads): peers'
//     staging buffers and events mapped with CUDA IPC, read by copies and cuda::reduce_into; bytes
//     moved in device memory plus a step cost per barrier (lib/cuda/ipc_group.hpp has the scripts).
//   - `device_path::staged`: D2H into pinned memory in chunks, the host collective on each chunk while
//     the next one copies, H2D back; 2 x bytes over PCIe plus the host collective's cost. It works over
//     every transport: the host algorithms reduce on the CPU, so they get host copies even when MPI is
//     CUDA-aware (transport_reads_device_memory() says whether it is; this MPICH build is not).
//
// `device_path::automatic` takes the cheapest of the paths the communicator has (nccl and ring only
// when NCCL is built and the communicator was made with it; ipc only when every rank is on one node).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <flexpar/collective/cost.hpp>
#include <flexpar/core/dtype.hpp>
#include <flexpar/core/reduce_op.hpp>
#include <flexpar/cuda/runtime.hpp>

namespace flexpar {
class communicator;
}

namespace flexpar::cuda {

class nccl_communicator;

/// How a device collective moves its bytes.
enum class device_path : std::uint8_t {
  automatic,  ///< the cheapest of the paths this communicator has, by their costs
  nccl,       ///< NCCL's own collective on the device buffers
  ring,       ///< flexpar's ring over ncclSend/ncclRecv with cuda::reduce_into (allreduce)
  staged,     ///< through pinned host memory and flexpar's host collective
  ipc,        ///< one node: the peers' staging buffers mapped with CUDA IPC, read by copies and reductions
};

/// "automatic", "nccl", "ring", "staged" or "ipc".
constexpr std::string_view name_of(device_path p) noexcept {
  switch (p) {
    case device_path::automatic: return "automatic";
    case device_path::nccl: return "nccl";
    case device_path::ring: return "ring";
    case device_path::staged: return "staged";
    case device_path::ipc: return "ipc";
  }
  return "?";
}

/// Which script the ipc path's allreduce runs (lib/cuda/ipc_group.hpp).
enum class ipc_allreduce : std::uint8_t {
  automatic,  ///< the cheaper of the two by their costs (the same choice on every rank)
  one_shot,   ///< one step a round: every rank publishes the round and reduces all of it
  two_step,   ///< two steps a round: each rank reduces its part, then gathers the others' parts
};

/// How the steps of the ipc path wait for each other across ranks.
enum class ipc_sync : std::uint8_t {
  events,  ///< the GPU waits for the peers' interprocess events; no host thread waits for the GPU
  host,    ///< each rank waits on the host for its own GPU work of a step before it tells the peers
};

/// Whether the host communicator's transport may be given device pointers: MPI asks MPICH
/// (MPIX_GPU_query_support for CUDA); the UCX and in-process transports of flexpar copy through host
/// memory and say no.
bool transport_reads_device_memory(const communicator& host);

/// Settings of a device_communicator.
struct device_options {
  /// Make an NCCL communicator (when built with NCCL); false: staged only.
  bool use_nccl = true;
  /// The link NCCL runs over (alpha: per step, incl. the kernel launch; beta: seconds per byte).
  cost_params device_link{.alpha = 10e-6, .beta = 1.0 / 20e9};
  /// Seconds per byte of a host <-> device copy through pinned memory.
  double pcie_beta = 1.0 / 20e9;
  /// Seconds per launch of a flexpar kernel between the ring's steps.
  double kernel_alpha = 5e-6;
  /// Seconds per byte through cuda::reduce_into (bytes read + written).
  double device_gamma = 1.0 / 1.5e12;
  /// Bytes per chunk of the staged pipeline.
  std::size_t staging_chunk_bytes = std::size_t{4} << 20;
  /// Build the ipc path when every rank is on one node (false: never).
  bool use_ipc = true;
  /// Bytes of one round of the ipc path (at least 64 KiB; larger collectives take several rounds).
  /// Each rank exports two rounds of device memory as its staging buffer.
  std::size_t ipc_round_bytes = std::size_t{64} << 20;
  /// How the ipc path's steps wait for each other.
  ipc_sync ipc_sync_mode = ipc_sync::events;
  /// The ipc path's allreduce script.
  ipc_allreduce ipc_allreduce_script = ipc_allreduce::automatic;
  /// Seconds per step of the ipc path when every rank holds a GPU of its own (a host hand-off
  /// through shared memory and a stream wait).
  double ipc_alpha = 10e-6;
  /// Seconds per step when ranks share a GPU: without MPS the GPU runs one process's context at a
  /// time, and every step hands the GPU from one process to the other (measured on an H100,
  /// doc/gpu.md "The ipc path").
  double ipc_shared_alpha = 300e-6;
};

/// The collectives of a group of ranks, one GPU each, on device memory. Move-only; used by one thread.
class device_communicator {
 public:
  /// Collective over `host` (its ranks, its transport for the staged path and the NCCL bootstrap).
  /// `host` must outlive this object.
  device_communicator(communicator& host, int device, device_options options = {});
  ~device_communicator();
  device_communicator(device_communicator&&) noexcept;             ///< takes ownership
  device_communicator& operator=(device_communicator&&) noexcept;  ///< takes ownership
  device_communicator(const device_communicator&) = delete;        ///< not copyable

  [[nodiscard]] int rank() const noexcept;    ///< this rank
  [[nodiscard]] int size() const noexcept;    ///< ranks
  [[nodiscard]] int device() const noexcept;  ///< this rank's GPU
  /// The host communicator it was made over (its ranks, deadlines and transport).
  [[nodiscard]] communicator& host() const noexcept;
  /// True when the NCCL path exists (built with NCCL and options.use_nccl).
  [[nodiscard]] bool has_nccl() const noexcept;
  /// True when the ipc path exists (options.use_ipc, every rank on one node, and every rank could
  /// map every other rank's staging buffer and events).
  [[nodiscard]] bool has_ipc() const noexcept;
  /// The NCCL communicator (for its point-to-point operations), if any.
  [[nodiscard]] nccl_communicator* nccl() noexcept;

  /// The path `automatic` takes for `op` ("allreduce", "allgather", "reduce_scatter", "broadcast",
  /// "alltoall") of `bytes` (the whole buffer: allgather's output, reduce_scatter's and alltoall's
  /// input), and the predicted seconds of every path. Same answer on every rank.
  struct choice {
    device_path path;       ///< the cheapest path
    double nccl_seconds;    ///< predicted, or +inf without NCCL
    double ring_seconds;    ///< predicted, or +inf without NCCL or for an op other than allreduce
    double staged_seconds;  ///< predicted
    double ipc_seconds;     ///< predicted, or +inf without the ipc path
  };
  /// See choice.
  [[nodiscard]] choice choose(std::string_view op, std::size_t bytes);

  /// In-place allreduce of `data`, ordered after the work already on `caller` and before its later work.
  template <element T>
  void allreduce(device_span<T> data, reduce_op op, cudaStream_t caller, device_path path = device_path::automatic) {
    run("allreduce", data.data(), nullptr, data.size(), dtype_of<T>, op, 0, caller, path);
  }
  /// `recv` (size() * send.size()) = every rank's `send` in rank order.
  template <element T>
  void allgather(device_span<const T> send, device_span<T> recv, cudaStream_t caller,
                 device_path path = device_path::automatic) {
    check_sizes("allgather", recv.size(), send.size() * static_cast<std::size_t>(size()));
    run("allgather", recv.data(), send.data(), send.size(), dtype_of<T>, reduce_op::sum, 0, caller, path);
  }
  /// `recv` = block rank() of the reduction of every rank's `send` (size() * recv.size() elements).
  template <element T>
  void reduce_scatter(device_span<const T> send, device_span<T> recv, reduce_op op, cudaStream_t caller,
                      device_path path = device_path::automatic) {
    check_sizes("reduce_scatter", send.size(), recv.size() * static_cast<std::size_t>(size()));
    run("reduce_scatter", recv.data(), send.data(), recv.size(), dtype_of<T>, op, 0, caller, path);
  }
  /// `data` on every rank = `data` of `root`.
  template <element T>
  void broadcast(device_span<T> data, int root, cudaStream_t caller, device_path path = device_path::automatic) {
    run("broadcast", data.data(), nullptr, data.size(), dtype_of<T>, reduce_op::sum, root, caller, path);
  }
  /// `send` and `recv` hold size() blocks of equal size; block q of `recv` = block rank() of rank
  /// q's `send` (nccl: grouped ncclSend/ncclRecv; staged: the host alltoall; ipc). `recv` may be `send`.
  template <element T>
  void alltoall(device_span<const T> send, device_span<T> recv, cudaStream_t caller,
                device_path path = device_path::automatic) {
    check_sizes("alltoall", recv.size(), send.size());
    check_blocks("alltoall", send.size());
    run("alltoall", recv.data(), send.data(), send.size() / static_cast<std::size_t>(size()), dtype_of<T>,
        reduce_op::sum, 0, caller, path);
  }

  /// Waits on the host, with the host communicator's timeout, until the work on `caller` is done;
  /// throws the NCCL communicator's failure or timeout_error naming `what`.
  void synchronize(cudaStream_t caller, std::string_view what);

 private:
  struct state;
  void check_sizes(std::string_view op, std::size_t have, std::size_t need) const;
  void check_blocks(std::string_view op, std::size_t elements) const;
  void run(std::string_view op, void* data, const void* send, std::size_t count, dtype t, reduce_op rop, int root,
           cudaStream_t caller, device_path path);
  std::unique_ptr<state> s_;
};

}  // namespace flexpar::cuda
