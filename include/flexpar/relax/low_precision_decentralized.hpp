// flexpar/relax/low_precision_decentralized.hpp — low_precision_decentralized: ring neighbours exchange min-max uint8
// compressed DIFFERENCES of their weights and keep replicas of each other (BAGUA's low precision decentralized SGD,
// after DCD-PSGD, arXiv:1803.06443).
//
// State per rank: x (the weights), for each ring neighbour j a replica xh_j, and my own last-sent
// replica xh_me (what my neighbours hold of me). At start() all are rank 0's weights. Step s (from
// 0), k = interval, Q = min-max uint8 round trip (decode(encode(.)) with `chunk` elements per chunk
// over the flat model), M = model bytes (f32), p ranks, neighbours L = rank - 1, R = rank + 1 (mod p):
//   on a communicating step ((s + 1) % k == 0):
//     step 1: x = ((x + xh_L) + xh_R) / 3         (p = 2: x = (x + xh_other) / 2; p = 1: unchanged)  local
//     step 2: opt.apply every parameter with its local gradient                                    local
//     step 3: z = x - xh_me; encode z; x = xh_me + Q(z); xh_me = x                                   local
//     step 4: send the encoded z to L and R; receive theirs            2 E(M) sent (p = 2: E(M))
//     step 5: xh_L += Q(z_L); xh_R += Q(z_R)                                                         local
//   other steps: opt.apply only (x drifts from xh_me; the next difference carries the drift).
// E(M) = M / 4 + 8 * ceil(M / (4 chunk)) bytes: about 8x less than decentralized ring (2 M).
//
// Invariant (tested): after every step, every rank's replica of rank j is bitwise equal to rank j's
// xh_j, and after a communicating step x == xh_me — neighbours add the same decoded bytes to the same
// starting values with the same float operations. finish() averages the weights of every rank with
// one allreduce. Use it on slow links where even decentralized's one model per step is too much; the
// compression error does not accumulate because every difference is taken against what the
// neighbours actually hold.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/compress/minmax_uint8.hpp>
#include <flexpar/relax/host_model.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax {

namespace detail {
/// low_precision_decentralized's steps over any Model (file header; host_lpd_model below, and
/// cuda::detail::device_lpd_model on the GPU). Besides host_model's rank(), size(), start(), check(),
/// apply() and average_weights(), the Model provides:
///   void reset(params, k);             x = xh_me = each of the k replicas = the weights
///   void average_with_replicas(params);  step 1: weights = ((x + xh_L) + xh_R) / (k + 1)
///   void send_difference(params);      step 3: z = weights - xh_me; encode z; xh_me += Q(z); weights = xh_me
///   std::uint64_t exchange(peers);     step 4: the encoded z to each peer, theirs received; bytes sent
///   void update_replicas();            step 5: replica j += Q(z_j)
class low_precision_decentralized_rule {
 public:
  /// @throws usage_error (naming `rank`) if interval < 1 or chunk == 0.
  low_precision_decentralized_rule(int rank, int interval, std::size_t chunk) : interval_(interval) {
    if (interval < 1)
      throw usage_error(where(rank, "low_precision_decentralized", "make") + "communication interval " +
                        std::to_string(interval) + " must be at least 1");
    if (chunk == 0) throw usage_error(where(rank, "low_precision_decentralized", "make") + "chunk must be positive");
  }
  template <class Model, class Params>
  void start(Model& m, Params params) {
    const int p = m.size(), me = m.rank();
    m.start("low_precision_decentralized", params, p > 1);
    neighbours_.clear();
    if (p > 1) neighbours_.push_back((me + p - 1) % p);
    if (p > 2) neighbours_.push_back((me + 1) % p);
    m.reset(params, neighbours_.size());
    steps_ = 0;
  }
  template <class Model, class Params, class Opt>
  void step(Model& m, Params params, Opt& opt) {
    m.check("step", params);
    ++steps_;
    ++traffic_.steps;
    const bool communicate = steps_ % static_cast<std::uint64_t>(interval_) == 0 && !neighbours_.empty();
    if (communicate) m.average_with_replicas(params);  // step 1
    m.apply(params, opt);                              // step 2
    if (!communicate) return;
    m.send_difference(params);                                             // step 3
    traffic_.bytes_sent += m.exchange(std::span<const int>(neighbours_));  // step 4
    m.update_replicas();                                                   // step 5
    ++traffic_.exchanges;
  }
  template <class Model, class Params>
  void finish(Model& m, Params params) {
    m.check("finish", params);
    if (m.size() == 1) return;
    traffic_.bytes_sent += m.average_weights(params);
  }
  [[nodiscard]] const traffic& so_far() const noexcept { return traffic_; }
  /// The ranks whose replicas this rank keeps: left, then right (one for p = 2, none for p = 1).
  [[nodiscard]] std::span<const int> neighbours() const noexcept { return neighbours_; }

