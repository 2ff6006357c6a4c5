// flexpar/engine/gradient_sync.hpp — data-parallel gradient synchronization for C++ training loops.
//
//   flexpar::engine eng(comm);
//   flexpar::gradient_sync sync(eng, {.reduction = flexpar::gradient_reduction::average});
//   sync.register_parameter("fc1.weight", w1, g1);   // once, same names on every rank
//   sync.broadcast_parameters(0);                    // the same initial state everywhere
//   for (each step) {
//     forward(); backward_with_hook([&](auto name) { sync.on_gradient_ready(name); });
//     if (sync.synchronize()) optimizer_step();      // false on local-accumulation passes
//   }
//
// Parameters on the GPU (the engine built with a device backend; flexpar/cuda/engine.hpp registers
// device spans): on_gradient_ready(name, stream) names the stream that produced the gradient, and
// synchronize(stream) returns without waiting for the GPU: it orders `stream` after the reductions and
// enqueues the scaling (and the decompression) on it, so the optimizer's kernels queued next see the
// averaged gradients.
//
// on_gradient_ready(name) submits that gradient's allreduce at once, so communication overlaps the
// rest of the backward pass; the engine fuses what becomes ready together (bucketing follows
// readiness). synchronize() submits the gradients not marked ready (unused parameters: every rank
// must reduce every registered gradient), waits, and scales; it ends the engine's step
// (engine::end_step), so that from the third step on the engine replays a frozen plan.
//
// Gradients in the arena (PyTorch DDP's gradient_as_bucket_view): a parameter registered without a
// gradient buffer gets one from the sync, a view of a flat buffer the sync owns, one per dtype and
// memory. The arena holds the gradients in the reverse of their registration order (the order a
// backward pass produces them) and is cut into buckets of about `bucket_bytes`; a bucket's allreduce
// starts when its last gradient is ready, and runs in place: no copy into a fusion buffer and back.
//
//   sync.register_parameter("fc1.weight", w1);           // no gradient buffer: in the arena
//   std::span<float> g1 = sync.gradient<float>("fc1.weight");  // the backward pass writes here
//
// Frozen parameters (freeze()): not reduced, their gradients left alone; every rank must freeze the
// same ones, between steps.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/engine/engine.hpp>

namespace flexpar {

enum class gradient_reduction : unsigned char {
  average,  ///< divide by ranks × backward_passes_per_step: the mean over the whole effective batch
  sum,      ///< plain sum over ranks and accumulated passes
};

enum class wire_compression : unsigned char {
  none,  ///< gradients travel in their own dtype
  fp16,  ///< f32 gradients travel as IEEE half (half the bytes; reduced in f32 per step of the ring)
  bf16,  ///< f32 gradients travel as bfloat16 (half the bytes, f32's range, 8 bits of mantissa)
};

/// How a gradient_sync reduces, compresses and accumulates.
struct gradient_sync_options {
  gradient_reduction reduction = gradient_reduction::average;  ///< average or sum
  wire_compression compression = wire_compression::none;       ///< what the gradients travel as
  /// Gradients of this many backward passes are accumulated locally (in the grad buffers, by the
  /// caller's backward) before one synchronization.
  int backward_passes_per_step = 1;
  /// The arena's buckets hold about this many bytes of gradients each (a parameter larger than it has
  /// a bucket of its own): smaller buckets start reducing earlier in the backward pass, larger ones
  /// run fewer collectives. 0: one bucket per parameter.
  std::size_t bucket_bytes = std::size_t{25} << 20;
};

/// Data-parallel gradient synchronization over an engine (usage above).
class gradient_sync {
 public:
  /// Synchronizes through `eng` (which must outlive this object).
  /// @throws usage_error when backward_passes_per_step < 1.
  gradient_sync(engine& eng, gradient_sync_options options = {});
  ~gradient_sync();
  gradient_sync(const gradient_sync&) = delete;
  gradient_sync& operator=(const gradient_sync&) = delete;

  /// Registers a parameter and its gradient buffer (same length). Names must be unique and the same
  /// on every rank. @throws usage_error for a duplicate name, a length mismatch, or fp16 compression
  /// of a non-f32 gradient.
  template <element T>
  void register_parameter(std::string name, std::span<T> parameter, std::span<T> gradient) {
    add(std::move(name), dtype_of<T>, std::as_writable_bytes(parameter), std::as_writable_bytes(gradient),
        parameter.size(), gradient.size());
  }

