// The disagreements every collective and algorithm must turn into a mismatch_error on every rank
// (collective/call_agreement.hpp): counts, dtypes of the same byte size, reduce ops, roots, uneven
// blocks, and a call the others did not make. Rank `odd` disagrees with the rest. Each case runs
// the call on guarded buffers (values 1, then 16 guard elements of 77) and, when the call throws,
// checks that neither the buffer nor its guards changed: the agreement comes before any data moves.
// Shared by the threads-as-ranks test and the one under mpiexec (MPI and UCX transports).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <flexpar/collective.hpp>

namespace flexpar::testing_support {

/// `n` elements of value 1 followed by 16 guard elements of value 77.
template <class T>
std::vector<T> guarded(std::size_t n) {
  std::vector<T> v(n + 16, T(77));
  std::fill_n(v.begin(), n, T(1));
  return v;
}

/// True when `v` is still guarded(n): nothing was written into it or past its first n elements.
template <class T>
bool untouched(const std::vector<T>& v, std::size_t n) {
  return v == guarded<T>(n);
}

/// Runs call(first n elements of a guarded buffer); rethrows what it throws after checking the
/// buffer is as it was.
template <class T, class Call>
void on_guarded(const communicator& comm, std::size_t n, Call&& call) {
  auto v = guarded<T>(n);
  try {
    call(std::span<T>(v).first(n));
  } catch (...) {
    EXPECT_TRUE(untouched(v, n)) << "rank " << comm.rank() << ": the buffer changed before the error";
    throw;
  }
}

/// One side of a disagreement as the text names it: a description, its call number (", call N"),
/// then " on " and its ranks.
struct side {
  std::string description;  // "allreduce by ring of 18 f32 (sum)"
  std::string ranks;        // "ranks {0,1}"
};

/// Whether `text` names `s`: its description, optionally ", call N", then " on " and its ranks.
inline bool names_side(const std::string& text, const side& s) {
  for (std::size_t at = text.find(s.description); at != std::string::npos; at = text.find(s.description, at + 1)) {
    std::size_t q = at + s.description.size();
    if (text.compare(q, 7, ", call ") == 0) {
      q += 7;
      while (q < text.size() && std::isdigit(static_cast<unsigned char>(text[q]))) ++q;
    }
    if (text.compare(q, 4 + s.ranks.size(), " on " + s.ranks) == 0) return true;
  }
  return false;
}

struct mismatch_case {
  std::string name;
  std::function<void(communicator&, bool odd)> call;  // the rank's side of the call
  std::vector<side> says;                             // named in the text on every rank
};

/// The cases for `p` ranks of which `odd` disagrees (p >= 2; odd != 1 for the root cases).
inline std::vector<mismatch_case> mismatch_cases(int p, int odd) {
  std::vector<int> rest;
  for (int r = 0; r < p; ++r)
    if (r != odd) rest.push_back(r);
  const std::string others = rank_set(rest), alone = "rank {" + std::to_string(odd) + "}";
  const std::size_t n = 6 * static_cast<std::size_t>(p);  // n and 3n split into p blocks
  const std::string ns = std::to_string(n), n3 = std::to_string(3 * n);
  const auto pieces = static_cast<std::size_t>(p);
  using A = algorithm;
  std::vector<mismatch_case> cases;
  auto add = [&](std::string name, std::function<void(communicator&, bool)> call, std::string mine,
                 std::string theirs) {
    cases.push_back({std::move(name), std::move(call), {{std::move(mine), others}, {std::move(theirs), alone}}});
  };
  // counts
  for (A a : {A::ring, A::halving_doubling}) {
    const std::string by = "allreduce by " + std::string(name_of(a));
    add(
        by + ": counts",
        [a, n](communicator& c, bool odd) {
          on_guarded<float>(c, odd ? 3 * n : n, [&](std::span<float> d) { allreduce(c, d, reduce_op::sum, a); });
        },
        by + " of " + ns + " f32 (sum)", by + " of " + n3 + " f32 (sum)");
  }
  // a dtype of the same bytes
  add(
      "allreduce by ring: dtypes",
      [n](communicator& c, bool odd) {
        if (odd)
          on_guarded<double>(c, n / 2, [&](std::span<double> d) { allreduce(c, d, reduce_op::sum, A::ring); });
        else
          on_guarded<float>(c, n, [&](std::span<float> d) { allreduce(c, d, reduce_op::sum, A::ring); });
      },
      "allreduce by ring of " + ns + " f32 (sum)", "allreduce by ring of " + std::to_string(n / 2) + " f64 (sum)");
  // the reduce op
  add(
      "allreduce by ring: ops",
      [n](communicator& c, bool odd) {
        on_guarded<float>(c, n,
                          [&](std::span<float> d) { allreduce(c, d, odd ? reduce_op::max : reduce_op::sum, A::ring); });
      },
      "allreduce by ring of " + ns + " f32 (sum)", "allreduce by ring of " + ns + " f32 (max)");
  add(
      "reduce_scatter by ring: counts",
      [n](communicator& c, bool odd) {
        on_guarded<float>(c, odd ? 3 * n : n,
                          [&](std::span<float> d) { reduce_scatter(c, d, reduce_op::sum, A::ring); });
      },
      "reduce_scatter by ring of " + ns + " f32 (sum)", "reduce_scatter by ring of " + n3 + " f32 (sum)");
  // uneven blocks of the same total
  std::vector<std::size_t> odd_counts(pieces, n / pieces);
  odd_counts[0] += 1;
  odd_counts[1] -= 1;
  add(
      "reduce_scatter_v by ring: blocks",
      [n, pieces, odd_counts](communicator& c, bool odd) {
        const std::vector<std::size_t> counts = odd ? odd_counts : std::vector<std::size_t>(pieces, n / pieces);
        on_guarded<float>(c, n, [&](std::span<float> d) { reduce_scatter_v(c, d, counts, reduce_op::sum, A::ring); });
      },
      "reduce_scatter_v by ring of " + ns + " f32 (sum)",
      "reduce_scatter_v by ring of " + ns + " f32 (sum) in uneven blocks #" +
          std::to_string(block_layout_digest(odd_counts)));
  // two uneven layouts of the same total: the digests must differ from each other, not only from 0
  std::vector<std::size_t> other_counts(pieces, n / pieces);
  other_counts[0] -= 1;
  other_counts[pieces - 1] += 1;
  add(
      "reduce_scatter_v by ring: two uneven layouts",
      [n, odd_counts, other_counts](communicator& c, bool odd) {
        const std::vector<std::size_t>& counts = odd ? odd_counts : other_counts;
        on_guarded<float>(c, n, [&](std::span<float> d) { reduce_scatter_v(c, d, counts, reduce_op::sum, A::ring); });
      },
      "reduce_scatter_v by ring of " + ns + " f32 (sum) in uneven blocks #" +
          std::to_string(block_layout_digest(other_counts)),
      "reduce_scatter_v by ring of " + ns + " f32 (sum) in uneven blocks #" +
          std::to_string(block_layout_digest(odd_counts)));
  for (A a : {A::ring, A::recursive_doubling}) {
    const std::string by = "allgather by " + std::string(name_of(a));
    add(
        by + ": counts",
        [a, n](communicator& c, bool odd) {
          on_guarded<float>(c, odd ? 3 * n : n, [&](std::span<float> d) { allgather(c, d, a); });
        },
        by + " of " + ns + " f32", by + " of " + n3 + " f32");
  }
  add(
      "allgather_v_placed: blocks",
      [n, pieces](communicator& c, bool odd) {
        std::vector<std::size_t> counts(pieces, n / pieces);
        if (odd) counts[0] += 1;
        staging transport;
        transport.path = staged_path::transport;
        on_guarded<float>(c, counts[static_cast<std::size_t>(c.rank())], [&](std::span<float> d) {
          allgather_v_placed<float>(
              c, d, counts, [](int, std::size_t, std::span<const float>) {}, transport);
        });
      },
      "allgather_v_placed by pairwise of " + ns + " f32",
      "allgather_v_placed by pairwise of " + std::to_string(n + 1) + " f32");
  for (A a : {A::chain, A::binomial_tree}) {
    const std::string by = " by " + std::string(name_of(a));
    add(
        "broadcast" + by + ": roots",
        [a, n](communicator& c, bool odd) {
          on_guarded<float>(c, n, [&](std::span<float> d) { broadcast(c, d, odd ? 1 : 0, a); });
        },
        "broadcast" + by + " of " + ns + " f32 at root 0", "broadcast" + by + " of " + ns + " f32 at root 1");
    add(
        "reduce" + by + ": ops",
        [a, n](communicator& c, bool odd) {
          on_guarded<float>(c, n,
                            [&](std::span<float> d) { reduce(c, d, odd ? reduce_op::min : reduce_op::sum, 0, a); });
        },
        "reduce" + by + " of " + ns + " f32 (sum) at root 0", "reduce" + by + " of " + ns + " f32 (min) at root 0");
  }
  add(
      "alltoall by pairwise: dtypes",
      [n](communicator& c, bool odd) {
        if (odd)
          on_guarded<std::int32_t>(c, n, [&](std::span<std::int32_t> d) { alltoall(c, d, A::pairwise); });
        else
          on_guarded<float>(c, n, [&](std::span<float> d) { alltoall(c, d, A::pairwise); });
      },
      "alltoall by pairwise of " + ns + " f32", "alltoall by pairwise of " + ns + " i32");
  add(
      "alltoall_v: dtypes",
      [n, pieces](communicator& c, bool odd) {
        const std::vector<std::size_t> counts(pieces, n / pieces);
        auto run = [&]<class T>(T) {
          auto out = guarded<T>(n);
          on_guarded<T>(c, n, [&](std::span<T> in) {
            alltoall_v(c, std::span<const T>(in), counts, std::span<T>(out).first(n), counts);
          });
          EXPECT_TRUE(untouched(out, n)) << "rank " << c.rank();
        };
        if (odd)
          run(std::int32_t{});
        else
          run(float{});
      },
      "alltoall_v by pairwise of f32", "alltoall_v by pairwise of i32");
  // a call the others did not make
  add(
      "barrier against allreduce",
      [n](communicator& c, bool odd) {
        if (odd)
          barrier(c);
        else
          on_guarded<float>(c, n, [&](std::span<float> d) { allreduce(c, d, reduce_op::sum, A::ring); });
      },
      "allreduce by ring of " + ns + " f32 (sum)", "barrier by dissemination");
  return cases;
}

}  // namespace flexpar::testing_support
