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
#include <flexpar/relax/host_model.hpp>
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
  throw error_on<usage_error>(no_rank, "relax", "unknown peer selection '", text, "'; known: all, shift_one, ring");
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

namespace detail {
/// decentralized's steps over any Model (host_model.hpp: host or device memory; file header).
class decentralized_rule {
 public:
  /// @throws usage_error (naming `rank`) if interval < 1.
  decentralized_rule(int rank, peer_selection peers, int interval) : peers_(peers), interval_(interval) {
    if (interval < 1)
      throw usage_error(where(rank, "decentralized", "make") + "communication interval " + std::to_string(interval) +
                        " must be at least 1");
  }
  template <class Model, class Params>
  void start(Model& m, Params params) {
    m.start("decentralized", params, peers_ != peer_selection::all);
    steps_ = 0;
    identical_ = true;
  }
  template <class Model, class Params, class Opt>
  void step(Model& m, Params params, Opt& opt) {
    m.check("step", params);
    m.apply(params, opt);
    ++steps_;
    ++traffic_.steps;
    if (steps_ % static_cast<std::uint64_t>(interval_) != 0) {
      identical_ = m.size() == 1;
      return;
    }
    exchange(m, params, steps_ / static_cast<std::uint64_t>(interval_) - 1);
  }
  template <class Model, class Params>
  void finish(Model& m, Params params) {
    m.check("finish", params);
    if (identical_ || m.size() == 1) return;
    traffic_.bytes_sent += m.average_weights(params);
    identical_ = true;
  }
  [[nodiscard]] const traffic& so_far() const noexcept { return traffic_; }

 private:
  // Averages the weights with the peers of `round` (file header).
  template <class Model, class Params>
  void exchange(Model& m, Params params, std::uint64_t round) {
    const int p = m.size(), me = m.rank();
    identical_ = p == 1;
    if (p == 1) return;
    if (peers_ == peer_selection::all) {
      traffic_.bytes_sent += m.average_weights(params);
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
    traffic_.bytes_sent += m.exchange_weights(params, std::span<const int>(peers));
    ++traffic_.exchanges;
  }

  peer_selection peers_;
  int interval_;
  std::uint64_t steps_ = 0;
  bool identical_ = true;
  traffic traffic_;
};
}  // namespace detail

/// Local steps, then weight averaging with peers every `interval` steps (file header).
class decentralized final : public detail::host_ruled<detail::decentralized_rule> {
 public:
  /// Over `comm` (kept by reference; it must outlive this object).
  /// @throws usage_error if interval < 1.
  decentralized(communicator& comm, peer_selection peers = peer_selection::shift_one, int interval = 1)
      : host_ruled(comm, peers, interval) {}

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
};

}  // namespace flexpar::relax
