// flexpar/collective/allreduce_shared_memory.hpp — allreduce among the ranks of one node through a
// shared-memory segment, reducing straight out of the peers' slots.
//
// Each rank owns a slot of `depth` round buffers in the communicator's segment (created once, on
// first use). The buffer is processed in rounds of shm_round_bytes; a round is cut into p parts
// and rank q reduces part q. Round g, on rank r:
//   step 1 (reuse):   wait until every peer has consumed round g-depth (my round buffer is free)
//   step 2 (publish): copy the parts that the others reduce into my round buffer; flag published = g+1
//   step 3 (reduce):  wait for every peer's publish; reduce part r of every peer's round buffer into
//                     my own data (for avg: divide it by p there, while it is in cache, instead of
//                     a pass of its own over the whole result), copy the result into my round
//                     buffer; flag reduced = g+1
//   step 4 (gather):  wait for every peer's reduce; copy their parts into my data; flag consumed = g+1
// Small buffers (<= shm_one_shot_bytes) take one round with one hand-off instead of three: every rank
// publishes its whole buffer, waits for the others' and reduces all of it itself, in rank order (so
// the results stay bitwise identical); its `consumed` flag then frees the buffers for later rounds.
// A round (1 MiB) stays in cache from publish to gather, so the only memory traffic that is not
// cache-resident is the rank's own buffer: read once, written once. No message goes through the
// transport, and there is one copy in and one copy out of the segment instead of two per hop.
// Every element is reduced by exactly one rank, so all ranks end with bitwise-identical results.
//
// Agreement. Each round's publish carries the rank's description of the call (shm_call: the call's
// number on this communicator, the operation, dtype, reduce op, count and rounds) in its flag line,
// and round 0 of every call, once every peer has published, compares them all: ranks that disagree
// (another count, dtype or op, or a call the others did not make) all throw the same mismatch_error
// naming each description and its ranks, before anything is reduced. A call on an empty buffer
// still takes one round, to say so. The communicator is unusable afterwards (its rounds no longer
// line up): later collectives on it throw usage_error.
//
// Liveness. Each rank writes its pid into its flag line when the segment is made; a rank that
// sleeps waiting for a peer's counter asks every 100 ms whether that peer's process still runs, and
// throws peer_failure naming it when it has exited (killed, crashed): every survivor waits for every
// peer's publish of a round, so each names the dead rank itself, within a fraction of a second and
// whatever FLEXPAR_TIMEOUT says. A rank that is alive but stuck still ends at the deadline.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/collective/algorithm.hpp>
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

/// What a rank says about a collective call: published with each shared-memory round and compared
/// in round 0 (the file header); exchanged before a call through the transport elsewhere
/// (collective/call_agreement.hpp). Plain bytes, every one of them set (they are compared as bytes).
struct shm_call {
  std::uint64_t call = 0;                            // calls before this one on its path (segment or transport channel)
  std::uint64_t count = 0;                           // elements (0 where the operation states none)
  std::uint32_t rounds = 0;                          // rounds of this call through the segment (0: a transport call)
  std::uint32_t op = 0;                              // FNV-1a of the operation's name, "allreduce(shared_memory)"
  std::uint32_t layout = 0;                          // digest of uneven block counts (0: even, or none)
  std::int32_t root = -1;                            // root rank, or -1
  std::uint8_t type = 0xff;                          // dtype, or 0xff where the operation states none
  std::uint8_t reduce = 0xff;                        // reduce_op, or 0xff
  std::uint8_t algorithm = 0xff;                     // flexpar::algorithm of a transport call, or 0xff
  std::uint8_t flags = 0;                            // count_unstated
  static constexpr std::uint8_t count_unstated = 1;  // the count differs between ranks by design
  std::uint32_t reserved32 = 0;
  friend bool operator==(const shm_call&, const shm_call&) = default;
};
static_assert(sizeof(shm_call) == 40);

constexpr std::uint32_t op_hash(std::string_view name) noexcept {
  std::uint32_t h = 2166136261u;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  return h;
}

