// lib/engine/collective_calls.hpp — the engine's bridge from type-erased responses (dtype + bytes)
// to the templated collectives. Each call asks `automatic`'s chooser (collective/automatic.hpp) with
// the bytes the collective's own `automatic` would ask with, runs the choice, and returns its name
// for the timeline.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <flexpar/collective.hpp>

namespace flexpar::detail {

template <class T>
std::span<T> typed(std::byte* p, std::size_t n) {
  return {reinterpret_cast<T*>(p), n};
}
template <class T>
std::span<const T> typed(const std::byte* p, std::size_t n) {
  return {reinterpret_cast<const T*>(p), n};
}

/// allreduce of `count` elements at `data` by `a`.
inline std::string run_allreduce(communicator& comm, dtype type, std::byte* data, std::size_t count, reduce_op op,
                                 algorithm a) {
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    allreduce(comm, typed<T>(data, count), op, a);
  });
  return std::string(name_of(a));
}

inline std::string run_allreduce(communicator& comm, dtype type, std::byte* data, std::size_t count, reduce_op op) {
  return run_allreduce(comm, type, data, count, op, choose_allreduce(comm, count * size_of(type)));
}

/// One tensor of a fused allreduce, type-erased: `count` elements read at `in`, written at `out`.
struct byte_piece {
  const std::byte* in;
  std::byte* out;
  std::size_t count;
};

/// A fused allreduce of `pieces` reduced straight from and into them (shared_memory: the caller chose
/// it with choose_fused_allreduce, as every rank did).
inline std::string run_allreduce_pieces(communicator& comm, dtype type, std::span<const byte_piece> pieces,
                                        reduce_op op) {
  constexpr algorithm a = algorithm::shared_memory;
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    std::vector<flexpar::allreduce_piece<T>> typed_pieces;
    typed_pieces.reserve(pieces.size());
    for (const byte_piece& x : pieces)
      typed_pieces.push_back({reinterpret_cast<const T*>(x.in), reinterpret_cast<T*>(x.out), x.count});
    flexpar::allreduce_shared_memory_pieces(comm, std::span<const flexpar::allreduce_piece<T>>(typed_pieces), op);
  });
  return std::string(name_of(a));
}

inline std::string run_broadcast(communicator& comm, dtype type, std::byte* data, std::size_t count, int root) {
  const algorithm a = choose_broadcast(comm, count * size_of(type));
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    broadcast(comm, typed<T>(data, count), root, a);
  });
  return std::string(name_of(a));
}

inline std::string run_allgather(communicator& comm, dtype type, const std::byte* in, std::byte* out,
                                 const std::vector<std::size_t>& counts) {
  std::size_t total = 0;
  for (auto c : counts) total += c;
  const algorithm a = choose_allgather(comm, total * size_of(type));
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    allgather_v(comm, typed<T>(in, counts[static_cast<std::size_t>(comm.rank())]), typed<T>(out, total),
                std::span<const std::size_t>(counts), a);
  });
  return std::string(name_of(a));
}

/// Blocks as equal as can be: the first count % p ranks get one more element.
inline std::string run_reduce_scatter(communicator& comm, dtype type, const std::byte* in, std::byte* out,
                                      std::size_t count, reduce_op op) {
  const block_layout layout = block_layout::even(count, comm.size());
  const algorithm a = choose_reduce_scatter(comm, count * size_of(type));
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    reduce_scatter_v(comm, typed<T>(in, count), typed<T>(out, layout.count(comm.rank())),
                     std::span<const std::size_t>(layout.counts), op, a);
  });
  return std::string(name_of(a));
}

inline std::string run_alltoall(communicator& comm, dtype type, const std::byte* in, std::byte* out,
                                std::size_t count) {
  const algorithm a = choose_alltoall(comm, count * size_of(type), in == out);
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    alltoall(comm, typed<T>(in, count), typed<T>(out, count), a);
  });
  return std::string(name_of(a));
}

/// Fills `count` elements at `data` with the identity of `op` (what a joined rank contributes).
inline void fill_identity(dtype type, reduce_op op, std::byte* data, std::size_t count) {
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    const T value = static_cast<T>(identity_of<accumulate_t<T>>(op));
    std::fill_n(reinterpret_cast<T*>(data), count, value);
  });
}

}  // namespace flexpar::detail
