// flexpar/collective/call_agreement.hpp — before a collective moves data over the transport, its
// ranks agree that they are in the same call: the operation, algorithm, dtype, count (or a digest of
// uneven counts), reduce op and root. Ranks that disagree all throw one mismatch_error naming each
// description and its ranks, before any byte of data is sent: no result, no write into any buffer.
//
// Why: through the transport a disagreement was caught only where a receive got a message of another
// size than it computed (transport::irecv_exact): the ranks that received from the odd one failed,
// the others waited for them until their deadline, and a disagreement of equal byte counts (another
// dtype of the same size, another reduce op, another root) gave a wrong result with no error at all.
// The shared-memory calls compare descriptions in their first round already
// (collective/allreduce_shared_memory.hpp, "Agreement"); this is the same check for the rest.
//
// Script (rank r of p, description d):
//   one node, segment mapped: one round through the communicator's segment without data: publish d
//     in my flag line, wait for every peer's publish of the round, compare them all (check_shm_call).
//     A rank on the shared-memory path of the same call compares in the same round, so ranks whose
//     counts sent them down different paths (automatic) disagree instead of waiting on each other.
//     The communicator is unusable after a disagreement (its rounds no longer line up).
//   otherwise: dissemination over the collective channel, ceil(log2 p) steps; in step k send what I
//     have seen to rank r + 2^k and merge what rank r - 2^k has seen, so that after the last step
//     every rank has seen every description. What travels is a fixed-size summary (agreement_message):
//     up to four distinct descriptions, each with its lowest rank and the ranks below 64 holding it.
//     Every message is received, so the channel stays in step: the communicator remains usable after
//     a disagreement.
// Cost: one segment hand-off (one node), or ceil(log2 p) latencies of a 232-byte message
// (doc/collectives.md has the measured table).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <flexpar/collective/algorithm.hpp>
#include <flexpar/collective/allreduce_shared_memory.hpp>
#include <flexpar/collective/context.hpp>
#include <flexpar/collective/shared_memory_rounds.hpp>

