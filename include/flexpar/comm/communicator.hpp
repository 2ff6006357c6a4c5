// flexpar/comm/communicator.hpp — a group of ranks, its node topology and its transport.
//
// A communicator is an object the user owns and passes to collectives (no global state). Build one
// from an existing MPI communicator (flexpar never calls MPI_Init itself), or from an in-process
// world (threads as ranks, for tests).
//
//   MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
//   flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
//   ... flexpar::allreduce(comm, data, flexpar::reduce_op::sum);
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <flexpar/core/config.hpp>
#include <flexpar/core/mpi_comm.hpp>
#include <flexpar/core/mpi_finalize.hpp>
#include <flexpar/transport/transport.hpp>

namespace flexpar {

namespace detail {
struct collective_context;  // defined by include/flexpar/collective/context.hpp

/// The launchers of other MPIs, by the variable each sets to the number of processes it started.
/// When one says more than one process while this MPI's world has `world_size` (1), the program was
/// started by another MPI's launcher and every process runs alone: the text of the usage_error that
/// says so (naming the launcher, the variable and the launcher to use), otherwise nullopt.
/// `lookup` reads a variable (config::environment_lookup); `mpi_library` is MPI_Get_library_version's text.
std::optional<std::string> wrong_launcher(const std::function<std::optional<std::string>(std::string_view)>& lookup,
                                          int world_size, std::string_view mpi_library);
}  // namespace detail

/// Which ranks share a node (shared memory). Ranks of one node need not be consecutive.
class node_topology {
 public:
  node_topology() = default;
  /// `node_of_rank[r]` = node index of rank r; node indices are 0.. in order of first appearance.
  node_topology(std::vector<int> node_of_rank, int my_rank);

  /// Every run of `ranks_per_node` consecutive ranks is one node.
  static node_topology blocks(int size, int ranks_per_node, int my_rank);

  /// Number of nodes.
  [[nodiscard]] int node_count() const noexcept { return static_cast<int>(ranks_of_node_.size()); }
  /// Node index of `rank` (0 <= rank < the group's size; std::out_of_range otherwise).
  [[nodiscard]] int node_of(int rank) const { return node_of_rank_.at(static_cast<std::size_t>(rank)); }
  /// Node index of my rank.
  [[nodiscard]] int my_node() const noexcept { return my_node_; }
  /// Ranks of node `node`, ascending.
  [[nodiscard]] std::span<const int> ranks_of_node(int node) const {
    return ranks_of_node_.at(static_cast<std::size_t>(node));
  }
  /// Position of my rank among the ranks of my node.
  [[nodiscard]] int local_rank() const noexcept { return local_rank_; }
  /// Number of ranks on my node.
  [[nodiscard]] int local_size() const noexcept {
    return static_cast<int>(ranks_of_node_[static_cast<std::size_t>(my_node_)].size());
  }
  /// True when every node has the same number of ranks (what hierarchical algorithms require).
  [[nodiscard]] bool uniform() const noexcept;

 private:
  std::vector<int> node_of_rank_;
  std::vector<std::vector<int>> ranks_of_node_;
  int my_node_ = 0;
  int local_rank_ = 0;
};

/// What a communicator needs from MPI's thread support.
enum class thread_need : int {
  single = MPI_THREAD_SINGLE,  ///< flexpar calls MPI from the thread that calls flexpar
  funneled = MPI_THREAD_FUNNELED,
  serialized = MPI_THREAD_SERIALIZED,  ///< a flexpar background thread calls MPI, never concurrently with you
  multiple = MPI_THREAD_MULTIPLE,
};

/// A group of ranks with the transport that moves bytes between them, which ranks share a node, and
/// the settings (config) of every operation on it. Move-only; owns its transport and its MPI
/// communicator. Used by one thread at a time (like its transport).
class communicator {
 public:
  /// Collective over `comm`. Duplicates `comm` (messages never mix with yours), builds the transport
  /// `cfg.transport` over it and detects which ranks share a node (MPI_Comm_split_type SHARED, or
  /// `cfg.ranks_per_node`). Until MPI_Finalize: if the communicator (or anything built on it, such
  /// as an engine) is still alive when MPI_Finalize runs, MPI_Finalize shuts it down cleanly first
  /// (core/mpi_finalize.hpp) and any later use is a usage_error.
  /// @throws usage_error if MPI is not initialized, or its thread level is below `need` (the text
  ///         says which level to ask MPI_Init_thread for), or the process was started by another
  ///         MPI's launcher (e.g. OMPI_COMM_WORLD_SIZE=2 while this MPI sees a world of 1: the text
  ///         says to use mpiexec.mpich).
  /// @throws timeout_error when not every rank of `comm` calls it within `cfg.timeout`.
  static communicator from_mpi(MPI_Comm comm, const config& cfg = config::from_environment(),
                               thread_need need = thread_need::single);

