// flexpar/cuda/collective.hpp — collectives on device memory: NCCL where it is built and cheapest, otherwise staged
// through pinned host memory and flexpar's host collectives — never a device pointer handed to a transport that cannot
// read it.
//
// Part of flexpar::cuda.
//
//   flexpar::cuda::device_communicator gpu(host, device);
//   gpu.allreduce(grad.span(), flexpar::reduce_op::avg, user_stream);   // NCCL or staged, by cost
//   gpu.synchronize(user_stream, "gradients");
//
// | path                  | what runs                                                        | cost (one rank's
// critical path)                    |
// |-----------------------|------------------------------------------------------------------|----------------------------------------------------|
// | `device_path::nccl`   | ncclAllReduce / AllGather / ReduceScatter / Broadcast            | the ring cost on the
// device link (`device_link`)   | | `device_path::ring`   | flexpar's ring (reduce-scatter + allgather, allreduce
// only):     | the ring cost on the device link + 2(p-1) steps of | |                       | ncclSend/ncclRecv in
// groups + cuda::reduce_into per step         | `kernel_alpha` + the reduction at `device_gamma`   | |
// `device_path::staged` | D2H into pinned memory in chunks, the host collective on each    | 2 x bytes over PCIe
// (`pcie_beta`) + the host       | |                       | chunk while the next chunk copies, H2D back |
// collective's own cost (collective/automatic.hpp)   |
//
// `device_path::automatic` takes the cheapest by those costs (nccl and ring only when NCCL is built and
// the communicator was made with it; NCCL's own ring fuses the reduction into its copy kernel, so the
// costs pick it over flexpar's ring, which is the script flexpar's compressed device paths build on). The staged path
// works over every transport (MPI, UCX, in-process): the host algorithms reduce on the CPU, so they get host copies
// even when MPI is CUDA-aware (transport_reads_device_memory() says whether it is; this MPICH build is not).
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
  automatic,  ///< the cheaper of nccl and staged by their costs
  nccl,       ///< NCCL's own collective on the device buffers
  ring,       ///< flexpar's ring over ncclSend/ncclRecv with cuda::reduce_into (allreduce)
  staged,     ///< through pinned host memory and flexpar's host collective
};

/// "automatic", "nccl", "ring" or "staged".
constexpr std::string_view name_of(device_path p) noexcept {
  switch (p) {
    case device_path::automatic: return "automatic";
    case device_path::nccl: return "nccl";
    case device_path::ring: return "ring";
    case device_path::staged: return "staged";
  }
  return "?";
}

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
  /// True when the NCCL path exists (built with NCCL and options.use_nccl).
  [[nodiscard]] bool has_nccl() const noexcept;
  /// The NCCL communicator (for its point-to-point operations), if any.
  [[nodiscard]] nccl_communicator* nccl() noexcept;

  /// The path `automatic` takes for `op` ("allreduce", "allgather", "reduce_scatter", "broadcast") of
  /// `bytes`, and the predicted seconds of both paths. Same answer on every rank.
  struct choice {
    device_path path;       ///< the cheapest path
    double nccl_seconds;    ///< predicted, or +inf without NCCL
    double ring_seconds;    ///< predicted, or +inf without NCCL or for an op other than allreduce
    double staged_seconds;  ///< predicted
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

  /// Waits on the host, with the host communicator's timeout, until the work on `caller` is done;
  /// throws the NCCL communicator's failure or timeout_error naming `what`.
  void synchronize(cudaStream_t caller, std::string_view what);

 private:
  struct state;
  void check_sizes(std::string_view op, std::size_t have, std::size_t need) const;
  void run(std::string_view op, void* data, const void* send, std::size_t count, dtype t, reduce_op rop, int root,
           cudaStream_t caller, device_path path);
  std::unique_ptr<state> s_;
};

}  // namespace flexpar::cuda
