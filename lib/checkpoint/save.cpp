// lib/checkpoint/save.cpp — save() and async_saver (flexpar/checkpoint/save.hpp): the steps of the
// protocol written in that header, in order, each followed by the ranks' agreement where it can fail
// on some ranks only.

#include <flexpar/checkpoint/save.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/core/mpi_finalize.hpp>

#include "agree.hpp"
#include "files.hpp"
#include "manifest.hpp"
#include "state_names.hpp"

namespace flexpar::checkpoint {
namespace detail {

/// One entry as this rank saves it (step 1's result).
struct prepared_entry {
  std::string name;
  holding kind = holding::global;
  dtype type = dtype::f32;
  sbp::shape_t shape;
  std::string sbp_text, saved_as;    // global
  std::vector<int> mesh;             // global
  int mesh_index = -1;               // global: -1 outside the mesh
  sbp::box box;                      // of `bytes`
  bool writes = false;               // this rank is the one holder that writes `bytes`
  std::span<const std::byte> bytes;  // what it writes
  std::shared_ptr<void> keep;        // a reduced copy `bytes` points into
};

/// Everything a save writes, as this rank sees it.
struct prepared {
  std::vector<prepared_entry> entries;
  std::vector<std::pair<std::string, std::int64_t>> integers;  // rank 0's are written
};

namespace {

constexpr std::string_view save_op = "checkpoint::save";
constexpr std::string_view async_op = "checkpoint::save (async)";

/// The hidden directory a save writes before it renames it to `dir`: beside it, so that the rename
/// stays on one file system.
std::filesystem::path saving_path(const std::filesystem::path& dir) {
  return dir.parent_path() / ("." + dir.filename().string() + ".flexpar-saving");
}

/// `dir` as an absolute path without a trailing separator.
std::filesystem::path normalized(const std::filesystem::path& dir) {
  std::filesystem::path p = std::filesystem::absolute(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p;
}

prepared_entry prepare_one(int rank, const entry& e, part& p, std::string_view op) {
  prepared_entry out;
  out.name = e.name;
  out.kind = e.kind;
  out.type = e.type;
  out.shape = p.shape;
  out.keep = std::move(p.keep);
  out.bytes = p.bytes;
  std::size_t want = 0;
  if (e.kind == holding::global) {
    out.sbp_text = p.sbp_text;
    out.saved_as = sbp::to_string(p.sbp);
    out.mesh = p.mesh_shape;
    out.mesh_index = p.mesh_index;
    if (p.mesh_index >= 0) {
      out.box = sbp::shard_box(p.shape, p.sbp, p.mesh_shape, p.coords);
      want = out.box.elements();
      // one holder per distinct region: coordinate 0 of every mesh axis that broadcasts
      out.writes = true;
      for (std::size_t d = 0; d < p.sbp.rank; ++d)
        if (p.sbp[d].is_broadcast() && p.coords[d] != 0) out.writes = false;
    }
  } else {
    out.box = {sbp::shape_t(p.shape.size(), 0), p.shape};
    want = sbp::elements_of(p.shape);
    out.writes = e.kind == holding::per_rank || rank == 0;
  }
  if (out.bytes.size() != want * size_of(e.type))
    throw error_on<usage_error>(rank, op, "tensor \"", e.name, "\" has ", out.bytes.size(),
                                " bytes here, but its shape ", sbp::to_string(p.shape), " of ", name_of(e.type),
                                " needs ", want * size_of(e.type),
                                e.kind == holding::global ? " for this rank's shard (a moved-from tensor?)" : "");
  return out;
}

/// FNV-1a over what every rank must agree on: names, holdings, dtypes, shapes, SBPs, meshes.
std::uint64_t digest_of(const prepared& p) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) {
    for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xffu)) * 1099511628211ull;
  };
  auto mix_text = [&](std::string_view t) {
    mix(t.size());
    for (char c : t) mix(static_cast<unsigned char>(c));
  };
  mix(p.entries.size());
  for (const prepared_entry& e : p.entries) {
    mix_text(e.name);
    mix(static_cast<std::uint64_t>(e.kind));
    mix(static_cast<std::uint64_t>(e.type));
    if (e.kind == holding::per_rank) continue;  // each rank's own shape
    mix(e.shape.size());
    for (std::size_t x : e.shape) mix(x);
    mix_text(e.saved_as);
    for (int x : e.mesh) mix(static_cast<std::uint64_t>(x));
  }
  mix(p.integers.size());
  for (const auto& [name, value] : p.integers) mix_text(name);
  return h;
}

