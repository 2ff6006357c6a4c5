// lib/cuda/ipc_group.cpp — the device intra-node path: see ipc_group.hpp for the scripts and the
// barriers.
#include "ipc_group.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <type_traits>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/process.hpp>
#include <flexpar/cuda/kernels.hpp>
#include <flexpar/cuda/runtime.hpp>

namespace flexpar::cuda::detail {
namespace {

using flexpar::process_gone;
using flexpar::shared_counter;
using flexpar::shared_memory_segment;

/// Barrier events per rank. A rank re-records the event of barrier b at barrier b + event_ring; by
/// then it has passed barrier b + event_ring - 1, so every peer has passed barrier b + 1 and has
/// therefore already enqueued its wait for barrier b (waits are enqueued before the next signal).
/// Two would do; four leave room.
constexpr int event_ring = 4;

/// The bytes of staging below which a round is not cut (so that p blocks of a round fit).
constexpr std::size_t min_round_bytes = std::size_t{64} << 10;

/// What each rank tells the others once, when the group is made.
struct card {
  std::int64_t pid = 0;
  std::int32_t device = 0;
  std::int32_t ok = 0;
  std::array<char, 32> bus{};         // the GPU's PCI bus id: which ranks share one GPU, whatever they call it
  std::uint64_t staging_address = 0;  // in the owner's address space (threads of one process use it)
  std::array<std::uint64_t, event_ring> event_address{};
  cudaIpcMemHandle_t staging_handle{};
  std::array<cudaIpcEventHandle_t, event_ring> event_handle{};
};
static_assert(std::is_trivially_copyable_v<card>);

enum class op_code : std::uint32_t { allreduce, reduce_scatter, allgather, broadcast, alltoall };

constexpr std::string_view name_of(op_code op) noexcept {
  switch (op) {
    case op_code::allreduce: return "allreduce";
    case op_code::reduce_scatter: return "reduce_scatter";
    case op_code::allgather: return "allgather";
    case op_code::broadcast: return "broadcast";
    case op_code::alltoall: return "alltoall";
  }
  return "?";
}

/// The description of a call that every rank leaves beside its counter before the call's first
/// barrier (see the top of ipc_group.hpp).
struct call_note {
  std::uint64_t call = 0;
  op_code op = op_code::allreduce;
  dtype type = dtype::f32;
  reduce_op reduction = reduce_op::sum;
  std::int32_t root = 0;
  std::uint64_t count = 0;

  [[nodiscard]] bool agrees_with(const call_note& o) const noexcept {
    return call == o.call && op == o.op && type == o.type && count == o.count &&
           (op != op_code::broadcast || root == o.root) &&
           ((op != op_code::allreduce && op != op_code::reduce_scatter) || reduction == o.reduction);
  }
  [[nodiscard]] std::string text() const {
    std::string t =
        std::string(name_of(op)) + " of " + std::to_string(count) + " " + std::string(flexpar::name_of(type));
    if (op == op_code::reduce_scatter || op == op_code::allgather) t += " per rank";
    if (op == op_code::alltoall) t += " per block";
    if (op == op_code::allreduce || op == op_code::reduce_scatter)
      t += " (" + std::string(flexpar::name_of(reduction)) + ")";
    if (op == op_code::broadcast) t += " from root " + std::to_string(root);
    return t;
  }
};
static_assert(std::is_trivially_copyable_v<call_note>);

/// One rank's part of the host segment: its counter and its teardown flag (each a word and its
/// waiters' word for shared_counter), and the notes of its calls: call c's in note[c % 2]. A peer
/// reads my note of call c after the first barrier of c and before it signals a barrier of c + 1,
/// and I cannot pass a barrier of c + 1, nor write the note of c + 2, before that signal.
struct alignas(64) rank_line {
  std::uint32_t barrier = 0, barrier_waiters = 0;
  std::uint32_t closed = 0, closed_waiters = 0;
  alignas(64) call_note note[2];
};

std::string rank_list(const std::vector<int>& ranks) {
  std::string t = ranks.size() == 1 ? "rank {" : "ranks {";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i) t += ',';  // appended apart: GCC 12 warns -Wrestrict on ("," + std::string)
    t += std::to_string(ranks[i]);
  }
  t += '}';
  return t;
}

}  // namespace

