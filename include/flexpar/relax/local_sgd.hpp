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
#include <flexpar/relax/host_model.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax {

namespace detail {
/// local_sgd's steps over any Model (host_model.hpp: host or device memory; file header).
class local_sgd_rule {
 public:
  /// @throws usage_error (naming `rank`) if interval < 1.
  local_sgd_rule(int rank, int interval) : interval_(interval) {
    if (interval < 1)
      throw usage_error(where(rank, "local_sgd", "make") + "interval " + std::to_string(interval) +
                        " must be at least 1");
  }
  template <class Model, class Params>
  void start(Model& m, Params params) {
    m.start("local_sgd", params, false);
    since_average_ = 0;
  }
  template <class Model, class Params, class Opt>
  void step(Model& m, Params params, Opt& opt) {
    m.check("step", params);
    m.apply(params, opt);
    ++traffic_.steps;
    if (++since_average_ == interval_) average(m, params);
  }
  template <class Model, class Params>
  void finish(Model& m, Params params) {
    m.check("finish", params);
    if (since_average_ > 0) average(m, params);
  }
  [[nodiscard]] const traffic& so_far() const noexcept { return traffic_; }

 private:
  template <class Model, class Params>
  void average(Model& m, Params params) {
    since_average_ = 0;
    if (m.size() == 1) return;
    traffic_.bytes_sent += m.average_weights(params);
    ++traffic_.exchanges;
  }

  int interval_;
  int since_average_ = 0;
  traffic traffic_;
};
}  // namespace detail

/// Local steps; weights averaged every `interval` steps (file header).
class local_sgd final : public detail::host_ruled<detail::local_sgd_rule> {
 public:
  /// Over `comm` (kept by reference; it must outlive this object). @throws usage_error if interval < 1.
  explicit local_sgd(communicator& comm, int interval = 4) : host_ruled(comm, interval) {}
  /// Bytes one rank sends per step, averaged over `interval` steps, for a model of `model_bytes`.
  static constexpr double wire_bytes(double model_bytes, int p, int interval) noexcept {
    return p <= 1 ? 0.0 : 2.0 * (p - 1) / p * model_bytes / interval;
  }
  [[nodiscard]] std::string_view name() const noexcept override { return "local_sgd"; }
};

}  // namespace flexpar::relax
