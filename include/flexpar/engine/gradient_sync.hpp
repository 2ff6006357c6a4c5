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

  /// Called by the backward pass when `name`'s gradient is final for this pass. On the last pass of
  /// a step it starts that gradient's allreduce. Thread-safe.
  void on_gradient_ready(std::string_view name);

  /// Ends a backward pass. On the last pass of a step: submits the gradients not yet marked ready,
  /// waits for all of them, scales them, and returns true (take the optimizer step). On the other
  /// passes returns false at once (keep accumulating).
  bool synchronize();

  /// Collective: every rank's parameters become rank `root`'s.
  void broadcast_parameters(int root);

  /// The options it was built with.
  [[nodiscard]] const gradient_sync_options& options() const noexcept;

 private:
  struct state;
  void add(std::string name, dtype type, std::span<std::byte> parameter, std::span<std::byte> gradient,
           std::size_t parameter_count, std::size_t gradient_count);
  std::unique_ptr<state> state_;
};

}  // namespace flexpar
