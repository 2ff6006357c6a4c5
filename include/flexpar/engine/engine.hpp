// flexpar/engine/engine.hpp — asynchronous, negotiated, fused collectives (Horovod's core, without
// its global state and its silent hangs).
//
// The user owns an `engine` built on a communicator; any thread submits named tensors
// (`allreduce_async("fc1.grad", grad, reduce_op::avg)`) and gets a `handle`. Ranks may submit the
// same tensors in different orders and at different times: a background thread negotiates which
// tensors every rank has submitted, checks that they agree, fuses small allreduces, and runs them
// in one order on every rank.
//
// ## The coordinator protocol (rank 0 coordinates; one round per cycle)
//  1. Every cycle (`config::cycle_time`), each rank's background thread takes the tensors submitted
//     since the last cycle and sends the coordinator one report: for each new tensor either its
//     response-cache slot (a number: "I have the tensor you already know as slot k") or its full
//     description (name, collective, dtype, count, op, root); plus "I have joined" and "I am
//     shutting down" flags. An empty report is still sent: the ranks stay in step (but see "Quiet").
//  2. The coordinator adds the reports to its table of tensors (name → which ranks have it and
//     with which description). A joined rank counts as having every tensor.
//  3. For each tensor that every rank now has, in the order they became complete, the coordinator
//     compares the descriptions: if they agree, the response is "run it" (by cache slot when every
//     rank reported the slot); otherwise "mismatch", with a text naming the tensor, the field and
//     which ranks hold which value. Tensors some ranks have had for longer than
//     `stall_warning` are logged with the ranks missing; after `stall_shutdown` they get the
//     response "timeout".
//  4. The coordinator sends every rank the same response list (and "all joined", "all shut down").
//  5. Every rank runs the responses in list order: consecutive allreduces of one dtype and op are
//     packed into the fusion buffer (up to `fusion_threshold` bytes), reduced with one collective,
//     and unpacked; the others run one by one. Handles complete (callbacks run on the background
//     thread); errors complete the handle of that tensor on every rank that submitted it (see
//     "Errors" below for when handle::wait rethrows them).
//     Device tensors (memory_kind::cuda, flexpar/cuda/engine.hpp) take the same steps; their
//     description carries the memory kind (ranks must agree), a fused run never mixes the kinds, and
//     a device response is handed to the device backend, which runs it on the GPU after its producers'
//     stream positions; its handles complete when the GPU is done (the background thread polls), and
//     handle::order_after() orders a stream after it without waiting on the host.
//  6. Every rank enters each newly run description into its response cache at the same slot
//     (slots are given in response order, so every cache agrees without a message).
// A rank that reaches no coordinator (or a coordinator that misses a rank's report) before
// `config::timeout` fails every pending handle with the timeout and refuses new work.
//
// ## Quiet
// A response list (or a round, below) after which nothing is outstanding on any rank says so, and
// every rank's thread then sleeps, with no timer and no call into MPI or UCX, until it has
// something: a submission, a skipped tensor, a join, a shutdown. An idle engine costs no core, and
// at MPI_Finalize it is not inside MPI, as the MPI standard requires of every other thread. Rank 0
// keeps a receive posted for each quiet rank and counts it as sending empty reports until its next
// report comes (its stall warnings and timeouts go on as above); a rank back from quiet waits for
// rank 0's answer, and under a plan the first round's votes are gathered on rank 0, with no
// deadline but `stall_warning` (logged) and `stall_shutdown` (the engine ends with a
// timeout_error naming whom it waited for); a dead peer fails it at once.
//
// ## The steady state (config::step_plan)
// A training loop submits the same tensors every step. Once a step has repeated, the ranks stop
// negotiating it tensor by tensor:
//  7. Rank 0 cuts its response lists into steps (a step ends where a tensor comes back). When two
//     steps in a row ran the same tensors, each by cache slot, and nothing is pending anywhere, its
//     response list also carries a plan: that step's fused runs as buckets, by cache slot. Every rank
//     freezes it after running the list (from its own cache: the same plan everywhere).
//  8. A submission that is a tensor of the plan, with its description, goes into its slot at once,
//     on the submitting thread (no report, no response, no lookup by the background thread).
//  9. A round replaces a cycle: one allreduce (max) of a few bytes, "this bucket is complete here"
//     and "begun here" per bucket, a "leave" flag and the plan's digest. The buckets complete on
//     every rank run in plan order, as step 5 runs a fused response (in place when their tensors lie
//     back to back: gradient_sync's arena). A rank enters a round when a bucket completes here, again
//     at once while one complete here waits for the others, and at least once per cycle.
// 10. Every rank drops the plan in the round where any rank says "leave": it had a submission the
//     plan does not have (a new tensor, another description or count, the same one twice), a step
//     ended without a tensor of the plan (end_step()), a bucket begun somewhere waited longer than
//     config::plan_patience for a rank, a join, a shutdown. What is in the slots is then negotiated
//     from the next cycle on, exactly as without a plan, and rank 0 watches for the next repetition.
//     A tensor that some ranks submitted and another's step ended without is a mismatch_error
//     naming both; one no rank submitted (a frozen parameter) is simply not run.
// Cost per round: one allreduce of 17 + 2 × buckets bytes; nothing per tensor but its slot.
//
// ## Errors and the caller's buffers
// When one tensor fails (a mismatch, a stall timeout, an output too small, a name submitted twice)
// the others of its batch may still be waiting for other ranks or running. handle::wait rethrows
// the error only once every tensor this rank submitted before that wait has finished, so that a
// caller who unwinds on the error and frees its buffers never frees one the engine still reads or
// writes (a completion callback gets the error at once: it runs on the engine's thread). A failed
// collective (timeout, peer failure) fails every tensor at once: nothing runs after it, and the
// transport settles the failed collective's own messages before the error leaves it
// (transport.hpp). The destructor returns only once the background thread has ended.
//
// ## MPI_Finalize
// An engine still alive at MPI_Finalize is shut down by it (core/mpi_finalize.hpp): the same
// collective shutdown as the destructor's, timeline included, before its communicator closes;
// afterwards submissions fail with a usage_error and the destructor only frees memory.
//
// Cost per cycle: one small message to and from the coordinator per rank (2 latencies); in steady
// state a report is a list of slot numbers, 4 bytes per tensor.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/config.hpp>
#include <flexpar/core/dtype.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/core/memory.hpp>
#include <flexpar/core/reduce_op.hpp>
#include <flexpar/engine/device_backend.hpp>