struct ipc_group::state {
  communicator* host = nullptr;
  int me = 0, p = 1, device = 0;
  std::size_t round_bytes = 0;
  ipc_sync sync = ipc_sync::events;
  std::chrono::milliseconds timeout{0};

  stream own;
  event ordered{false};
  event finished{false};
  device_buffer<std::byte> staging;
  std::vector<event> events;  // mine, interprocess, event_ring of them

  std::vector<card> cards;                                       // every rank's
  std::vector<std::byte*> peer_staging;                          // every rank's staging, in my address space
  std::vector<std::array<cudaEvent_t, event_ring>> peer_events;  // every rank's events, usable here
  std::vector<bool> imported;                                    // opened through IPC (closed at the end)
  std::unique_ptr<shared_memory_segment> segment;

  std::uint64_t barriers = 0;  // barriers passed: the value of my counter
  std::uint64_t calls = 0;
  std::uint64_t rounds = 0;  // rounds run, over every call: round g uses staging slot g % 2
  ipc_allreduce script = ipc_allreduce::automatic;
  double alpha = 0, gamma = 0, link_beta = 0;  // of the cost (device_options)
  std::string broken;                          // why the group is unusable, once a call failed after its first step
  std::string_view op_name;                    // of the call in progress, for messages

  [[nodiscard]] rank_line& line(int q) const {
    return reinterpret_cast<rank_line*>(segment->data())[static_cast<std::size_t>(q)];
  }
  [[nodiscard]] shared_counter counter(int q) const { return {&line(q).barrier, &line(q).barrier_waiters}; }
  [[nodiscard]] shared_counter closed(int q) const { return {&line(q).closed, &line(q).closed_waiters}; }

  /// Rank q's staging slot of round g, in my address space.
  [[nodiscard]] std::byte* slot(int q, std::uint64_t g) const {
    return peer_staging[static_cast<std::size_t>(q)] + (g % 2) * round_bytes;
  }

  [[nodiscard]] std::string prefix() const {
    return on_rank(me, std::string("device ").append(op_name).append(" (ipc)"));
  }

  /// Waits until rank q's counter reaches `target`, checking every 200 ms whether q's process still
  /// exists (a dead peer is named at once, not at the deadline).
  void wait_for(const shared_counter& c, int q, std::uint64_t target, std::string_view step, deadline until) const {
    for (;;) {
      const deadline slice = std::min(until, clock::now() + std::chrono::milliseconds(200));
      try {
        c.wait_until_reached(target, slice, [] { return std::string(); });
        return;
      } catch (const timeout_error&) {
        if (cards[static_cast<std::size_t>(q)].pid != cards[static_cast<std::size_t>(me)].pid &&
            process_gone(cards[static_cast<std::size_t>(q)].pid))
          throw peer_failure(prefix() + "rank " + std::to_string(q) + " (pid " +
                             std::to_string(cards[static_cast<std::size_t>(q)].pid) +
                             ") has exited; it did not reach step '" + std::string(step) + "' of call #" +
                             std::to_string(calls));
        if (clock::now() >= until)
          throw timeout_error(prefix() + "rank " + std::to_string(q) + " did not reach step '" + std::string(step) +
                              "' of call #" + std::to_string(calls) + " within " + std::to_string(timeout.count()) +
                              " ms (a rank that skipped the call, or is stuck)");
      }
    }
  }

  /// signal + await (see the top of ipc_group.hpp).
  void barrier(std::string_view step) {
    const std::uint64_t target = ++barriers;
    const auto slot = static_cast<std::size_t>(target % event_ring);
    events[slot].record(own);
    if (sync == ipc_sync::host)
      wait(events[slot], timeout, std::string(op_name) + " (ipc) step " + std::string(step), me);
    counter(me).publish(target);
    const deadline until = deadline_after(timeout);
    for (int q = 0; q < p; ++q) {
      if (q == me) continue;
      wait_for(counter(q), q, target, step, until);
      if (sync == ipc_sync::events)
        FLEXPAR_CHECK_CUDA(me, cudaStreamWaitEvent(own, peer_events[static_cast<std::size_t>(q)][slot], 0));
    }
  }

