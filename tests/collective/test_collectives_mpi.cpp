// The collectives under mpiexec (1-5 ranks) against MPI's own collectives on the same input, for
// the dtypes MPI has; f16/bf16 against the serial oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <flexpar/collective.hpp>

#include "oracle.hpp"
#include "sweep.hpp"

namespace flexpar {
namespace {

using namespace testing_support;

communicator make_comm() {
  config cfg = config::from_environment();
  cfg.timeout = std::chrono::seconds(60);
  return communicator::from_mpi(MPI_COMM_WORLD, cfg);
}

template <element T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  if constexpr (std::is_same_v<T, std::int8_t>) return MPI_INT8_T;
  if constexpr (std::is_same_v<T, std::uint8_t>) return MPI_UINT8_T;
  if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  return MPI_DATATYPE_NULL;  // half, bfloat16: MPI has none
}

MPI_Op mpi_op(reduce_op op) {
  switch (op) {
    case reduce_op::prod: return MPI_PROD;
    case reduce_op::min: return MPI_MIN;
    case reduce_op::max: return MPI_MAX;
    case reduce_op::sum:
    case reduce_op::avg: break;
  }
  return MPI_SUM;
}

/// MPI_Allreduce of `input` (avg: MPI's sum, then the same division flexpar documents).
template <element T>
std::vector<T> mpi_allreduce(const communicator& comm, const std::vector<T>& input, reduce_op op) {
  std::vector<T> out(input.size());
  EXPECT_EQ(MPI_Allreduce_c(input.data(), out.data(), static_cast<MPI_Count>(input.size()), mpi_type<T>(), mpi_op(op),
                            comm.mpi_comm()),
            MPI_SUCCESS);
  if (op == reduce_op::avg) scale_for_average(std::span(out), comm.size());
  return out;
}

/// The oracle of an allreduce of every rank's make_input: MPI's own where MPI has the type.
template <element T>
std::vector<T> oracle(const communicator& comm, reduce_op op, std::size_t count) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    return expected_reduction<T>(op, comm.size(), count);
  else
    return mpi_allreduce(comm, make_input<T>(op, comm.rank(), count), op);
}

TEST(mpi_collectives, allreduce_every_algorithm_dtype_and_op_matches_mpi) {
  communicator comm = make_comm();
  for_each_dtype([&](auto zero) {
    using T = decltype(zero);
    for (const auto& c : sweep_cases<T>(dtype_of<T> == dtype::f32)) {
      if (!c.in_place && c.count > 7) continue;  // out of place is the same path after one copy
      const std::vector<T> want = oracle<T>(comm, c.op, c.count);
      for (algorithm a :
           {algorithm::ring, algorithm::halving_doubling, algorithm::shared_memory, algorithm::automatic}) {
        const std::vector<T> input = make_input<T>(c.op, comm.rank(), c.count);
        std::vector<T> out(c.count, from_int<T>(99));
        if (c.in_place) {
          out = input;
          allreduce(comm, std::span(out), c.op, a);
        } else {
          allreduce(comm, std::span(input), std::span(out), c.op, a);
        }
        EXPECT_TRUE(same_elements(out, want, describe<T>(c, comm, "allreduce " + std::string(name_of(a)))));
      }
    }
  });
}

/// Every rank's `mine`, gathered on every rank with MPI_Allgather (bytes: MPI plays no part in what is
/// compared).
template <element T>
std::vector<std::vector<T>> gather_results(const std::vector<T>& mine) {
  int p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  std::vector<T> all(mine.size() * static_cast<std::size_t>(p));
  const auto bytes = static_cast<MPI_Count>(mine.size() * sizeof(T));
  EXPECT_EQ(MPI_Allgather_c(mine.data(), bytes, MPI_BYTE, all.data(), bytes, MPI_BYTE, MPI_COMM_WORLD), MPI_SUCCESS);
  std::vector<std::vector<T>> each;
  for (int r = 0; r < p; ++r)
    each.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * mine.size()),
                      all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r + 1) * mine.size()));
  return each;
}

