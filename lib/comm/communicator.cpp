// lib/comm/communicator.cpp — the compiled part of flexpar/comm/communicator.hpp: communicators from
// MPI (node detection, the transport chosen by config) and their splits, node topologies.

#include <flexpar/comm/communicator.hpp>
#include <flexpar/comm/cpu_cache.hpp>
#include <flexpar/core/blas_threads.hpp>
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/transport/mpi.hpp>
#include <flexpar/transport/ucx.hpp>

#include <algorithm>
#include <exception>
#include <fstream>
#include <string>

namespace flexpar {
// ---- node_topology ------------------------------------------------------------------------------

node_topology::node_topology(std::vector<int> node_of_rank, int my_rank) : node_of_rank_(std::move(node_of_rank)) {
  if (my_rank < 0 || static_cast<std::size_t>(my_rank) >= node_of_rank_.size())
    throw error_on<usage_error>(my_rank, "node_topology", "rank ", my_rank, " outside ", node_of_rank_.size(),
                                " ranks");
  // Renumber nodes 0.. in order of first appearance so that equal inputs give equal topologies.
  std::vector<int> renumber;
  for (int& node : node_of_rank_) {
    auto it = std::find(renumber.begin(), renumber.end(), node);
    if (it == renumber.end()) {
      renumber.push_back(node);
      it = renumber.end() - 1;
    }
    node = static_cast<int>(it - renumber.begin());
  }
  ranks_of_node_.resize(renumber.size());
  for (std::size_t r = 0; r < node_of_rank_.size(); ++r)
    ranks_of_node_[static_cast<std::size_t>(node_of_rank_[r])].push_back(static_cast<int>(r));
  my_node_ = node_of_rank_[static_cast<std::size_t>(my_rank)];
  const auto& mine = ranks_of_node_[static_cast<std::size_t>(my_node_)];
  local_rank_ = static_cast<int>(std::find(mine.begin(), mine.end(), my_rank) - mine.begin());
}

node_topology node_topology::blocks(int size, int ranks_per_node, int my_rank) {
  if (ranks_per_node < 1)
    throw error_on<usage_error>(my_rank, "node_topology::blocks", "ranks_per_node must be >= 1, got ", ranks_per_node);
  std::vector<int> nodes(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) nodes[static_cast<std::size_t>(r)] = r / ranks_per_node;
  return node_topology(std::move(nodes), my_rank);
}

bool node_topology::uniform() const noexcept {
  return std::all_of(ranks_of_node_.begin(), ranks_of_node_.end(),
                     [&](const auto& ranks) { return ranks.size() == ranks_of_node_.front().size(); });
}

// ---- communicator -------------------------------------------------------------------------------

namespace {

std::string_view name_of(thread_need need) {
  switch (need) {
    case thread_need::single: return "MPI_THREAD_SINGLE";
    case thread_need::funneled: return "MPI_THREAD_FUNNELED";
    case thread_need::serialized: return "MPI_THREAD_SERIALIZED";
    case thread_need::multiple: return "MPI_THREAD_MULTIPLE";
  }
  return "?";
}

/// The launcher of each other MPI and the variable it sets to the number of processes it started.
struct foreign_launcher {
  std::string_view name;
  std::string_view size_variable;
};
constexpr foreign_launcher foreign_launchers[] = {
    {"Open MPI's mpirun/mpiexec", "OMPI_COMM_WORLD_SIZE"},
    {"MVAPICH2's mpirun_rsh", "MV2_COMM_WORLD_SIZE"},
    {"a PMI launcher (Hydra of another MPI build)", "PMI_SIZE"},
};

/// Node of every rank of `comm`: the lowest rank of its shared-memory group (MPI_Comm_split_type).
std::vector<int> detect_nodes(MPI_Comm comm) {
  int rank = 0, size = 0;
  FLEXPAR_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  FLEXPAR_CHECK_MPI(MPI_Comm_size(comm, &size));
  MPI_Comm shared = MPI_COMM_NULL;
  FLEXPAR_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared));
  detail::owned_mpi_comm owned(shared);
  int leader = rank;
  FLEXPAR_CHECK_MPI(MPI_Allreduce(&rank, &leader, 1, MPI_INT, MPI_MIN, owned.get()));
  std::vector<int> nodes(static_cast<std::size_t>(size));
  FLEXPAR_CHECK_MPI(MPI_Allgather(&leader, 1, MPI_INT, nodes.data(), 1, MPI_INT, comm));
  return nodes;
}

}  // namespace