  /// After the first barrier of a call: every peer's note against mine.
  void check_notes() const {
    const call_note& mine = line(me).note[calls % 2];
    std::vector<call_note> notes(static_cast<std::size_t>(p));
    bool agree = true;
    for (int q = 0; q < p; ++q) {
      std::memcpy(&notes[static_cast<std::size_t>(q)], &line(q).note[calls % 2], sizeof(call_note));
      agree = agree && notes[static_cast<std::size_t>(q)].agrees_with(mine);
    }
    if (agree) return;
    // Group the ranks by what they called, in rank order of first appearance.
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int q = 0; q < p; ++q) {
      const std::string t = notes[static_cast<std::size_t>(q)].text();
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == t; });
      if (it == groups.end())
        groups.push_back({t, {q}});
      else
        it->second.push_back(q);
    }
    std::string text = prefix() + "the ranks disagree on call #" + std::to_string(calls) + ": ";
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (g) text += ", but ";
      text += groups[g].first;
      text += " on ";
      text += rank_list(groups[g].second);
    }
    throw mismatch_error(text);
  }

  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0 || dst == src) return;
    FLEXPAR_CHECK_CUDA(me, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, own));
  }

  /// The operands of my reduction in round g: my own copy first (as the host's shared-memory path
  /// folds them), then every peer's slot at `offset`, in rank order.
  void gather_sources(std::vector<const void*>& sources, const std::byte* own_copy, std::uint64_t g,
                      std::size_t offset) const {
    sources.clear();
    sources.push_back(own_copy);
    for (int q = 0; q < p; ++q)
      if (q != me) sources.push_back(slot(q, g) + offset);
  }

  void reduce(dtype t, void* dst, std::vector<const void*>& sources, std::size_t count, reduce_op op) {
    if (count == 0) return;
    reduce_into(t, dst, std::span<const void* const>(sources), count, op, own);
    if (op == reduce_op::avg) {
      visit_dtype(t, [&](auto zero) {
        using T = decltype(zero);
        scale_for_average(device_span<T>(static_cast<T*>(dst), count), p, own);
      });
    }
  }

  /// Runs one call: the note, the caller's order in and out, and the failure that makes the group
  /// unusable (a failed call leaves the ranks' counters apart).
  void run(call_note note, cudaStream_t caller, const std::function<void()>& script) {
    op_name = name_of(note.op);
    if (!broken.empty())
      throw usage_error(prefix() + "this device communicator's intra-node path is unusable after an earlier failure (" +
                        broken + ")");
    note.call = ++calls;
    std::memcpy(&line(me).note[calls % 2], &note, sizeof note);
    try {
      ordered.record(caller);
      stream_wait(own, ordered);
      script();
      finished.record(own);
      stream_wait(caller, finished);
    } catch (const std::exception& e) {
      broken = e.what();
      throw;
    }
  }
};

ipc_group::ipc_group(std::unique_ptr<state> s) : s_(std::move(s)) {}

