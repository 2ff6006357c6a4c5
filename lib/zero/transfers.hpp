// lib/zero/transfers.hpp — how a bucket's values move: its three SBP annotations and the two boxings
// between them, exact (the nd boxing) or quantized to 8 bits (ZeRO++ qwZ, qgZ), with their wire bytes
// (flexpar/zero/sharded_data_parallel.hpp has the scheme). The exact forms are in transfers.cpp, the
// quantized ones in quantized_transfers.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <flexpar/compress/minmax_uint8.hpp>
#include <flexpar/core/aligned_vector.hpp>
#include <flexpar/sbp/global_tensor.hpp>
#include <flexpar/zero/sharded_data_parallel.hpp>
#include <vector>

namespace flexpar::zero::detail {

/// The three annotations of a bucket on a mesh of each rank.
template <std::size_t MeshRank>
struct annotations;
template <>
struct annotations<1> {
  using shard = sbp::split<0>;
  using full = sbp::broadcast;
  using gradient = sbp::partial_sum;
};
template <>
struct annotations<2> {
  using shard = sbp::sbp<sbp::broadcast, sbp::split<0>>;
  using full = sbp::sbp<sbp::broadcast, sbp::broadcast>;
  using gradient = sbp::sbp<sbp::partial_sum, sbp::partial_sum>;
};

/// The boxings of a bucket on `mesh`: S(0) -> B (gather) and P -> S(0) (reduce), each exact or, as the
/// options say, quantized. Called on the communication thread, in the same order on every rank: each
/// call is collective over the mesh.
template <std::size_t MeshRank>
class transfers {
 public:
  using shard_sbp = typename annotations<MeshRank>::shard;
  using full_sbp = typename annotations<MeshRank>::full;
  using gradient_sbp = typename annotations<MeshRank>::gradient;
  using shard_tensor = sbp::global_tensor<float, shard_sbp>;
  using full_tensor = sbp::global_tensor<float, full_sbp>;
  using gradient_tensor = sbp::global_tensor<float, gradient_sbp>;
  /// After the quantized step within a node of a 2-D mesh: reduced within the node, partial across.
  using node_reduced_tensor = sbp::global_tensor<float, sbp::sbp<sbp::partial_sum, sbp::split<0>>>;

  /// `mesh` must outlive this object.
  transfers(sbp::placement<MeshRank>& mesh, const options& o)
      : mesh(mesh),
        codec{o.quantization_chunk},
        quantize_weights(o.quantize_weights),
        quantize_gradients(o.quantize_gradients) {}

  /// S(0) -> B of a bucket's parameters: quantized when options::quantize_weights (qwZ), else exact.
  [[nodiscard]] full_tensor gather(const shard_tensor& shard);
  /// S(0) -> B in f32 of `shard` (taken over), whatever the options (full_parameters(),
  /// full_optimizer_state()).
  [[nodiscard]] full_tensor gather_exact(shard_tensor shard);
  /// P -> S(0) of a bucket's n gradient values (`summand`: this rank's full gradient, taken over):
  /// quantized when options::quantize_gradients (qgZ), else exact.
  [[nodiscard]] shard_tensor reduce(std::size_t n, aligned_vector<float> summand);

  /// Wire bytes one gather, one reduction of a bucket of n values sends from this rank.
  [[nodiscard]] std::uint64_t gather_bytes(std::size_t n) const;
  [[nodiscard]] std::uint64_t reduce_bytes(std::size_t n) const;

 private:
  // ---- the quantized forms (quantized_transfers.cpp) ----
  /// The group a bucket is sharded over: every rank (1-D), the ranks of my node (2-D: mesh axis 1).
  [[nodiscard]] communicator& shard_group() const;
  /// Encoded bytes of each rank's part of n values over the shard group.
  [[nodiscard]] std::vector<std::size_t> encoded_parts(std::size_t n) const;
  /// Bytes a quantized gather sends from this rank: every part but its own, once (allgather).
  [[nodiscard]] std::uint64_t quantized_gather_bytes(std::size_t n) const;
  /// Bytes a quantized reduction sends from this rank: every other rank's part (alltoall), plus the
  /// f32 allreduce of the shard across nodes on a 2-D mesh.
  [[nodiscard]] std::uint64_t quantized_reduce_bytes(std::size_t n) const;
  /// qwZ: S(0) -> B with every part min-max quantized; every rank decodes every part (its own too).
  [[nodiscard]] full_tensor gather_quantized(const shard_tensor& shard);
  /// qgZ: P -> S(0) with each destination's part min-max quantized (one alltoall); my part decoded
  /// and summed in rank order; on a 2-D mesh then (P, S(0)) -> (B, S(0)) across nodes in f32.
  [[nodiscard]] shard_tensor reduce_quantized(std::size_t n, aligned_vector<float> summand);

  sbp::placement<MeshRank>& mesh;
  compress::minmax_uint8 codec;
  bool quantize_weights, quantize_gradients;
};

}  // namespace flexpar::zero::detail
