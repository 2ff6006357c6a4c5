// flexpar/transport/inproc.hpp — threads as ranks in one process.
//
// For fast unit tests across many world sizes (the gloo model). Messages are matched per
// (receiver, sender, tag) in send order and copied once, straight from the sender's buffer into the
// receiver's (a send completes when the receiver has its bytes: rendezvous, like a large MPI message).
#pragma once

#include <functional>
#include <memory>

#include <flexpar/comm/communicator.hpp>
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

/// Runs `body(comm)` on `size` threads, one communicator each, over one inproc_world; `ranks_per_node`
/// (0 = all ranks on one node) sets the node topology. After every thread has ended, rethrows the
/// exception of the lowest rank that threw one. Give `cfg.timeout` a short value in tests so that
/// a rank waiting on a failed one ends soon.
void run_in_process(int size, const std::function<void(communicator&)>& body, config cfg = {}, int ranks_per_node = 0);

}  // namespace flexpar