std::unique_ptr<ipc_group> ipc_group::create(communicator& host, int device, const device_options& options) {
  if (host.topology().node_count() != 1) return nullptr;  // every rank sees the same topology
  auto s = std::make_unique<state>();
  s->host = &host;
  s->me = host.rank();
  s->p = host.size();
  s->device = device;
  s->round_bytes = std::max(options.ipc_round_bytes, min_round_bytes);
  s->sync = options.ipc_sync_mode;
  s->script = options.ipc_allreduce_script;
  s->gamma = options.device_gamma;
  s->link_beta = options.device_link.beta;
  s->timeout = std::chrono::duration_cast<std::chrono::milliseconds>(host.settings().timeout);
  const auto p = static_cast<std::size_t>(s->p);

  card mine;
  mine.pid = ::getpid();
  mine.device = device;
  mine.ok = 1;
  try {
    FLEXPAR_CHECK_CUDA(s->me, cudaDeviceGetPCIBusId(mine.bus.data(), static_cast<int>(mine.bus.size()), device));
    s->staging = device_buffer<std::byte>(2 * s->round_bytes);  // two slots: rounds g and g + 1
    for (int k = 0; k < event_ring; ++k) s->events.emplace_back(false, true);
    mine.staging_address = reinterpret_cast<std::uint64_t>(s->staging.data());
    FLEXPAR_CHECK_CUDA(s->me, cudaIpcGetMemHandle(&mine.staging_handle, s->staging.data()));
    for (int k = 0; k < event_ring; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      mine.event_address[kk] = reinterpret_cast<std::uint64_t>(s->events[kk].get());
      FLEXPAR_CHECK_CUDA(s->me, cudaIpcGetEventHandle(&mine.event_handle[kk], s->events[kk].get()));
    }
  } catch (const transport_error&) {
    (void)cudaGetLastError();
    mine.ok = 0;
  }
  s->cards.resize(p);
  flexpar::allgather(host, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(&mine), sizeof mine),
                     std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(s->cards.data()), sizeof(card) * p));

  // Map every peer's staging and events: raw in one process, through IPC across processes.
  s->peer_staging.assign(p, nullptr);
  s->peer_events.assign(p, {});
  s->imported.assign(p, false);
  int ok = mine.ok;
  for (std::size_t q = 0; q < p && ok; ++q) {
    const card& c = s->cards[q];
    if (!c.ok) {
      ok = 0;
      break;
    }
    if (static_cast<int>(q) == s->me) {
      s->peer_staging[q] = s->staging.data();
      for (int k = 0; k < event_ring; ++k)
        s->peer_events[q][static_cast<std::size_t>(k)] = s->events[static_cast<std::size_t>(k)].get();
      continue;
    }
    if (c.pid == mine.pid) {
      if (c.device != device) {
        int can = 0;
        if (cudaDeviceCanAccessPeer(&can, device, c.device) != cudaSuccess || !can) {
          ok = 0;
          break;
        }
        const cudaError_t e = cudaDeviceEnablePeerAccess(c.device, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) ok = 0;
        (void)cudaGetLastError();
      }
      s->peer_staging[q] = reinterpret_cast<std::byte*>(c.staging_address);
      for (int k = 0; k < event_ring; ++k)
        s->peer_events[q][static_cast<std::size_t>(k)] =
            reinterpret_cast<cudaEvent_t>(c.event_address[static_cast<std::size_t>(k)]);
      continue;
    }
    void* mapped = nullptr;
    if (cudaIpcOpenMemHandle(&mapped, c.staging_handle, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) {
      (void)cudaGetLastError();
      ok = 0;
      break;
    }
    s->imported[q] = true;
    s->peer_staging[q] = static_cast<std::byte*>(mapped);
    for (int k = 0; k < event_ring; ++k) {
      const auto kk = static_cast<std::size_t>(k);
      if (cudaIpcOpenEventHandle(&s->peer_events[q][kk], c.event_handle[kk]) != cudaSuccess) {
        (void)cudaGetLastError();
        s->peer_events[q][kk] = nullptr;
        ok = 0;
      }
    }
  }
  flexpar::allreduce(host, std::span(&ok, 1), reduce_op::min);
  if (ok) {
    s->segment = make_shared_memory_segment(host, sizeof(rank_line) * p);
    ok = s->segment ? 1 : 0;  // create() agrees across the ranks
  }
  if (!ok) {
    // Close what I opened, and free mine only after every peer has closed what it opened of mine.
    for (std::size_t q = 0; q < p; ++q) {
      if (!s->imported[q]) continue;
      (void)cudaIpcCloseMemHandle(s->peer_staging[q]);
      for (cudaEvent_t e : s->peer_events[q])
        if (e) (void)cudaEventDestroy(e);
    }
    s->imported.assign(p, false);
    int done = 1;
    flexpar::allreduce(host, std::span(&done, 1), reduce_op::min);
    return nullptr;
  }
  auto group = std::unique_ptr<ipc_group>(new ipc_group(std::move(s)));
  group->s_->alpha = group->ranks_per_device() > 1 ? options.ipc_shared_alpha : options.ipc_alpha;
  return group;
}

ipc_group::~ipc_group() {
  state& s = *s_;
  const device_guard on(s.device);
  // My queued work may still read the peers' staging: let it end (bounded), then close my mappings,
  // say so, and free my own buffers only once every live peer has closed its mappings of them.
  const auto bound = std::min<std::chrono::milliseconds>(s.timeout, std::chrono::seconds(10));
  try {
    synchronize(s.own, bound, "device intra-node path: teardown", s.me);
  } catch (const error&) {
  }
  for (std::size_t q = 0; q < s.imported.size(); ++q) {
    if (!s.imported[q]) continue;
    (void)cudaIpcCloseMemHandle(s.peer_staging[q]);
    for (cudaEvent_t e : s.peer_events[q])
      if (e) (void)cudaEventDestroy(e);
  }
  s.closed(s.me).publish(1);
  const deadline until = deadline_after(bound);
  for (int q = 0; q < s.p; ++q) {
    if (q == s.me) continue;
    try {
      s.wait_for(s.closed(q), q, 1, "teardown", until);
    } catch (const error&) {
      // a peer that died or never tears down cannot touch my memory any more through a live call
    }
  }
  (void)cudaGetLastError();
}

