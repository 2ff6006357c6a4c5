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

/// Throughput of the gradient compressors on one device, in bytes of f32 input (encode) or output
/// (decode) per second. The simulator prices BAGUA's compressed relaxations with them; measure_compression()
/// times the library's own compressors (compress/minmax_uint8.hpp, compress/onebit.hpp).
struct compression_rates {
  double minmax_encode = 2e9;  ///< min-max uint8 encode (bytegrad, low precision decentralized)
  double minmax_decode = 4e9;  ///< min-max uint8 decode
  double onebit_encode = 1e9;  ///< 1-bit sign encode with error feedback (1-bit Adam)
  double onebit_decode = 2e9;  ///< 1-bit decode
  double adam_update = 1e9;    ///< 1-bit Adam's own optimizer passes (momentum; x -= lr m / (sqrt(v) + eps))
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
  compression_rates compression;             ///< the gradient compressors' throughput on one device
  /// Communication runs beside computation (GPU streams: a device's link and compute queues are apart).
  /// false: a device blocks in its collectives, as the CPU-rank executor (execute.hpp) does.
  bool overlap = true;

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

/// Times the library's compressors on this machine, locally (not collective): min-max uint8 and 1-bit
/// encode and decode of `floats` values, and 1-bit Adam's momentum and update passes (the loops of
/// relax/momentum_adam.hpp's compression stage), the median of 5 after a warm-up each.
compression_rates measure_compression(std::size_t floats = std::size_t{1} << 22);

/// Built-in cluster specs by name, V100-class devices (15 TFLOP/s, 16 GiB): "16-4-slow-inter" (16 devices
/// on 4 nodes, PCIe-class 12 GB/s inside a node, an inter-node link 10x slower: 1.2 GB/s, 10 GbE-class),
/// "16-4-nvlink" (the same with 100 GB/s inside a node, 10 GB/s between), "64-8" (64 devices on 8 nodes,
/// PCIe / 10x slower), "8-1" (one node of 8, PCIe), "2-1-cpu" (2 CPU ranks on one node).
/// @throws usage_error for an unknown name (listing them).
cluster preset(std::string_view name);
/// The names preset() knows.
std::vector<std::string> preset_names();

/// The spec as JSON text ({"nodes", "devices_per_node", "flops", "memory_bandwidth", "memory_bytes",
/// "kernel_latency", "intra": {"latency", "bandwidth"}, "inter": {...}, "compression": {"minmax_encode",
/// "minmax_decode", "onebit_encode", "onebit_decode", "adam_update"}, "overlap"}).
std::string to_json(const cluster& c);
/// Parses what to_json(cluster) writes; absent fields keep their defaults. @throws usage_error.
cluster cluster_from_json(std::string_view text);

/// A cluster measured on this machine, once, and held in the returned value (no globals): the FLOP
/// rate from timing a local f32 GEMM of size `gemm_n`^3 (median of 5), the memory bandwidth from
/// a memcpy (median of 5), the compressors' throughput from measure_compression(), and the link alpha / beta
/// fitted (least squares on the relative error) to the SBP layer's own boxings on a 1-D mesh of every rank of
/// `comm` — allgather (S(0) -> B, S(1) -> B), allreduce (P -> B), reduce-scatter (P -> S(0)), all-to-all
/// (S(0) -> S(1)) of 16 KiB to 1 MiB tensors, each the median of 5 after a barrier — so the per-message
/// overhead of the run-time path (allocation, pack / unpack, the transport) is in alpha and its per-byte
/// costs in beta (one rank, or no positive fit: the collectives' ping-pong). Intra- and inter-node links are both the
/// fitted one; nodes = 1, devices_per_node = comm.size(); overlap = false (the executor blocks in its
/// collectives). Collective over `comm`; every rank gets the same values (the slowest rank's timings), so a
/// search on them agrees across ranks.
cluster measure_cluster(communicator& comm, std::size_t gemm_n = 256);

/// One timed boxing of measure_cluster's link fit: its cost terms (sbp::axis_step_cost) and its seconds
/// (median, slowest rank).
using link_sample = timed_cost;

/// The link (alpha = latency, 1 / beta = bandwidth) that fits `samples` best in relative error, with the
/// reduction term priced at `gamma` seconds per byte; alpha >= 0 (refitted with alpha = 0 if negative).
/// @throws usage_error for fewer than 2 samples or no positive fit.
link fit_link(const std::vector<link_sample>& samples, double gamma);

}  // namespace flexpar::search
