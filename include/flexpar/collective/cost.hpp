// flexpar/collective/cost.hpp — the alpha-beta(-gamma) cost model shared by the collectives, the
// simulator, the docs and bench/.
//
// A collective's cost on one rank's critical path is a handful of numbers:
//   steps, wire_bytes      messages in sequence and bytes on the transport        (alpha, beta)
//   shm_steps, copy_bytes  flag hand-offs and bytes copied through shared memory  (shm_alpha, copy_beta)
//   reduce_bytes           bytes through the local reduction kernel               (gamma)
// and its time is the sum of each times its machine parameter. Each algorithm header
// has one constexpr function returning its `cost`; `automatic` picks the smallest time.
#pragma once

#include <bit>
#include <cstddef>

namespace flexpar {

/// The machine the costs are evaluated on. Two channels: the transport between ranks (alpha, beta)
/// and memory inside a node (shm_alpha, copy_beta), which the shared-memory algorithms use.
struct cost_params {
  double alpha = 5e-6;              ///< seconds per message on the transport
  double beta = 1.0 / 2.0e9;        ///< seconds per byte on the transport
  double gamma = 1.0 / 8.0e9;       ///< seconds per byte through the reduction kernel
  double shm_alpha = 1e-6;          ///< seconds per flag hand-off between ranks of one node
  double copy_beta = 1.0 / 10.0e9;  ///< seconds per byte copied to or from a shared-memory slot
};

/// Cost of one collective on one rank's critical path. Steps and bytes that go between ranks of one
/// node through shared memory are counted apart from those on the transport.
struct cost {
  double steps = 0;         ///< messages in sequence on the transport
  double wire_bytes = 0;    ///< bytes on the transport
  double reduce_bytes = 0;  ///< bytes through the reduction kernel
  double shm_steps = 0;     ///< flag hand-offs in sequence through shared memory
  double copy_bytes = 0;    ///< bytes copied to or from shared memory

  /// Predicted seconds on the machine `m`.
  [[nodiscard]] constexpr double seconds(const cost_params& m) const noexcept {
    return steps * m.alpha + wire_bytes * m.beta + reduce_bytes * m.gamma + shm_steps * m.shm_alpha +
           copy_bytes * m.copy_beta;
  }

  /// The cost of running `a` then `b`: every term adds.
  friend constexpr cost operator+(cost a, const cost& b) noexcept {
    a.steps += b.steps;
    a.wire_bytes += b.wire_bytes;
    a.reduce_bytes += b.reduce_bytes;
    a.shm_steps += b.shm_steps;
    a.copy_bytes += b.copy_bytes;
    return a;
  }
};

/// The same cost with its transport steps and bytes moved inside one node (memory copies).
constexpr cost within_node(cost c) noexcept {
  c.shm_steps += c.steps;
  c.copy_bytes += c.wire_bytes;
  c.steps = 0;
  c.wire_bytes = 0;
  return c;
}

namespace detail {
/// ceil(a / b) for a >= 0, b > 0 (std::ceil is not constexpr before C++23).
constexpr double ceil_div(double a, double b) noexcept {
  const double q = a / b;
  const auto whole = static_cast<double>(static_cast<unsigned long long>(q));
  return whole < q ? whole + 1 : whole;
}
/// ceil(log2(p)) for p >= 1.
constexpr double ceil_log2(int p) noexcept {
  return static_cast<double>(std::bit_width(static_cast<unsigned>(p > 1 ? p - 1 : 0)));
}
/// floor(log2(p)) for p >= 1.
constexpr double floor_log2(int p) noexcept {
  return static_cast<double>(std::bit_width(static_cast<unsigned>(p)) - 1);
}
}  // namespace detail

}  // namespace flexpar