std::size_t ipc_group::round_bytes() const noexcept { return s_->round_bytes; }

// Bytes read + written in device memory by one rank (the scripts above), at device_gamma, slowed by
// the ranks that share its GPU's memory; the bytes read out of peers' slots cross the device link
// when the ranks hold different GPUs; alpha per barrier of every round.
double ipc_group::cost(std::string_view op, double b) const {
  const state& s = *s_;
  const double p = s.p, others = (p - 1) / p;
  const double rounds = std::max(1.0, std::ceil(b / static_cast<double>(s.round_bytes)));
  double moved = 2 * b, remote = b * others, steps = 1;  // alltoall, and the others' defaults
  if (op == "allreduce") {
    const bool shot = one_shot(static_cast<std::size_t>(b));
    moved = shot ? (p + 3) * b : 4 * b * others + b + 3 * b / p;
    remote = shot ? b * (p - 1) : 2 * b * others;
    steps = shot ? 1 : 2;
  } else if (op == "reduce_scatter") {
    moved = 2 * b * others + b + b / p;
  } else if (op == "allgather") {
    moved = 4 * b / p + 2 * b * others;
  } else if (op == "broadcast") {
    remote = b;
  }
  const double link = crosses_devices() ? remote * s.link_beta : 0.0;
  return moved * s.gamma * ranks_per_device() + link + steps * rounds * s.alpha;
}

bool ipc_group::one_shot(std::size_t bytes) const {
  const state& s = *s_;
  if (s.script != ipc_allreduce::automatic) return s.script == ipc_allreduce::one_shot;
  // the two scripts' costs for this buffer (as cost() prices them)
  const double b = static_cast<double>(bytes), p = s.p, others = (p - 1) / p;
  const double rounds = std::max(1.0, std::ceil(b / static_cast<double>(s.round_bytes)));
  const double scale = s.gamma * ranks_per_device();
  const double link = crosses_devices() ? s.link_beta : 0.0;
  const double one = (p + 3) * b * scale + b * (p - 1) * link + rounds * s.alpha;
  const double two = (4 * b * others + b + 3 * b / p) * scale + 2 * b * others * link + 2 * rounds * s.alpha;
  return one <= two;
}
int ipc_group::ranks_per_device() const noexcept {
  int most = 1;
  for (const card& a : s_->cards) {
    const auto same = std::count_if(s_->cards.begin(), s_->cards.end(), [&](const card& b) { return a.bus == b.bus; });
    most = std::max(most, static_cast<int>(same));
  }
  return most;
}
bool ipc_group::crosses_devices() const noexcept {
  return std::any_of(s_->cards.begin(), s_->cards.end(), [&](const card& c) { return c.bus != s_->cards[0].bus; });
}
ipc_sync ipc_group::sync() const noexcept { return s_->sync; }

// ---- the scripts ------------------------------------------------------------------------------------

namespace {
/// One rank: the collective is a copy (or nothing), on the caller's stream.
void local_copy(void* dst, const void* src, std::size_t bytes, cudaStream_t caller) {
  if (bytes == 0 || dst == src) return;
  FLEXPAR_CHECK_CUDA(0, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, caller));
}
}  // namespace

// Every script below reads the peers' slots of round g only before it signals the first barrier of
// round g + 1, and writes my slot of round g + 2 only after it has awaited that barrier of every peer
// (in events mode my stream waits for the peers' events; in host mode their work is done): so no
// slot is overwritten while a peer may read it, with no barrier at the end of a call.

/// The rounds of a call over `count` elements, `per_round` at a time (one empty round for count 0,
/// so that every call meets its peers at least once and compares the notes).
struct round_plan {
  std::size_t count, per_round;
  [[nodiscard]] std::size_t rounds() const noexcept {
    return std::max<std::size_t>(1, (count + per_round - 1) / per_round);
  }
  [[nodiscard]] std::size_t begin(std::size_t r) const noexcept { return r * per_round; }
  [[nodiscard]] std::size_t size(std::size_t r) const noexcept {
    return count == 0 ? 0 : std::min(per_round, count - r * per_round);
  }
};

