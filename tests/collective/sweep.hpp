// The sweep every collective test runs: dtypes x ops x counts x placement, with oracles from oracle.hpp.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <flexpar/collective.hpp>

#include "oracle.hpp"

namespace flexpar::testing_support {

struct sweep_case {
  reduce_op op;
  std::size_t count;
  bool in_place;
};

/// Counts {0, 1, 7, one pipeline chunk + 1, 1 MiB + 3}: every op and both placements for 0, 1 and 7;
/// sum and max in both placements for one chunk + 1 (the chunked paths do not depend on the op);
/// the 1 MiB + 3 count (the slowest) for sum and max, in place, on the dtypes in `big_for`.
template <element T>
std::vector<sweep_case> sweep_cases(bool big) {
  std::vector<sweep_case> cases;
  const std::size_t chunk_plus_one = pipeline_chunk_bytes / sizeof(T) + 1;
  for (reduce_op op : all_ops)
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, chunk_plus_one})
      for (bool in_place : {true, false})
        if (count != chunk_plus_one || op == reduce_op::sum || op == reduce_op::max)
          cases.push_back({op, count, in_place});
  if (big)
    for (reduce_op op : {reduce_op::sum, reduce_op::max}) cases.push_back({op, (std::size_t{1} << 20) + 3, true});
  return cases;
}

/// The dtypes that also get the 1 MiB + 3 count.
constexpr bool big_for(dtype t) { return t == dtype::f32 || t == dtype::bf16 || t == dtype::i32; }

template <element T>
std::string describe(const sweep_case& c, const communicator& comm, std::string_view what) {
  return "[rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) + "] " + std::string(what) +
         " " + std::string(name_of(dtype_of<T>)) + " " + std::string(name_of(c.op)) + " count " +
         std::to_string(c.count) + (c.in_place ? " in place" : " out of place");
}

template <class F>
void for_each_dtype(F&& f) {
  for (dtype t : all_dtypes) visit_dtype(t, f);
}

/// Uneven counts per rank for the `v` variants: some ranks contribute nothing.
inline std::vector<std::size_t> uneven_counts(int p, std::size_t count) {
  std::vector<std::size_t> counts;
  for (int r = 0; r < p; ++r) counts.push_back(r % 3 == 1 ? 0 : count + static_cast<std::size_t>(r));
  return counts;
}

}  // namespace flexpar::testing_support
