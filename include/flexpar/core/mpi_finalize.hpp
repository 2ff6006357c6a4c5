// flexpar/core/mpi_finalize.hpp — shutting flexpar's objects down at MPI_Finalize when they are still
// alive then.
//
// MPI_Finalize first deletes the attributes of MPI_COMM_SELF, calling their delete callbacks while
// MPI still works (MPI 4.0 §11.2.2; mpi4py hooks its own cleanup there the same way). A program
// that calls MPI_Finalize with an engine, a gradient_sync or a communicator still in scope would
// otherwise leave a background thread calling MPI (or UCX) after MPI is gone, and a timeline never
// written. So communicator::from_mpi attaches a `finalize_registry` to MPI_COMM_SELF, every object
// built on that communicator (its splits, the collectives' channel, an engine) registers how to
// shut itself down, and at MPI_Finalize the registry runs those in the reverse order of their
// registration: an engine (registered after the communicator it runs on) stops its thread and
// writes its timeline before that communicator closes its transport. Afterwards every such object
// refuses further use with a usage_error that names MPI_Finalize, and its destructor only frees
// memory.
//
// Not a process-wide singleton: each communicator::from_mpi makes a registry of its own, shared by
// the objects derived from that communicator and reached only through them (no global variable,
// no static keyval). The attribute on MPI_COMM_SELF is MPI's pointer to it for MPI_Finalize; when
// the last of those objects goes before MPI_Finalize, the registry deletes its attribute and frees
// its keyval.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace flexpar::detail {

/// What to shut down at MPI_Finalize for the objects of one communicator::from_mpi (above).
class finalize_registry {
 public:
  /// A new registry, attached to MPI_COMM_SELF. MPI must be initialized and not finalized.
  /// @throws transport_error when MPI refuses the keyval or the attribute.
  static std::shared_ptr<finalize_registry> attach();

  finalize_registry(const finalize_registry&) = delete;
  finalize_registry& operator=(const finalize_registry&) = delete;
  /// Detaches from MPI_COMM_SELF (unless MPI is finalized already).
  ~finalize_registry();

  /// Registers `shut_down`, run once at MPI_Finalize unless removed first. Returns its id.
  std::uint64_t add(std::function<void()> shut_down);
  /// Removes a registration (nothing happens if it already ran).
  void remove(std::uint64_t id) noexcept;
  /// True once MPI_Finalize has run (or is running) this registry's entries.
  [[nodiscard]] bool finalized() const noexcept;

 private:
  finalize_registry() = default;
  static int on_delete(MPI_Comm comm, int keyval, void* value, void* extra) noexcept;
  void run_all() noexcept;

  mutable std::mutex mutex_;
  std::vector<std::pair<std::uint64_t, std::function<void()>>> entries_;
  std::uint64_t next_id_ = 1;
  std::atomic<bool> finalized_{false};  // read on every collective call: no lock
  int keyval_ = MPI_KEYVAL_INVALID;
};

/// One object's registration with a registry; removed when this is destroyed. Empty (and never
/// finalized) for objects without MPI (the in-process transport).
class finalize_hook {
 public:
  finalize_hook() = default;
  /// Registers `shut_down` with `registry` (nothing when `registry` is null).
  finalize_hook(std::shared_ptr<finalize_registry> registry, std::function<void()> shut_down);
  finalize_hook(finalize_hook&& other) noexcept
      : registry_(std::move(other.registry_)), id_(std::exchange(other.id_, 0)) {}
  finalize_hook& operator=(finalize_hook&& other) noexcept {
    if (this != &other) {
      release();
      registry_ = std::move(other.registry_);
      id_ = std::exchange(other.id_, 0);
    }
    return *this;
  }
  ~finalize_hook() { release(); }

  /// The registry (null for objects without MPI).
  [[nodiscard]] const std::shared_ptr<finalize_registry>& registry() const noexcept { return registry_; }
  /// True once MPI_Finalize has shut this object down.
  [[nodiscard]] bool finalized() const noexcept { return registry_ && registry_->finalized(); }

 private:
  void release() noexcept {
    if (registry_ && id_ != 0) registry_->remove(id_);
    id_ = 0;
  }
  std::shared_ptr<finalize_registry> registry_;
  std::uint64_t id_ = 0;
};

}  // namespace flexpar::detail
