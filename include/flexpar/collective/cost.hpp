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

#include <algorithm>
#include <bit>
#include <cstddef>
#include <span>
#include <utility>

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

/// One timed call for the fit: the call's cost terms, and the seconds it took.
struct timed_cost {
  cost terms;          ///< the call's steps, bytes and hand-offs (its algorithm's cost function)
  double seconds = 0;  ///< measured (median over repetitions, slowest rank)
};

/// The two parameters (x, y) of one channel that make `time(sample) = x * u(terms) + y * v(terms)`
/// closest to the samples in relative error (weighted least squares, weight 1 / seconds^2), with
/// x >= min_x and y >= min_y (a bound that binds refits the other parameter alone). `known` is the
/// part of each sample's time priced by parameters fitted elsewhere (the reduction kernel's), taken
/// off first. Returns {min_x, min_y} without samples.
template <class U, class V, class Known>
constexpr std::pair<double, double> fit_channel(std::span<const timed_cost> samples, U u, V v, Known known,
                                                double min_x, double min_y) {
  double uu = 0, uv = 0, vv = 0, ut = 0, vt = 0;
  for (const timed_cost& s : samples) {
    if (!(s.seconds > 0)) continue;
    const double w = 1.0 / (s.seconds * s.seconds);
    const double t = std::max(s.seconds - known(s.terms), 0.05 * s.seconds);  // never below 5% of the call
    const double a = u(s.terms), b = v(s.terms);
    uu += w * a * a;
    uv += w * a * b;
    vv += w * b * b;
    ut += w * a * t;
    vt += w * b * t;
  }
  const double det = uu * vv - uv * uv;
  const double x = det > 1e-12 * uu * vv ? (ut * vv - vt * uv) / det : -1;
  const double y = det > 1e-12 * uu * vv ? (vt * uu - ut * uv) / det : -1;
  if (x >= min_x && y >= min_y) return {x, y};
  // a bound binds (or the samples do not separate the terms): fix that parameter at its bound and
  // refit the other alone; keep whichever of the two fits leaves the smaller weighted error
  auto error = [&](double px, double py) {
    double e = 0;
    for (const timed_cost& s : samples) {
      if (!(s.seconds > 0)) continue;
      const double t = std::max(s.seconds - known(s.terms), 0.05 * s.seconds);
      const double r = (px * u(s.terms) + py * v(s.terms) - t) / s.seconds;
      e += r * r;
    }
    return e;
  };
  const std::pair<double, double> only_y{min_x, vv > 0 ? std::max(min_y, (vt - min_x * uv) / vv) : min_y};
  const std::pair<double, double> only_x{uu > 0 ? std::max(min_x, (ut - min_y * uv) / uu) : min_x, min_y};
  return error(only_y.first, only_y.second) <= error(only_x.first, only_x.second) ? only_y : only_x;
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
