// flexpar/core/config.hpp — run-time settings, from FLEXPAR_* environment variables or from code.
//
// A `config` is a plain value: build it with `config::from_environment()` (or default-construct it),
// change any field in code, and pass it to the objects that use it. Nothing reads the environment
// behind your back. The table of variables is in doc/configuration.md; each field below names its
// variable.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace flexpar {

/// Which point-to-point transport a communicator moves bytes with.
enum class transport_kind : unsigned char {
  mpi,     ///< MPI_Isend/MPI_Irecv on a duplicated communicator
  ucx,     ///< UCX ucp tag API; worker addresses exchanged over MPI
  inproc,  ///< threads as ranks in one process (tests)
};

/// Name of a transport kind as in FLEXPAR_TRANSPORT and in messages: "mpi", "ucx", "inproc".
std::string_view name_of(transport_kind kind) noexcept;

/// The run-time settings of flexpar's objects; each field names the FLEXPAR_* variable that
/// config::from_environment() reads it from.
struct config {
  /// FLEXPAR_TIMEOUT (seconds, fractional allowed; default 300): the deadline of every blocking wait
  /// that is not given one explicitly. A wait past it throws flexpar::timeout_error.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};

  /// FLEXPAR_TRANSPORT (mpi | ucx; default mpi): the transport communicator::from_mpi() builds.
  transport_kind transport = transport_kind::mpi;

  /// FLEXPAR_RANKS_PER_NODE (default 0 = detect with MPI_Comm_split_type): treat every run of this
  /// many consecutive ranks as one node. Lets hierarchical algorithms be tested on one machine.
  int ranks_per_node = 0;

  /// FLEXPAR_SPIN_US (microseconds; default 100000): how long a wait polls its transport (yielding
  /// the core between polls) before it sleeps: MPI between polls (2 us doubling to 256 us), UCX on the
  /// worker's event file descriptor. Transfers make progress only while polled (rendezvous stages,
  /// UCX's TCP), so waits shorter than this run at full speed; a rank idle for longer does not burn
  /// a core.
  std::chrono::microseconds spin{100000};

  /// FLEXPAR_HEARTBEAT_MS (milliseconds; default 250; 0 = no heartbeats): how often each rank of a
  /// communicator made by communicator::from_mpi tells every other that it is alive, on a UDP side
  /// channel of its own (transport/liveness.hpp). A peer is failed when its process on the same host
  /// has exited (seen within 0.1 s) or when heartbeat_misses beats in a row did not come; every
  /// wait of the transport then ends with peer_failure naming it, whatever `timeout` says.
  std::chrono::milliseconds heartbeat_interval{250};

  /// FLEXPAR_HEARTBEAT_MISSES (default 8): beats in a row a peer may miss before it is failed (with
  /// the default interval: 2 s of silence). Raise it where ranks can be descheduled for long.
  int heartbeat_misses = 8;

  /// FLEXPAR_STREAMING_MIN_BYTES (bytes; default 4 MiB; 0 = never): a destination of at least this
  /// many bytes is taken to live in memory, not in cache, by the shared-memory collectives and the
  /// boxings, and written with streaming (non-temporal) stores. Where it pays depends on the machine
  /// (doc/configuration.md): on the 2-core AMD EPYC VM of CI and on a 16-core Intel Xeon host,
  /// streaming from 4 MiB on was as fast or faster than never streaming. Sources have their own
  /// threshold (below).
  std::size_t streaming_min_bytes = std::size_t{4} << 20;

  /// FLEXPAR_SOURCE_IN_MEMORY_MIN_BYTES (bytes; 0 = never; unset: the last-level cache divided among
  /// the ranks of my node, read when the communicator is made, or streaming_min_bytes where the cache
  /// size is unknown): a source of at least this many bytes is taken to live in memory by the
  /// boxings' packing passes (P -> S(i), S(i) -> S(j) with i, j inner axes), which then copy its short
  /// runs inline and read it front to back once. Sources and destinations differ: a destination in
  /// memory is worth streaming stores whether or not its source is cached, while a source held by a
  /// large last-level cache is better read in place: the default, the cache's share of each rank,
  /// measured faster than a fixed 4 MiB both on a large-cache Intel host and on the small-cache AMD
  /// VM of CI.
  std::optional<std::size_t> source_in_memory_min_bytes;