void ipc_group::allreduce(dtype t, void* data, std::size_t count, reduce_op op, cudaStream_t caller) {
  state& s = *s_;
  if (s.p == 1) return;  // avg over one rank is the identity
  const device_guard on(s.device);
  s.run({.op = op_code::allreduce, .type = t, .reduction = op, .count = count}, caller, [&] {
    const std::size_t e = size_of(t);
    const round_plan plan{count, std::max<std::size_t>(1, s.round_bytes / e)};
    const bool one_shot = this->one_shot(count * e);
    auto* bytes = static_cast<std::byte*>(data);
    std::vector<const void*> sources;
    for (std::size_t r = 0; r < plan.rounds(); ++r) {
      const std::uint64_t g = s.rounds++;
      const std::size_t n = plan.size(r);
      std::byte* round = bytes + plan.begin(r) * e;
      std::byte* const mine_slot = s.slot(s.me, g);
      if (one_shot) {
        // one barrier: every rank publishes the whole round and reduces all of it from every slot, in
        // rank order (the same operations on every rank: bitwise identical results)
        s.copy(mine_slot, round, n * e);
        s.barrier("ready");
        if (r == 0) s.check_notes();
        sources.clear();
        for (int q = 0; q < s.p; ++q) sources.push_back(s.slot(q, g));
        s.reduce(t, round, sources, n, op);
        continue;
      }
      auto part = [&](int q) {  // [offset, offset + length) of part q of the round, in elements
        const std::size_t b = n * static_cast<std::size_t>(q) / static_cast<std::size_t>(s.p);
        const std::size_t end = n * static_cast<std::size_t>(q + 1) / static_cast<std::size_t>(s.p);
        return std::pair{b, end - b};
      };
      const auto [mine, length] = part(s.me);
      // step 1: the parts the peers reduce, into my slot
      s.copy(mine_slot, round, mine * e);
      s.copy(mine_slot + (mine + length) * e, round + (mine + length) * e, (n - mine - length) * e);
      s.barrier("ready");
      if (r == 0) s.check_notes();
      // step 2: my part, reduced out of every rank's copy (mine first, in place), then published
      s.gather_sources(sources, round + mine * e, g, mine * e);
      s.reduce(t, round + mine * e, sources, length, op);
      s.copy(mine_slot + mine * e, round + mine * e, length * e);
      s.barrier("reduced");
      // step 3: the peers' reduced parts
      for (int q = 0; q < s.p; ++q) {
        if (q == s.me) continue;
        const auto [at, len] = part(q);
        s.copy(round + at * e, s.slot(q, g) + at * e, len * e);
      }
    }
  });
}

void ipc_group::reduce_scatter(dtype t, const void* send, void* recv, std::size_t count, reduce_op op,
                               cudaStream_t caller) {
  state& s = *s_;
  const device_guard on(s.device);
  if (s.p == 1) return local_copy(recv, send, count * size_of(t), caller);
  s.run({.op = op_code::reduce_scatter, .type = t, .reduction = op, .count = count}, caller, [&] {
    const std::size_t e = size_of(t), p = static_cast<std::size_t>(s.p), me = static_cast<std::size_t>(s.me);
    const round_plan plan{count, std::max<std::size_t>(1, s.round_bytes / (e * p))};
    const auto* in = static_cast<const std::byte*>(send);
    auto* out = static_cast<std::byte*>(recv);
    std::vector<const void*> sources;
    for (std::size_t r = 0; r < plan.rounds(); ++r) {
      const std::uint64_t g = s.rounds++;
      const std::size_t lo = plan.begin(r), n = plan.size(r);
      // step 1: the peers' blocks of this round, into my slot (block q at q * per_round)
      for (std::size_t q = 0; q < p; ++q)
        if (q != me) s.copy(s.slot(s.me, g) + q * plan.per_round * e, in + (q * count + lo) * e, n * e);
      s.barrier("ready");
      if (r == 0) s.check_notes();
      // step 2: my block, reduced out of every rank's copy (mine first, read from `send`)
      s.gather_sources(sources, in + (me * count + lo) * e, g, me * plan.per_round * e);
      s.reduce(t, out + lo * e, sources, n, op);
    }
  });
}

