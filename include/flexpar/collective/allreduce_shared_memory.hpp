// flexpar/collective/allreduce_shared_memory.hpp — allreduce among the ranks of one node through a
// shared-memory segment, reducing straight out of the peers' slots.
//
// Each rank owns a slot of `depth` round buffers in the communicator's segment (created once, on
// first use). The buffer is processed in rounds of shm_round_bytes; a round is cut into p parts
// and rank q reduces part q. Round g, on rank r:
//   step 1 (reuse):   wait until every peer has consumed round g-depth (my round buffer is free)
//   step 2 (publish): copy the parts that the others reduce into my round buffer; flag published = g+1
//   step 3 (reduce):  wait for every peer's publish; reduce part r of every peer's round buffer into
//                     my own data, copy the result into my round buffer; flag reduced = g+1
//   step 4 (gather):  wait for every peer's reduce; copy their parts into my data; flag consumed = g+1
// Small buffers (<= shm_one_shot_bytes) take one round with one hand-off instead of three: every rank
// publishes its whole buffer, waits for the others' and reduces all of it itself, in rank order (so
// the results stay bitwise identical); its `consumed` flag then frees the buffers for later rounds.
// A round (1 MiB) stays in cache from publish to gather, so the only memory traffic that is not
// cache-resident is the rank's own buffer: read once, written once. No message goes through the
// transport, and there is one copy in and one copy out of the segment instead of two per hop.
// Every element is reduced by exactly one rank, so all ranks end with bitwise-identical results.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include <flexpar/collective/context.hpp>
#include <flexpar/collective/reduce_kernel.hpp>
#include <flexpar/core/streaming_copy.hpp>

namespace flexpar {

/// Bytes of the buffer one shared-memory round covers (all p parts together).
inline constexpr std::size_t shm_round_bytes = std::size_t{1} << 20;
/// Buffers up to this size take the one-hand-off round (latency over redundant reduction work).
inline constexpr std::size_t shm_one_shot_bytes = std::size_t{16} << 10;
/// Buffers from this size on are written back with non-temporal stores in step 4: they will not
/// stay in cache anyway, and streaming saves the read-for-ownership of every line.
inline constexpr std::size_t shm_streaming_bytes = std::size_t{8} << 20;
/// Round buffers per rank: round g+1 is published while peers still gather round g.
inline constexpr std::size_t shm_depth = 2;

/// 3 flag hand-offs per round; (p-1)/p of the buffer copied in, the same copied out, 1/p copied to
/// the slot after reducing; (p-1)/p reduced.
constexpr cost allreduce_shared_memory_cost(int p, double bytes) noexcept {
  if (p <= 1) return {};
  if (bytes <= shm_one_shot_bytes) return {.reduce_bytes = (p - 1) * bytes, .shm_steps = 1, .copy_bytes = bytes};
  const double rounds = detail::ceil_div(bytes, static_cast<double>(shm_round_bytes));
  const double share = (p - 1) * bytes / p;
  return {.reduce_bytes = share, .shm_steps = 3 * (rounds < 1 ? 1 : rounds), .copy_bytes = 2 * share + bytes / p};
}

namespace detail {

/// Where the flags and round buffers of each rank lie in the segment.
struct shm_geometry {
  static constexpr std::size_t flag_line = 64;  // one cache line of flags per rank (one writer each)
  static std::size_t bytes(int p) {
    return flag_line * static_cast<std::size_t>(p) + static_cast<std::size_t>(p) * shm_depth * shm_round_bytes;
  }
  std::byte* base;
  int p;
  [[nodiscard]] shared_counter published(int q) const { return counter(q, 0); }
  [[nodiscard]] shared_counter reduced(int q) const { return counter(q, 1); }
  [[nodiscard]] shared_counter consumed(int q) const { return counter(q, 2); }
  [[nodiscard]] std::byte* round_buffer(int q, std::uint64_t round) const {
    return base + flag_line * static_cast<std::size_t>(p) +
           (static_cast<std::size_t>(q) * shm_depth + round % shm_depth) * shm_round_bytes;
  }

