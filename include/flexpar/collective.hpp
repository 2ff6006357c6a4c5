// flexpar/collective.hpp — the collectives: allreduce, reduce_scatter(_v), allgather(_v), broadcast,
// reduce, alltoall, barrier.
//
// Every function here is collective over `comm`: every rank calls it, in the same order as its other
// collectives on `comm`, with the same counts, op, root and algorithm. Disagreements end in errors,
// never in a result or a write out of bounds: through the shared-memory segment (one node) the
// ranks compare their calls (operation, count, dtype, op) and every rank throws the same
// mismatch_error naming each side and its ranks (the communicator is unusable afterwards); through
// the transport every receive is exact, so a count that differs is a mismatch_error (or the
// transport's truncation error) on the ranks that receive the other size, and a timeout_error on
// those left waiting for them. A disagreement in dtype or op alone on the transport is not detected.
// Each function blocks until this rank's part is done, with comm.default_deadline(). Collectives
// use a private channel of `comm` (context.hpp): they never match user point-to-point messages on
// comm.transport(). One thread at a time may call collectives on one communicator (the
// engine's background thread, for instance); use one communicator per thread otherwise.
//
// Element types are the dtypes of core/dtype.hpp (half and bfloat16 reduce in float); counts are
// std::size_t and may exceed 2^31. reduce_op::avg is a sum followed by one division by the number of
// ranks. Each algorithm is a header of its own in flexpar/collective/, with its cost function;
// `algorithm::automatic` picks by those costs (collective/automatic.hpp).
//
//   MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
//   flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
//   std::vector<float> grad = ...;
//   flexpar::allreduce(comm, std::span(grad), flexpar::reduce_op::avg);
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <flexpar/collective/algorithm.hpp>
#include <flexpar/collective/allgather_pairwise_placed.hpp>
#include <flexpar/collective/allgather_recursive_doubling.hpp>
#include <flexpar/collective/allgather_ring.hpp>
#include <flexpar/collective/allreduce_halving_doubling.hpp>
#include <flexpar/collective/allreduce_hierarchical.hpp>
#include <flexpar/collective/allreduce_ring.hpp>
#include <flexpar/collective/allreduce_shared_memory.hpp>
#include <flexpar/collective/alltoall_pairwise.hpp>
#include <flexpar/collective/automatic.hpp>
#include <flexpar/collective/barrier_dissemination.hpp>
#include <flexpar/collective/broadcast_binomial_tree.hpp>
#include <flexpar/collective/broadcast_chain.hpp>
#include <flexpar/collective/call_agreement.hpp>
#include <flexpar/collective/context.hpp>
#include <flexpar/collective/exchange_shared_memory.hpp>
#include <flexpar/collective/reduce_binomial_tree.hpp>
#include <flexpar/collective/reduce_chain.hpp>
#include <flexpar/collective/reduce_kernel.hpp>
#include <flexpar/collective/reduce_scatter_ring.hpp>
#include <flexpar/collective/shared_memory_rounds.hpp>
#include <flexpar/comm/communicator.hpp>

