// What the MPI benchmarks share when they time: medians, reported for the slowest rank.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <vector>

namespace flexpar::bench {

/// The median of `samples`, which it sorts in place (for an even count the upper of the middle two).
/// @pre samples is not empty.
inline double median_in_place(std::vector<double>& samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

/// The median of this rank's samples, then the largest such median over MPI_COMM_WORLD (the
/// slowest rank is what a collective step waits for).
inline double median_of_slowest(std::vector<double> samples) {
  double mine = median_in_place(samples), slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

}  // namespace flexpar::bench
