// flexpar/checkpoint/save.hpp — writing a checkpoint directory, atomically, now or in the background.
//
//   flexpar::checkpoint::save(comm, "ckpt/step_1000", s);        // returns once it is committed
//
//   flexpar::checkpoint::async_saver saver(comm);                // collective: a private split of comm
//   auto h = saver.save("ckpt/step_1000", s);                    // snapshots, then returns
//   ... the training step goes on, and may change the tensors ...
//   h.wait();                                                    // committed (or its error rethrown)
//
// The protocol (every rank; `dir` must be one directory that every rank sees, as on a shared file
// system or one node):
//   step 1: every rank takes its part of each entry (a partial tensor is reduced first: a boxing,
//           collective over its mesh) and checks, with one allgather of a digest, that every rank
//           passed the same names, dtypes, shapes, SBPs and meshes.
//   step 2: rank 0 makes the hidden directory `.NAME.flexpar-saving` beside `dir` (removing one
//           left by a crashed save).
//   step 3: every rank writes `rank_R.data` there: its regions back to back, a crc32 per chunk of
//           save_options::chunk_bytes, then fsync. Only one holder writes each distinct region: of
//           a broadcast copy, the rank at coordinate 0 of every B mesh axis; of a replicated host
//           tensor, rank 0.
//   step 4: one allgather_v: every rank's regions (entry, mesh index, offset, box, crc32s).
//   step 5: rank 0 checks that the regions tile every tensor, writes `metadata.json` (with a crc32
//           of its own) to a temporary name, fsyncs it and renames it; fsyncs the directory, then
//           renames the directory to `dir` (an existing checkpoint there is swapped out in the same
//           rename, renameat2 RENAME_EXCHANGE, then removed) and fsyncs `dir`'s parent.
//   After every step that can fail on one rank, the ranks agree: a rank that failed throws its
//   error, every other rank a peer_failure carrying that text, and the hidden directory is removed.
// A crash at any point leaves either the previous checkpoint at `dir`, or the new one, complete;
// never a directory that load() accepts with wrong contents (load refuses one without metadata.json).
// Every wait is bounded by the communicator's deadline (config::timeout).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>

#include <flexpar/checkpoint/state.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/deadline.hpp>

namespace flexpar::checkpoint {

/// What a save does when `dir` exists.
enum class if_exists : std::uint8_t {
  replace,  ///< replace a checkpoint (or an empty directory) there, atomically; anything else is refused
  fail,     ///< refuse (usage_error) whatever is there
};

/// How a checkpoint is written.
struct save_options {
  /// The bytes each crc32 covers (the last chunk of a region is shorter). A load reads and checks
  /// whole chunks, so a smaller chunk reads less around a resharded region and lists more
  /// checksums in metadata.json. Must be at least 1.
  std::size_t chunk_bytes = std::size_t{4} << 20;
  /// What to do when `dir` exists.
  if_exists existing = if_exists::replace;
};

/// Collective over `comm`: writes `s` to the directory `dir` (the protocol above) and returns once
/// it is committed on every rank. The tensors are read in place, not copied. Every global tensor's
/// mesh ranks must be ranks of `comm` (a placement over any communicator of the same processes).
/// @throws usage_error: `dir` holds something other than a checkpoint (or anything, under
///         if_exists::fail), two entries share a name, chunk_bytes is 0, a host tensor's shape does
///         not match its span.
/// @throws mismatch_error: the ranks passed different states (names them).
/// @throws error: a file or directory cannot be written (names it and the system's reason).
/// @throws peer_failure: another rank failed (carries its message). timeout_error: a rank did not come.
void save(communicator& comm, const std::filesystem::path& dir, const state& s, const save_options& options = {});

namespace detail {
struct save_progress;
struct async_saver_core;
}  // namespace detail

/// A save in flight (async_saver::save). Copyable: copies watch the same save.
class save_handle {
 public:
  save_handle() = default;
  /// Waits until the save is committed, at most the saver's communicator's timeout from now.
  /// Rethrows the save's error (the same on every rank, as save() throws it).
  /// @throws timeout_error naming the directory when the save is still running at the deadline.
  void wait() const;
  /// The same, until `until`.
  void wait(deadline until) const;
  /// True once the save has committed or failed (wait() then returns or throws at once).
  [[nodiscard]] bool done() const;
  /// True for a handle of a save (false for a default-constructed one).
  [[nodiscard]] bool valid() const noexcept { return progress_ != nullptr; }

 private:
  friend struct detail::async_saver_core;
  explicit save_handle(std::shared_ptr<detail::save_progress> p) : progress_(std::move(p)) {}
  std::shared_ptr<detail::save_progress> progress_;
};

/// Saves in the background: the call snapshots the state (a copy of the bytes this rank writes; a
/// partial tensor's reduction is that copy) and returns, and a thread of the saver writes and
/// commits the checkpoint on a private split of the communicator, so that the caller may change its
/// tensors and run its own collectives at once. One save at a time: a second save() waits for the
/// first (the snapshot buffers are reused). Over MPI the thread needs MPI_THREAD_MULTIPLE.
class async_saver {
 public:
  /// Collective over `comm` (which must outlive the saver): splits it and starts the thread.
  /// @throws usage_error when `comm` runs over MPI initialized below MPI_THREAD_MULTIPLE.
  explicit async_saver(communicator& comm);
  async_saver(const async_saver&) = delete;
  async_saver& operator=(const async_saver&) = delete;
  /// Waits for the save in flight (at most the communicator's timeout), then stops the thread. An
  /// error no handle's wait() collected is printed to stderr (a destructor cannot throw it).
  ~async_saver();

  /// Collective over the saver's communicator: waits for the previous save (as its wait() does),
  /// snapshots `s` and returns a handle; the files are written and committed in the background.
  /// @throws the previous save's error when no handle's wait() collected it; the errors of
  ///         snapshotting (as save()); usage_error after MPI_Finalize.
  save_handle save(const std::filesystem::path& dir, const state& s, const save_options& options = {});

 private:
  std::unique_ptr<detail::async_saver_core> core_;
};

}  // namespace flexpar::checkpoint
