// flexpar/sbp/parallel.hpp — SBP (split / broadcast / partial): how a logical tensor is laid out
// over the ranks of one placement mesh axis, as a type.
//
//   split<I>        each rank holds a slice of tensor axis I (balanced: the first n % p get one more)
//   broadcast       each rank holds the whole tensor
//   partial<Op>     each rank holds a tensor of the full shape; the logical tensor is their Op-reduction
//   sbp<A0, A1..>   nd-SBP: entry d says how mesh axis d lays the tensor out (OneFlow's nd_sbp)
//
// Printing follows OneFlow: S(0), B, P(sum), and (S(0), B) for nd-SBP. Every static SBP has a
// run-time twin (`parallel` / `nd_parallel`) with the same printing, used by the dynamic form, the
// boxing routes and the strategy search.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <type_traits>

#include <flexpar/core/reduce_op.hpp>

namespace flexpar::sbp {

/// The three kinds of SBP.
enum class kind : unsigned char { split, broadcast, partial };

/// A one-axis SBP as a value (structural: usable as a template argument).
struct parallel {
  kind what = kind::broadcast;    ///< split, broadcast or partial
  int axis = 0;                   ///< the split tensor axis (split only)
  reduce_op op = reduce_op::sum;  ///< the reduction (partial only)

  /// S(axis).
  static constexpr parallel S(int a) noexcept { return {kind::split, a, reduce_op::sum}; }
  /// B.
  static constexpr parallel B() noexcept { return {kind::broadcast, 0, reduce_op::sum}; }
  /// P(op).
  static constexpr parallel P(reduce_op o = reduce_op::sum) noexcept { return {kind::partial, 0, o}; }

  /// S(i)?
  [[nodiscard]] constexpr bool is_split() const noexcept { return what == kind::split; }
  /// B?
  [[nodiscard]] constexpr bool is_broadcast() const noexcept { return what == kind::broadcast; }
  /// P(op)?
  [[nodiscard]] constexpr bool is_partial() const noexcept { return what == kind::partial; }
  /// Equal as layouts (the axis matters for split only, the op for partial only).
  friend constexpr bool operator==(const parallel& a, const parallel& b) noexcept {
    if (a.what != b.what) return false;
    if (a.what == kind::split) return a.axis == b.axis;
    if (a.what == kind::partial) return a.op == b.op;
    return true;
  }
};

/// OneFlow notation: "S(1)", "B", "P(sum)".
inline std::string to_string(const parallel& p) {
  switch (p.what) {
    case kind::split: {
      std::string s = "S(";
      s.append(std::to_string(p.axis)).append(")");
      return s;
    }
    case kind::broadcast: return "B";
    case kind::partial: {
      std::string s = "P(";
      s.append(name_of(p.op)).append(")");
      return s;
    }
  }
  return "?";
}

/// The largest mesh rank of an nd-SBP value.
inline constexpr std::size_t max_mesh_rank = 4;

/// An nd-SBP as a value: one `parallel` per placement mesh axis.
struct nd_parallel {
  std::array<parallel, max_mesh_rank> axes{};  ///< entries [0, rank) are used
  std::size_t rank = 1;                        ///< mesh axes

  /// The SBP of mesh axis d.
  [[nodiscard]] constexpr const parallel& operator[](std::size_t d) const noexcept { return axes[d]; }
  /// The SBP of mesh axis d.
  [[nodiscard]] constexpr parallel& operator[](std::size_t d) noexcept { return axes[d]; }
  /// True when some mesh axis holds partial values.
  [[nodiscard]] constexpr bool any_partial() const noexcept {
    for (std::size_t d = 0; d < rank; ++d)
      if (axes[d].is_partial()) return true;
    return false;
  }
  /// Same rank and the same layout on every mesh axis.
  friend constexpr bool operator==(const nd_parallel& a, const nd_parallel& b) noexcept {
    if (a.rank != b.rank) return false;
    for (std::size_t d = 0; d < a.rank; ++d)
      if (!(a.axes[d] == b.axes[d])) return false;
    return true;
  }
};

/// "S(0)" for one mesh axis, "(S(0), B)" for several.
inline std::string to_string(const nd_parallel& p) {
  if (p.rank == 1) return to_string(p.axes[0]);
  std::string s = "(";
  for (std::size_t d = 0; d < p.rank; ++d) {
    if (d) s.append(", ");
    s.append(to_string(p.axes[d]));
  }
  return s.append(")");
}

// ---- the types ---------------------------------------------------------------------------------

/// Split along tensor axis I.
template <int I>
struct split {
  static_assert(I >= 0, "flexpar::sbp::split<I>: the split axis I must be >= 0");
  static constexpr parallel value = parallel::S(I);  ///< the run-time twin
};

/// Whole tensor on every rank.
struct broadcast {
  static constexpr parallel value = parallel::B();  ///< the run-time twin
};

/// Every rank holds a summand (for Op = sum) of the logical tensor. Op: sum, max or min.
template <reduce_op Op = reduce_op::sum>
struct partial {
  static_assert(Op == reduce_op::sum || Op == reduce_op::max || Op == reduce_op::min,
                "flexpar::sbp::partial<Op>: Op must be reduce_op::sum, max or min (prod and avg do not compose "
                "with boxing)");
  static constexpr parallel value = parallel::P(Op);  ///< the run-time twin
};

/// P(sum), the common case (a row-parallel matmul's output, a gradient before its allreduce).
using partial_sum = partial<reduce_op::sum>;

/// True for the one-axis SBP types (split, broadcast, partial).
template <class T>
struct is_parallel : std::false_type {};
template <int I>
struct is_parallel<split<I>> : std::true_type {};
template <>
struct is_parallel<broadcast> : std::true_type {};
template <reduce_op Op>
struct is_parallel<partial<Op>> : std::true_type {};

/// One of `split<I>`, `broadcast`, `partial<Op>`.
template <class T>
concept one_axis_sbp = is_parallel<T>::value;

/// nd-SBP: entry d lays the tensor out over placement mesh axis d.
template <one_axis_sbp... P>
struct sbp {
  static_assert(sizeof...(P) >= 1 && sizeof...(P) <= max_mesh_rank,
                "flexpar::sbp::sbp<...>: an nd-SBP has one entry per placement mesh axis, 1 to 4 of them");
  /// Mesh axes.
  static constexpr std::size_t mesh_rank = sizeof...(P);
  /// The run-time twin.
  static constexpr nd_parallel value = [] {
    nd_parallel v;
    v.rank = sizeof...(P);
    std::size_t d = 0;
    ((v.axes[d++] = P::value), ...);
    return v;
  }();
};

namespace detail {
template <class S>
struct as_nd {
  using type = S;
};
template <one_axis_sbp P>
struct as_nd<P> {
  using type = sbp<P>;
};
template <class T>
struct is_nd : std::false_type {};
template <class... P>
struct is_nd<sbp<P...>> : std::true_type {};
}  // namespace detail

/// A one-axis SBP or an nd-SBP.
template <class T>
concept sbp_type = one_axis_sbp<T> || detail::is_nd<T>::value;

/// The nd form of an SBP: split<0> -> sbp<split<0>>; sbp<...> unchanged.
template <sbp_type S>
using nd_of = typename detail::as_nd<S>::type;

/// The OneFlow spelling of a static SBP: to_string<split<0>>() == "S(0)".
template <sbp_type S>
std::string to_string() {
  return to_string(nd_of<S>::value);
}

}  // namespace flexpar::sbp