void check_same_state(communicator& comm, const prepared& p, std::string_view op) {
  const auto mine = static_cast<std::int64_t>(digest_of(p) >> 1);
  std::vector<std::int64_t> all(static_cast<std::size_t>(comm.size()));
  allgather(comm, std::span<const std::int64_t>(&mine, 1), std::span<std::int64_t>(all));
  std::vector<int> differ;
  for (int r = 1; r < comm.size(); ++r)
    if (all[static_cast<std::size_t>(r)] != all[0]) differ.push_back(r);
  if (!differ.empty())
    throw error_on<mismatch_error>(comm.rank(), op, "the ranks passed different states: those of ", rank_set(differ),
                                   " differ from rank 0's in the names, holdings, dtypes, shapes, SBPs or meshes of "
                                   "their entries, or in the names of their integers");
}

/// Step 1: every entry's part (a partial tensor boxed: collective over its mesh), checked here, then
/// the same on every rank.
prepared prepare(communicator& comm, const state& s, const save_options& options, std::string_view op) {
  // Every part first, with nothing between that can throw on one rank only: no rank may skip a
  // boxing the others are in.
  std::vector<part> parts;
  parts.reserve(s.entries().size());
  for (const entry& e : s.entries()) parts.push_back(e.get(purpose::save));
  prepared p;
  std::exception_ptr failure;
  try {
    if (options.chunk_bytes == 0) throw error_on<usage_error>(comm.rank(), op, "save_options::chunk_bytes is 0");
    check_unique_names(s, comm.rank(), op);
    for (std::size_t i = 0; i < parts.size(); ++i)
      p.entries.push_back(prepare_one(comm.rank(), s.entries()[i], parts[i], op));
    for (const integer_entry& i : s.integers()) p.integers.emplace_back(i.name, *i.value);
  } catch (...) {
    failure = std::current_exception();
  }
  agree(comm, failure, op);
  check_same_state(comm, p, op);
  return p;
}

/// Step 2 (rank 0): the hidden directory, empty, once `dir` is known to be replaceable.
void make_saving_directory(const io_context& io, const std::filesystem::path& dir, const std::filesystem::path& saving,
                           const save_options& options) {
  std::error_code ec;
  std::filesystem::create_directories(dir.parent_path(), ec);
  if (ec) throw error_on<error>(io.rank, io.op, "cannot create ", dir.parent_path().string(), ": ", ec.message());
  if (std::filesystem::exists(dir, ec)) {
    if (options.existing == if_exists::fail)
      throw error_on<usage_error>(io.rank, io.op, dir.string(), " exists (save_options::existing is if_exists::fail)");
    if (!std::filesystem::is_directory(dir, ec))
      throw error_on<usage_error>(io.rank, io.op, dir.string(), " exists and is not a directory: not replaced");
    if (!std::filesystem::is_empty(dir, ec) && !looks_like_checkpoint(dir))
      throw error_on<usage_error>(io.rank, io.op, dir.string(), " exists and is not a flexpar checkpoint (it has no ",
                                  metadata_file, " of this format): not replaced");
  }
  // a crashed save's directory, or the one an earlier replace could not remove
  std::filesystem::path aside = saving;
  aside += ".old";
  for (const std::filesystem::path& stale : {saving, aside}) {
    std::filesystem::remove_all(stale, ec);
    if (ec) throw error_on<error>(io.rank, io.op, "cannot remove ", stale.string(), ": ", ec.message());
  }
  if (!std::filesystem::create_directory(saving, ec) || ec)
    throw error_on<error>(io.rank, io.op, "cannot create ", saving.string(), ": ", ec.message());
}

