// flexpar/relax/local_sgd.hpp — local_sgd: every rank steps on its own; every k steps the weights are
// averaged (Local SGD, model averaging).
//
// Step s (counted from 0), k = interval, M = model bytes (f32), p ranks:
//   step 1: opt.apply every parameter with its local gradient                 local
//   step 2: if (s + 1) % k == 0: fuse the weights, allreduce(avg), copy back  2 (p - 1) / p * M sent
// Bytes on the wire per step per rank, averaged over steps: 2 (p - 1) / (p k) * M.
// finish() averages once more if any step ran since the last average, so the run ends with one
// model. k = 1 with plain SGD (no momentum) is gradient_allreduce up to rounding. Use it when
// communication is expensive and the model tolerates some drift between replicas; optimizer state
// (momentum, Adam moments) stays local and is not averaged.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/relax/flat_model.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax {

/// Local steps; weights averaged every `interval` steps (file header).
class local_sgd final : public relaxation {
 public:
  /// Over `comm` (kept by reference; it must outlive this object). @throws usage_error if interval < 1.
  explicit local_sgd(communicator& comm, int interval = 4) : comm_(comm), interval_(interval) {
    if (interval < 1)
      throw usage_error(detail::where(comm.rank(), "local_sgd", "make") + "interval " + std::to_string(interval) +
                        " must be at least 1");
  }

  /// Bytes one rank sends per step, averaged over `interval` steps, for a model of `model_bytes`.
  static constexpr double wire_bytes(double model_bytes, int p, int interval) noexcept {
    return p <= 1 ? 0.0 : 2.0 * (p - 1) / p * model_bytes / interval;
  }

  [[nodiscard]] std::string_view name() const noexcept override { return "local_sgd"; }

  void start(std::span<const parameter> params) override {
    model_.bind(comm_, name(), params);
    model_.broadcast_weights(comm_, params);
    flat_.assign(model_.size(), 0.0f);
    since_average_ = 0;
  }

  void step(std::span<const parameter> params, optimizer& opt) override {
    model_.check(comm_.rank(), "step", params);
    for (std::size_t i = 0; i < params.size(); ++i) opt.apply(i, params[i].weight, params[i].gradient);
    ++traffic_.steps;
    if (++since_average_ == interval_) average(params);
  }

  void finish(std::span<const parameter> params) override {
    model_.check(comm_.rank(), "finish", params);
    if (since_average_ > 0) average(params);
  }

  [[nodiscard]] traffic traffic_so_far() const noexcept override { return traffic_; }

 private:
  void average(std::span<const parameter> params) {
    since_average_ = 0;
    if (comm_.size() == 1) return;
    model_.gather_weights(params, flat_);
    flexpar::allreduce(comm_, std::span<float>(flat_), reduce_op::avg);
    model_.scatter_weights(flat_, params);
    traffic_.bytes_sent += detail::ring_allreduce_bytes(flat_.size(), comm_.size());
    ++traffic_.exchanges;
  }

  communicator& comm_;
  int interval_;
  detail::flat_model model_;
  std::vector<float> flat_;
  int since_average_ = 0;
  traffic traffic_;
};

}  // namespace flexpar::relax
