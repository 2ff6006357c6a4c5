// flexpar/collective/context.hpp — what the collective layer keeps per communicator, and the small
// vocabulary (block layouts, chunks, typed byte views) that every algorithm script is written in.
//
// Tags. Collectives never share a tag space with user point-to-point traffic: on first use the
// context splits the communicator's transport into a private `channel` (a transport split never
// matches messages of its parent). On that channel every collective call takes the next number of a
// per-communicator sequence, modulo the transport's max_tag() (MPICH here: MPI_TAG_UB = 2^28 - 1),
// as its one tag. Collectives are called in the same order on every rank (MPI's rule), so the
// numbers agree; inside one call, messages between one pair of ranks are posted in the same order on
// both sides, which the transport's per-(peer, tag) FIFO matching relies on.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <flexpar/collective/cost.hpp>
#include <flexpar/collective/shared_memory_segment.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/dtype.hpp>

namespace flexpar {

/// Bytes per message of the pipelined algorithms (ring, chain): large enough to reach the link's
/// bandwidth, small enough that sending, receiving and reducing of consecutive chunks overlap.
inline constexpr std::size_t pipeline_chunk_bytes = std::size_t{1} << 19;

/// Counts and offsets of p consecutive blocks of one buffer.
struct block_layout {
  std::vector<std::size_t> counts;  ///< elements of each block
  std::vector<std::size_t> displs;  ///< offset of each block from the start of the buffer
  std::size_t total = 0;            ///< elements of all blocks

  /// n elements in p blocks as equal as can be: the first n % p blocks have one more.
  static block_layout even(std::size_t n, int p) {
    const auto parts = static_cast<std::size_t>(p);
    std::vector<std::size_t> counts(parts, n / parts);
    for (std::size_t i = 0; i < n % parts; ++i) ++counts[i];
    return of_counts(counts);
  }
  /// Blocks of the given sizes, back to back.
  static block_layout of_counts(std::span<const std::size_t> sizes) {
    block_layout b;
    b.counts.assign(sizes.begin(), sizes.end());
    b.displs.resize(sizes.size());
    std::exclusive_scan(sizes.begin(), sizes.end(), b.displs.begin(), std::size_t{0});
    b.total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
    return b;
  }
  /// Elements of block `block`.
  [[nodiscard]] std::size_t count(int block) const { return counts[static_cast<std::size_t>(block)]; }
  /// Offset of block `block`.
  [[nodiscard]] std::size_t displ(int block) const { return displs[static_cast<std::size_t>(block)]; }
  /// Elements of the largest block (0 for no blocks).
  [[nodiscard]] std::size_t max_count() const {
    return counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  }
  /// Block `block` of `data`.
  template <class T>
  [[nodiscard]] std::span<T> of(std::span<T> data, int block) const {
    return data.subspan(displ(block), count(block));
  }
};

/// Where an in-place reduce-scatter leaves my reduced block in the buffer.
enum class result_at : std::uint8_t {
  my_block,  ///< at its own place: counts[0] + .. + counts[rank-1] (MPI's in-place layout)
  front,     ///< at the start of the buffer, data[0, counts[rank]): the buffer can be cut down to it
};

namespace detail {

struct collective_context {
  std::unique_ptr<flexpar::transport> channel;  // private split of the communicator's transport
  finalize_hook channel_at_finalize;            // MPI_Finalize closes the channel (core/mpi_finalize.hpp)
  std::uint64_t sequence = 0;                   // collectives started on this communicator

  // shared-memory path (one node): created on its first use, nullptr if some rank could not map it
  bool shm_tried = false;
  std::unique_ptr<shared_memory_segment> shm;
  std::uint64_t shm_rounds = 0;  // rounds completed through the segment (its flags count these)
  std::uint64_t shm_calls = 0;   // calls through the segment (their descriptions number them)
  // a collective's mismatch_error that left the ranks out of step (shared-memory rounds): every
  // later collective refuses the communicator with this text
  std::string broken;

  // hierarchical path: my node's ranks, and the ranks with my local rank on every node
  std::unique_ptr<communicator> node;
  std::unique_ptr<communicator> across;

  std::optional<cost_params> machine;  // what `automatic` evaluates costs with
  // the last choice of allreduce(automatic): repeated calls of one size (a training loop) skip the costs
  std::size_t last_allreduce_bytes = ~std::size_t{0};
  int last_allreduce_choice = -1;