/// Where the flags, call descriptions and round buffers of each rank lie in the segment.
struct shm_geometry {
  static constexpr std::size_t flag_line = 192;  // per rank (one writer each): flags, then its shm_calls
  static std::size_t bytes(int p) {
    return flag_line * static_cast<std::size_t>(p) + static_cast<std::size_t>(p) * shm_depth * shm_round_bytes;
  }
  std::byte* base;
  int p;
  [[nodiscard]] shared_counter published(int q) const { return counter(q, 0); }
  [[nodiscard]] shared_counter reduced(int q) const { return counter(q, 1); }
  [[nodiscard]] shared_counter consumed(int q) const { return counter(q, 2); }
  /// Writes my pid where the waits on my counters read it (once, when the segment is made).
  void announce_pid(int me) const {
    auto* line = reinterpret_cast<std::uint32_t*>(base + flag_line * static_cast<std::size_t>(me));
    std::atomic_ref<std::uint32_t>(line[3]).store(static_cast<std::uint32_t>(my_pid()), std::memory_order_relaxed);
  }
  /// Rank q's description of its call in round `round` (one slot per round buffer).
  [[nodiscard]] std::byte* call_slot(int q, std::uint64_t round) const {
    return base + flag_line * static_cast<std::size_t>(q) + 64 + (round % shm_depth) * sizeof(shm_call);
  }
  [[nodiscard]] std::byte* round_buffer(int q, std::uint64_t round) const {
    return base + flag_line * static_cast<std::size_t>(p) +
           (static_cast<std::size_t>(q) * shm_depth + round % shm_depth) * shm_round_bytes;
  }

 private:
  // line of rank q: uint32 counters {published, reduced, consumed} at words 0..2, its pid at word
  // 3, the counters' waiters at 4..6; its shm_call of each round buffer from byte 64
  [[nodiscard]] shared_counter counter(int q, int which) const {
    auto* line = reinterpret_cast<std::uint32_t*>(base + flag_line * static_cast<std::size_t>(q));
    return shared_counter(line + which, line + 4 + which, line + 3);
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
    if (ctx.shm) shm_geometry{ctx.shm->data(), comm.size()}.announce_pid(comm.rank());
  }
  return ctx.shm.get();
}

/// My description of a call of `rounds` rounds (the next call number of `ctx`).
inline shm_call begin_shm_call(collective_context& ctx, std::string_view op, std::uint64_t rounds,
                               std::uint64_t count = 0, std::uint8_t type = 0xff, std::uint8_t reduce = 0xff,
                               std::int32_t root = -1, std::uint32_t layout = 0) {
  shm_call c;
  c.call = ctx.shm_calls++;
  c.count = count;
  c.rounds = static_cast<std::uint32_t>(rounds);
  c.op = op_hash(op);
  c.layout = layout;
  c.root = root;
  c.type = type;
  c.reduce = reduce;
  return c;
}

/// The name of an operation of flexpar's collective layer whose op_hash is `hash`, or "" (the
/// boxings' own names among others): to name the other side of a mismatch.
inline std::string_view known_operation(std::uint32_t hash) {
  static constexpr std::string_view names[] = {"allreduce",
                                               "allreduce(shared_memory)",
                                               "reduce_scatter",
                                               "reduce_scatter_v",
                                               "reduce_scatter(shared_memory)",
                                               "allgather",
                                               "allgather_v",
                                               "allgather_v_placed",
                                               "allgather(shared_memory)",
                                               "broadcast",
                                               "reduce",
                                               "alltoall",
                                               "alltoall_v",
                                               "alltoall_v_placed",
                                               "alltoall(shared_memory)",
                                               "barrier"};
  for (std::string_view n : names)
    if (op_hash(n) == hash) return n;
  return {};
}

/// "allreduce(shared_memory) of 1000 f32 (sum) in 1 round, call 4", "broadcast by chain of 8 u8 from
/// root 0, call 7": the operation is `op` when its hash is op's, a collective's name when it is
/// one, "another operation" otherwise.
inline std::string describe(const shm_call& c, std::string_view op) {
  const std::string_view known = c.op == op_hash(op) ? op : known_operation(c.op);
  std::string s = known.empty() ? std::string("another operation") : std::string(known);
  if (c.algorithm != 0xff) s.append(" by ").append(name_of(static_cast<algorithm>(c.algorithm)));
  const bool count_stated = (c.flags & shm_call::count_unstated) == 0;
  if (c.count != 0 || c.type != 0xff) s.append(" of");
  if (count_stated && (c.count != 0 || c.type != 0xff)) s.append(" ").append(std::to_string(c.count));
  if (c.type != 0xff) s.append(" ").append(name_of(static_cast<dtype>(c.type)));
  if (c.reduce != 0xff) s.append(" (").append(name_of(static_cast<reduce_op>(c.reduce))).append(")");
  if (c.layout != 0) s.append(" in uneven blocks #").append(std::to_string(c.layout));
  if (c.root >= 0) s.append(" at root ").append(std::to_string(c.root));
  if (c.rounds != 0) s.append(" in ").append(std::to_string(c.rounds)).append(c.rounds == 1 ? " round" : " rounds");
  return s.append(", call ").append(std::to_string(c.call));
}