namespace flexpar {

/// For call_facts::layout: 0 when `counts` are block_layout::even's for their total (the count then
/// says it all), a digest of them otherwise (never 0).
inline std::uint32_t block_layout_digest(std::span<const std::size_t> counts) noexcept {
  const std::size_t p = counts.size();
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  bool even = true;
  for (std::size_t i = 0; i < p && even; ++i) even = counts[i] == total / p + (i < total % p ? 1 : 0);
  if (even) return 0;
  std::uint32_t h = 2166136261u;
  for (std::size_t c : counts)
    for (int byte = 0; byte < 8; ++byte) h = (h ^ static_cast<std::uint8_t>(c >> (8 * byte))) * 16777619u;
  return h == 0 ? 1 : h;
}

namespace detail {

/// One distinct description in an agreement_message: its lowest rank and its ranks below 64.
struct agreement_entry {
  shm_call call;
  std::int32_t lowest = 0;
  std::uint32_t reserved = 0;
  std::uint64_t ranks = 0;  // bit q: rank q (q < 64) described the call as `call`
};

inline constexpr std::uint32_t agreement_kinds = 4;

/// What a rank has seen of the others' descriptions so far.
struct agreement_message {
  std::uint32_t kinds = 0;  // entries in use, ordered by their lowest rank
  std::uint32_t more = 0;   // 1: some description did not fit
  agreement_entry entry[agreement_kinds];
};
static_assert(sizeof(agreement_message) == 232);

/// Adds what `from` has seen to `into`. `from` came over the wire: only its first
/// min(kinds, agreement_kinds) entries are read.
inline void merge_into(agreement_message& into, const agreement_message& from) {
  const std::span<const agreement_entry> incoming(from.entry, std::min(from.kinds, agreement_kinds));
  for (const agreement_entry& e : incoming) {
    const std::span<agreement_entry> have(into.entry, std::min(into.kinds, agreement_kinds));
    auto same = std::find_if(have.begin(), have.end(), [&](const agreement_entry& x) { return x.call == e.call; });
    if (same != have.end()) {
      same->lowest = std::min(same->lowest, e.lowest);
      same->ranks |= e.ranks;
    } else if (into.kinds < agreement_kinds) {
      into.entry[into.kinds++] = e;
    } else {  // keep the kinds of the lowest ranks: the same four on every rank once all is merged
      into.more = 1;
      auto worst =
          std::max_element(have.begin(), have.end(), [](const auto& a, const auto& b) { return a.lowest < b.lowest; });
      if (e.lowest < worst->lowest) *worst = e;
    }
  }
  into.more |= from.more;
  const std::span<agreement_entry> have(into.entry, std::min(into.kinds, agreement_kinds));
  std::sort(have.begin(), have.end(), [](const auto& a, const auto& b) { return a.lowest < b.lowest; });
}

/// The dissemination of the file header over the collective channel.
inline void agree_over_transport(communicator& comm, shm_call mine, const char* op) {
  call c = begin_call(comm);
  mine.call = static_cast<std::uint64_t>(c.tag);
  agreement_message seen;
  seen.kinds = 1;
  seen.entry[0] = {mine, c.rank, 0, c.rank < 64 ? std::uint64_t{1} << c.rank : 0};
  for (int d = 1; d < c.size; d *= 2) {
    const agreement_message out = seen;
    agreement_message in;
    request received = c.irecv(modulo(c.rank - d, c.size), std::as_writable_bytes(std::span(&in, 1)));
    request sent = c.t.isend(modulo(c.rank + d, c.size), c.tag, std::as_bytes(std::span(&out, 1)));
    received.wait(c.until);
    sent.wait(c.until);
    merge_into(seen, in);
  }
  if (seen.kinds == 1 && seen.more == 0) return;
  std::vector<call_group> groups;
  for (const agreement_entry& e : std::span<const agreement_entry>(seen.entry, std::min(seen.kinds, agreement_kinds))) {
    call_group g{e.call, {}, c.size > 64};
    for (int q = 0; q < std::min(c.size, 64); ++q)
      if ((e.ranks >> q) & 1u) g.ranks.push_back(q);
    if (g.ranks.empty() || g.ranks.front() != e.lowest) g.ranks.insert(g.ranks.begin(), e.lowest);
    groups.push_back(std::move(g));
  }
  throw error_on<mismatch_error>(c.rank, op, disagreement_text(groups, op, seen.more != 0));
}

/// The agreement of the file header for a call of `op` by algorithm `a` (not shared_memory: those
/// calls compare in their own first round). Collective over `comm`; nothing for p == 1.
/// @throws mismatch_error on every rank when the ranks disagree.
inline void agree_on_call(communicator& comm, const char* op, algorithm a, const call_facts& facts) {
  const int p = comm.size(), me = comm.rank();
  if (p == 1) return;
  collective_context& ctx = context_of(comm);
  const auto type = facts.type ? static_cast<std::uint8_t>(*facts.type) : std::uint8_t{0xff};
  const auto reduce = facts.op ? static_cast<std::uint8_t>(*facts.op) : std::uint8_t{0xff};
  shared_memory_segment* segment = one_node_segment(comm);
  if (segment == nullptr) {
    shm_call mine;
    mine.count = facts.count;
    mine.op = op_hash(op);
    mine.layout = facts.layout;
    mine.root = facts.root.value_or(-1);
    mine.type = type;
    mine.reduce = reduce;
    mine.algorithm = static_cast<std::uint8_t>(a);
    if (facts.count_differs) mine.flags = shm_call::count_unstated;
    agree_over_transport(comm, mine, op);
    return;
  }
  shm_call mine = begin_shm_call(ctx, op, 0, facts.count, type, reduce, facts.root.value_or(-1), facts.layout);
  mine.algorithm = static_cast<std::uint8_t>(a);
  if (facts.count_differs) mine.flags = shm_call::count_unstated;
  const shm_geometry shm{segment->data(), p};
  const deadline until = comm.default_deadline();
  const std::uint64_t g = ctx.shm_rounds;
  if (g >= shm_depth)
    wait_for_peers(
        comm, [&](int q) { return shm.consumed(q); }, g - shm_depth + 1, op, "consuming", until);
  post_shm_call(shm, me, g, mine);
  shm.published(me).publish(g + 1);
  wait_for_peers(
      comm, [&](int q) { return shm.published(q); }, g + 1, op, "publishing", until);
  check_shm_call(comm, ctx, shm, g, mine, op);
  shm.reduced(me).publish(g + 1);
  shm.consumed(me).publish(g + 1);
  ctx.shm_rounds = g + 1;
}

}  // namespace detail
}  // namespace flexpar