  [[nodiscard]] tag_t next_tag() { return static_cast<tag_t>(sequence++ % channel->max_tag()); }
};

/// The context of `comm`, built on the first collective call (which is collective anyway).
/// @throws timeout_error when a rank does not make that first call within the communicator's timeout
///         (the text names it); usage_error once MPI_Finalize has shut `comm` down.
inline collective_context& context_of(communicator& comm) {
  if (comm.finalized())
    throw error_on<usage_error>(comm.rank(), "collective",
                                "called after MPI_Finalize shut its communicator down (destroy flexpar's objects "
                                "before calling MPI_Finalize)");
  auto& state = comm.collective_state();
  if (state && !state->broken.empty())
    throw error_on<usage_error>(comm.rank(), "collective",
                                "this communicator's collectives are out of step since an earlier one failed (make a "
                                "new communicator): ",
                                state->broken);
  if (!state) {
    auto fresh = std::make_shared<collective_context>();
    try {
      fresh->channel = comm.transport().split(0, comm.rank());
    } catch (const timeout_error& e) {
      // throw: e.what() is the split's message, built already ("[rank R] ..."); this adds its likely cause
      throw timeout_error(std::string(e.what()) +
                          " (the first collective on a communicator splits its transport: every rank must call "
                          "the same collectives in the same order)");
    }
    fresh->channel_at_finalize = finalize_hook(comm.at_finalize(), [t = fresh->channel.get()] { t->close(); });
    state = std::move(fresh);
  }
  return *state;
}

/// A buffer cut into chunks of at most `chunk` elements: chunk c covers [c*chunk, c*chunk + size(c)).
struct chunking {
  std::size_t elements;
  std::size_t chunk;
  [[nodiscard]] std::size_t count() const noexcept { return (elements + chunk - 1) / chunk; }
  [[nodiscard]] std::size_t offset(std::size_t c) const noexcept { return c * chunk; }
  [[nodiscard]] std::size_t size(std::size_t c) const noexcept { return std::min(chunk, elements - c * chunk); }
  template <class T>
  [[nodiscard]] std::span<T> of(std::span<T> data, std::size_t c) const {
    return data.subspan(offset(c), size(c));
  }
};

template <class T>
chunking pipeline_chunks(std::size_t elements) {
  return {elements, std::max<std::size_t>(1, pipeline_chunk_bytes / sizeof(T))};
}

template <class T>
std::span<const std::byte> bytes_of(std::span<T> s) noexcept {
  return std::as_bytes(s);
}
template <class T>
std::span<std::byte> writable_bytes_of(std::span<T> s) noexcept {
  return std::as_writable_bytes(s);
}

constexpr int modulo(long a, int p) noexcept { return static_cast<int>(((a % p) + p) % p); }

/// Scratch space of n elements, left uninitialised.
template <element T>
std::unique_ptr<T[]> scratch(std::size_t n) {
  return std::make_unique_for_overwrite<T[]>(n);
}

}  // namespace detail

/// One collective call on a communicator: the collectives' private channel (never matched by the
/// user's point-to-point traffic), this call's tag from the communicator's collective sequence, its
/// deadline, rank and size. A layer that writes an exchange of its own out of point-to-point messages
/// (relax::compressed_average's pieces) takes one with begin_collective_call, so that its messages
/// keep to the collectives' tag order. Its receives are exact (transport::irecv_exact): both sides of
/// every message compute its size, so a message of another size is a mismatch_error on the receiving
/// rank, never a partial result.
struct collective_call {
  flexpar::transport& t;      ///< the collectives' private channel of the communicator
  tag_t tag;                  ///< this call's one tag on it
  deadline until;             ///< the communicator's default deadline, from the call's start
  int rank;                   ///< my rank in the communicator
  int size;                   ///< its size
  bool across_nodes = false;  ///< the communicator spans more than one node

