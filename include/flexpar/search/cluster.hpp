// flexpar/search/cluster.hpp — the machine the simulator runs a strategy on: nodes x devices,
// each device with a FLOP rate, memory size and memory bandwidth, and two kinds of link
// (inside a node, between nodes) each with a latency and a bandwidth.
//
// Devices are numbered node-major: device d is on node d / devices_per_node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/collective/cost.hpp>

namespace flexpar {
class communicator;
}

namespace flexpar::search {

/// One kind of link: latency (alpha) and bandwidth (1 / beta).
struct link {
  double latency = 5e-6;    ///< seconds per message
  double bandwidth = 10e9;  ///< bytes per second
};

/// The cluster spec (header comment).
struct cluster {
  int nodes = 1;                             ///< nodes
  int devices_per_node = 1;                  ///< devices on each node
  double flops = 1e12;                       ///< floating-point operations per second of one device
  double memory_bandwidth = 100e9;           ///< bytes per second between a device and its memory
  std::uint64_t memory_bytes = 16ull << 30;  ///< memory of one device
  double kernel_latency = 5e-6;              ///< fixed seconds per kernel launch
  link intra;                                ///< between devices of one node
  link inter{10e-6, 1e9};                    ///< between nodes

  /// nodes * devices_per_node.
  [[nodiscard]] int devices() const noexcept { return nodes * devices_per_node; }
  /// The node of device d.
  [[nodiscard]] int node_of(int d) const noexcept { return d / devices_per_node; }
  /// The collectives' cost_params for a group inside one node (`crosses_nodes` false) or one that
  /// spans nodes (the inter-node link is the ring's bottleneck; shm_alpha / copy_beta carry the
  /// intra-node link, which allreduce_hierarchical_cost uses for its within-node steps).
  [[nodiscard]] cost_params params(bool crosses_nodes) const noexcept;
  /// Throws usage_error naming the field when a value is not positive.
  void validate() const;
};

/// Built-in cluster specs by name, V100-class devices (15 TFLOP/s, 16 GiB): "16-4-slow-inter" (16 devices
/// on 4 nodes, PCIe-class 12 GB/s inside a node, an inter-node link 10x slower: 1.2 GB/s, 10 GbE-class),
/// "16-4-nvlink" (the same with 100 GB/s inside a node, 10 GB/s between), "64-8" (64 devices on 8 nodes,
/// PCIe / 10x slower), "8-1" (one node of 8, PCIe), "2-1-cpu" (2 CPU ranks on one node).
/// @throws usage_error for an unknown name (listing them).
cluster preset(std::string_view name);
/// The names preset() knows.
std::vector<std::string> preset_names();

/// The spec as JSON text ({"nodes", "devices_per_node", "flops", "memory_bandwidth", "memory_bytes",
/// "kernel_latency", "intra": {"latency", "bandwidth"}, "inter": {...}}).
std::string to_json(const cluster& c);
/// Parses what to_json(cluster) writes; absent fields keep their defaults. @throws usage_error.
cluster cluster_from_json(std::string_view text);

/// A cluster measured on this machine, once, and held in the returned value (no globals): the FLOP
/// rate from timing a local f32 GEMM of size `gemm_n`^3 (median of 5), the memory bandwidth from
/// a memcpy (median of 5), and the link alpha / beta from the collectives' measurement on `comm` (machine_of:
/// a ping-pong between ranks 0 and 1; the defaults on one rank). Intra- and inter-node links are
/// both the measured one; nodes = 1, devices_per_node = comm.size(). Collective over `comm`; every rank
/// gets the same values (the slowest rank's timings), so a search on them agrees across ranks.
cluster measure_cluster(communicator& comm, std::size_t gemm_n = 256);

}  // namespace flexpar::search