/// Step 3: this rank's data file; returns its regions, serialized for step 4:
/// [count, then per region: entry, mesh index, offset, bytes, axes, box offset..., box extent...,
/// chunks, crc32...].
std::vector<std::int64_t> write_data_file(const io_context& io, const std::filesystem::path& path, const prepared& p,
                                          std::size_t chunk_bytes) {
  file f = file::create(io, path);
  std::vector<std::int64_t> out{0};
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < p.entries.size(); ++i) {
    const prepared_entry& e = p.entries[i];
    if (!e.writes) continue;
    ++out[0];
    out.push_back(static_cast<std::int64_t>(i));
    out.push_back(e.mesh_index);
    out.push_back(static_cast<std::int64_t>(offset));
    out.push_back(static_cast<std::int64_t>(e.bytes.size()));
    out.push_back(static_cast<std::int64_t>(e.box.extent.size()));
    for (std::size_t x : e.box.offset) out.push_back(static_cast<std::int64_t>(x));
    for (std::size_t x : e.box.extent) out.push_back(static_cast<std::int64_t>(x));
    out.push_back(static_cast<std::int64_t>(chunks_of(e.bytes.size(), chunk_bytes)));
    for (std::size_t at = 0; at < e.bytes.size(); at += chunk_bytes) {
      const std::span<const std::byte> chunk = e.bytes.subspan(at, std::min(chunk_bytes, e.bytes.size() - at));
      out.push_back(crc32_of(chunk));
      f.write_all(chunk);
    }
    offset += e.bytes.size();
  }
  f.close_synced();
  return out;
}

/// Step 5 (rank 0): metadata.json from every rank's regions, then the commit.
void commit(const io_context& io, int world_size, const std::filesystem::path& dir, const std::filesystem::path& saving,
            const prepared& p, const save_options& options, std::span<const std::int64_t> regions,
            std::span<const std::size_t> counts) {
  manifest m;
  m.world_size = world_size;
  m.chunk_bytes = options.chunk_bytes;
  m.file_bytes.assign(static_cast<std::size_t>(world_size), 0);
  m.integers = p.integers;
  for (const prepared_entry& e : p.entries)
    m.tensors.push_back({e.name, e.kind, e.type, e.shape, e.sbp_text, e.saved_as, e.mesh, {}});
  std::size_t at = 0;
  for (int r = 0; r < world_size; ++r) {
    const std::size_t end = at + counts[static_cast<std::size_t>(r)];
    auto next = [&] { return regions[at++]; };
    for (std::int64_t n = next(); n > 0; --n) {
      region g;
      g.file = r;
      const auto i = static_cast<std::size_t>(next());
      g.mesh_index = next();
      g.offset = static_cast<std::uint64_t>(next());
      g.bytes = static_cast<std::uint64_t>(next());
      const auto axes = static_cast<std::size_t>(next());
      for (std::size_t k = 0; k < axes; ++k) g.box.offset.push_back(static_cast<std::size_t>(next()));
      for (std::size_t k = 0; k < axes; ++k) g.box.extent.push_back(static_cast<std::size_t>(next()));
      for (std::int64_t c = next(); c > 0; --c) g.crc.push_back(static_cast<std::uint32_t>(next()));
      m.file_bytes[static_cast<std::size_t>(r)] =
          std::max(m.file_bytes[static_cast<std::size_t>(r)], g.offset + g.bytes);
      if (m.tensors[i].kind == holding::per_rank && r == 0) m.tensors[i].shape = g.box.extent;
      m.tensors[i].regions.push_back(std::move(g));
    }
    if (at != end) throw error_on<error>(io.rank, io.op, "rank ", r, "'s list of regions is malformed");
  }
  for (tensor_record& t : m.tensors) {
    if (t.kind == holding::global)
      std::stable_sort(t.regions.begin(), t.regions.end(),
                       [](const region& a, const region& b) { return a.mesh_index < b.mesh_index; });
    if (t.kind == holding::per_rank) continue;
    std::size_t covered = 0;
    for (const region& g : t.regions) covered += g.box.elements();
    if (covered != sbp::elements_of(t.shape))
      throw error_on<usage_error>(io.rank, io.op, "tensor \"", t.name, "\": the ranks wrote ", covered, " of its ",
                                  sbp::elements_of(t.shape),
                                  " elements; every rank of its placement must call save on this communicator");
  }

  // metadata.json last, under a temporary name until it is durable
  const std::string text = serialize(m);
  const std::filesystem::path partial = saving / (std::string(metadata_file) + ".partial");
  file f = file::create(io, partial);
  f.write_all(std::as_bytes(std::span(text)));
  f.close_synced();
  std::error_code ec;
  std::filesystem::rename(partial, saving / metadata_file, ec);
  if (ec) throw error_on<error>(io.rank, io.op, "cannot rename ", partial.string(), ": ", ec.message());
  sync_directory(io, saving);
  // the commit: one rename (an exchange when a checkpoint is there), made durable in the parent
  const std::optional<std::filesystem::path> old = rename_into_place(io, saving, dir);
  sync_directory(io, dir.parent_path());
  // The old checkpoint is garbage now; a failure to remove it is not this save's (the next save
  // removes it in step 2), so it is not reported.
  if (old) std::filesystem::remove_all(*old, ec);
}