namespace flexpar {

namespace detail {

[[noreturn]] inline void unsupported(const communicator& comm, std::string_view collective, algorithm a,
                                     std::string_view offered) {
  throw error_on<usage_error>(comm.rank(), collective, "has no algorithm '", name_of(a), "'; it offers ", offered);
}

inline void require(bool ok, const communicator& comm, std::string_view collective, const std::string& text) {
  if (!ok) throw error_on<usage_error>(comm.rank(), collective, text);
}

inline void check_root(const communicator& comm, std::string_view collective, int root) {
  require(root >= 0 && root < comm.size(), comm, collective,
          "root " + std::to_string(root) + " is outside the communicator of " + std::to_string(comm.size()) + " ranks");
}

inline block_layout checked_layout(const communicator& comm, std::string_view collective,
                                   std::span<const std::size_t> counts) {
  require(counts.size() == static_cast<std::size_t>(comm.size()), comm, collective,
          "counts has " + std::to_string(counts.size()) + " entries; it needs one per rank (" +
              std::to_string(comm.size()) + ")");
  return block_layout::of_counts(counts);
}

template <class T>
bool same_buffer(std::span<const T> a, std::span<T> b) {
  return a.data() == b.data();
}

template <element T>
void allreduce_in_place(communicator& comm, std::span<T> data, reduce_op op, algorithm a) {
  if (a == algorithm::automatic) a = choose_allreduce(comm, data.size_bytes());
  if (a == algorithm::ring || a == algorithm::halving_doubling || a == algorithm::hierarchical)
    agree_on_call(comm, "allreduce", a, facts_of<T>(data.size(), op));
  switch (a) {
    case algorithm::ring: allreduce_ring(comm, data, op); break;
    case algorithm::halving_doubling: allreduce_halving_doubling(comm, data, op); break;
    case algorithm::hierarchical: allreduce_hierarchical(comm, data, op); break;
    case algorithm::shared_memory: allreduce_shared_memory(comm, data, op); break;
    default: unsupported(comm, "allreduce", a, "automatic, ring, halving_doubling, hierarchical, shared_memory");
  }
  // shared_memory divides each part as it reduces it (allreduce_shared_memory.hpp, step 3)
  if (op == reduce_op::avg && a != algorithm::shared_memory) scale_for_average(data, comm.size());
}

/// Returns my reduced block: at its place in `data`, or at the front (result_at::front).
template <element T>
std::span<T> reduce_scatter_in_place(communicator& comm, std::span<T> data, const block_layout& layout, reduce_op op,
                                     algorithm a, std::string_view name, result_at where = result_at::my_block) {
  require(data.size() == layout.total, comm, name,
          "the buffer holds " + std::to_string(data.size()) + " elements but the counts add up to " +
              std::to_string(layout.total));
  if (a == algorithm::automatic) a = choose_reduce_scatter(comm, data.size_bytes());
  const std::span<T> mine =
      where == result_at::front ? data.first(layout.count(comm.rank())) : layout.of(data, comm.rank());
  switch (a) {  // both honour `where`
    case algorithm::ring: {
      agree_on_call(comm, name.data(), a,
                    facts_of<T>(layout.total, op, std::nullopt, block_layout_digest(layout.counts)));
      call c = begin_call(comm);
      ring_reduce_scatter(c, data, layout, op, where);
      break;
    }
    case algorithm::shared_memory:
      require_one_node_segment(comm, name);
      if (comm.size() > 1) shared_memory_reduce_scatter(comm, std::span<const T>(data), layout, mine, op);
      break;
    default: unsupported(comm, name, a, "automatic, ring, shared_memory");
  }
  if (op == reduce_op::avg) scale_for_average(mine, comm.size());
  return mine;
}

/// Out of place: `out` receives my block of `in` reduced over every rank. Through the segment the
/// rounds read `in` and write `out` directly; otherwise `in` is copied into scratch first (the ring
/// works in place).
template <element T>
void reduce_scatter_out_of_place(communicator& comm, std::span<const T> in, std::span<T> out,
                                 const block_layout& layout, reduce_op op, algorithm a, std::string_view name) {
  if (a == algorithm::automatic) a = choose_reduce_scatter(comm, in.size_bytes());
  const bool overlap =
      !in.empty() && !out.empty() && in.data() < out.data() + out.size() && out.data() < in.data() + in.size();
  if (a == algorithm::shared_memory && !overlap) {
    require_one_node_segment(comm, name);
    if (comm.size() > 1)
      shared_memory_reduce_scatter(comm, in, layout, out, op);
    else if (!out.empty())
      std::memcpy(out.data(), in.data(), out.size_bytes());
    if (op == reduce_op::avg) scale_for_average(out, comm.size());
    return;
  }
  auto work = scratch<T>(in.size());
  std::copy(in.begin(), in.end(), work.get());
  reduce_scatter_in_place(comm, std::span<T>(work.get(), in.size()), layout, op, a, name);
  std::copy_n(work.get() + layout.displ(comm.rank()), out.size(), out.begin());
}

template <element T>
void allgather_in_place(communicator& comm, std::span<T> data, const block_layout& layout, algorithm a,
                        std::string_view name) {
  require(data.size() == layout.total, comm, name,
          "the buffer holds " + std::to_string(data.size()) + " elements but the counts add up to " +
              std::to_string(layout.total));
  if (a == algorithm::automatic) a = choose_allgather(comm, data.size_bytes());
  if (a == algorithm::shared_memory) {
    require_one_node_segment(comm, name);
    if (comm.size() > 1) shared_memory_allgather(comm, data, layout);
    return;
  }
  if (a != algorithm::ring && a != algorithm::recursive_doubling)
    unsupported(comm, name, a, "automatic, ring, recursive_doubling, shared_memory");
  agree_on_call(comm, name.data(), a,
                facts_of<T>(layout.total, std::nullopt, std::nullopt, block_layout_digest(layout.counts)));
  call c = begin_call(comm);
  switch (a) {
    case algorithm::ring: ring_allgather(c, data, layout); break;
    case algorithm::recursive_doubling: recursive_doubling_allgather(c, data, layout); break;
    default: unsupported(comm, name, a, "automatic, ring, recursive_doubling, shared_memory");
  }
}

/// My block from `in`, the others into `out`: through shared memory my block goes to `out` from my
/// round buffer (one read of `in`); otherwise it is copied first and the rest gathered in place.
template <element T>
void allgather_out_of_place(communicator& comm, std::span<const T> in, std::span<T> out, const block_layout& layout,
                            algorithm a, std::string_view name) {
  if (a == algorithm::automatic) a = choose_allgather(comm, out.size_bytes());
  if (a == algorithm::shared_memory && comm.size() > 1) {
    require_one_node_segment(comm, name);
    shared_memory_allgather_placed<T>(
        comm, in, layout, staging{}, [&](int block, std::size_t offset, std::span<const T> piece) {
          place_contiguous(comm, layout.of(out, block).data() + offset, piece.data(), piece.size(), out.size_bytes());
        });
    return;
  }
  std::copy(in.begin(), in.end(), layout.of(out, comm.rank()).begin());
  allgather_in_place(comm, out, layout, a, name);
}

template <element T>
void reduce_into_acc(communicator& comm, std::span<T> acc, reduce_op op, int root, algorithm a) {
  if (a == algorithm::automatic) a = choose_reduce(comm, acc.size_bytes());
  if (a != algorithm::chain && a != algorithm::binomial_tree)
    unsupported(comm, "reduce", a, "automatic, chain, binomial_tree");
  agree_on_call(comm, "reduce", a, facts_of<T>(acc.size(), op, root));
  call c = begin_call(comm);
  switch (a) {
    case algorithm::chain: chain_reduce(c, acc, op, root); break;
    case algorithm::binomial_tree: binomial_tree_reduce(c, acc, op, root); break;
    default: unsupported(comm, "reduce", a, "automatic, chain, binomial_tree");
  }
  if (op == reduce_op::avg && comm.rank() == root) scale_for_average(acc, comm.size());
}

}  // namespace detail

// ---- allreduce ---------------------------------------------------------------------------------

/// In place: every rank's `data` becomes the element-wise reduction of every rank's `data`.
/// Algorithms: automatic, ring, halving_doubling, hierarchical, shared_memory.
/// @post the results are bitwise identical on every rank.
template <element T>
void allreduce(communicator& comm, std::span<T> data, reduce_op op, algorithm a = algorithm::automatic) {
  detail::allreduce_in_place(comm, data, op, a);
}

/// Out of place: `out` receives the reduction of every rank's `in`; `in` is not changed.
/// @pre in.size() == out.size(); in and out are the same buffer or do not overlap.
template <element T>
void allreduce(communicator& comm, std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op,
               algorithm a = algorithm::automatic) {
  detail::require(in.size() == out.size(), comm, "allreduce",
                  "input of " + std::to_string(in.size()) + " and output of " + std::to_string(out.size()) +
                      " elements; they must have the same length");
  if (!detail::same_buffer(in, out)) std::copy(in.begin(), in.end(), out.begin());
  detail::allreduce_in_place(comm, out, op, a);
}

/// Type-erased allreduce of `count` elements of `type` (in == out for in place).
inline void allreduce(communicator& comm, dtype type, const void* in, void* out, std::size_t count, reduce_op op,
                      algorithm a = algorithm::automatic) {
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    allreduce(comm, std::span<const T>(static_cast<const T*>(in), count), std::span<T>(static_cast<T*>(out), count), op,
              a);
  });
}