namespace {
/// The byte view of an out-of-place call: element size, ranks, my rank, send and receive buffers.
struct byte_views {
  std::size_t e, p, me;
  const std::byte* in;
  std::byte* out;
};
byte_views views_of(int p, int me, dtype t, const void* send, void* recv) {
  return {size_of(t), static_cast<std::size_t>(p), static_cast<std::size_t>(me), static_cast<const std::byte*>(send),
          static_cast<std::byte*>(recv)};
}
}  // namespace

void ipc_group::allgather(dtype t, const void* send, void* recv, std::size_t count, cudaStream_t caller) {
  state& s = *s_;
  const device_guard on(s.device);
  const byte_views v = views_of(s.p, s.me, t, send, recv);
  const std::size_t e = v.e, p = v.p, me = v.me;
  if (s.p == 1) return local_copy(v.out, v.in, count * e, caller);
  const std::byte* in = v.in;
  std::byte* out = v.out;
  s.run({.op = op_code::allgather, .type = t, .count = count}, caller, [&] {
    const round_plan plan{count, std::max<std::size_t>(1, s.round_bytes / e)};
    for (std::size_t r = 0; r < plan.rounds(); ++r) {
      const std::uint64_t g = s.rounds++;
      const std::size_t lo = plan.begin(r), n = plan.size(r);
      s.copy(s.slot(s.me, g), in + lo * e, n * e);
      s.copy(out + (me * count + lo) * e, in + lo * e, n * e);  // nothing when in place
      s.barrier("ready");
      if (r == 0) s.check_notes();
      for (std::size_t q = 0; q < p; ++q)
        if (q != me) s.copy(out + (q * count + lo) * e, s.slot(static_cast<int>(q), g), n * e);
    }
  });
}

void ipc_group::broadcast(dtype t, void* data, std::size_t count, int root, cudaStream_t caller) {
  state& s = *s_;
  if (s.p == 1) return;
  const device_guard on(s.device);
  s.run({.op = op_code::broadcast, .type = t, .root = root, .count = count}, caller, [&] {
    const std::size_t e = size_of(t);
    const round_plan plan{count, std::max<std::size_t>(1, s.round_bytes / e)};
    auto* bytes = static_cast<std::byte*>(data);
    for (std::size_t r = 0; r < plan.rounds(); ++r) {
      const std::uint64_t g = s.rounds++;
      const std::size_t lo = plan.begin(r), n = plan.size(r);
      if (s.me == root) s.copy(s.slot(s.me, g), bytes + lo * e, n * e);
      s.barrier("ready");
      if (r == 0) s.check_notes();
      if (s.me != root) s.copy(bytes + lo * e, s.slot(root, g), n * e);
    }
  });
}

void ipc_group::alltoall(dtype t, const void* send, void* recv, std::size_t count, cudaStream_t caller) {
  state& s = *s_;
  const device_guard on(s.device);
  const byte_views v = views_of(s.p, s.me, t, send, recv);
  if (s.p == 1) return local_copy(v.out, v.in, count * v.e, caller);
  const std::size_t e = v.e, p = v.p, me = v.me;
  s.run({.op = op_code::alltoall, .type = t, .count = count}, caller, [&] {
    const std::byte* in = v.in;
    std::byte* out = v.out;
    const round_plan plan{count, std::max<std::size_t>(1, s.round_bytes / (e * p))};
    for (std::size_t r = 0; r < plan.rounds(); ++r) {
      const std::uint64_t g = s.rounds++;
      const std::size_t lo = plan.begin(r), n = plan.size(r);
      // step 1: the blocks for the peers into my slot (block q at q * per_round); mine straight over
      for (std::size_t q = 0; q < p; ++q)
        if (q != me) s.copy(s.slot(s.me, g) + q * plan.per_round * e, in + (q * count + lo) * e, n * e);
      s.copy(out + (me * count + lo) * e, in + (me * count + lo) * e, n * e);
      s.barrier("ready");
      if (r == 0) s.check_notes();
      // step 2: my block out of every peer's slot
      for (std::size_t q = 0; q < p; ++q)
        if (q != me)
          s.copy(out + (q * count + lo) * e, s.slot(static_cast<int>(q), g) + me * plan.per_round * e, n * e);
    }
  });
}

}  // namespace flexpar::cuda::detail