/// Steps 2-5 of `p` into `dir` over `comm`.
void write_checkpoint(communicator& comm, const std::filesystem::path& requested, const prepared& p,
                      const save_options& options, std::string_view op) {
  const io_context io{comm.rank(), op};
  const std::filesystem::path dir = normalized(requested), saving = saving_path(dir);
  // a failed step leaves nothing behind: rank 0 removes the hidden directory before it throws
  auto agree_or_remove = [&](const std::exception_ptr& failure) {
    try {
      agree(comm, failure, op);
    } catch (...) {
      std::error_code ec;
      if (comm.rank() == 0) std::filesystem::remove_all(saving, ec);
      throw;
    }
  };

  // step 2
  std::exception_ptr failure;
  if (comm.rank() == 0) try {
      make_saving_directory(io, dir, saving, options);
    } catch (...) {
      failure = std::current_exception();
    }
  agree(comm, failure, op);  // nothing of ours to remove when it failed

  // step 3
  std::vector<std::int64_t> mine;
  try {
    mine = write_data_file(io, saving / data_file_name(comm.rank()), p, options.chunk_bytes);
  } catch (...) {
    failure = std::current_exception();
  }
  agree_or_remove(failure);

  // step 4
  const auto p_ranks = static_cast<std::size_t>(comm.size());
  const auto length = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> lengths(p_ranks);
  allgather(comm, std::span<const std::int64_t>(&length, 1), std::span<std::int64_t>(lengths));
  std::vector<std::size_t> counts(lengths.begin(), lengths.end());
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  std::vector<std::int64_t> regions(total);
  allgather_v(comm, std::span<const std::int64_t>(mine), std::span<std::int64_t>(regions),
              std::span<const std::size_t>(counts));

  // step 5
  if (comm.rank() == 0) try {
      commit(io, comm.size(), dir, saving, p, options, regions, counts);
    } catch (...) {
      failure = std::current_exception();
    }
  agree_or_remove(failure);
}

}  // namespace

/// What a handle watches: one save of an async_saver.
struct save_progress {
  std::mutex mutex;
  std::condition_variable changed;
  bool finished = false;
  std::exception_ptr failure;
  bool collected = false;  // a wait() has thrown `failure`
  std::filesystem::path dir;
  int rank = -1;
  std::chrono::milliseconds timeout{};

  /// Waits for the end until `until`; rethrows the failure (every time when `always`, otherwise
  /// only when no wait() has thrown it yet).
  void wait(deadline until, bool always) {
    std::unique_lock lock(mutex);
    if (!changed.wait_until(lock, until, [&] { return finished; }))
      throw error_on<timeout_error>(rank, async_op, "the save of ", dir.string(), " is still running at the deadline");
    if (failure && (always || !collected)) {
      collected = true;
      std::rethrow_exception(failure);
    }
  }
};

/// The saver's thread and what it shares with save() (save.hpp, async_saver).
struct async_saver_core {
  struct job {
    prepared work;
    std::filesystem::path dir;
    save_options options;
    std::shared_ptr<save_progress> progress;
  };

  communicator& parent;
  std::optional<communicator> own;  // a split of parent: the thread's collectives never meet the caller's
  std::mutex mutex;
  std::condition_variable wake;
  std::optional<job> pending;
  bool stopping = false;
  std::shared_ptr<save_progress> last;
  std::vector<std::vector<std::byte>> buffers;  // the snapshots, reused (one save at a time)
  std::thread thread;
  flexpar::detail::finalize_hook at_finalize;