 private:
  int interval_;
  std::vector<int> neighbours_;
  std::uint64_t steps_ = 0;
  traffic traffic_;
};

/// low_precision_decentralized_rule's Model for host parameters (min-max uint8 of `chunk`).
class host_lpd_model : public host_model {
 public:
  host_lpd_model(communicator& comm, std::size_t chunk) : host_model(comm), q_{chunk == 0 ? 1 : chunk} {}

  void reset(std::span<const parameter> params, std::size_t k) {
    const std::size_t n = model_.size();
    x_.assign(n, 0.0f);
    model_.gather_weights(params, x_);
    sent_ = x_;
    replicas_.assign(k, x_);
    encoded_.assign(q_.encoded_size(n), std::byte{0});
    received_.assign(k, encoded_);
    decoded_.assign(n, 0.0f);
  }
  void average_with_replicas(std::span<const parameter> params) {
    model_.gather_weights(params, x_);
    average_in_order(x_, replicas_);
    model_.scatter_weights(x_, params);
  }
  void send_difference(std::span<const parameter> params) {
    model_.gather_weights(params, x_);
    for (std::size_t i = 0; i < x_.size(); ++i) x_[i] -= sent_[i];
    q_.encode(x_, encoded_);
    q_.decode(encoded_, decoded_);
    for (std::size_t i = 0; i < x_.size(); ++i) sent_[i] += decoded_[i];
    model_.scatter_weights(sent_, params);
  }
  std::uint64_t exchange(std::span<const int> peers) {
    transport& t = links_->transport();
    std::vector<request> requests;
    for (std::size_t j = 0; j < peers.size(); ++j)
      requests.push_back(t.irecv(peers[j], 0, std::span<std::byte>(received_[j])));
    for (int peer : peers) requests.push_back(t.isend(peer, 0, std::span<const std::byte>(encoded_)));
    wait_all(requests, links_->default_deadline());
    return peers.size() * encoded_.size();
  }
  void update_replicas() {
    for (std::size_t j = 0; j < replicas_.size(); ++j) {
      q_.decode(received_[j], decoded_);
      for (std::size_t i = 0; i < decoded_.size(); ++i) replicas_[j][i] += decoded_[i];
    }
  }

  [[nodiscard]] std::span<const float> replica(std::size_t j) const { return replicas_.at(j); }
  [[nodiscard]] std::span<const float> sent_replica() const noexcept { return sent_; }

 private:
  compress::minmax_uint8 q_;
  std::vector<float> x_, sent_, decoded_;
  std::vector<std::vector<float>> replicas_;
  std::vector<std::byte> encoded_;
  std::vector<std::vector<std::byte>> received_;
};
}  // namespace detail

/// Ring gossip of compressed weight differences with neighbour replicas (file header).
class low_precision_decentralized final : public relaxation {
 public:
  /// Over `comm` (kept by reference; it must outlive this object).
  /// @throws usage_error if interval < 1 or chunk == 0.
  explicit low_precision_decentralized(communicator& comm, int interval = 1, std::size_t chunk = 512)
      : rule_(comm.rank(), interval, chunk), model_(comm, chunk) {}

  /// Bytes one rank sends on a communicating step for a model of `model_bytes` (f32) on `p` ranks.
  static constexpr double wire_bytes(double model_bytes, int p, std::size_t chunk = 512) noexcept {
    if (p <= 1) return 0.0;
    const double n = model_bytes / 4.0;
    const double encoded = n + 8.0 * (n / static_cast<double>(chunk) + 1.0);
    return p == 2 ? encoded : 2.0 * encoded;
  }

  [[nodiscard]] std::string_view name() const noexcept override { return "low_precision_decentralized"; }
  void start(std::span<const parameter> params) override { rule_.start(model_, params); }
  void step(std::span<const parameter> params, optimizer& opt) override { rule_.step(model_, params, opt); }
  void finish(std::span<const parameter> params) override { rule_.finish(model_, params); }
  [[nodiscard]] traffic traffic_so_far() const noexcept override { return rule_.so_far(); }

  /// The ranks whose replicas this rank keeps: left, then right (one for p = 2, none for p = 1).
  [[nodiscard]] std::span<const int> neighbours() const noexcept { return rule_.neighbours(); }
  /// This rank's replica of neighbours()[j] (flat, parameters back to back).
  [[nodiscard]] std::span<const float> replica(std::size_t j) const { return model_.replica(j); }
  /// What this rank's neighbours hold of it (its last-sent replica xh_me).
  [[nodiscard]] std::span<const float> sent_replica() const noexcept { return model_.sent_replica(); }

 private:
  detail::low_precision_decentralized_rule rule_;  // first: it checks the settings
  detail::host_lpd_model model_;
};

}  // namespace flexpar::relax
