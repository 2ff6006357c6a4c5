// samples/collectives_tour.cpp — doc/collectives.md's first example: one call of each collective on an
// MPI communicator, every result checked against what it must be (small integers: exact in any order).
//
//   mpiexec -n 3 build/samples/collectives_tour
#include <cstdio>
#include <numeric>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/core/uncaught.hpp>

int main(int argc, char** argv) {
  std::set_terminate(flexpar::report_uncaught_and_abort);  // a rank's uncaught error: one whole line
  int provided = 0, p = 0, me = 0, wrong = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  {
    const auto up = static_cast<std::size_t>(p), block = std::size_t{4};
    auto rank_plus = [&](float x) { return static_cast<float>(me) + x; };
    std::vector<float> grad(1000, rank_plus(1)), in(block * up), peak(in.size()), total(in.size()), swapped(in.size()),
        weights(16, rank_plus(7));
    std::iota(in.begin(), in.end(), rank_plus(0));  // rank r: r, r + 1, ...
    std::vector<std::size_t> counts(up);            // rank r's block of the v collectives: r + 1 elements
    std::iota(counts.begin(), counts.end(), std::size_t{1});
    const std::size_t whole = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    std::vector<float> buf(whole, 1.0f), part(counts[static_cast<std::size_t>(me)], rank_plus(0)), all(whole);
    const std::size_t count = 5;
    std::vector<flexpar::bfloat16> in_bf16(count, flexpar::bfloat16(2.0f)), out_bf16(count);
    const void* in_ptr = in_bf16.data();
    void* out_ptr = out_bf16.data();

    // [snippet:tour]
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    flexpar::allreduce(comm, std::span(grad), flexpar::reduce_op::avg);  // in place, algorithm automatic
    flexpar::allreduce(comm, std::span(in), std::span(peak), flexpar::reduce_op::max, flexpar::algorithm::ring);
    std::span<float> mine = flexpar::reduce_scatter_v(comm, std::span(buf), counts, flexpar::reduce_op::sum);
    flexpar::allgather_v(comm, std::span(part), std::span(all), counts);
    flexpar::broadcast(comm, std::span(weights), /*root=*/0);
    flexpar::reduce(comm, std::span(in), std::span(total), flexpar::reduce_op::sum, /*root=*/0);
    flexpar::alltoall(comm, std::span(in), std::span(swapped));
    flexpar::barrier(comm);
    flexpar::allreduce(comm, flexpar::dtype::bf16, in_ptr, out_ptr, count, flexpar::reduce_op::sum);  // type-erased
    // [/snippet:tour]

    const float pf = static_cast<float>(p);
    for (float g : grad) wrong += g != (pf + 1) / 2;  // the mean of 1 .. p
    for (std::size_t i = 0; i < in.size(); ++i) {
      const auto fi = static_cast<float>(i);
      wrong += peak[i] != pf - 1 + fi;                                // the last rank's
      if (me == 0) wrong += total[i] != pf * fi + pf * (pf - 1) / 2;  // sum over r of r + i
      const std::size_t from = i / block, at = static_cast<std::size_t>(me) * block + i % block;
      wrong += swapped[i] != static_cast<float>(from) + static_cast<float>(at);  // rank `from`'s block `me`
    }
    for (float x : mine) wrong += x != pf;  // p ones
    wrong += mine.size() != counts[static_cast<std::size_t>(me)];
    for (std::size_t r = 0, at = 0; r < up; at += counts[r], ++r)
      for (std::size_t k = 0; k < counts[r]; ++k) wrong += all[at + k] != static_cast<float>(r);  // rank r's part
    for (float w : weights) wrong += w != 7.0f;                                                   // rank 0's
    for (flexpar::bfloat16 x : out_bf16) wrong += static_cast<float>(x) != 2 * pf;
    std::printf("rank %d of %d: every collective called once, %d wrong\n", me, p, wrong);
  }
  MPI_Finalize();
  return wrong == 0 ? 0 : 1;
}