 private:
  // line of rank q: uint32 counters {published, reduced, consumed} at words 0..2, their waiters at 4..6
  [[nodiscard]] shared_counter counter(int q, int which) const {
    auto* line = reinterpret_cast<std::uint32_t*>(base + flag_line * static_cast<std::size_t>(q));
    return shared_counter(line + which, line + 4 + which);
  }
};

/// The communicator's segment, created on first call (collective); nullptr if it cannot exist
/// (a rank could not map it). Only for communicators whose ranks share one node.
inline shared_memory_segment* shared_memory_of(communicator& comm) {
  collective_context& ctx = context_of(comm);
  if (!ctx.shm_tried) {
    ctx.shm_tried = true;
    ctx.shm = shared_memory_segment::create(*ctx.channel, ctx.next_tag(), shm_geometry::bytes(comm.size()),
                                            comm.default_deadline());
  }
  return ctx.shm.get();
}

/// Waits until counter_of(q) has reached `target` for every rank q but me.
template <class Counter>
void wait_for_peers(const communicator& comm, Counter&& counter_of, std::uint64_t target, const char* op,
                    const char* event, deadline until) {
  for (int q = 0; q < comm.size(); ++q) {
    if (q == comm.rank()) continue;
    counter_of(q).wait_until_reached(
        target, until, [&] { return error_text(comm.rank(), op, "rank ", q, " ", event, " round ", target - 1); });
  }
}

/// The one-hand-off round of a small buffer (see the top of this file).
template <element T>
void one_shot_round(const communicator& comm, const shm_geometry& shm, std::uint64_t g, std::span<T> data, reduce_op op,
                    deadline until) {
  const int p = comm.size(), me = comm.rank();
  auto slot = [&](int q) {
    return std::span<const T>(reinterpret_cast<const T*>(shm.round_buffer(q, g)), data.size());
  };
  if (g >= shm_depth)
    wait_for_peers(
        comm, [&](int q) { return shm.consumed(q); }, g - shm_depth + 1, "allreduce(shared_memory)", "consuming",
        until);
  std::memcpy(shm.round_buffer(me, g), data.data(), data.size_bytes());
  shm.published(me).publish(g + 1);
  wait_for_peers(
      comm, [&](int q) { return shm.published(q); }, g + 1, "allreduce(shared_memory)", "publishing", until);
  reduce_into(data, slot(0), slot(1), op);
  for (int q = 2; q < p; ++q) reduce_into(data, slot(q), op);
  shm.reduced(me).publish(g + 1);
  shm.consumed(me).publish(g + 1);
}

template <element T>
void allreduce_shared_memory(communicator& comm, std::span<T> data, reduce_op op) {
  const int p = comm.size(), me = comm.rank();
  if (p == 1) return;
  if (comm.topology().node_count() != 1)
    throw error_on<usage_error>(me, "allreduce(shared_memory)", "the communicator spans ", comm.topology().node_count(),
                                " nodes; the shared-memory path needs every rank on one node (use hierarchical)");
  shared_memory_segment* segment = shared_memory_of(comm);
  if (!segment)
    throw error_on<usage_error>(me, "allreduce(shared_memory)",
                                "a rank could not map the shared-memory segment (is /dev/shm available to every "
                                "rank?); use ring or automatic");
  collective_context& ctx = context_of(comm);
  const shm_geometry shm{segment->data(), p};
  const deadline until = comm.default_deadline();
  const std::size_t per_round = shm_round_bytes / sizeof(T);
  const std::size_t rounds = (data.size() + per_round - 1) / per_round;

  if (data.size_bytes() <= shm_one_shot_bytes && !data.empty()) {
    one_shot_round(comm, shm, ctx.shm_rounds++, data, op, until);
    return;
  }
  const bool streaming = data.size_bytes() >= shm_streaming_bytes;
  for (std::size_t k = 0; k < rounds; ++k) {
    const std::uint64_t g = ctx.shm_rounds + k;
    const std::span<T> round = data.subspan(k * per_round, std::min(per_round, data.size() - k * per_round));
    auto part = [&](int q) {  // [lo, hi) of part q within the round
      const std::size_t lo = round.size() * static_cast<std::size_t>(q) / static_cast<std::size_t>(p);
      const std::size_t hi = round.size() * static_cast<std::size_t>(q + 1) / static_cast<std::size_t>(p);
      return std::pair{lo, hi - lo};
    };
    auto slot = [&](int q) { return std::span<T>(reinterpret_cast<T*>(shm.round_buffer(q, g)), round.size()); };
    // step 1: my round buffer is free once every peer consumed round g - depth
    if (g >= shm_depth)
      wait_for_peers(
          comm, [&](int q) { return shm.consumed(q); }, g - shm_depth + 1, "allreduce(shared_memory)", "consuming",
          until);
    // step 2: publish the parts the others reduce
    for (int q = 0; q < p; ++q) {
      if (q == me) continue;
      const auto [lo, len] = part(q);
      if (len) std::memcpy(slot(me).data() + lo, round.data() + lo, len * sizeof(T));
    }
    shm.published(me).publish(g + 1);
    // step 3: reduce my part out of every peer's buffer, then share the result
    wait_for_peers(
        comm, [&](int q) { return shm.published(q); }, g + 1, "allreduce(shared_memory)", "publishing", until);
    const auto [my_lo, my_len] = part(me);
    const std::span<T> mine = round.subspan(my_lo, my_len);
    for (int q = 0; q < p; ++q)
      if (q != me) reduce_into(mine, std::span<const T>(slot(q).subspan(my_lo, my_len)), op);
    if (my_len) std::memcpy(slot(me).data() + my_lo, mine.data(), my_len * sizeof(T));
    shm.reduced(me).publish(g + 1);
    // step 4: gather the parts the others reduced
    wait_for_peers(
        comm, [&](int q) { return shm.reduced(q); }, g + 1, "allreduce(shared_memory)", "reducing", until);
    for (int q = 0; q < p; ++q) {
      if (q == me) continue;
      const auto [lo, len] = part(q);
      auto* to = reinterpret_cast<std::byte*>(round.data() + lo);
      const auto* from = reinterpret_cast<const std::byte*>(slot(q).data() + lo);
      if (streaming)
        copy_streaming(to, from, len * sizeof(T));
      else if (len)
        std::memcpy(to, from, len * sizeof(T));
    }
    shm.consumed(me).publish(g + 1);
  }
  ctx.shm_rounds += rounds;
}

}  // namespace detail
}  // namespace flexpar