namespace flexpar {

/// The collectives the engine runs.
enum class collective_kind : unsigned char { allreduce, allgather, broadcast, reduce_scatter, alltoall };

std::string_view name_of(collective_kind kind) noexcept;

namespace detail {
class engine_core;
struct engine_entry;
}  // namespace detail

/// The completion of one submitted tensor. Copyable (shared state); `wait()` may be called from
/// any thread, any number of times.
class handle {
 public:
  handle() = default;

  /// True once the collective finished (successfully or not). Never blocks.
  [[nodiscard]] bool test() const;
  /// Blocks until finished. @throws the error the collective ended with (mismatch_error,
  /// timeout_error, usage_error, transport_error, ...), once every tensor this rank submitted
  /// before this call has finished too; timeout_error at `until` if this tensor, or one of those,
  /// is still running (the text then carries this tensor's error and names those).
  void wait(deadline until) const;
  /// wait() with the engine's config::timeout.
  void wait() const;
  /// For allgather: elements received (the sum over ranks of their counts); otherwise the count.
  [[nodiscard]] std::size_t result_count() const;
  /// The tensor's name as submitted.
  [[nodiscard]] const std::string& name() const;
  /// Where the tensor lives (memory_kind::cuda for a device tensor, flexpar/cuda/engine.hpp).
  [[nodiscard]] memory_kind memory() const;
  /// For a device tensor: waits (on the host, with the engine's timeout) until its collective has been
  /// enqueued on the device, then makes `stream` (a cudaStream_t) wait, on the device, for its end:
  /// work enqueued on `stream` afterwards sees the result, and the host waits for nothing more.
  /// @throws the collective's error when it failed before it was enqueued; usage_error for a host tensor.
  void order_after(void* stream) const;