// ---- reduce_scatter ----------------------------------------------------------------------------

/// Out of place: `in` holds p blocks of out.size() elements; `out` receives block `rank` reduced
/// over every rank. Algorithms: automatic, ring, shared_memory (one node: in rounds through the
/// communicator's segment, reading `in` and writing `out` directly).
template <element T>
void reduce_scatter(communicator& comm, std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op,
                    algorithm a = algorithm::automatic) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), out.size());
  const block_layout layout = block_layout::of_counts(counts);
  detail::require(
      in.size() == layout.total, comm, "reduce_scatter",
      "input of " + std::to_string(in.size()) + " elements; it needs ranks * output = " + std::to_string(layout.total));
  detail::reduce_scatter_out_of_place(comm, in, out, layout, op, a, "reduce_scatter");
}

/// In place: `data` holds p equal blocks; returns block `rank` of `data`, reduced over every rank.
/// The other blocks are left holding partial results (or, through the segment, my own input).
template <element T>
std::span<T> reduce_scatter(communicator& comm, std::span<T> data, reduce_op op, algorithm a = algorithm::automatic) {
  const auto p = static_cast<std::size_t>(comm.size());
  detail::require(data.size() % p == 0, comm, "reduce_scatter",
                  std::to_string(data.size()) + " elements do not split into " + std::to_string(p) + " equal blocks");
  const block_layout layout = block_layout::even(data.size(), comm.size());
  detail::reduce_scatter_in_place(comm, data, layout, op, a, "reduce_scatter");
  return layout.of(data, comm.rank());
}

