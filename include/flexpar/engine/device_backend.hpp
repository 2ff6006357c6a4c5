// flexpar/engine/device_backend.hpp — what the engine needs to run its collectives on device
// tensors, without the host library knowing CUDA: flexpar::cuda::engine_backend implements it over a
// cuda::device_communicator (flexpar/cuda/engine.hpp), and the engine calls it from its background
// thread only (capture() from the submitting threads).
//
// A device tensor enters the engine with a marker of its producer: the position the caller's stream
// had reached when it was submitted (capture()). When its response comes, the backend runs it on a
// stream of its own after that marker (a fused allreduce: one batched copy into a device fusion buffer,
// the collective, one batched copy out) and returns the marker of its end; the engine completes the
// handle once that marker is done (done()), without waiting on the host for the GPU in between, and a
// caller orders its own stream after it (order_after()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <flexpar/core/dtype.hpp>
#include <flexpar/core/reduce_op.hpp>

namespace flexpar {

enum class collective_kind : unsigned char;

/// A position in a device stream (opaque to the engine; the backend's own type behind it).
using device_marker = std::shared_ptr<void>;

/// One device tensor of a response as the engine hands it over. `in` is null for a rank that has
/// joined: it contributes the identity of the reduction (allreduce) or receives into scratch
/// (broadcast).
struct device_item {
  const std::byte* in = nullptr;  ///< device address of the input, `count` elements
  std::byte* out = nullptr;       ///< device address of the output
  std::size_t count = 0;          ///< this rank's elements
  device_marker ready;            ///< the producer's position (null: nothing to wait for)
};

/// How long the phases of a finished device response took on the GPU (CUDA events), in ms.
struct device_phases {
  float copy_in = 0;     ///< into the fusion buffer (0 for one tensor)
  float collective = 0;  ///< the device collective itself
  float copy_out = 0;    ///< out of the fusion buffer
};

/// The engine's device side (see the top of this file).
class device_backend {
 public:
  virtual ~device_backend() = default;
  /// On a submitting thread: the current end of `stream` (a cudaStream_t, opaque here).
  [[nodiscard]] virtual device_marker capture(void* stream) = 0;
  /// Runs one response of `kind` over `items` (several only for a fused allreduce; `counts` are every
  /// rank's counts of the single tensor, as the engine negotiated them) after their ready markers, and
  /// returns the marker of its end; `path` receives the device path's name (for the timeline).
  /// @throws the backend's error (usage_error, transport_error, timeout_error, ...).
  [[nodiscard]] virtual device_marker run(collective_kind kind, dtype type, reduce_op op, int root,
                                          std::span<const device_item> items, std::span<const std::uint64_t> counts,
                                          std::string& path) = 0;
  /// True once the work behind `m` has finished; throws the error of a failed kernel or collective.
  [[nodiscard]] virtual bool done(const device_marker& m) = 0;
  /// The GPU time of the phases of a finished response's marker.
  [[nodiscard]] virtual device_phases phases(const device_marker& m) = 0;
  /// Makes `stream` (a cudaStream_t) wait on the device, without blocking the host, for `m`.
  virtual void order_after(const device_marker& m, void* stream) = 0;

  // ---- what the gradient sync needs on device tensors (flexpar/engine/gradient_sync.hpp) ----------

  /// Enqueues on `stream`: out[i] = to(factor * from(in[i])) for `count` elements, computed in float
  /// for f16/bf16/f32 (double for f64, the accumulation type for integers) and rounded once; `in` and
  /// `out` may be the same when the types are. Supported: any type to itself (a scaling), and f32 to
  /// and from f16 and bf16 (wire compression).
  /// @throws usage_error for another pair of types.
  virtual void convert(dtype from, const void* in, dtype to, void* out, std::size_t count, double factor,
                       void* stream) = 0;
  /// Device memory of `bytes` bytes (a wire buffer), freed when the last copy of the pointer goes.
  [[nodiscard]] virtual std::shared_ptr<void> allocate(std::size_t bytes) = 0;
};

}  // namespace flexpar