  /// A communicator over an existing transport (e.g. inproc_world::make_transport) with a known
  /// topology; not collective, nothing is exchanged. `mpi` (optional) is an MPI communicator over
  /// the same ranks that this object takes ownership of.
  communicator(std::unique_ptr<flexpar::transport> t, node_topology topology, config cfg,
               detail::owned_mpi_comm mpi = {});

  /// My rank in this group, 0 <= rank() < size().
  [[nodiscard]] int rank() const noexcept { return transport_->rank(); }
  /// Number of ranks in this group.
  [[nodiscard]] int size() const noexcept { return transport_->size(); }
  /// The point-to-point transport of this group (its messages never mix with other communicators').
  [[nodiscard]] flexpar::transport& transport() const noexcept { return *transport_; }
  /// Which ranks of this group share a node.
  [[nodiscard]] const node_topology& topology() const noexcept { return topology_; }
  /// The settings this communicator was built with (timeout, transport, ...).
  [[nodiscard]] const config& settings() const noexcept { return config_; }
  /// The deadline of a blocking operation started now (settings().timeout from now).
  [[nodiscard]] deadline default_deadline() const { return deadline_after(config_.timeout); }

  /// The MPI communicator under this one (a duplicate owned by flexpar), or MPI_COMM_NULL for
  /// transports that have none (in-process).
  [[nodiscard]] MPI_Comm mpi_comm() const noexcept { return mpi_.get(); }

  /// Collective: the ranks that pass the same `color` form a new communicator, ordered by (key,
  /// rank); ranks that pass a negative color get std::nullopt. The new communicator's node topology
  /// is the parent's, restricted to its members.
  /// @throws timeout_error naming the ranks that did not call it within settings().timeout.
  [[nodiscard]] std::optional<communicator> split(int color, int key) const;

  /// The ranks of this group known to have failed, ascending (empty: none, or no heartbeats): what
  /// the liveness monitor (FLEXPAR_HEARTBEAT_MS, transport/liveness.hpp) says now.
  [[nodiscard]] std::vector<int> failed_ranks() const;

  /// Collective over the ranks still alive, after a failure (a peer_failure from any operation on
  /// this communicator): they agree on which ranks failed and get a new communicator over the
  /// others, ordered as here, with the same settings. The agreement runs over this communicator's
  /// transport (tag max_tag() - 1) and the heartbeats: the lowest live rank collects every live
  /// rank's view of the failures and sends the union to all, each rank passes it on to all, and
  /// each returns once every other survivor has confirmed it; a coordinator that fails meanwhile is
  /// replaced by the next live rank. This communicator is not used again afterwards (its
  /// collectives stopped out of step); destroy it.
  /// @throws peer_failure when a survivor fails during the agreement (call shrink() again on this
  ///         communicator); usage_error without heartbeats or without MPI (in-process groups);
  ///         timeout_error at settings().timeout.
  [[nodiscard]] communicator shrink();

  /// Collective: the ranks of my node (the intra-node group of hierarchical algorithms).
  [[nodiscard]] communicator split_node() const;
  /// Collective: the ranks with my local rank, one per node (the inter-node group).
  [[nodiscard]] communicator split_across_nodes() const;

  /// The collective layer's state for this communicator (its own message channel and tag sequence,
  /// the shared-memory segment of the intra-node path, cached sub-communicators): built on first use
  /// by include/flexpar/collective/context.hpp, destroyed with this communicator before its transport.
  [[nodiscard]] std::shared_ptr<detail::collective_context>& collective_state() noexcept { return collective_; }

  /// Where objects built on this communicator register what MPI_Finalize must shut down
  /// (core/mpi_finalize.hpp); null for communicators without MPI (in-process).
  [[nodiscard]] const std::shared_ptr<detail::finalize_registry>& at_finalize() const noexcept {
    return at_finalize_.registry();
  }
  /// True once MPI_Finalize has shut this communicator down (its transport is closed).
  [[nodiscard]] bool finalized() const noexcept { return transport_->closed(); }

 private:
  /// Registers this communicator with `registry`: at MPI_Finalize its transport closes.
  void close_at_finalize(std::shared_ptr<detail::finalize_registry> registry);

  std::unique_ptr<flexpar::transport> transport_;
  node_topology topology_;
  config config_;
  detail::owned_mpi_comm mpi_;
  std::shared_ptr<detail::collective_context> collective_;  // destroyed before the transport
  detail::finalize_hook at_finalize_;                       // last member: unregistered first
};

}  // namespace flexpar