 private:
  friend class detail::engine_core;
  explicit handle(std::shared_ptr<detail::engine_entry> entry) : entry_(std::move(entry)) {}
  std::shared_ptr<detail::engine_entry> entry_;
};

/// Called on the background thread when a tensor's collective ends; `error` is null on success.
using completion_callback = std::function<void(const handle&, std::exception_ptr error)>;

/// Where the engine's warnings go (stall warnings); default: stderr with a "[flexpar rank N]" prefix.
using log_sink = std::function<void(std::string_view line)>;

/// Asynchronous, negotiated, fused collectives over a communicator (the protocol above).
/// Owned by the user; submissions are thread-safe.
class engine {
 public:
  /// Collective over `comm`'s ranks: builds the engine's own sub-communicator (its traffic never
  /// mixes with yours), starts the background thread. `cfg` defaults to the communicator's settings.
  /// @throws usage_error when `comm` runs on MPI and MPI provides less than MPI_THREAD_MULTIPLE
  ///         (the background thread calls MPI while your threads may too), or (on every rank) when
  ///         rank 0 cannot open `cfg.timeline_path` for writing.
  /// @throws timeout_error naming the ranks that did not construct it within the timeout.
  /// `device` (optional; it must outlive the engine) runs the collectives of device tensors:
  /// flexpar::cuda::engine_backend. Every rank of an engine that runs device tensors needs one.
  explicit engine(communicator& comm, std::optional<config> cfg = std::nullopt, log_sink log = {},
                  device_backend* device = nullptr);
  /// Collective: waits until every rank is shutting down, then stops the background thread. Pending
  /// handles of tensors that never became ready on every rank fail with "engine shut down".
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  /// Reduces `data` in place across ranks. `name` identifies the tensor across ranks and must not
  /// be in flight twice on one rank. The span stays in use until the handle completes.
  template <element T>
  handle allreduce_async(std::string name, std::span<T> data, reduce_op op, completion_callback done = {}) {
    return submit(std::move(name), collective_kind::allreduce, dtype_of<T>, op, -1,
                  std::as_bytes(std::span<const T>(data)), std::as_writable_bytes(data), data.size(), std::move(done));
  }
  /// Concatenates every rank's `mine` (counts may differ per rank) into `all` in rank order.
  /// `all` must have room for the total; handle::result_count() tells how many were received.
  template <element T>
  handle allgather_async(std::string name, std::span<const T> mine, std::span<T> all, completion_callback done = {}) {
    return submit(std::move(name), collective_kind::allgather, dtype_of<T>, reduce_op::sum, -1, std::as_bytes(mine),
                  std::as_writable_bytes(all), mine.size(), std::move(done));
  }
  /// Copies `data` of rank `root` into `data` of every rank.
  template <element T>
  handle broadcast_async(std::string name, std::span<T> data, int root, completion_callback done = {}) {
    return submit(std::move(name), collective_kind::broadcast, dtype_of<T>, reduce_op::sum, root,
                  std::as_bytes(std::span<const T>(data)), std::as_writable_bytes(data), data.size(), std::move(done));
  }
  /// Reduces `in` (same count on every rank) and leaves block r of the result on rank r: blocks as
  /// equal as can be, the first count % p one element longer.
  template <element T>
  handle reduce_scatter_async(std::string name, std::span<const T> in, std::span<T> out, reduce_op op,
                              completion_callback done = {}) {
    return submit(std::move(name), collective_kind::reduce_scatter, dtype_of<T>, op, -1, std::as_bytes(in),
                  std::as_writable_bytes(out), in.size(), std::move(done));
  }
  /// Sends block j of `in` (count / p elements each; count divisible by p) to rank j; block i of
  /// `out` comes from rank i.
  template <element T>
  handle alltoall_async(std::string name, std::span<const T> in, std::span<T> out, completion_callback done = {}) {
    return submit(std::move(name), collective_kind::alltoall, dtype_of<T>, reduce_op::sum, -1, std::as_bytes(in),
                  std::as_writable_bytes(out), in.size(), std::move(done));
  }