  /// Starts receiving exactly data.size() bytes from `peer` under the call's tag.
  [[nodiscard]] request irecv(int peer, std::span<std::byte> data) const { return t.irecv_exact(peer, tag, data); }
  /// Receives exactly data.size() bytes from `peer`, by the call's deadline.
  void recv(int peer, std::span<std::byte> data) const { t.recv_exact(peer, tag, data, until); }
};

namespace detail {

using call = collective_call;

inline call begin_call(communicator& comm) {
  collective_context& ctx = context_of(comm);
  return call{*ctx.channel, ctx.next_tag(), comm.default_deadline(),
              comm.rank(),  comm.size(),    comm.topology().node_count() > 1};
}

}  // namespace detail

/// Collective (every rank of `comm` calls it in the same order as its other collectives): starts one
/// collective call of the caller's own making on `comm` (see collective_call). The first collective on
/// a communicator makes its private channel.
/// @throws timeout_error when a rank does not come to that first call; usage_error after MPI_Finalize
///         shut `comm` down, or when an earlier collective left `comm`'s collectives out of step.
[[nodiscard]] inline collective_call begin_collective_call(communicator& comm) { return detail::begin_call(comm); }

/// Collective: a shared-memory segment of `bytes` mapped by every rank of `comm` (one node), made under
/// the next tag of `comm`'s collective channel (so that it never races a collective's own segment), or
/// nullptr on every rank when some rank could not map it (create() agrees across the ranks). For a
/// layer that keeps flags or staging of its own in shared memory (the CUDA IPC group's rank lines).
/// @throws timeout_error when a rank does not come by `comm`'s deadline; usage_error as
///         begin_collective_call.
[[nodiscard]] inline std::unique_ptr<shared_memory_segment> make_shared_memory_segment(communicator& comm,
                                                                                       std::size_t bytes) {
  detail::collective_context& ctx = detail::context_of(comm);
  return shared_memory_segment::create(*ctx.channel, ctx.next_tag(), bytes, comm.default_deadline());
}

namespace detail {

/// Messages from this size on go by rendezvous in MPICH and UCX (a request-to-send, then the data).
inline constexpr std::size_t rendezvous_bytes = std::size_t{64} << 10;

/// Whether a phase whose first message to a peer has `first_bytes` should start with clear_to_send
/// (every rank of a pair must pass the same figure).
///
/// Over TCP (MPICH 4.0 and UCX 1.13, both transports), a rendezvous message whose request-to-send
/// arrives before its receive is posted moves at about half the link's rate while the other
/// direction carries data too (scripts/fakehosts, 1 Gbit/s links, 16 MiB each way: 141 ms with the
/// receive posted first, 284 ms with it posted 5 ms late); a phase's first message races its peer's
/// entry into the call (ranks leave the previous call at different times). Within one node the
/// libraries' shared-memory paths have no such cost, so only a communicator spanning nodes pays the
/// one zero-byte exchange.
inline bool needs_clear_to_send(const call& c, std::size_t first_bytes) noexcept {
  return c.across_nodes && first_bytes >= rendezvous_bytes;
}

/// The first message of a ring phase over `layout`: its largest block's first chunk, the same
/// figure on every rank (each rank's own first message may be a few elements shorter), so that
/// every pair agrees on needs_clear_to_send.
template <class T>
std::size_t first_message_bytes(const block_layout& layout) noexcept {
  return std::min(layout.max_count() * sizeof(T), pipeline_chunk_bytes);
}

/// The receiver-ready hand-shake of a phase: `ready_from`'s note is received into a request posted
/// first of all (before the phase's data receives, so that, with one peer on both sides, the note
/// and the data keep their order under the call's one tag); then the caller posts its data
/// receives and calls clear_to_send::granted(), which tells `notify` that they are posted and waits
/// for `ready_from`'s note: its receives are posted, so the data sent next arrives expected.
class clear_to_send {
 public:
  /// Posts the receive of `ready_from`'s note (nothing when `active` is false).
  clear_to_send(const call& c, int notify, int ready_from, bool active) : c_(c), notify_(notify), active_(active) {
    if (active_) note_ = c.irecv(ready_from, {});
  }
  /// Sends my note to `notify`, then waits for the note of `ready_from`.
  void granted() {
    if (!active_) return;
    sent_ = c_.t.isend(notify_, c_.tag, {});
    note_.wait(c_.until);
  }
  clear_to_send(const clear_to_send&) = delete;
  clear_to_send& operator=(const clear_to_send&) = delete;
  ~clear_to_send() = default;  // sent_ settles on destruction (a zero-byte send completes at once)

 private:
  const call& c_;
  int notify_;
  bool active_;
  request note_;
  request sent_;
};

}  // namespace detail
}  // namespace flexpar