  explicit async_saver_core(communicator& comm) : parent(comm) {
    if (comm.mpi_comm() != MPI_COMM_NULL && comm.transport().kind() == transport_kind::mpi) {
      int provided = MPI_THREAD_SINGLE;
      FLEXPAR_CHECK_MPI(MPI_Query_thread(&provided));
      if (provided < MPI_THREAD_MULTIPLE)
        throw error_on<usage_error>(
            comm.rank(), "checkpoint::async_saver",
            "its thread calls MPI while yours may too, so it needs MPI_THREAD_MULTIPLE; "
            "initialize MPI with MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided)");
    }
    own = comm.split(0, comm.rank());
    // the split's collective channel now, on every rank, not lazily in the thread's first save
    barrier(*own);
    thread = std::thread([this] { run(); });
    at_finalize = flexpar::detail::finalize_hook(own->at_finalize(), [this] { stop(); });
  }

  void run() {
    for (;;) {
      job j;
      {
        std::unique_lock lock(mutex);
        wake.wait(lock, [&] { return pending.has_value() || stopping; });
        if (!pending) return;  // stopping, and nothing left to write
        j = std::move(*pending);
        pending.reset();
      }
      std::exception_ptr failure;
      try {
        write_checkpoint(*own, j.dir, j.work, j.options, async_op);
      } catch (...) {
        failure = std::current_exception();
      }
      j.work = {};  // the reduced copies go now, not at the next save
      {
        std::lock_guard lock(j.progress->mutex);
        j.progress->finished = true;
        j.progress->failure = failure;
      }
      j.progress->changed.notify_all();
    }
  }

  /// Ends the thread once it has written what it was given (its collectives have deadlines).
  void stop() noexcept {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    if (thread.joinable()) thread.join();
  }

  save_handle save(const std::filesystem::path& dir, const state& s, const save_options& options) {
    if (at_finalize.finalized() || parent.finalized())
      throw error_on<usage_error>(parent.rank(), async_op, "called after MPI_Finalize shut the saver down");
    if (last) last->wait(parent.default_deadline(), false);
    prepared p = prepare(parent, s, options, async_op);
    // the snapshot: a copy of what this rank writes, unless it is a reduced copy already
    std::size_t used = 0;
    for (prepared_entry& e : p.entries) {
      if (!e.writes || e.keep) continue;
      if (used == buffers.size()) buffers.emplace_back();
      std::vector<std::byte>& b = buffers[used++];
      b.resize(e.bytes.size());
      std::copy(e.bytes.begin(), e.bytes.end(), b.begin());
      e.bytes = b;
    }
    auto progress = std::make_shared<save_progress>();
    progress->dir = dir;
    progress->rank = parent.rank();
    progress->timeout = parent.settings().timeout;
    {
      std::lock_guard lock(mutex);
      pending = job{std::move(p), dir, options, progress};
    }
    wake.notify_all();
    last = progress;
    return save_handle(progress);
  }

  ~async_saver_core() {
    stop();
    if (!last) return;
    std::lock_guard lock(last->mutex);
    if (last->failure && !last->collected) {
      try {
        std::rethrow_exception(last->failure);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s (reported by ~async_saver: no wait() collected it)\n", e.what());
      } catch (...) {
        std::fprintf(stderr, "%s: a save failed (reported by ~async_saver)\n", on_rank(last->rank, async_op).c_str());
      }
    }
  }
};

}  // namespace detail

void save(communicator& comm, const std::filesystem::path& dir, const state& s, const save_options& options) {
  const detail::prepared p = detail::prepare(comm, s, options, detail::save_op);
  detail::write_checkpoint(comm, dir, p, options, detail::save_op);
}

void save_handle::wait() const {
  if (!progress_) throw error_on<usage_error>(-1, "checkpoint::save_handle::wait", "the handle watches no save");
  wait(deadline_after(progress_->timeout));
}

void save_handle::wait(deadline until) const {
  if (!progress_) throw error_on<usage_error>(-1, "checkpoint::save_handle::wait", "the handle watches no save");
  progress_->wait(until, true);
}

bool save_handle::done() const {
  if (!progress_) return false;
  std::lock_guard lock(progress_->mutex);
  return progress_->finished;
}

async_saver::async_saver(communicator& comm) : core_(std::make_unique<detail::async_saver_core>(comm)) {}

async_saver::~async_saver() = default;

save_handle async_saver::save(const std::filesystem::path& dir, const state& s, const save_options& options) {
  return core_->save(dir, s, options);
}

}  // namespace flexpar::checkpoint