/// Out of place, uneven: `in` holds blocks of counts[0], counts[1], ... elements; `out`
/// (counts[rank] elements) receives block `rank` reduced over every rank.
template <element T>
void reduce_scatter_v(communicator& comm, std::span<const std::type_identity_t<T>> in, std::span<T> out,
                      std::span<const std::size_t> counts, reduce_op op, algorithm a = algorithm::automatic) {
  const block_layout layout = detail::checked_layout(comm, "reduce_scatter_v", counts);
  detail::require(out.size() == layout.count(comm.rank()), comm, "reduce_scatter_v",
                  "output of " + std::to_string(out.size()) + " elements; counts[rank] is " +
                      std::to_string(layout.count(comm.rank())));
  detail::require(
      in.size() == layout.total, comm, "reduce_scatter_v",
      "input of " + std::to_string(in.size()) + " elements; the counts add up to " + std::to_string(layout.total));
  detail::reduce_scatter_out_of_place(comm, in, out, layout, op, a, "reduce_scatter_v");
}

/// In place, uneven: returns block `rank` of `data` (at counts[0] + .. + counts[rank-1]), reduced.
template <element T>
std::span<T> reduce_scatter_v(communicator& comm, std::span<T> data, std::span<const std::size_t> counts, reduce_op op,
                              algorithm a = algorithm::automatic) {
  const block_layout layout = detail::checked_layout(comm, "reduce_scatter_v", counts);
  return detail::reduce_scatter_in_place(comm, data, layout, op, a, "reduce_scatter_v");
}

/// In place, uneven, with the result where the caller wants it: result_at::front leaves block `rank`,
/// reduced over every rank, in data[0, counts[rank]) — the last reduction (the ring's last step, or
/// each round's first one through the segment) writes there instead of at the block's own place, so
/// a caller that keeps only its block (P -> S boxing) cuts the buffer down to it without moving
/// counts[rank] elements. Returns that span. Every element past it holds partial results (the ring)
/// or this rank's own input (shared_memory). The same steps and bytes as the other in-place form
/// (result_at::my_block is it); through the segment the front form can take longer than it, since
/// it writes its result to lines other than the ones it has just read.
/// Algorithms: automatic, ring, shared_memory.
template <element T>
std::span<T> reduce_scatter_v(communicator& comm, std::span<T> data, std::span<const std::size_t> counts, reduce_op op,
                              result_at where, algorithm a = algorithm::automatic) {
  const block_layout layout = detail::checked_layout(comm, "reduce_scatter_v", counts);
  return detail::reduce_scatter_in_place(comm, data, layout, op, a, "reduce_scatter_v", where);
}

// ---- allgather ---------------------------------------------------------------------------------