/// The ranks that described a call alike, and their description.
struct call_group {
  shm_call call;            // their description
  std::vector<int> ranks;   // the ranks, ascending
  bool and_others = false;  // more ranks than `ranks` lists (too many to carry)
};

/// "the ranks disagree about the call: allreduce ... on ranks {0,1} but allreduce ... on rank {2}".
inline std::string disagreement_text(std::span<const call_group> groups, std::string_view op, bool more_kinds = false) {
  std::string text = "the ranks disagree about the call: ";
  for (std::size_t i = 0; i < groups.size(); ++i) {
    text.append(i == 0 ? "" : " but ")
        .append(describe(groups[i].call, op))
        .append(" on ")
        .append(rank_set(groups[i].ranks));
    if (groups[i].and_others) text.append(" and others");
  }
  if (more_kinds) text.append(" but still other calls on other ranks");
  return text;
}

/// Round 0 of a call, after every peer published round g: throws mismatch_error (the same ranks and
/// descriptions on every rank) unless every rank described the call as `mine`, and leaves `ctx`
/// broken (context_of refuses it from then on).
inline void check_shm_call(const communicator& comm, collective_context& ctx, const shm_geometry& shm, std::uint64_t g,
                           const shm_call& mine, std::string_view op) {
  const int p = comm.size();
  bool agree = true;  // the common case, compared in place: no copy, no allocation
  for (int q = 0; q < p && agree; ++q) agree = std::memcmp(shm.call_slot(q, g), &mine, sizeof(shm_call)) == 0;
  if (agree) return;
  std::vector<call_group> groups;  // in the order of their lowest rank
  for (int q = 0; q < p; ++q) {
    shm_call c;
    std::memcpy(&c, shm.call_slot(q, g), sizeof(shm_call));
    auto it = std::find_if(groups.begin(), groups.end(), [&](const call_group& g2) { return g2.call == c; });
    if (it == groups.end())
      groups.push_back({c, {q}});
    else
      it->ranks.push_back(q);
  }
  const mismatch_error e = error_on<mismatch_error>(comm.rank(), op, disagreement_text(groups, op));
  ctx.broken = e.what();
  throw e;
}

/// Writes my description of round g's call where peers read it; before the round's publish.
inline void post_shm_call(const shm_geometry& shm, int me, std::uint64_t g, const shm_call& mine) {
  std::memcpy(shm.call_slot(me, g), &mine, sizeof(shm_call));
}

/// Waits until counter_of(q) has reached `target` for every rank q but me.
template <class Counter>
void wait_for_peers(const communicator& comm, Counter&& counter_of, std::uint64_t target, const char* op,
                    const char* event, deadline until) {
  for (int q = 0; q < comm.size(); ++q) {
    if (q == comm.rank()) continue;
    counter_of(q).wait_until_reached(
        target, until, [&] { return error_text(comm.rank(), op, "rank ", q, " ", event, " round ", target - 1); },
        comm.transport().liveness());
  }
}

}  // namespace detail

/// One tensor of a grouped allreduce (allreduce_shared_memory_pieces): `count` elements read from `in`
/// and the result written to `out` (the same address for in place; otherwise the two do not overlap).
template <element T>
struct allreduce_piece {
  const T* in;        ///< `count` elements read
  T* out;             ///< `count` elements written (may be `in`)
  std::size_t count;  ///< elements of this tensor
};

namespace detail {

/// An allreduce's buffer as the algorithm sees it: `size()` elements, and for a range of them
/// for_each(lo, len, f) calls f(in, out, n, offset) once per stretch that lies in one piece of memory
/// (offset: from lo). contiguous_buffer is one span, reduced in place.
template <element T>
struct contiguous_buffer {
  std::span<T> data;
  [[nodiscard]] std::size_t size() const noexcept { return data.size(); }
  template <class F>
  void for_each(std::size_t lo, std::size_t len, F&& f) const {
    if (len != 0) f(static_cast<const T*>(data.data() + lo), data.data() + lo, len, std::size_t{0});
  }
};

/// Several tensors reduced as their concatenation (fusion without a fusion buffer): ranges of the
/// concatenation map back to the pieces, so that rounds copy straight from the inputs into the
/// segment and from the segment into the outputs.
template <element T>
class piecewise_buffer {
 public:
  explicit piecewise_buffer(std::span<const allreduce_piece<T>> pieces) : pieces_(pieces) {
    starts_.reserve(pieces.size() + 1);
    starts_.push_back(0);
    for (const allreduce_piece<T>& x : pieces) starts_.push_back(starts_.back() + x.count);
  }
  [[nodiscard]] std::size_t size() const noexcept { return starts_.back(); }
  template <class F>
  void for_each(std::size_t lo, std::size_t len, F&& f) const {
    if (len == 0) return;
    // the last piece that starts at or before lo (empty pieces share their successor's start)
    auto k = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), lo) - starts_.begin()) - 1;
    for (std::size_t done = 0; done < len; ++k) {
      const std::size_t at = lo + done - starts_[k];
      const std::size_t n = std::min(pieces_[k].count - at, len - done);
      if (n != 0) f(pieces_[k].in + at, pieces_[k].out + at, n, done);
      done += n;
    }
  }

 private:
  std::span<const allreduce_piece<T>> pieces_;
  std::vector<std::size_t> starts_;
};

