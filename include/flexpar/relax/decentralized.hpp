// flexpar/relax/decentralized.hpp — decentralized: local steps, then average the WEIGHTS with a few peers (BAGUA's
// decentralized SGD, D-PSGD).
//
// Step s (counted from 0), k = communication interval, M = model bytes (f32), p ranks:
//   step 1: opt.apply every parameter with its local gradient                    local
//   step 2: if (s + 1) % k == 0, communication round t = (s + 1) / k - 1 with the peers:
//     peers = all:       x = allreduce(avg) of x                                  2 (p - 1) / p * M sent
//     peers = shift_one: x = (x + x_peer) / 2, peer = shift_one_peer(rank, p, t)  M sent (0 when sitting out)
//     peers = ring:      x = ((x + x_left) + x_right) / 3 with left = rank - 1, right = rank + 1
//                        (mod p); for p = 2 the one neighbour: x = (x + x_other) / 2  2 M sent (p >= 3), M (p = 2)
//
// shift_one is the circle method of round-robin tournaments: in round t the ranks form disjoint
// pairs, symmetric by construction (my peer's peer is me), and every pair meets once in p - 1
// rounds (p even) or p rounds (p odd). For an even p: with m = p - 1, rank m meets rank t mod m,
// rank t mod m meets m, and any other rank r meets (2t - r) mod m. For an odd p the same rule runs
// on p + 1 slots with m = p; the rank whose partner would be the empty slot p — rank t mod p — sits
// out round t (keeps its weights, sends nothing). p = 1: nobody communicates.
//
// finish() averages the weights of every rank with one allreduce, so the run ends with one model
// (skipped when peers = all and the last step communicated: the replicas are already identical).
// Use it when the network's latency or a slow link makes the global allreduce the bottleneck:
// each rank talks to one or two peers per round, and the replicas still converge (BAGUA, D-PSGD).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/relax/flat_model.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax {

/// Which peers decentralized (and low_precision_decentralized: ring only) averages with.
enum class peer_selection : std::uint8_t {
  all,        ///< every rank (one allreduce of the weights)
  shift_one,  ///< one peer per round, rotating (file header: the rule, odd p)
  ring,       ///< the left and right neighbours
};

/// The peer_selection called `text` ("all", "shift_one", "ring").
/// @throws usage_error naming the known values for any other text.
inline peer_selection peer_selection_of(std::string_view text) {
  if (text == "all") return peer_selection::all;
  if (text == "shift_one") return peer_selection::shift_one;
  if (text == "ring") return peer_selection::ring;
  std::string msg("relax: unknown peer selection '");
  msg.append(text).append("'; known: all, shift_one, ring");
  throw usage_error(msg);
}

/// The peer of `rank` in round `round` of shift_one on `p` ranks, or -1 when `rank` sits out
/// (odd p: rank round mod p; p = 1: always). Symmetric: shift_one_peer(peer) == rank.
constexpr int shift_one_peer(int rank, int p, std::uint64_t round) noexcept {
  if (p <= 1) return -1;
  const int slots = p % 2 == 0 ? p : p + 1;  // an empty slot p makes an odd world even
  const int m = slots - 1;                   // the fixed slot; the others rotate
  const int t = static_cast<int>(round % static_cast<std::uint64_t>(m));
  int peer = 0;
  if (rank == m)
    peer = t;
  else if (rank == t)
    peer = m;
  else
    peer = ((2 * t - rank) % m + m) % m;
  return peer >= p ? -1 : peer;
}

/// Local steps, then weight averaging with peers every `interval` steps (file header).
class decentralized final : public relaxation {
 public:
  /// Over `comm` (kept by reference; it must outlive this object).
  /// @throws usage_error if interval < 1.
  decentralized(communicator& comm, peer_selection peers = peer_selection::shift_one, int interval = 1)
      : comm_(comm), peers_(peers), interval_(interval) {
    if (interval < 1)
      throw usage_error(detail::where(comm.rank(), "decentralized", "make") + "communication interval " +
                        std::to_string(interval) + " must be at least 1");
  }