  /// Type-erased allreduce of `count` elements of `type` from `in` into `out` (the same buffer for
  /// in place). @throws usage_error when a buffer is shorter than count elements.
  handle allreduce_async(std::string name, std::span<const std::byte> in, std::span<std::byte> out, dtype type,
                         std::size_t count, reduce_op op, completion_callback done = {}) {
    check_bytes("allreduce", name, in.size(), type, count);
    check_bytes("allreduce", name, out.size(), type, count);
    return submit(std::move(name), collective_kind::allreduce, type, op, -1, in, out, count, std::move(done));
  }
  /// Type-erased broadcast of `count` elements of `type`.
  handle broadcast_async(std::string name, std::span<std::byte> data, dtype type, std::size_t count, int root,
                         completion_callback done = {}) {
    check_bytes("broadcast", name, data.size(), type, count);
    return submit(std::move(name), collective_kind::broadcast, type, reduce_op::sum, root, data, data, count,
                  std::move(done));
  }

  /// The type-erased submission of a device tensor, behind flexpar/cuda/engine.hpp's typed functions:
  /// `in` and `out` are device addresses (`count` input elements; `out_capacity` output elements),
  /// `stream` the stream that produced it (a cudaStream_t: the collective runs after the work queued
  /// there so far; the position is captured at submission, or once for its whole bucket in the steady
  /// state). The same rules as the host forms; every rank must submit the tensor as a device tensor
  /// (a host tensor of the same name elsewhere is a mismatch), and a fused response holds only device
  /// tensors.
  /// @throws usage_error when this engine has no device backend.
  handle submit_device(std::string name, collective_kind kind, dtype type, reduce_op op, int root, const void* in,
                       void* out, std::size_t count, std::size_t out_capacity, void* stream,
                       completion_callback done = {});

  /// The device backend the engine was built with, or null.
  [[nodiscard]] device_backend* device() const noexcept;

  /// For uneven data: this rank has no more tensors. Until every rank has joined, it contributes
  /// the identity of the op (zeros for sum/avg) to the others' allreduces and receives their
  /// broadcasts into scratch; allgather, reduce_scatter and alltoall with a joined rank fail with a
  /// usage_error. Blocks until every rank has joined; returns the last rank to join.
  /// @throws timeout_error when not every rank joined within config::timeout (this rank stays joined).
  int join();

  /// This rank has submitted every tensor of its current step (gradient_sync calls it at the end of
  /// each step). Under a frozen plan, a tensor of the plan this step did not submit makes every rank
  /// drop the plan at once (instead of after config::plan_patience), and the ranks that did submit it
  /// get a mismatch_error naming this rank. Without a plan it does nothing. Not collective; never blocks.
  void end_step();

  /// This rank in the engine's communicator (the same as in the communicator it was built on).
  [[nodiscard]] int rank() const noexcept;
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept;
  /// The settings the engine runs with.
  [[nodiscard]] const config& settings() const noexcept;

  /// Counters since construction (for tests and benchmarks).
  struct statistics {
    std::size_t cycles = 0;             ///< negotiation cycles run
    std::size_t tensors_done = 0;       ///< handles completed (successfully or not)
    std::size_t fused_collectives = 0;  ///< collectives that carried more than one tensor
    std::size_t collectives = 0;        ///< collectives run (fused or not)
    std::size_t cache_hits = 0;         ///< tensors this rank reported by cache slot
    std::size_t full_reports = 0;       ///< tensors this rank reported in full
    std::size_t plans_frozen = 0;       ///< steps frozen into a plan ("The steady state")
    std::size_t plans_dropped = 0;      ///< plans the ranks left
    std::size_t plan_rounds = 0;        ///< rounds run under a plan
    std::size_t planned_tensors = 0;    ///< tensors run by a plan, without negotiation
    std::size_t plan_buckets = 0;       ///< buckets of the plan in force (0: none)
  };
  /// A snapshot of the counters.
  [[nodiscard]] statistics stats() const;

 private:
  static void check_bytes(std::string_view op, const std::string& name, std::size_t bytes, dtype type,
                          std::size_t count);
  handle submit(std::string name, collective_kind kind, dtype type, reduce_op op, int root,
                std::span<const std::byte> in, std::span<std::byte> out, std::size_t count, completion_callback done);
  std::unique_ptr<detail::engine_core> core_;
};

}  // namespace flexpar
