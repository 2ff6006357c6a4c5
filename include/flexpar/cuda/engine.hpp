// flexpar/cuda/engine.hpp — the engine's device side: flexpar::device_backend over a
// cuda::device_communicator.
//
// Part of flexpar::cuda. The backend runs each response the engine hands it on a stream of its own,
// after the producers' stream positions: a fused allreduce is one batched copy (fusion_packer) of
// every tensor into a device fusion buffer, one device allreduce by the cheapest path (NCCL, the
// CUDA IPC path, or staged through host memory), and one batched copy back; a single tensor runs in
// place. Nothing on this path waits on the host for the GPU but the staged path's middle.
//
//   flexpar::cuda::device_communicator gpu(comm, device);
//   flexpar::cuda::engine_backend backend(gpu);
//   device_marker ready = backend.capture(stream);            // where the gradient is produced
//   device_marker end = backend.run(collective_kind::allreduce, dtype::f32, reduce_op::avg, -1,
//                                   items, counts, path);     // items carry `ready`
//   backend.order_after(end, stream);                          // the optimizer's kernels come after
#pragma once

#include <memory>
#include <string>

#include <flexpar/cuda/collective.hpp>
#include <flexpar/engine/device_backend.hpp>
#include <flexpar/engine/engine.hpp>
#include <flexpar/engine/gradient_sync.hpp>

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
  void convert(dtype from, const void* in, dtype to, void* out, std::size_t count, double factor,
               void* stream) override;
  [[nodiscard]] std::shared_ptr<void> allocate(std::size_t bytes) override;

 private:
  struct state;
  std::unique_ptr<state> s_;
};

// ---- device tensors through an engine -----------------------------------------------------------
//
// The engine's asynchronous collectives on device memory (the engine must have been built with an
// engine_backend). Each marks where `stream` stands, so the collective runs after the work already
// queued there (the backward pass that produced a gradient); handle::wait() returns once the GPU is
// done, order_after() makes a stream wait for it on the device instead. The spans stay in use until
// then. A host span where a device span is expected does not compile.

/// Reduces `data` in place across ranks (engine::allreduce_async for device memory).
template <element T>
handle allreduce_async(engine& eng, std::string name, device_span<T> data, reduce_op op, cudaStream_t stream,
                       completion_callback done = {}) {
  return eng.submit_device(std::move(name), collective_kind::allreduce, dtype_of<T>, op, -1, data.data(), data.data(),
                           data.size(), data.size(), stream, std::move(done));
}
/// Every rank's `mine` (counts may differ per rank) into `all`, in rank order.
template <element T>
handle allgather_async(engine& eng, std::string name, device_span<const T> mine, device_span<T> all,
                       cudaStream_t stream, completion_callback done = {}) {
  return eng.submit_device(std::move(name), collective_kind::allgather, dtype_of<T>, reduce_op::sum, -1, mine.data(),
                           all.data(), mine.size(), all.size(), stream, std::move(done));
}
/// `data` of rank `root` into `data` of every rank.
template <element T>
handle broadcast_async(engine& eng, std::string name, device_span<T> data, int root, cudaStream_t stream,
                       completion_callback done = {}) {
  return eng.submit_device(std::move(name), collective_kind::broadcast, dtype_of<T>, reduce_op::sum, root, data.data(),
                           data.data(), data.size(), data.size(), stream, std::move(done));
}
/// Block r of the reduction of every rank's `in` into `out` on rank r (blocks as equal as can be).
template <element T>
handle reduce_scatter_async(engine& eng, std::string name, device_span<const T> in, device_span<T> out, reduce_op op,
                            cudaStream_t stream, completion_callback done = {}) {
  return eng.submit_device(std::move(name), collective_kind::reduce_scatter, dtype_of<T>, op, -1, in.data(), out.data(),
                           in.size(), out.size(), stream, std::move(done));
}
/// Block j of `in` to rank j; block i of `out` from rank i (in.size() divisible by the ranks).
template <element T>
handle alltoall_async(engine& eng, std::string name, device_span<const T> in, device_span<T> out, cudaStream_t stream,
                      completion_callback done = {}) {
  return eng.submit_device(std::move(name), collective_kind::alltoall, dtype_of<T>, reduce_op::sum, -1, in.data(),
                           out.data(), in.size(), out.size(), stream, std::move(done));
}

/// Makes `stream` wait, on the device, for the collective of `h` (handle::order_after).
inline void order_after(const handle& h, cudaStream_t stream) { h.order_after(stream); }

// ---- gradient sync of device parameters -------------------------------------------------------------

/// Registers a device parameter and its gradient with `sync` (same length; names unique and the same
/// on every rank). Its engine must have been built with an engine_backend.
template <element T>
void register_parameter(gradient_sync& sync, std::string name, device_span<T> parameter, device_span<T> gradient) {
  sync.register_device_parameter(std::move(name), dtype_of<T>, parameter.data(), parameter.size(), gradient.data(),
                                 gradient.size());
}
/// Registers a device parameter whose gradient lives in `sync`'s device arena (gradient_sync's file
/// header): cuda::gradient gives it.
template <element T>
void register_parameter(gradient_sync& sync, std::string name, device_span<T> parameter) {
  sync.register_device_parameter(std::move(name), dtype_of<T>, parameter.data(), parameter.size());
}
/// The device gradient of an arena parameter of element type T (gradient_sync::gradient for device
/// memory; uninitialized until the backward pass writes it).
template <element T>
device_span<T> gradient(gradient_sync& sync, std::string_view name) {
  const std::span<std::byte> bytes = sync.device_gradient(name, dtype_of<T>);
  return {reinterpret_cast<T*>(bytes.data()), bytes.size() / sizeof(T)};
}
/// `name`'s gradient is final; it was produced on `stream` (gradient_sync::on_gradient_ready).
inline void on_gradient_ready(gradient_sync& sync, std::string_view name, cudaStream_t stream) {
  sync.on_gradient_ready(name, stream);
}
/// Ends a backward pass; the averaged gradients are ready for the work queued on `stream` next
/// (gradient_sync::synchronize(stream)).
inline bool synchronize(gradient_sync& sync, cudaStream_t stream) { return sync.synchronize(stream); }

}  // namespace flexpar::cuda
