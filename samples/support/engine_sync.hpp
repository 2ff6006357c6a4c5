// samples/support/engine_sync.hpp — the MLP samples' gradient sync over flexpar's engine, overlapped
// with the backward pass: a relaxation-shaped step (so the sample's loop, checks and summary stay as
// they are) whose gradients live in a gradient_sync's arena, and the parameter source through which
// the MLP's backward pass writes them there and announces each layer as soon as it is done.
//
// The arena holds the gradients in the reverse of their registration order (the order the backward
// pass produces them) cut into buckets of `bucket_bytes`: a bucket's allreduce starts when its last
// gradient is ready, while the backward pass goes on with the layers below. step() then waits for
// what is still running (the exposed communication), and applies the optimizer.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/engine/gradient_sync.hpp>
#include <flexpar/relax/gradient_allreduce.hpp>
#include <flexpar/relax/relaxation.hpp>

#include "mlp.hpp"

namespace flexpar::samples {

/// gradient_sync as a relaxation (average gradients exactly, then step), over gradients in its arena.
class engine_sync final : public relax::relaxation, public parameter_source {
 public:
  /// Registers `params` (their weights; their gradients become arena views: params[i].gradient is
  /// rewritten) with a sync over `eng`; `model` is read by the forward and backward passes.
  engine_sync(engine& eng, mlp& model, std::vector<relax::parameter>& params, std::size_t bucket_bytes)
      : sync_(eng, {.reduction = gradient_reduction::average, .bucket_bytes = bucket_bytes}),
        model_(model),
        params_(params),
        ranks_(eng.size()) {
    for (relax::parameter& p : params) sync_.register_parameter(p.name, p.weight);
    for (relax::parameter& p : params) p.gradient = sync_.gradient<float>(p.name);
  }

  [[nodiscard]] std::string_view name() const noexcept override { return "engine"; }
  void start(std::span<const relax::parameter>) override { sync_.broadcast_parameters(0); }
  /// The backward pass has run through this source: waits for the reductions still running, then
  /// applies `opt` to every parameter.
  void step(std::span<const relax::parameter> params, relax::optimizer& opt) override {
    sync_.synchronize();
    for (std::size_t i = 0; i < params.size(); ++i) opt.apply(i, params[i].weight, params[i].gradient);
    traffic_.bytes_sent += static_cast<std::uint64_t>(relax::gradient_allreduce::wire_bytes(model_bytes(), ranks_));
    ++traffic_.steps;
    ++traffic_.exchanges;
  }
  void finish(std::span<const relax::parameter>) override {}
  [[nodiscard]] relax::traffic traffic_so_far() const noexcept override { return traffic_; }

  // parameter_source: the model's weights, the arena's gradients, each layer announced when done
  std::span<const float> weight(std::size_t l) override { return model_.weight(l); }
  std::span<const float> bias(std::size_t l) override { return model_.bias(l); }
  std::span<float> weight_grad(std::size_t l) override { return params_[2 * l].gradient; }
  std::span<float> bias_grad(std::size_t l) override { return params_[2 * l + 1].gradient; }
  void gradients_ready(std::size_t l) override {
    sync_.on_gradient_ready(params_[2 * l].name);
    sync_.on_gradient_ready(params_[2 * l + 1].name);
  }

 private:
  [[nodiscard]] double model_bytes() const {
    double n = 0;
    for (const relax::parameter& p : params_) n += static_cast<double>(p.weight.size());
    return n * sizeof(float);
  }

  gradient_sync sync_;
  mlp& model_;
  std::vector<relax::parameter>& params_;
  int ranks_;
  relax::traffic traffic_;
};

}  // namespace flexpar::samples