namespace detail {

std::optional<std::string> wrong_launcher(const std::function<std::optional<std::string>(std::string_view)>& lookup,
                                          int world_size, std::string_view mpi_library) {
  if (world_size != 1) return std::nullopt;
  for (const foreign_launcher& l : foreign_launchers) {
    const std::optional<std::string> value = lookup(l.size_variable);
    if (!value) continue;
    int started = 0;
    try {
      started = std::stoi(*value);
    } catch (const std::exception&) {
      continue;
    }
    if (started <= 1) continue;
    const bool mpich = mpi_library.find("MPICH") != std::string_view::npos;
    std::string library(mpi_library.substr(0, mpi_library.find('\n')));
    return "communicator::from_mpi: this process was started by " + std::string(l.name) + " for " +
           std::to_string(started) + " processes (" + std::string(l.size_variable) + "=" + *value + "), but MPI (" +
           library + ") sees a world of 1 rank: each process runs alone. flexpar is built with " +
           (mpich ? std::string("MPICH: launch with mpiexec.mpich -n ") + std::to_string(started) + " <program>"
                  : std::string("this MPI: launch with its own mpiexec"));
  }
  return std::nullopt;
}

}  // namespace detail

communicator communicator::from_mpi(MPI_Comm comm, const config& cfg, thread_need need) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)  // no rank to name: "[rank ?]"
    throw error_on<usage_error>(-1, "communicator::from_mpi", finalized ? "MPI is finalized" : "MPI is not initialized",
                                " (call MPI_Init_thread first; flexpar never initializes MPI itself)");
  int world_size = 0, world_rank = 0;
  FLEXPAR_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  FLEXPAR_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  int provided = MPI_THREAD_SINGLE;
  FLEXPAR_CHECK_MPI(MPI_Query_thread(&provided));
  if (provided < static_cast<int>(need))
    throw error_on<usage_error>(world_rank, "communicator::from_mpi", "flexpar needs ", name_of(need),
                                " but MPI provides ", name_of(static_cast<thread_need>(provided)),
                                "; initialize MPI with MPI_Init_thread(&argc, &argv, ", name_of(need), ", &provided)");
  if (cfg.transport == transport_kind::inproc)
    throw error_on<usage_error>(world_rank, "communicator::from_mpi",
                                "the in-process transport has no MPI communicator; use run_in_process or inproc_world");
  char library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int library_length = 0;
  FLEXPAR_CHECK_MPI(MPI_Get_library_version(library, &library_length));
  if (auto wrong = detail::wrong_launcher(config::environment_lookup, world_size,
                                          std::string_view(library, static_cast<std::size_t>(library_length))))
    throw error_on<usage_error>(world_rank, "", *wrong);

  // The one collective here that can wait for a rank that never comes has a deadline; the blocking
  // calls after it (MPI_Comm_split_type, the transport's set-up) run once every rank is known to be here.
  detail::owned_mpi_comm own =
      detail::duplicate_for_flexpar(comm, deadline_after(cfg.timeout), "communicator::from_mpi");
  int rank = 0, size = 0;
  FLEXPAR_CHECK_MPI(MPI_Comm_rank(own.get(), &rank));
  FLEXPAR_CHECK_MPI(MPI_Comm_size(own.get(), &size));
  node_topology topology = cfg.ranks_per_node > 0 ? node_topology::blocks(size, cfg.ranks_per_node, rank)
                                                  : node_topology(detect_nodes(own.get()), rank);
  std::unique_ptr<flexpar::transport> t =
      cfg.transport == transport_kind::ucx ? make_ucx_transport(own.get(), cfg) : make_mpi_transport(own.get(), cfg);
  const int ranks_on_node = topology.local_size();
  communicator made(std::move(t), std::move(topology), cfg, std::move(own));
  made.close_at_finalize(detail::finalize_registry::attach());
  // p ranks on a node with a BLAS thread per core each run p times as many threads as there are cores
  size_blas_threads(cfg.blas_threads, ranks_on_node, &config::environment_lookup);
  return made;
}

