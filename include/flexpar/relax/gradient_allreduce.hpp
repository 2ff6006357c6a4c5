// flexpar/relax/gradient_allreduce.hpp — gradient_allreduce: the baseline — average the gradients exactly, then step
// (Horovod, DDP).
//
// Pattern of one step, M = model bytes (f32), p ranks:
//   step 0: fuse every gradient into one flat buffer (a bucket)          local, M
//   step 1: allreduce(avg) of the bucket — ring (or halving-doubling, by the cost model), or
//           hierarchical (intra-node reduce-scatter, inter-node allreduce, intra-node allgather)
//                                                                        2 (p - 1) / p * M sent per rank
//   step 2: copy the averages back into the gradients, opt.apply each parameter
// Bytes on the wire per step per rank: 2 (p - 1) / p * M (traffic_so_far() counts this ring figure).
// Every rank ends each step with bitwise identical weights; finish() has nothing to do.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/relax/host_model.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax {

namespace detail {
/// One step of gradient_allreduce over any Model (host_model.hpp: host or device memory).
template <class Model, class Params, class Opt>
void gradient_allreduce_step(Model& m, Params params, Opt& opt, flexpar::algorithm how, traffic& t) {
  m.check("step", params);
  t.bytes_sent += m.average_gradients(params, how);
  m.apply(params, opt);
  ++t.steps;
  ++t.exchanges;
}
}  // namespace detail

/// Average gradients with one fused allreduce per step (file header: pattern, bytes).
class gradient_allreduce final : public relaxation {
 public:
  /// Over `comm` (kept by reference; it must outlive this object). `hierarchical` selects the
  /// two-level allreduce (needs every node to hold the same number of ranks).
  explicit gradient_allreduce(communicator& comm, bool hierarchical = false)
      : model_(comm), hierarchical_(hierarchical) {}

  /// Bytes one rank sends per step for a model of `model_bytes` on `p` ranks.
  static constexpr double wire_bytes(double model_bytes, int p) noexcept {
    return p <= 1 ? 0.0 : 2.0 * (p - 1) / p * model_bytes;
  }

  [[nodiscard]] std::string_view name() const noexcept override { return "gradient_allreduce"; }

  void start(std::span<const parameter> params) override { model_.start(name(), params, false); }

  void step(std::span<const parameter> params, optimizer& opt) override {
    detail::gradient_allreduce_step(model_, params, opt,
                                    hierarchical_ ? flexpar::algorithm::hierarchical : flexpar::algorithm::automatic,
                                    traffic_);
  }

  void finish(std::span<const parameter> params) override { model_.check("finish", params); }

  [[nodiscard]] traffic traffic_so_far() const noexcept override { return traffic_; }

 private:
  detail::host_model model_;
  bool hierarchical_;
  traffic traffic_;
};

}  // namespace flexpar::relax
