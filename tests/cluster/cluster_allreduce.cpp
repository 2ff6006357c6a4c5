// tests/cluster/cluster_allreduce.cpp — flexpar::allreduce between fake hosts (scripts/fakehosts):
// every rank on its own network namespace, the bytes crossing a tc-shaped veth link.
//
// Checks, on every rank: each rank is its own node (so the collectives really go over the network,
// not shared memory), and for int32 and f32 data of lengths 0, 1, 7, 65539 (odd, several chunks)
// and 2^20, the ring and the automatic allreduce (sum) equal both MPI_Allreduce's result and the
// serial sum: data[i] = (rank + 1) * (i % 7 + 1), so the sum is p (p + 1) / 2 * (i % 7 + 1), exact
// in f32 in any order. Rank 0 prints the verdict line that scripts/fakehosts --done waits for.
//
//   scripts/fakehosts -n 2 -r 100mbit -- build/tests/cluster/cluster_allreduce
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <vector>

#include <flexpar/collective.hpp>

namespace {

template <class T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<std::int32_t>() {
  return MPI_INT32_T;
}

/// Wrong elements of one allreduce of `n` elements with algorithm `a`, against the serial sum and
/// MPI_Allreduce; prints the first mismatch.
template <class T>
std::size_t check(flexpar::communicator& comm, std::size_t n, flexpar::algorithm a, const char* type) {
  const int p = comm.size(), r = comm.rank();
  std::vector<T> mine(n), ours(n), theirs(n);
  for (std::size_t i = 0; i < n; ++i) mine[i] = static_cast<T>((r + 1) * static_cast<int>(i % 7 + 1));
  ours = mine;
  flexpar::allreduce(comm, std::span<T>(ours), flexpar::reduce_op::sum, a);
  MPI_Allreduce(mine.data(), theirs.data(), static_cast<int>(n), mpi_type<T>(), MPI_SUM, MPI_COMM_WORLD);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const T serial = static_cast<T>(p * (p + 1) / 2 * static_cast<int>(i % 7 + 1));
    if (ours[i] != serial || theirs[i] != serial) {
      if (wrong == 0)
        std::fprintf(stderr, "rank %d: allreduce %s of %zu %s, element %zu: flexpar %g, MPI_Allreduce %g, serial %g\n",
                     r, std::string(flexpar::name_of(a)).c_str(), n, type, i, static_cast<double>(ours[i]),
                     static_cast<double>(theirs[i]), static_cast<double>(serial));
      ++wrong;
    }
  }
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  unsigned long long wrong = 0, checks = 0;
  int rank = 0, size = 1, nodes = 0;
  try {
    auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    rank = comm.rank();
    size = comm.size();
    nodes = comm.topology().node_count();
    if (nodes != size) {
      std::fprintf(stderr, "rank %d: %d ranks on %d nodes: the fake hosts are not separate nodes to MPI\n", rank, size,
                   nodes);
      ++wrong;
    }
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{65539}, std::size_t{1} << 20})
      for (flexpar::algorithm a : {flexpar::algorithm::ring, flexpar::algorithm::automatic}) {
        wrong += check<std::int32_t>(comm, n, a, "int32");
        wrong += check<float>(comm, n, a, "f32");
        checks += 2;
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  unsigned long long total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("cluster allreduce: %llu allreduces on %d hosts (%d nodes), %llu wrong\n", checks, size, nodes, total);
    std::fflush(stdout);
  }
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