  /// FLEXPAR_BLAS_THREADS (default 0 = auto; -1 = leave the BLAS alone; n > 0 = n threads): the
  /// threads of the BLAS behind the SBP ops' local GEMMs (OpenBLAS), set by communicator::from_mpi.
  /// Auto gives each rank the cores it may run on (its affinity mask) divided among the ranks of its
  /// node, at least one — unless OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS is set,
  /// which then rules. Without it every rank starts a BLAS thread per core, and p ranks on a node
  /// run p times as many threads as there are cores. The setting is the BLAS library's, for the
  /// whole process; with a BLAS other than OpenBLAS nothing is set.
  int blas_threads = 0;

  // ---- engine (include/flexpar/engine/engine.hpp) ----

  /// FLEXPAR_FUSION_THRESHOLD (bytes; default 128 MiB; 0 disables fusion): ready allreduces of one
  /// dtype and op are packed into one buffer of at most this many bytes and reduced together.
  std::size_t fusion_threshold = std::size_t{128} << 20;

  /// FLEXPAR_CYCLE_TIME_MS (milliseconds, fractional allowed; default 1): how often the engine's
  /// background thread negotiates the tensors submitted since its last cycle.
  std::chrono::microseconds cycle_time{1000};

  /// FLEXPAR_CACHE_CAPACITY (entries; default 1024; 0 disables): tensors whose negotiation is
  /// remembered, so that in steady state a rank reports a number instead of the whole description.
  std::size_t cache_capacity = 1024;

  /// FLEXPAR_STALL_WARNING_S (seconds; default 60): warn, naming the tensor and the ranks that
  /// have not submitted it, when some ranks have waited this long for the others.
  std::chrono::milliseconds stall_warning{std::chrono::seconds(60)};

  /// FLEXPAR_STALL_SHUTDOWN_S (seconds; default 300; 0 = never): after this long, fail the
  /// stalled tensor's handles on every rank with a timeout_error.
  std::chrono::milliseconds stall_shutdown{std::chrono::seconds(300)};

  /// FLEXPAR_STEP_PLAN (0 or 1; default 1): once a step's submissions have repeated (the same
  /// tensors, descriptions and counts, twice in a row), the engine freezes them into a plan and
  /// replays it with one small agreement per round instead of negotiating every tensor
  /// (include/flexpar/engine/engine.hpp, "The steady state"). 0: every tensor is negotiated.
  bool step_plan = true;

  /// FLEXPAR_PLAN_PATIENCE_MS (milliseconds, fractional allowed; default 1000): how long a bucket of
  /// the frozen plan may wait, begun on some rank, for a rank that has not completed it, before the
  /// ranks drop the plan and negotiate (a tensor skipped or submitted much later than the others).
  std::chrono::microseconds plan_patience{std::chrono::seconds(1)};

  /// FLEXPAR_TIMELINE (a file path; default empty = off): write a Chrome-trace JSON timeline of
  /// the engine's work there (all ranks merged into one file by rank 0 at shutdown).
  std::string timeline_path;

  /// FLEXPAR_TIMELINE_MARK_CYCLES (0 or 1; default 0): add an instant event per engine cycle.
  bool timeline_mark_cycles = false;

  /// Reads every FLEXPAR_* variable above; unset ones keep their defaults. A malformed value throws
  /// flexpar::usage_error naming the variable, the value and what was expected.
  /// `lookup` returns a variable's value (default: std::getenv); tests pass their own.
  static config from_environment(
      const std::function<std::optional<std::string>(std::string_view)>& lookup = environment_lookup);

  /// std::getenv as a lookup function.
  static std::optional<std::string> environment_lookup(std::string_view name);
};

}  // namespace flexpar
