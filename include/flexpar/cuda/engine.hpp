/// @file
/// @brief The engine's device side: flexpar::device_backend over a cuda::device_communicator.
///
/// Part of flexpar::cuda. The backend runs each response the engine hands it on a stream of its own,
/// after the producers' stream positions: a fused allreduce is one batched copy (fusion_packer) of
/// every tensor into a device fusion buffer, one device allreduce by the cheapest path (NCCL, the
/// CUDA IPC path, or staged through host memory), and one batched copy back; a single tensor runs in
/// place. Nothing on this path waits on the host for the GPU but the staged path's middle.
///
///   flexpar::cuda::device_communicator gpu(comm, device);
///   flexpar::cuda::engine_backend backend(gpu);
///   device_marker ready = backend.capture(stream);            // where the gradient is produced
///   device_marker end = backend.run(collective_kind::allreduce, dtype::f32, reduce_op::avg, -1,
///                                   items, counts, path);     // items carry `ready`
///   backend.order_after(end, stream);                          // the optimizer's kernels come after
#pragma once

#include <memory>

#include <flexpar/cuda/collective.hpp>
#include <flexpar/engine/device_backend.hpp>

namespace flexpar::cuda {

/// The engine's device backend over `gpu` (which must outlive it). Used by one engine.
class engine_backend final : public device_backend {
 public:
  /// A backend with its own stream on gpu.device(), its fusion buffer grown on demand.
  explicit engine_backend(device_communicator& gpu);
  ~engine_backend() override;
  engine_backend(const engine_backend&) = delete;             ///< not copyable
  engine_backend& operator=(const engine_backend&) = delete;  ///< not copyable

  [[nodiscard]] device_marker capture(void* stream) override;
  [[nodiscard]] device_marker run(collective_kind kind, dtype type, reduce_op op, int root,
                                  std::span<const device_item> items, std::span<const std::uint64_t> counts,
                                  std::string& path) override;
  [[nodiscard]] bool done(const device_marker& m) override;
  [[nodiscard]] device_phases phases(const device_marker& m) override;
  void order_after(const device_marker& m, void* stream) override;

 private:
  struct state;
  std::unique_ptr<state> s_;
};

}  // namespace flexpar::cuda
