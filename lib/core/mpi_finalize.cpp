// lib/core/mpi_finalize.cpp — the registry of what MPI_Finalize shuts down
// (include/flexpar/core/mpi_finalize.hpp).
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/core/mpi_finalize.hpp>

#include <cstdio>
#include <exception>

namespace flexpar::detail {

std::shared_ptr<finalize_registry> finalize_registry::attach() {
  std::shared_ptr<finalize_registry> registry(new finalize_registry);
  FLEXPAR_CHECK_MPI(
      MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &finalize_registry::on_delete, &registry->keyval_, nullptr));
  // The attribute holds a weak pointer: the registry's owners are the flexpar objects, not MPI.
  auto* value = new std::weak_ptr<finalize_registry>(registry);
  if (const int code = MPI_Comm_set_attr(MPI_COMM_SELF, registry->keyval_, value); code != MPI_SUCCESS) {
    delete value;
    throw_mpi_failure(code, "MPI_Comm_set_attr(MPI_COMM_SELF, keyval, registry)", std::source_location::current());
  }
  return registry;
}

finalize_registry::~finalize_registry() {
  if (keyval_ == MPI_KEYVAL_INVALID) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Calls on_delete, which finds the weak pointer expired and only deletes it.
  MPI_Comm_delete_attr(MPI_COMM_SELF, keyval_);
  MPI_Comm_free_keyval(&keyval_);
}

int finalize_registry::on_delete(MPI_Comm, int, void* value, void*) noexcept {
  auto* weak = static_cast<std::weak_ptr<finalize_registry>*>(value);
  // Alive: this is MPI_Finalize deleting MPI_COMM_SELF's attributes. Expired: the registry's
  // destructor deleting its own attribute.
  if (const std::shared_ptr<finalize_registry> registry = weak->lock()) registry->run_all();
  delete weak;
  return MPI_SUCCESS;
}

std::uint64_t finalize_registry::add(std::function<void()> shut_down) {
  std::lock_guard lock(mutex_);
  entries_.emplace_back(next_id_, std::move(shut_down));
  return next_id_++;
}

void finalize_registry::remove(std::uint64_t id) noexcept {
  std::lock_guard lock(mutex_);
  std::erase_if(entries_, [&](const auto& e) { return e.first == id; });
}

bool finalize_registry::finalized() const noexcept { return finalized_.load(std::memory_order_acquire); }

void finalize_registry::run_all() noexcept {
  finalized_.store(true, std::memory_order_release);
  // Newest first, each outside the lock: shutting one object down may destroy others, which then
  // remove their own entries.
  for (;;) {
    std::function<void()> shut_down;
    {
      std::lock_guard lock(mutex_);
      if (entries_.empty()) return;
      shut_down = std::move(entries_.back().second);
      entries_.pop_back();
    }
    try {
      shut_down();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[flexpar] at MPI_Finalize: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "[flexpar] at MPI_Finalize: an unknown exception\n");
    }
  }
}

finalize_hook::finalize_hook(std::shared_ptr<finalize_registry> registry, std::function<void()> shut_down)
    : registry_(std::move(registry)) {
  if (registry_) id_ = registry_->add(std::move(shut_down));
}

}  // namespace flexpar::detail