/// The one-hand-off round of a small buffer (see the top of this file).
template <element T, class Buffer>
void one_shot_round(const communicator& comm, collective_context& ctx, const shm_geometry& shm, std::uint64_t g,
                    const shm_call& call, const Buffer& data, reduce_op op, deadline until) {
  const int p = comm.size(), me = comm.rank();
  auto slot = [&](int q, std::size_t at, std::size_t n) {
    return std::span<const T>(reinterpret_cast<const T*>(shm.round_buffer(q, g)) + at, n);
  };
  if (g >= shm_depth)
    wait_for_peers(
        comm, [&](int q) { return shm.consumed(q); }, g - shm_depth + 1, "allreduce(shared_memory)", "consuming",
        until);
  T* mine = reinterpret_cast<T*>(shm.round_buffer(me, g));
  data.for_each(0, data.size(),
                [&](const T* in, T*, std::size_t n, std::size_t at) { std::memcpy(mine + at, in, n * sizeof(T)); });
  post_shm_call(shm, me, g, call);
  shm.published(me).publish(g + 1);
  wait_for_peers(
      comm, [&](int q) { return shm.published(q); }, g + 1, "allreduce(shared_memory)", "publishing", until);
  check_shm_call(comm, ctx, shm, g, call, "allreduce(shared_memory)");
  data.for_each(0, data.size(), [&](const T*, T* out, std::size_t n, std::size_t at) {
    const std::span<T> result(out, n);
    if constexpr (average_folds<T>) {
      if (p == 2 && op == reduce_op::avg) {  // the sum and the division in one pass
        average_into_forward(result, slot(0, at, n), slot(1, at, n), p);
        return;
      }
    }
    reduce_into(result, slot(0, at, n), slot(1, at, n), op);
    for (int q = 2; q < p; ++q) reduce_into(result, slot(q, at, n), op);
    if (op == reduce_op::avg) scale_for_average(result, p);
  });
  shm.reduced(me).publish(g + 1);
  shm.consumed(me).publish(g + 1);
}

