// The sweep every collective test runs: dtypes x ops x counts x placement, with oracles from oracle.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>
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

/// The dtypes the sweeps run: every dtype, or those FLEXPAR_TEST_DTYPES lists by name_of
/// ("f32,f64,bf16,i8"). The sanitized stage of scripts/test and the Release run's worlds of 5, 7 and
/// 8 threads name one dtype of each element size: bounds and lifetimes in the collectives depend on
/// the element's size, not on its arithmetic, which the Release run checks for all eight at 1-4. A
/// name that is not a dtype throws, so a typo cannot quietly run nothing.
inline std::vector<dtype> swept_dtypes() {
  std::vector<dtype> chosen;
  const char* env = std::getenv("FLEXPAR_TEST_DTYPES");
  if (env == nullptr || *env == '\0') return {std::begin(all_dtypes), std::end(all_dtypes)};
  std::string_view names = env;
  while (!names.empty()) {
    const std::size_t comma = names.find(',');
    const std::string_view name = names.substr(0, comma);
    const auto* it =
        std::find_if(std::begin(all_dtypes), std::end(all_dtypes), [&](dtype t) { return name_of(t) == name; });
    if (it == std::end(all_dtypes)) {
      std::string known;
      for (dtype t : all_dtypes) known += (known.empty() ? "" : ", ") + std::string(name_of(t));
      throw std::invalid_argument("FLEXPAR_TEST_DTYPES names \"" + std::string(name) + "\", which is not a dtype (" +
                                  known + ")");
    }
    chosen.push_back(*it);
    names = comma == std::string_view::npos ? std::string_view{} : names.substr(comma + 1);
  }
  return chosen;
}

template <class F>
void for_each_dtype(F&& f) {
  for (dtype t : swept_dtypes()) visit_dtype(t, f);
}

/// Uneven counts per rank for the `v` variants: some ranks contribute nothing.
inline std::vector<std::size_t> uneven_counts(int p, std::size_t count) {
  std::vector<std::size_t> counts;
  for (int r = 0; r < p; ++r) counts.push_back(r % 3 == 1 ? 0 : count + static_cast<std::size_t>(r));
  return counts;
}

}  // namespace flexpar::testing_support
