// flexpar/relax/momentum_adam.hpp — the Adam family with compressed momentum (1-bit Adam, QAdam): what onebit_adam.hpp
// and qadam.hpp share.
//
// These algorithms own their optimizer: Adam with the adam_options given at construction; the
// optimizer passed to step() is ignored. n = model elements, t = step number from 1,
// T = warmup_steps, M = model bytes (f32), p ranks:
//   warm-up (t <= T), exact Adam on averaged gradients:
//     step 1: g = allreduce(avg) of the fused gradients                    2 (p - 1) / p * M sent
//     step 2: g += wd * x; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
//             x -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)   local
//     at t = T: v is frozen as vf = v / (1 - b2^T) (never updated again)
//   compression stage (t > T), the momentum crosses the network compressed:
//     step 1: g = my local gradient (+ wd * x); m = b1 m + (1 - b1) g      local
//     step 2: m = compressed_average(m) (compressed_average.hpp; the codec below)
//                                                                          2 (p - 1) / p * E(M) sent
//     step 3: x -= lr * (m / (1 - b1^t)) / (sqrt(vf) + eps)                local
// On the host, steps 1-3 of the compression stage run as one pass: the average is streamed in pieces
// (compressed_average_streamed) and each piece of m is updated right before it is encoded, each
// piece of x right after its average is decoded, overlapping the transfers of the other pieces.
// Because step 2 leaves m identical on every rank and the frozen variance is identical too, the
// weights stay identical on every rank in both stages; finish() has nothing to do. With T = 0 the
// variance is frozen at zero (vf = 0): the update is then m / eps — give a warm-up.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/relax/compressed_average.hpp>
#include <flexpar/relax/flat_model.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax::detail {

/// The Adam family's steps over any Model (file header), written once for host and device memory.
/// The Model (host_adam_model below; cuda::detail::device_adam_model on the GPU) holds the flat
/// gradient g, weights x, momentum m and variance v, and provides, besides host_model's rank(),
/// size(), start(algo, params, links) and check(op, params):
///   void reset();                        g, x, m, v = 0; the codec sized for the partitions
///   void load(params);                   g = the gradients, x = the weights (fused)
///   void store(params);                  the weights = x
///   std::uint64_t average_gradients();   g = allreduce(avg) of g; the bytes sent
///   void warmup_update(adam, c1, c2);    warm-up step 2 (file header), element by element
///   void freeze(c2);                     v = v / c2
///   void momentum_update(b1, wd);        compression step 1
///   std::uint64_t average_momentum();    compression step 2: compressed_average_steps over m; bytes
///   void frozen_update(adam, c1);        compression step 3
/// The arithmetic of each element is the file header's, each operation rounded to f32 in that order.
class momentum_adam_rule {
 public:
  /// @throws usage_error (naming `rank`) if warmup < 0.
  momentum_adam_rule(int rank, std::string_view name, int warmup, adam_options adam)
      : name_(name), warmup_(warmup), adam_(adam) {
    if (warmup < 0)
      throw usage_error(where(rank, name, "make") + "warm-up of " + std::to_string(warmup) +
                        " steps; it must be 0 or more");
  }
  template <class Model, class Params>
  void start(Model& m, Params params) {
    m.start(name_, params, false);
    m.reset();
    t_ = 0;
  }
  template <class Model, class Params, class Opt>
  void step(Model& m, Params params, Opt& /*opt: ignored, this algorithm is its own Adam*/) {
    m.check("step", params);
    ++t_;
    ++traffic_.steps;
    ++traffic_.exchanges;
    m.load(params);
    const auto c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(adam_.beta1), static_cast<double>(t_)));
    if (t_ <= static_cast<std::uint64_t>(warmup_)) {
      traffic_.bytes_sent += m.average_gradients();
      const auto c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(adam_.beta2), static_cast<double>(t_)));
      m.warmup_update(adam_, c1, c2);
      if (t_ == static_cast<std::uint64_t>(warmup_)) m.freeze(c2);  // frozen, bias-corrected
    } else if constexpr (requires { m.fused_momentum_step(adam_, c1); }) {
      traffic_.bytes_sent += m.fused_momentum_step(adam_, c1);  // steps 1-3 in one pass
    } else {
      m.momentum_update(adam_.beta1, adam_.weight_decay);
      traffic_.bytes_sent += m.average_momentum();
      m.frozen_update(adam_, c1);
    }
    m.store(params);
  }
  template <class Model, class Params>
  void finish(Model& m, Params params) {
    m.check("finish", params);
  }
  [[nodiscard]] const traffic& so_far() const noexcept { return traffic_; }
  [[nodiscard]] std::string_view name() const noexcept { return name_; }

 private:
  std::string name_;
  int warmup_;
  adam_options adam_;
  std::uint64_t t_ = 0;
  traffic traffic_;
};

/// momentum_adam_rule's Model for host parameters, with a compressed_average codec that has
/// `void prepare(const block_layout& parts, int rank)` (called by reset()).
template <class Codec>
class host_adam_model {
 public:
  host_adam_model(communicator& comm, Codec codec) : comm_(comm), codec_(std::move(codec)) {}