/// The rounds of allreduce(shared_memory) over `data` (a contiguous_buffer or a piecewise_buffer).
template <element T, class Buffer>
void allreduce_shared_memory_rounds(communicator& comm, const Buffer& data, reduce_op op) {
  const int p = comm.size(), me = comm.rank();
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
  const std::size_t total = data.size();
  const std::size_t per_round = shm_round_bytes / sizeof(T);
  const std::size_t rounds = (total + per_round - 1) / per_round;

  const auto describe_call = [&](std::uint64_t n) {
    return begin_shm_call(ctx, "allreduce(shared_memory)", n, total, static_cast<std::uint8_t>(dtype_of<T>),
                          static_cast<std::uint8_t>(op));
  };
  if (total * sizeof(T) <= shm_one_shot_bytes) {  // an empty buffer too: its round says so
    one_shot_round<T>(comm, ctx, shm, ctx.shm_rounds++, describe_call(1), data, op, until);
    return;
  }
  const shm_call call = describe_call(rounds);
  const bool streaming = total * sizeof(T) >= shm_streaming_bytes;
  for (std::size_t k = 0; k < rounds; ++k) {
    const std::uint64_t g = ctx.shm_rounds + k;
    const std::size_t base = k * per_round, size = std::min(per_round, total - base);
    auto part = [&](int q) {  // [lo, lo + len) of part q within the round
      const std::size_t lo = size * static_cast<std::size_t>(q) / static_cast<std::size_t>(p);
      const std::size_t hi = size * static_cast<std::size_t>(q + 1) / static_cast<std::size_t>(p);
      return std::pair{lo, hi - lo};
    };
    auto slot = [&](int q) { return reinterpret_cast<T*>(shm.round_buffer(q, g)); };
    // step 1: my round buffer is free once every peer consumed round g - depth
    if (g >= shm_depth)
      wait_for_peers(
          comm, [&](int q) { return shm.consumed(q); }, g - shm_depth + 1, "allreduce(shared_memory)", "consuming",
          until);
    // step 2: publish the parts the others reduce
    for (int q = 0; q < p; ++q) {
      if (q == me) continue;
      const auto [lo, len] = part(q);
      data.for_each(base + lo, len, [&](const T* in, T*, std::size_t n, std::size_t at) {
        std::memcpy(slot(me) + lo + at, in, n * sizeof(T));
      });
    }
    post_shm_call(shm, me, g, call);
    shm.published(me).publish(g + 1);
    // step 3: reduce my part out of every peer's buffer, then share the result
    wait_for_peers(
        comm, [&](int q) { return shm.published(q); }, g + 1, "allreduce(shared_memory)", "publishing", until);
    if (k == 0) check_shm_call(comm, ctx, shm, g, call, "allreduce(shared_memory)");
    const auto [my_lo, my_len] = part(me);
    data.for_each(base + my_lo, my_len, [&](const T* in, T* out, std::size_t n, std::size_t at) {
      const std::span<T> result(out, n);
      bool first = true;  // the input, then every peer's part in rank order (as in place)
      bool averaged = false;
      for (int q = 0; q < p; ++q) {
        if (q == me) continue;
        const std::span<const T> theirs(slot(q) + my_lo + at, n);
        const bool last = q == p - 1 || (q == p - 2 && me == p - 1);
        if constexpr (average_folds<T>) {
          if (last && op == reduce_op::avg) {  // the sum's last term and the division in one pass
            average_into_forward(result, first ? std::span<const T>(in, n) : std::span<const T>(result), theirs, p);
            averaged = true;
            continue;
          }
        }
        if (first)
          reduce_into_forward(result, std::span<const T>(in, n), theirs, op);
        else
          reduce_into(result, theirs, op);
        first = false;
      }
      if (op == reduce_op::avg && !averaged) scale_for_average(result, p);
      std::memcpy(slot(me) + my_lo + at, out, n * sizeof(T));
    });
    shm.reduced(me).publish(g + 1);
    // step 4: gather the parts the others reduced
    wait_for_peers(
        comm, [&](int q) { return shm.reduced(q); }, g + 1, "allreduce(shared_memory)", "reducing", until);
    for (int q = 0; q < p; ++q) {
      if (q == me) continue;
      const auto [lo, len] = part(q);
      data.for_each(base + lo, len, [&](const T*, T* out, std::size_t n, std::size_t at) {
        auto* to = reinterpret_cast<std::byte*>(out);
        const auto* from = reinterpret_cast<const std::byte*>(slot(q) + lo + at);
        if (streaming)
          copy_streaming(to, from, n * sizeof(T));
        else
          std::memcpy(to, from, n * sizeof(T));
      });
    }
    shm.consumed(me).publish(g + 1);
  }
  ctx.shm_rounds += rounds;
}

template <element T>
void allreduce_shared_memory(communicator& comm, std::span<T> data, reduce_op op) {
  if (comm.size() == 1) return;
  allreduce_shared_memory_rounds<T>(comm, contiguous_buffer<T>{data}, op);
}

}  // namespace detail

/// Collective: allreduce(shared_memory) of several tensors as one call, each read from its `in` and
/// written to its `out` with no fusion buffer (the engine's fused allreduce when `automatic` picks
/// shared_memory): the result is the one allreduce of their concatenation gives (bitwise), avg
/// included, and the call agrees with the other ranks by the concatenation's count.
/// @pre every rank passes pieces whose counts add up to the same total; how they are cut may differ.
/// @throws usage_error when `comm` spans more than one node or a rank could not map the segment;
///         mismatch_error when the ranks' totals, dtypes or ops differ; timeout_error at the deadline.
template <element T>
void allreduce_shared_memory_pieces(communicator& comm, std::span<const allreduce_piece<T>> pieces, reduce_op op) {
  if (comm.size() == 1) {
    for (const allreduce_piece<T>& x : pieces)
      if (x.count != 0 && x.in != x.out) std::memcpy(x.out, x.in, x.count * sizeof(T));
    return;
  }
  detail::allreduce_shared_memory_rounds<T>(comm, detail::piecewise_buffer<T>(pieces), op);
}

}  // namespace flexpar