void communicator::close_at_finalize(std::shared_ptr<detail::finalize_registry> registry) {
  // The transport object stays where it is when this communicator moves: the hook may point at it.
  at_finalize_ = detail::finalize_hook(std::move(registry), [t = transport_.get()] { t->close(); });
}

std::size_t last_level_cache_bytes(const std::filesystem::path& cache_dir) {
  int best_level = 0;
  std::size_t best = 0;
  for (int index = 0; index < 16; ++index) {
    const std::filesystem::path dir = cache_dir / ("index" + std::to_string(index));
    std::ifstream level_file(dir / "level"), type_file(dir / "type"), size_file(dir / "size");
    int level = 0;
    std::string type, size;
    if (!(level_file >> level) || !(type_file >> type) || !(size_file >> size) || type == "Instruction") continue;
    std::size_t digits = 0;
    unsigned long long value = 0;
    try {
      value = std::stoull(size, &digits);
    } catch (const std::exception&) {
      continue;
    }
    const std::string unit = size.substr(digits);
    const std::size_t bytes = static_cast<std::size_t>(value) << (unit == "K"   ? 10
                                                                  : unit == "M" ? 20
                                                                  : unit == "G" ? 30
                                                                                : 0);
    if (level > best_level) best_level = level, best = bytes;
  }
  return best;
}

communicator::communicator(std::unique_ptr<flexpar::transport> t, node_topology topology, config cfg,
                           detail::owned_mpi_comm mpi)
    : transport_(std::move(t)), topology_(std::move(topology)), config_(std::move(cfg)), mpi_(std::move(mpi)) {
  if (!transport_) throw error_on<usage_error>(no_rank, "communicator", "the transport is null");
  if (!config_.source_in_memory_min_bytes)  // the last-level cache's share of each rank of my node
    config_.source_in_memory_min_bytes =
        cache_share(last_level_cache_bytes(), topology_.local_size(), config_.streaming_min_bytes);
}

std::optional<communicator> communicator::split(int color, int key) const {
  // The MPI communicator (if any) and the transport split alike, so both keep the same ranks. The
  // transport first: its split makes sure every rank is here (with a deadline) before it blocks in
  // MPI_Comm_split, and then the MPI communicator's split cannot wait for a rank that never comes.
  std::unique_ptr<flexpar::transport> sub = transport_->split(color, key);
  detail::owned_mpi_comm sub_mpi;
  if (mpi_.get() != MPI_COMM_NULL) sub_mpi = detail::split_for_flexpar(mpi_.get(), color, key);
  if (!sub) return std::nullopt;
  // The members' parent ranks, in their new order, give the restricted topology.
  const int my_parent = rank();
  std::vector<int> parents(static_cast<std::size_t>(sub->size()));
  detail::bootstrap_allgather(*sub, std::as_bytes(std::span(&my_parent, 1)), std::as_writable_bytes(std::span(parents)),
                              default_deadline(), "communicator::split");
  std::vector<int> nodes;
  nodes.reserve(parents.size());
  for (int parent : parents) nodes.push_back(topology_.node_of(parent));
  node_topology topology(std::move(nodes), sub->rank());
  communicator made(std::move(sub), std::move(topology), config_, std::move(sub_mpi));
  made.close_at_finalize(at_finalize());
  return made;
}

communicator communicator::split_node() const { return std::move(*split(topology_.my_node(), rank())); }

communicator communicator::split_across_nodes() const { return std::move(*split(topology_.local_rank(), rank())); }

}  // namespace flexpar