// Random floats of mixed magnitude (oracle.hpp's random_input), whose sum depends on its order: the
// results of every algorithm (hierarchical and automatic also over "nodes" of 2 ranks where p is even,
// of 1 where it is odd) must have the same bits on every rank and lie within the rounding bound of the
// serial sum; every floating dtype, the cases of random_float_cases.
TEST(mpi_collectives, random_floats_are_bitwise_identical_on_every_rank_and_near_the_serial_sum) {
  communicator comm = make_comm();
  config cfg = config::from_environment();
  cfg.timeout = std::chrono::seconds(60);
  cfg.ranks_per_node = comm.size() % 2 == 0 ? 2 : 1;
  communicator nodes = communicator::from_mpi(MPI_COMM_WORLD, cfg);
  const std::pair<communicator*, algorithm> runs[] = {
      {&comm, algorithm::ring},      {&comm, algorithm::halving_doubling}, {&comm, algorithm::shared_memory},
      {&comm, algorithm::automatic}, {&nodes, algorithm::hierarchical},    {&nodes, algorithm::automatic}};
  std::uint64_t seed = 1;
  for (dtype t : float_dtypes)
    visit_dtype(t, [&](auto zero) {
      using T = decltype(zero);
      for (const auto& [count, op] : random_float_cases<T>())
        for (const auto& [on, a] : runs) {
          const std::vector<std::vector<T>> inputs = random_inputs<T>(comm.size(), count, ++seed);
          std::vector<T> data = inputs[static_cast<std::size_t>(comm.rank())];
          allreduce(*on, std::span(data), op, a);
          const std::string what = "[rank " + std::to_string(comm.rank()) + "] allreduce " + std::string(name_of(a)) +
                                   " on " + std::to_string(on->topology().node_count()) + " node(s) " +
                                   std::string(name_of(t)) + " " + std::string(name_of(op)) + " count " +
                                   std::to_string(count);
          EXPECT_TRUE(same_bits_on_every_rank(gather_results(data), what));
          EXPECT_TRUE(close_to_serial_sum(data, inputs, op, what));
        }
    });
}

TEST(mpi_collectives, automatic_fits_one_machine_that_every_rank_shares_and_every_rank_picks_alike) {
  // one node, and (even p) "nodes" of 2 ranks: the fit then times the node communicators' segments
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int per_node : {0, size % 2 == 0 ? 2 : 1}) {
    config cfg = config::from_environment();
    cfg.timeout = std::chrono::seconds(60);
    cfg.ranks_per_node = per_node;
    communicator comm = communicator::from_mpi(MPI_COMM_WORLD, cfg);
    const cost_params m = machine_of(comm);
    std::vector<double> mine{m.alpha, m.beta, m.gamma, m.shm_alpha, m.copy_beta};
    for (std::size_t bytes : {std::size_t{1} << 10, std::size_t{1} << 20, std::size_t{16} << 20}) {
      mine.push_back(static_cast<double>(choose_allreduce(comm, bytes)));
      mine.push_back(static_cast<double>(choose_allgather(comm, bytes)));
      mine.push_back(static_cast<double>(choose_reduce_scatter(comm, bytes)));
      mine.push_back(static_cast<double>(choose_alltoall(comm, bytes)));
      mine.push_back(static_cast<double>(choose_broadcast(comm, bytes)));
    }
    for (std::size_t k = 0; k < 5 && size > 1; ++k)
      EXPECT_TRUE(std::isfinite(mine[k]) && mine[k] > 0) << "machine parameter " << k << ": " << mine[k];
    std::vector<double> rank0 = mine;
    ASSERT_EQ(MPI_Bcast(rank0.data(), static_cast<int>(rank0.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD), MPI_SUCCESS);
    EXPECT_EQ(mine, rank0) << "rank " << comm.rank() << ", " << per_node << " ranks per node";
  }
}

TEST(mpi_collectives, hierarchical_allreduce_over_a_configured_mesh_matches_mpi) {
  config cfg = config::from_environment();
  cfg.timeout = std::chrono::seconds(60);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  cfg.ranks_per_node = size % 2 == 0 ? 2 : 1;  // two "nodes" of one machine's ranks where p is even
  communicator comm = communicator::from_mpi(MPI_COMM_WORLD, cfg);
  for (std::size_t count : {std::size_t{0}, std::size_t{7}, (std::size_t{1} << 18) + 3}) {
    std::vector<float> data = make_input<float>(reduce_op::sum, comm.rank(), count);
    const std::vector<float> want = oracle<float>(comm, reduce_op::sum, count);
    allreduce(comm, std::span(data), reduce_op::sum, algorithm::hierarchical);
    EXPECT_TRUE(same_elements(data, want, "hierarchical allreduce count " + std::to_string(count)));
  }
}