  /// Registers a parameter whose gradient lives in the sync's arena (file header): gradient() gives
  /// it, zeros until the caller's backward pass writes it. Same rules as the form with a gradient.
  template <element T>
  void register_parameter(std::string name, std::span<T> parameter) {
    add(std::move(name), dtype_of<T>, std::as_writable_bytes(parameter), {}, parameter.size(), parameter.size(), true);
  }

  /// The gradient of an arena parameter of element type T. The first call after registrations lays
  /// out the arena for the parameters registered so far; the span stays valid as long as the sync
  /// (parameters registered later get an arena block of their own).
  /// @throws usage_error for a parameter that is not in the arena, a device parameter, or another T.
  template <element T>
  std::span<T> gradient(std::string_view name) {
    const std::span<std::byte> bytes = arena_gradient(name, dtype_of<T>);
    return {reinterpret_cast<T*>(bytes.data()), bytes.size() / sizeof(T)};
  }

  /// Registers a parameter and its gradient in device memory (elements of `type`; the counts must
  /// agree): the type-erased form behind flexpar::cuda::register_parameter. The engine must have a device backend.
  /// @throws usage_error as register_parameter, or when the engine has no device backend.
  void register_device_parameter(std::string name, dtype type, void* parameter, std::size_t parameter_count,
                                 void* gradient, std::size_t gradient_count);
  /// Registers a device parameter whose gradient lives in the sync's device arena (uninitialized
  /// device memory; device_gradient() gives it): the form behind flexpar::cuda::register_parameter
  /// without a gradient.
  void register_device_parameter(std::string name, dtype type, void* parameter, std::size_t count);
  /// An arena parameter's gradient in device memory (`type` as registered): its device addresses as a
  /// span of bytes, which the host must not read; the form behind flexpar::cuda::gradient.
  /// @throws usage_error as gradient().
  std::span<std::byte> device_gradient(std::string_view name, dtype type);

  /// Stops reducing `name`'s gradient (its layer is frozen) until unfreeze(); its gradient buffer is
  /// left alone. Every rank must freeze the same parameters before the same step (otherwise the
  /// engine's mismatch error names the tensor and the ranks). Between steps only.
  /// @throws usage_error for an unknown name or while a step is in progress.
  void freeze(std::string_view name);
  /// Reduces `name`'s gradient again from the next step on. Between steps only.
  void unfreeze(std::string_view name);

  /// Called by the backward pass when `name`'s gradient is final for this pass. On the last pass of
  /// a step it starts that gradient's allreduce. Thread-safe. For a device parameter use the form
  /// with the stream (usage_error here).
  void on_gradient_ready(std::string_view name);
  /// The same for a device parameter whose gradient was produced on `stream` (a cudaStream_t): its
  /// allreduce runs after the work queued there so far.
  void on_gradient_ready(std::string_view name, void* stream);

  /// Ends a backward pass. On the last pass of a step: submits the gradients not yet marked ready,
  /// waits for all of them, scales them, and returns true (take the optimizer step). On the other
  /// passes returns false at once (keep accumulating). With device parameters use synchronize(stream).
  bool synchronize();
  /// synchronize() for parameters on the GPU (host parameters too): the device gradients not yet marked
  /// ready are submitted after the work on `stream`; host gradients are waited for and scaled as
  /// above; `stream` is made to wait for the device reductions and their scaling is enqueued on it.
  /// Returns when all that is enqueued, without waiting for the GPU.
  bool synchronize(void* stream);

  /// Collective: every rank's parameters (host and device) become rank `root`'s; returns when they have.
  /// Device parameters are read once the work queued on `stream` (a cudaStream_t; null: the default
  /// stream) has run: their initialization.
  void broadcast_parameters(int root, void* stream = nullptr);

  /// The options it was built with.
  [[nodiscard]] const gradient_sync_options& options() const noexcept;

 private:
  struct state;
  void add(std::string name, dtype type, std::span<std::byte> parameter, std::span<std::byte> gradient,
           std::size_t parameter_count, std::size_t gradient_count, bool in_arena = false);
  std::span<std::byte> arena_gradient(std::string_view name, dtype type);
  std::unique_ptr<state> state_;
};

}  // namespace flexpar