  /// Bytes one rank sends on a communicating step for a model of `model_bytes` on `p` ranks
  /// (shift_one: of a rank that does not sit out).
  static constexpr double wire_bytes(double model_bytes, int p, peer_selection peers) noexcept {
    if (p <= 1) return 0.0;
    switch (peers) {
      case peer_selection::all: return 2.0 * (p - 1) / p * model_bytes;
      case peer_selection::shift_one: return model_bytes;
      case peer_selection::ring: return p == 2 ? model_bytes : 2.0 * model_bytes;
    }
    return 0.0;
  }

  [[nodiscard]] std::string_view name() const noexcept override { return "decentralized"; }

  void start(std::span<const parameter> params) override {
    model_.bind(comm_, name(), params);
    model_.broadcast_weights(comm_, params);
    mine_.assign(model_.size(), 0.0f);
    if (peers_ != peer_selection::all) links_ = comm_.split(0, comm_.rank());  // p2p messages of our own
    steps_ = 0;
    identical_ = true;
  }

  void step(std::span<const parameter> params, optimizer& opt) override {
    model_.check(comm_.rank(), "step", params);
    for (std::size_t i = 0; i < params.size(); ++i) opt.apply(i, params[i].weight, params[i].gradient);
    ++steps_;
    ++traffic_.steps;
    if (steps_ % static_cast<std::uint64_t>(interval_) != 0) {
      identical_ = comm_.size() == 1;
      return;
    }
    const std::uint64_t round = steps_ / static_cast<std::uint64_t>(interval_) - 1;
    model_.gather_weights(params, mine_);
    exchange(round);
    model_.scatter_weights(mine_, params);
  }

  void finish(std::span<const parameter> params) override {
    model_.check(comm_.rank(), "finish", params);
    if (identical_ || comm_.size() == 1) return;
    model_.gather_weights(params, mine_);
    flexpar::allreduce(comm_, std::span<float>(mine_), reduce_op::avg);
    traffic_.bytes_sent += detail::ring_allreduce_bytes(mine_.size(), comm_.size());
    model_.scatter_weights(mine_, params);
    identical_ = true;
  }

  [[nodiscard]] traffic traffic_so_far() const noexcept override { return traffic_; }

 private:
  // Averages mine_ with the peers of `round` (file header).
  void exchange(std::uint64_t round) {
    const int p = comm_.size(), me = comm_.rank();
    identical_ = p == 1;
    if (p == 1) return;
    if (peers_ == peer_selection::all) {
      flexpar::allreduce(comm_, std::span<float>(mine_), reduce_op::avg);
      traffic_.bytes_sent += detail::ring_allreduce_bytes(mine_.size(), p);
      ++traffic_.exchanges;
      identical_ = true;
      return;
    }
    std::vector<int> peers;
    if (peers_ == peer_selection::shift_one) {
      const int peer = shift_one_peer(me, p, round);
      if (peer < 0) return;  // sitting out this round
      peers.push_back(peer);
    } else {
      peers.push_back((me + p - 1) % p);
      if (p > 2) peers.push_back((me + 1) % p);
    }
    theirs_.resize(peers.size());
    std::vector<request> requests;
    transport& t = links_->transport();
    for (std::size_t i = 0; i < peers.size(); ++i) {
      theirs_[i].resize(mine_.size());
      requests.push_back(t.irecv(peers[i], 0, std::as_writable_bytes(std::span<float>(theirs_[i]))));
    }
    for (int peer : peers) requests.push_back(t.isend(peer, 0, std::as_bytes(std::span<const float>(mine_))));
    wait_all(requests, links_->default_deadline());
    const float divisor = static_cast<float>(peers.size() + 1);
    for (std::size_t k = 0; k < mine_.size(); ++k) {
      float sum = mine_[k];
      for (const auto& other : theirs_) sum += other[k];
      mine_[k] = sum / divisor;
    }
    traffic_.bytes_sent += peers.size() * mine_.size() * sizeof(float);
    ++traffic_.exchanges;
  }

  communicator& comm_;
  peer_selection peers_;
  int interval_;
  detail::flat_model model_;
  std::optional<communicator> links_;
  std::vector<float> mine_;
  std::vector<std::vector<float>> theirs_;
  std::uint64_t steps_ = 0;
  bool identical_ = true;
  traffic traffic_;
};

}  // namespace flexpar::relax