TEST(mpi_collectives, reduce_scatter_v_allgather_v_broadcast_reduce_alltoall_match_mpi) {
  communicator comm = make_comm();
  const int p = comm.size();
  const auto me = static_cast<std::size_t>(comm.rank());
  for (std::size_t count :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, pipeline_chunk_bytes / sizeof(std::int32_t) + 1}) {
    const std::vector<std::size_t> counts = uneven_counts(p, count);
    const block_layout layout = block_layout::of_counts(counts);
    std::vector<int> mpi_counts(counts.begin(), counts.end()), mpi_displs(layout.displs.begin(), layout.displs.end());
    const std::string what = "count " + std::to_string(count);

    // reduce_scatter_v vs MPI_Reduce_scatter
    const std::vector<std::int32_t> input = make_input<std::int32_t>(reduce_op::sum, comm.rank(), layout.total);
    std::vector<std::int32_t> mine(counts[me]), want(counts[me]);
    reduce_scatter_v(comm, std::span(input), std::span(mine), counts, reduce_op::sum);
    ASSERT_EQ(MPI_Reduce_scatter(input.data(), want.data(), mpi_counts.data(), MPI_INT32_T, MPI_SUM, comm.mpi_comm()),
              MPI_SUCCESS);
    EXPECT_TRUE(same_elements(mine, want, "reduce_scatter_v " + what));
    // ... and in place with the result at the front of the buffer, for these counts and for counts in
    // which every rank past 0 has a block to move (count + rank + 1)
    std::vector<std::size_t> every(counts.size());
    for (std::size_t r = 0; r < every.size(); ++r) every[r] = count + r + 1;
    for (const std::vector<std::size_t>& front_counts : {counts, every}) {
      const block_layout front_layout = block_layout::of_counts(front_counts);
      std::vector<int> front_mpi_counts(front_counts.begin(), front_counts.end());
      std::vector<std::int32_t> work = make_input<std::int32_t>(reduce_op::sum, comm.rank(), front_layout.total);
      std::vector<std::int32_t> front_want(front_counts[me]);
      ASSERT_EQ(MPI_Reduce_scatter(work.data(), front_want.data(), front_mpi_counts.data(), MPI_INT32_T, MPI_SUM,
                                   comm.mpi_comm()),
                MPI_SUCCESS);
      const std::span<std::int32_t> front =
          reduce_scatter_v(comm, std::span(work), front_counts, reduce_op::sum, result_at::front);
      EXPECT_EQ(front.data(), work.data());
      EXPECT_TRUE(same_elements(std::vector<std::int32_t>(front.begin(), front.end()), front_want,
                                "reduce_scatter_v(result_at::front) " + what));
    }

    // allgather_v (both algorithms) vs MPI_Allgatherv
    std::vector<std::int32_t> gathered_mpi(layout.total);
    ASSERT_EQ(MPI_Allgatherv(want.data(), mpi_counts[me], MPI_INT32_T, gathered_mpi.data(), mpi_counts.data(),
                             mpi_displs.data(), MPI_INT32_T, comm.mpi_comm()),
              MPI_SUCCESS);
    for (algorithm a : {algorithm::ring, algorithm::recursive_doubling}) {
      std::vector<std::int32_t> gathered(layout.total, 99);
      allgather_v(comm, std::span(want), std::span(gathered), counts, a);
      EXPECT_TRUE(same_elements(gathered, gathered_mpi, "allgather_v " + std::string(name_of(a)) + " " + what));
    }
    // allgather_v_placed (each piece placed at its block's offset) vs MPI_Allgatherv, multi-chunk:
    // 3-element chunks for the small counts, 1024-element ones for the large (64 per block; 3-element
    // chunks there are 20000 messages a block, 30 s on 5 ranks of 2 cores), and the default
    for (const staging stage : {staging{count < 64 ? std::size_t{12} : std::size_t{4096}, 2}, staging{}}) {
      std::vector<std::int32_t> placed(layout.total, 99);
      allgather_v_placed<std::int32_t>(
          comm, std::span(want), counts,
          [&](int block, std::size_t offset, std::span<const std::int32_t> piece) {
            std::copy(
                piece.begin(), piece.end(),
                placed.begin() + static_cast<std::ptrdiff_t>(layout.displs[static_cast<std::size_t>(block)] + offset));
          },
          stage);
      EXPECT_TRUE(same_elements(placed, gathered_mpi,
                                "allgather_v_placed chunk " + std::to_string(stage.chunk_bytes) + " B " + what));
    }

    // broadcast and reduce from the last rank vs MPI_Bcast / MPI_Reduce
    const int root = p - 1;
    for (algorithm a : {algorithm::chain, algorithm::binomial_tree}) {
      std::vector<double> data = make_input<double>(reduce_op::max, comm.rank(), count), data_mpi = data;
      broadcast(comm, std::span(data), root, a);
      ASSERT_EQ(MPI_Bcast(data_mpi.data(), static_cast<int>(count), MPI_DOUBLE, root, comm.mpi_comm()), MPI_SUCCESS);
      EXPECT_TRUE(same_elements(data, data_mpi, "broadcast " + std::string(name_of(a)) + " " + what));
      const std::vector<double> in = make_input<double>(reduce_op::prod, comm.rank(), count);
      std::vector<double> out(count), out_mpi(count);
      reduce(comm, std::span(in), std::span(out), reduce_op::prod, root, a);
      ASSERT_EQ(
          MPI_Reduce(in.data(), out_mpi.data(), static_cast<int>(count), MPI_DOUBLE, MPI_PROD, root, comm.mpi_comm()),
          MPI_SUCCESS);
      if (comm.rank() == root) {
        EXPECT_TRUE(same_elements(out, out_mpi, "reduce " + std::string(name_of(a)) + " " + what));
      }
    }

    // alltoall vs MPI_Alltoall
    const std::vector<std::int64_t> blocks =
        make_input<std::int64_t>(reduce_op::min, comm.rank(), count * static_cast<std::size_t>(p));
    std::vector<std::int64_t> out(blocks.size(), 99), out_mpi(blocks.size());
    alltoall(comm, std::span(blocks), std::span(out));
    ASSERT_EQ(MPI_Alltoall(blocks.data(), static_cast<int>(count), MPI_INT64_T, out_mpi.data(), static_cast<int>(count),
                           MPI_INT64_T, comm.mpi_comm()),
              MPI_SUCCESS);
    EXPECT_TRUE(same_elements(out, out_mpi, "alltoall " + what));

    // alltoall_v vs MPI_Alltoallv: rank i sends (i + j + count) % 3 elements to rank j (zeros included)
    std::vector<std::size_t> sends(static_cast<std::size_t>(p)), receives(static_cast<std::size_t>(p));
    std::vector<int> send_counts(sends.size()), recv_counts(sends.size()), send_displs(sends.size()),
        recv_displs(sends.size());
    for (int j = 0; j < p; ++j) {
      const auto u = static_cast<std::size_t>(j);
      sends[u] = static_cast<std::size_t>(comm.rank() + j) % 3 + count % 5;
      receives[u] = static_cast<std::size_t>(j + comm.rank()) % 3 + count % 5;
      send_counts[u] = static_cast<int>(sends[u]);
      recv_counts[u] = static_cast<int>(receives[u]);
      send_displs[u] = j == 0 ? 0 : send_displs[u - 1] + send_counts[u - 1];
      recv_displs[u] = j == 0 ? 0 : recv_displs[u - 1] + recv_counts[u - 1];
    }
    const std::size_t send_total = static_cast<std::size_t>(send_displs.back() + send_counts.back());
    const std::size_t recv_total = static_cast<std::size_t>(recv_displs.back() + recv_counts.back());
    const std::vector<std::int64_t> v_in = make_input<std::int64_t>(reduce_op::sum, comm.rank(), send_total);
    std::vector<std::int64_t> v_out(recv_total, 99), v_out_mpi(recv_total);
    alltoall_v(comm, std::span(v_in), std::span<const std::size_t>(sends), std::span(v_out),
               std::span<const std::size_t>(receives));
    ASSERT_EQ(MPI_Alltoallv(v_in.data(), send_counts.data(), send_displs.data(), MPI_INT64_T, v_out_mpi.data(),
                            recv_counts.data(), recv_displs.data(), MPI_INT64_T, comm.mpi_comm()),
              MPI_SUCCESS);
    EXPECT_TRUE(same_elements(v_out, v_out_mpi, "alltoall_v " + what));
  }
  barrier(comm);
}

}  // namespace
}  // namespace flexpar