/// Out of place: `out` (p * in.size() elements) receives every rank's `in`, in rank order.
/// Algorithms: automatic, ring, recursive_doubling, shared_memory (one node: through the communicator's
/// segment, collective/exchange_shared_memory.hpp).
template <element T>
void allgather(communicator& comm, std::span<const std::type_identity_t<T>> in, std::span<T> out,
               algorithm a = algorithm::automatic) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), in.size());
  const block_layout layout = block_layout::of_counts(counts);
  detail::require(out.size() == layout.total, comm, "allgather",
                  "output of " + std::to_string(out.size()) +
                      " elements; it needs ranks * input = " + std::to_string(layout.total));
  detail::allgather_out_of_place(comm, std::span<const T>(in), out, layout, a, "allgather");
}

/// In place: `data` holds p equal blocks, block `rank` already mine; afterwards every block is filled.
template <element T>
void allgather(communicator& comm, std::span<T> data, algorithm a = algorithm::automatic) {
  const auto p = static_cast<std::size_t>(comm.size());
  detail::require(data.size() % p == 0, comm, "allgather",
                  std::to_string(data.size()) + " elements do not split into " + std::to_string(p) + " equal blocks");
  detail::allgather_in_place(comm, data, block_layout::even(data.size(), comm.size()), a, "allgather");
}

/// Out of place, uneven: rank i contributes counts[i] elements (in.size() == counts[rank]).
template <element T>
void allgather_v(communicator& comm, std::span<const std::type_identity_t<T>> in, std::span<T> out,
                 std::span<const std::size_t> counts, algorithm a = algorithm::automatic) {
  const block_layout layout = detail::checked_layout(comm, "allgather_v", counts);
  detail::require(in.size() == layout.count(comm.rank()), comm, "allgather_v",
                  "input of " + std::to_string(in.size()) + " elements; counts[rank] is " +
                      std::to_string(layout.count(comm.rank())));
  detail::require(
      out.size() == layout.total, comm, "allgather_v",
      "output of " + std::to_string(out.size()) + " elements; the counts add up to " + std::to_string(layout.total));
  detail::allgather_out_of_place(comm, std::span<const T>(in), out, layout, a, "allgather_v");
}

/// In place, uneven: block `rank` (at counts[0] + .. + counts[rank-1]) is already mine.
template <element T>
void allgather_v(communicator& comm, std::span<T> data, std::span<const std::size_t> counts,
                 algorithm a = algorithm::automatic) {
  detail::allgather_in_place(comm, data, detail::checked_layout(comm, "allgather_v", counts), a, "allgather_v");
}

/// Uneven, with the blocks placed by the caller: rank i contributes counts[i] elements
/// (in.size() == counts[rank]), and instead of landing in one buffer, every block, mine included, is
/// handed to `place(block, offset, piece)` in pieces: elements [offset, offset + piece.size()) of
/// rank `block`'s contribution, each exactly once, in no promised order. For a destination in which
/// a block is not contiguous (rows of a tensor split on an inner axis): the pieces come through
/// s.slots cache-sized buffers of s.chunk_bytes, so each is placed while it is in cache and the
/// next ones are in flight (collective/allgather_pairwise_placed.hpp). `s` must be the same on every
/// rank. Algorithm: pairwise, sent straight from `in` (cost allgather_pairwise_placed_cost).
/// @pre `place` must not call into `comm`; the spans it is given are valid only during the call.
template <element T, class Place>
requires std::invocable<Place&, int, std::size_t, std::span<const T>>
void allgather_v_placed(communicator& comm, std::span<const std::type_identity_t<T>> in,
                        std::span<const std::size_t> counts, Place&& place, staging s = {}) {
  const block_layout layout = detail::checked_layout(comm, "allgather_v_placed", counts);
  detail::require(in.size() == layout.count(comm.rank()), comm, "allgather_v_placed",
                  "input of " + std::to_string(in.size()) + " elements; counts[rank] is " +
                      std::to_string(layout.count(comm.rank())));
  detail::require(s.chunk_bytes > 0, comm, "allgather_v_placed", "staging::chunk_bytes is 0; it must be positive");
  if (uses_shared_memory(comm, s, "allgather_v_placed")) {
    detail::shared_memory_allgather_placed(comm, std::span<const T>(in), layout, s, place);
    return;
  }
  detail::agree_on_call(comm, "allgather_v_placed", algorithm::pairwise,
                        facts_of<T>(layout.total, std::nullopt, std::nullopt, block_layout_digest(layout.counts)));
  detail::call c = detail::begin_call(comm);
  detail::pairwise_allgather_placed(c, std::span<const T>(in), layout, s, place);
}

