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
// must reduce every registered gradient), waits, and scales.
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

  /// Registers a parameter and its gradient in device memory (elements of `type`; the counts must
  /// agree): the type-erased form behind flexpar::cuda::register_parameter. The engine must have a device backend.
  /// @throws usage_error as register_parameter, or when the engine has no device backend.
  void register_device_parameter(std::string name, dtype type, void* parameter, std::size_t parameter_count,
                                 void* gradient, std::size_t gradient_count);

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
  /// Device parameters are read once the work queued on `stream` (a cudaStream_t; null: nothing to
  /// wait for) has run: their initialization.
  void broadcast_parameters(int root, void* stream = nullptr);

  /// The options it was built with.
  [[nodiscard]] const gradient_sync_options& options() const noexcept;

 private:
  struct state;
  void add(std::string name, dtype type, std::span<std::byte> parameter, std::span<std::byte> gradient,
           std::size_t parameter_count, std::size_t gradient_count);
  std::unique_ptr<state> state_;
};

}  // namespace flexpar
