// lib/engine/fused_executor.hpp — step 5 of the protocol in include/flexpar/engine/engine.hpp: runs a
// response list on a communicator. Compatible allreduces go through the fusion buffer as one
// collective, the other responses run one by one, device responses go to the device backend, and
// every tensor ends through the owner (the engine) that handed it in.
//
// Every rank runs the same list through the same plan (plan_fusion), so the collectives and their
// order agree on every rank without a message.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/engine/device_backend.hpp>
#include <flexpar/timeline.hpp>

#include "entry.hpp"
#include "protocol.hpp"

namespace flexpar::detail {

/// What the fusion plan needs to know of a response.
struct fusion_item {
  bool fusable = false;  // an allreduce to run (not an error, not another collective)
  dtype type = dtype::f32;
  reduce_op op = reduce_op::sum;
  memory_kind memory = memory_kind::host;
  std::size_t bytes = 0;  // rank 0's
};
/// The runs of a list, as indices into it, in the order they run: each allreduce gathers the later
/// allreduces of the list that share its dtype, op and memory kind, in list order, while they fit
/// `fusion_threshold` bytes (0: no fusion); every other response runs alone. One fused run per kind,
/// whatever else the list interleaves (host and device gradients, two dtypes).
std::vector<std::vector<std::size_t>> plan_fusion(std::span<const fusion_item> list, std::size_t fusion_threshold);
/// The fusion item of a response whose description and counts are filled in.
fusion_item fusion_item_of(const response& r);
/// plan_fusion of a response list (every response's description and counts filled in).
std::vector<std::vector<std::size_t>> plan_fusion(std::span<const response> list, std::size_t fusion_threshold);

/// One run of a response list (plan_fusion's indices), read in place: no response is copied.
struct response_run {
  std::span<const response> list;
  std::span<const std::size_t> at;
  [[nodiscard]] const response& operator[](std::size_t k) const { return list[at[k]]; }
  [[nodiscard]] const response& front() const { return list[at.front()]; }
  [[nodiscard]] std::size_t size() const noexcept { return at.size(); }
};

class fused_executor {
 public:
  /// What the executor needs from the engine: this rank's pending tensors, and where they end.
  class owner {
   public:
    /// Takes this rank's pending tensor `name` out of its pending set; null when this rank has none
    /// (it has joined: it contributes the identity, or receives into scratch), or when `step` is
    /// given and this rank's is of another step.
    virtual std::shared_ptr<engine_entry> take(const std::string& name, std::optional<std::uint32_t> step = {}) = 0;
    /// Completes `entries` (null ones skipped) with `error` (null on success) and their result counts.
    virtual void complete(std::span<const std::shared_ptr<engine_entry>> entries, std::exception_ptr error,
                          std::span<const std::size_t> result_counts) = 0;
    /// A collective ran that carried `tensors` tensors (the statistics).
    virtual void ran(std::size_t tensors) = 0;
    /// An error response for a tensor this rank does not hold (it never submitted it, or ended its
    /// step without it): `text` names the tensor and the ranks, for this rank's log.
    virtual void note(const std::string& text) = 0;

   protected:
    ~owner() = default;
  };

  /// How often the background thread asks whether device responses have finished.
  static constexpr std::chrono::microseconds device_poll{50};

  /// `device` (may be null) runs device responses; `trace` (may be null) records each tensor's
  /// phases. `comm`, `device`, `trace` and `to` must outlive the executor.
  fused_executor(communicator& comm, std::size_t fusion_threshold, device_backend* device, timeline* trace, owner& to);

  /// Step 5 on this rank: runs `list` (the responses of one cycle, received at `responded`).
  /// @throws what a failed collective threw (the ranks are out of step then: the engine stops);
  ///         an error of one tensor only (its output too small) completes that tensor and goes on.
  void execute(std::span<const response> list, clock::time_point responded);
  /// Runs one group of the fusion plan (a bucket of a frozen step: step_plan.hpp) with this rank's
  /// entries of it (null where this rank has joined), agreed on at `responded`; errors as execute().
  void run(response_run group, std::vector<std::shared_ptr<engine_entry>> entries, clock::time_point responded);

  /// True while device responses are enqueued and not yet seen finished.
  [[nodiscard]] bool device_in_flight() const noexcept { return !in_flight_.empty(); }
  /// Completes the device responses whose GPU work has finished (in order: a stream runs in order).
  void poll_device();
  /// Waits (at most `bound`) for the device responses in flight, so that no handle completes while
  /// the GPU may still write its output.
  void drain_device(std::chrono::milliseconds bound);
  /// For a failing engine: drains (at most `bound`; a second error changes nothing), then completes
  /// every device response still in flight with `error`.
  void abandon(std::exception_ptr error, std::chrono::milliseconds bound);

 private:
  /// A device response in flight: its handles complete when the backend says its marker is done.
  struct device_flight {
    std::vector<std::shared_ptr<engine_entry>> entries;  // null where this rank has joined
    std::vector<std::size_t> result_counts;
    std::vector<std::exception_ptr> local;  // a failure of one handle (its output too small)
    device_marker end;
    std::string path;
  };
  /// When the phases of a host run began and ended (the timeline's spans).
  struct phase_times {
    clock::time_point copied_in, reduced;
    bool packed = false;  // through the fusion buffer (copied in and out), not reduced in place
  };

  void fail_one(const response& r);
  std::string run_fused(response_run group, std::span<const std::shared_ptr<engine_entry>> entries, phase_times& times);
  std::string run_single(const response& r, engine_entry* e, std::size_t& result_count);
  void run_device_group(response_run group, std::vector<std::shared_ptr<engine_entry>> entries);
  [[noreturn]] void throw_too_small(const engine_entry& e, std::size_t room, std::size_t needed) const;
  std::byte* scratch(std::size_t bytes);
  void record(const engine_entry& e, std::size_t fused, bool packed, const std::string& algorithm_name);

  communicator& comm_;
  std::size_t fusion_threshold_;
  device_backend* device_;
  timeline* trace_;
  owner& owner_;
  std::vector<std::byte> fusion_, scratch_;
  std::deque<device_flight> in_flight_;  // device responses enqueued, not yet finished
};

}  // namespace flexpar::detail