// ---- broadcast, reduce -------------------------------------------------------------------------

/// `data` of `root` is copied into `data` of every rank. Algorithms: automatic, chain, binomial_tree.
template <element T>
void broadcast(communicator& comm, std::span<T> data, int root, algorithm a = algorithm::automatic) {
  detail::check_root(comm, "broadcast", root);
  if (a == algorithm::automatic) a = choose_broadcast(comm, data.size_bytes());
  if (a != algorithm::chain && a != algorithm::binomial_tree)
    detail::unsupported(comm, "broadcast", a, "automatic, chain, binomial_tree");
  detail::agree_on_call(comm, "broadcast", a, facts_of<T>(data.size(), std::nullopt, root));
  detail::call c = detail::begin_call(comm);
  switch (a) {
    case algorithm::chain: detail::chain_broadcast(c, data, root); break;
    case algorithm::binomial_tree: detail::binomial_tree_broadcast(c, data, root); break;
    default: detail::unsupported(comm, "broadcast", a, "automatic, chain, binomial_tree");
  }
}

/// Out of place: `out` of `root` receives the reduction of every rank's `in`; `out` is not used on
/// other ranks (it may be empty there). Algorithms: automatic, chain, binomial_tree.
template <element T>
void reduce(communicator& comm, std::span<const std::type_identity_t<T>> in, std::span<T> out, reduce_op op, int root,
            algorithm a = algorithm::automatic) {
  detail::check_root(comm, "reduce", root);
  if (comm.rank() == root) {
    detail::require(
        out.size() == in.size(), comm, "reduce",
        "the root's output has " + std::to_string(out.size()) + " elements, the input " + std::to_string(in.size()));
    if (!detail::same_buffer(in, out)) std::copy(in.begin(), in.end(), out.begin());
    detail::reduce_into_acc(comm, out, op, root, a);
  } else {
    auto acc = detail::scratch<T>(in.size());
    std::copy(in.begin(), in.end(), acc.get());
    detail::reduce_into_acc(comm, std::span<T>(acc.get(), in.size()), op, root, a);
  }
}

/// In place: `data` of `root` becomes the reduction of every rank's `data`; other ranks' `data` is
/// left unchanged.
template <element T>
void reduce(communicator& comm, std::span<T> data, reduce_op op, int root, algorithm a = algorithm::automatic) {
  reduce(comm, std::span<const T>(data), data, op, root, a);
}

// ---- alltoall, barrier -------------------------------------------------------------------------

/// `in` and `out` hold p blocks of in.size() / p elements: block j of `in` is sent to rank j, block i
/// of `out` comes from rank i. Algorithms: automatic, pairwise, shared_memory (one node: through
/// the communicator's segment, collective/exchange_shared_memory.hpp).
/// @pre in.size() == out.size(), a multiple of p; in and out are the same buffer or do not overlap.
template <element T>
void alltoall(communicator& comm, std::span<const std::type_identity_t<T>> in, std::span<T> out,
              algorithm a = algorithm::automatic) {
  const auto p = static_cast<std::size_t>(comm.size());
  detail::require(in.size() == out.size() && in.size() % p == 0, comm, "alltoall",
                  "input of " + std::to_string(in.size()) + " and output of " + std::to_string(out.size()) +
                      " elements; both need the same multiple of the " + std::to_string(p) + " ranks");
  if (a != algorithm::automatic && a != algorithm::pairwise && a != algorithm::shared_memory)
    detail::unsupported(comm, "alltoall", a, "automatic, pairwise, shared_memory");
  if (a == algorithm::automatic) a = choose_alltoall(comm, in.size_bytes(), detail::same_buffer(in, out));
  if (a == algorithm::shared_memory) {  // in place too: round k packs chunk k of every block first
    detail::require_one_node_segment(comm, "alltoall");
    detail::shared_memory_alltoall(comm, std::span<const T>(in), out, in.size() / p);
    return;
  }
  detail::agree_on_call(comm, "alltoall", a, facts_of<T>(in.size()));
  detail::call c = detail::begin_call(comm);
  if (detail::same_buffer(in, out)) {
    auto copy = detail::scratch<T>(in.size());
    std::copy(in.begin(), in.end(), copy.get());
    detail::pairwise_alltoall(c, std::span<const T>(copy.get(), in.size()), out, in.size() / p);
  } else {
    detail::pairwise_alltoall(c, in, out, in.size() / p);
  }
}