  [[nodiscard]] int rank() const noexcept { return comm_.rank(); }
  [[nodiscard]] int size() const noexcept { return comm_.size(); }
  void start(std::string_view algo, std::span<const parameter> params, bool) {
    model_.bind(comm_, algo, params);
    model_.broadcast_weights(comm_, params);
  }
  void check(std::string_view op, std::span<const parameter> params) const { model_.check(comm_.rank(), op, params); }
  void reset() {
    const std::size_t n = model_.size();
    g_.assign(n, 0.0f);
    x_.assign(n, 0.0f);
    m_.assign(n, 0.0f);
    v_.assign(n, 0.0f);
    codec_.prepare(block_layout::even(n, comm_.size()), comm_.rank());
  }
  void load(std::span<const parameter> params) {
    model_.gather_gradients(params, g_);
    model_.gather_weights(params, x_);
  }
  void store(std::span<const parameter> params) { model_.scatter_weights(x_, params); }
  std::uint64_t average_gradients() {
    flexpar::allreduce(comm_, std::span<float>(g_), reduce_op::avg);
    return ring_allreduce_bytes(g_.size(), comm_.size());
  }
  void warmup_update(const adam_options& a, float c1, float c2) {
    const float b1 = a.beta1, b2 = a.beta2, wd = a.weight_decay;
    for (std::size_t i = 0; i < g_.size(); ++i) {
      float g = g_[i];
      if (wd != 0.0f) g += wd * x_[i];
      m_[i] = b1 * m_[i] + (1.0f - b1) * g;
      v_[i] = b2 * v_[i] + (1.0f - b2) * g * g;
      x_[i] -= a.learning_rate * (m_[i] / c1) / (std::sqrt(v_[i] / c2) + a.epsilon);
    }
  }
  void freeze(float c2) {
    for (float& v : v_) v = v / c2;
  }
  void momentum_update(float b1, float wd) { momentum_update(b1, wd, 0, g_.size()); }
  std::uint64_t average_momentum() {
    return compressed_average_streamed(comm_, std::span<float>(m_), codec_, scratch_);
  }
  void frozen_update(const adam_options& a, float c1) { frozen_update(a, c1, 0, g_.size()); }
  /// Compression steps 1-3 fused into the streamed average: each piece of the momentum is updated
  /// right before it is encoded, and its weights right after its average is decoded (the same
  /// operations on each element, in the same order, as the three steps one after another).
  std::uint64_t fused_momentum_step(const adam_options& a, float c1, std::size_t piece = stream_piece_elements) {
    return compressed_average_streamed(
        comm_, std::span<float>(m_), codec_, scratch_, piece,
        [&](std::size_t first, std::size_t count) { momentum_update(a.beta1, a.weight_decay, first, count); },
        [&](std::size_t first, std::size_t count) { frozen_update(a, c1, first, count); });
  }

  [[nodiscard]] std::span<const float> momentum() const noexcept { return m_; }
  [[nodiscard]] std::span<const float> variance() const noexcept { return v_; }
  [[nodiscard]] const Codec& codec() const noexcept { return codec_; }

 private:
  void momentum_update(float b1, float wd, std::size_t first, std::size_t count) {
    for (std::size_t i = first; i < first + count; ++i) {
      float g = g_[i];
      if (wd != 0.0f) g += wd * x_[i];
      m_[i] = b1 * m_[i] + (1.0f - b1) * g;
    }
  }
  void frozen_update(const adam_options& a, float c1, std::size_t first, std::size_t count) {
    for (std::size_t i = first; i < first + count; ++i)
      x_[i] -= a.learning_rate * (m_[i] / c1) / (std::sqrt(v_[i]) + a.epsilon);
  }

  communicator& comm_;
  Codec codec_;
  flat_model model_;
  compressed_scratch scratch_;
  std::vector<float> g_, x_, m_, v_;
};

/// Adam with a compressed momentum average after `warmup` exact steps (file header): its rule over
/// host memory. `Codec` is a compressed_average codec with `void prepare(const block_layout& parts,
/// int rank)` called at start.
template <class Codec>
class momentum_adam : public relaxation {
 public:
  /// Over `comm` (kept by reference; it must outlive this object).
  /// @throws usage_error if warmup < 0.
  momentum_adam(communicator& comm, std::string_view name, Codec codec, int warmup, adam_options adam)
      : model_(comm, std::move(codec)), rule_(comm.rank(), name, warmup, adam) {}

  [[nodiscard]] std::string_view name() const noexcept override { return rule_.name(); }
  void start(std::span<const parameter> params) override { rule_.start(model_, params); }
  /// One step; `opt` is ignored (this algorithm is its own Adam; file header).
  void step(std::span<const parameter> params, optimizer& opt) override { rule_.step(model_, params, opt); }
  void finish(std::span<const parameter> params) override { rule_.finish(model_, params); }
  [[nodiscard]] traffic traffic_so_far() const noexcept override { return rule_.so_far(); }

  /// The (averaged) momentum, flat.
  [[nodiscard]] std::span<const float> momentum() const noexcept { return model_.momentum(); }
  /// The variance (frozen after the warm-up), flat.
  [[nodiscard]] std::span<const float> variance() const noexcept { return model_.variance(); }
  /// The codec (for its error-feedback residuals).
  [[nodiscard]] const Codec& codec() const noexcept { return model_.codec(); }

 private:
  host_adam_model<Codec> model_;
  momentum_adam_rule rule_;
};

}  // namespace flexpar::relax::detail
