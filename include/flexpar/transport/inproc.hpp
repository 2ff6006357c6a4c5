// flexpar/transport/inproc.hpp — threads as ranks in one process.
//
// For fast unit tests across many world sizes (the gloo model). Messages are matched per
// (receiver, sender, tag) in send order and copied once, straight from the sender's buffer into the
// receiver's (a send completes when the receiver has its bytes: rendezvous, like a large MPI message).
// Communicators over such a world: run_in_process (flexpar/comm/run_in_process.hpp).
#pragma once

#include <memory>

#include <flexpar/transport/transport.hpp>

namespace flexpar {

namespace detail {
class inproc_state;
}

/// The shared mailbox of `size` in-process ranks. Each rank's thread takes its own transport.
class inproc_world {
 public:
  /// A world of `size` ranks (size >= 1) with empty mailboxes.
  explicit inproc_world(int size);
  ~inproc_world();
  inproc_world(const inproc_world&) = delete;
  inproc_world& operator=(const inproc_world&) = delete;

  /// Number of ranks.
  [[nodiscard]] int size() const noexcept;
  /// The transport of rank `rank`; the world must outlive it.
  [[nodiscard]] std::unique_ptr<transport> make_transport(int rank);

 private:
  std::shared_ptr<detail::inproc_state> state_;
};

}  // namespace flexpar