/// In place alltoall.
template <element T>
void alltoall(communicator& comm, std::span<T> data, algorithm a = algorithm::automatic) {
  alltoall(comm, std::span<const T>(data), data, a);
}

/// Uneven alltoall: block j of `in` (send_counts[j] elements, back to back) goes to rank j; block i of
/// `out` (recv_counts[i] elements, back to back) comes from rank i. send_counts[j] on rank i must equal
/// recv_counts[i] on rank j (a mismatch ends in a transport_error for truncation, or a timeout).
/// Algorithms: automatic, pairwise. @pre in and out do not overlap.
template <element T>
void alltoall_v(communicator& comm, std::span<const std::type_identity_t<T>> in,
                std::span<const std::size_t> send_counts, std::span<T> out, std::span<const std::size_t> recv_counts,
                algorithm a = algorithm::automatic) {
  const block_layout sends = detail::checked_layout(comm, "alltoall_v", send_counts);
  const block_layout receives = detail::checked_layout(comm, "alltoall_v", recv_counts);
  detail::require(
      in.size() == sends.total, comm, "alltoall_v",
      "input of " + std::to_string(in.size()) + " elements; the send counts add up to " + std::to_string(sends.total));
  detail::require(out.size() == receives.total, comm, "alltoall_v",
                  "output of " + std::to_string(out.size()) + " elements; the receive counts add up to " +
                      std::to_string(receives.total));
  if (a != algorithm::automatic && a != algorithm::pairwise)
    detail::unsupported(comm, "alltoall_v", a, "automatic, pairwise");
  // the counts differ between ranks by design: each receive checks its own size (irecv_exact)
  call_facts facts = facts_of<T>(0);
  facts.count_differs = true;
  detail::agree_on_call(comm, "alltoall_v", algorithm::pairwise, facts);
  detail::call c = detail::begin_call(comm);
  detail::pairwise_alltoall_v(c, in, sends, out, receives);
}

/// Uneven alltoall whose blocks the caller provides and receives, for layouts in which a block is
/// not contiguous on one side (columns of a row-split tensor): pairwise over the transport, step
/// s = 1 .. p-1 exchanging with ranks rank+s and rank-s, one partner each way per step, as
/// alltoall_v does. In step s:
///   source(rank+s) returns the block to send to rank+s: a span of the caller's data, or of a
///                  staging buffer it has just packed;
///   target(rank-s) returns where rank-s's block lands: its place in the caller's result, or a
///                  staging buffer;
///   landed(rank-s, block) is called once that block has landed and mine has been sent (to unpack
///                  a staging buffer).
/// My own block is not exchanged: the caller moves it (it is a local copy). Each span must stay
/// valid until landed() of its step returns, so one staging buffer per direction serves every step.
/// source(j) on rank i has as many elements as target(i) on rank j (a mismatch ends in a
/// transport_error for truncation, or a timeout). Through the communicator's segment the same
/// exchange is shared_memory_alltoall_placed (collective/shared_memory_rounds.hpp).
/// Cost: alltoall_pairwise_cost. @pre the callbacks do not call into `comm`.
template <element T, class Source, class Target, class Landed>
requires std::invocable<Source&, int> && std::invocable<Target&, int> &&
    std::invocable<Landed&, int, std::span<const T>>
void alltoall_v_placed(communicator& comm, Source&& source, Target&& target, Landed&& landed) {
  call_facts facts;  // the caller's blocks: their counts and type are its own business
  facts.count_differs = true;
  detail::agree_on_call(comm, "alltoall_v_placed", algorithm::pairwise, facts);
  detail::call c = detail::begin_call(comm);
  detail::pairwise_alltoall_v_placed<T>(c, source, target, landed);
}

/// Returns once every rank of `comm` has entered the barrier. Algorithms: automatic, dissemination.
inline void barrier(communicator& comm, algorithm a = algorithm::automatic) {
  if (a != algorithm::automatic && a != algorithm::dissemination)
    detail::unsupported(comm, "barrier", a, "automatic, dissemination");
  detail::agree_on_call(comm, "barrier", algorithm::dissemination, call_facts{});
  detail::call c = detail::begin_call(comm);
  detail::dissemination_barrier(c);
}

}  // namespace flexpar
