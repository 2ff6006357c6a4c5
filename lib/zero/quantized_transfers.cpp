// lib/zero/quantized_transfers.cpp — ZeRO++ qwZ and qgZ: a bucket's gather and reduction with each
// rank's part min-max quantized to 8 bits (compress::minmax_uint8), and their wire bytes (transfers.hpp).
#include <flexpar/collective.hpp>
#include <flexpar/sbp/boxing.hpp>
#include <utility>

#include "transfers.hpp"

namespace flexpar::zero::detail {

template <std::size_t MeshRank>
communicator& transfers<MeshRank>::shard_group() const {
  return MeshRank == 1 ? mesh.group() : mesh.axis(1);
}

template <std::size_t MeshRank>
std::vector<std::size_t> transfers<MeshRank>::encoded_parts(std::size_t n) const {
  const int p = shard_group().size();
  std::vector<std::size_t> bytes(static_cast<std::size_t>(p));
  for (int q = 0; q < p; ++q)
    bytes[static_cast<std::size_t>(q)] = codec.encoded_size(sbp::balanced_part(n, p, q).count);
  return bytes;
}

template <std::size_t MeshRank>
std::uint64_t transfers<MeshRank>::quantized_gather_bytes(std::size_t n) const {
  const std::vector<std::size_t> bytes = encoded_parts(n);
  const auto me = static_cast<std::size_t>(shard_group().rank());
  std::uint64_t sum = 0;
  for (std::size_t q = 0; q < bytes.size(); ++q) sum += q == me ? 0 : bytes[q];
  return sum;
}

template <std::size_t MeshRank>
std::uint64_t transfers<MeshRank>::quantized_reduce_bytes(std::size_t n) const {
  std::uint64_t sum = quantized_gather_bytes(n);
  if constexpr (MeshRank == 2)
    sum += static_cast<std::uint64_t>(
        sbp::boxing_cost<sbp::sbp<sbp::partial_sum, sbp::split<0>>, shard_sbp>({n}, mesh).wire_bytes);
  return sum;
}

template <std::size_t MeshRank>
auto transfers<MeshRank>::gather_quantized(const shard_tensor& shard) -> full_tensor {
  communicator& g = shard_group();
  const std::size_t n = shard.shape()[0];
  const int p = g.size();
  const std::vector<std::size_t> bytes = encoded_parts(n);
  std::size_t total = 0;
  for (std::size_t b : bytes) total += b;
  aligned_vector<std::uint8_t> mine =
      mesh.pool().template acquire<std::uint8_t>(bytes[static_cast<std::size_t>(g.rank())]);
  aligned_vector<std::uint8_t> all = mesh.pool().template acquire<std::uint8_t>(total);
  codec.encode(shard.to_local(), std::as_writable_bytes(std::span<std::uint8_t>(mine)));
  allgather_v(g, std::span<const std::uint8_t>(mine), std::span<std::uint8_t>(all),
              std::span<const std::size_t>(bytes));
  aligned_vector<float> full = mesh.pool().template acquire<float>(n);
  std::size_t at = 0;
  for (int q = 0; q < p; ++q) {
    const sbp::part part = sbp::balanced_part(n, p, q);
    codec.decode(std::as_bytes(std::span<const std::uint8_t>(all).subspan(at, bytes[static_cast<std::size_t>(q)])),
                 std::span<float>(full).subspan(part.offset, part.count));
    at += bytes[static_cast<std::size_t>(q)];
  }
  mesh.pool().give_back(std::move(mine));
  mesh.pool().give_back(std::move(all));
  return full_tensor::adopt(mesh, {n}, std::move(full));
}

template <std::size_t MeshRank>
auto transfers<MeshRank>::reduce_quantized(std::size_t n, aligned_vector<float> summand) -> shard_tensor {
  communicator& g = shard_group();
  const int p = g.size(), me = g.rank();
  const std::vector<std::size_t> bytes = encoded_parts(n);
  std::size_t total = 0;
  for (std::size_t b : bytes) total += b;
  const sbp::part my_part = sbp::balanced_part(n, p, me);
  const std::vector<std::size_t> receives(static_cast<std::size_t>(p), bytes[static_cast<std::size_t>(me)]);
  aligned_vector<std::uint8_t> out = mesh.pool().template acquire<std::uint8_t>(total);
  aligned_vector<std::uint8_t> in =
      mesh.pool().template acquire<std::uint8_t>(bytes[static_cast<std::size_t>(me)] * static_cast<std::size_t>(p));
  std::size_t at = 0;
  for (int q = 0; q < p; ++q) {
    const sbp::part part = sbp::balanced_part(n, p, q);
    codec.encode(std::span<const float>(summand).subspan(part.offset, part.count),
                 std::as_writable_bytes(std::span<std::uint8_t>(out).subspan(at, bytes[static_cast<std::size_t>(q)])));
    at += bytes[static_cast<std::size_t>(q)];
  }
  mesh.pool().give_back(std::move(summand));
  alltoall_v(g, std::span<const std::uint8_t>(out), std::span<const std::size_t>(bytes), std::span<std::uint8_t>(in),
             std::span<const std::size_t>(receives));
  aligned_vector<float> local = mesh.pool().template acquire<float>(my_part.count, 0.0f);
  aligned_vector<float> piece = mesh.pool().template acquire<float>(my_part.count);
  for (int q = 0; q < p; ++q) {
    const std::size_t size = bytes[static_cast<std::size_t>(me)];
    codec.decode(std::as_bytes(std::span<const std::uint8_t>(in).subspan(static_cast<std::size_t>(q) * size, size)),
                 std::span<float>(piece));
    for (std::size_t i = 0; i < piece.size(); ++i) local[i] += piece[i];
  }
  mesh.pool().give_back(std::move(out));
  mesh.pool().give_back(std::move(in));
  mesh.pool().give_back(std::move(piece));
  if constexpr (MeshRank == 2)
    return sbp::to<shard_sbp>(node_reduced_tensor::adopt(mesh, {n}, std::move(local)));
  else
    return shard_tensor::adopt(mesh, {n}, std::move(local));
}

// The members defined here, for both meshes (transfers.cpp instantiates the rest of the class).
template communicator& transfers<1>::shard_group() const;
template communicator& transfers<2>::shard_group() const;
template std::vector<std::size_t> transfers<1>::encoded_parts(std::size_t) const;
template std::vector<std::size_t> transfers<2>::encoded_parts(std::size_t) const;
template std::uint64_t transfers<1>::quantized_gather_bytes(std::size_t) const;
template std::uint64_t transfers<2>::quantized_gather_bytes(std::size_t) const;
template std::uint64_t transfers<1>::quantized_reduce_bytes(std::size_t) const;
template std::uint64_t transfers<2>::quantized_reduce_bytes(std::size_t) const;
template auto transfers<1>::gather_quantized(const shard_tensor&) -> full_tensor;
template auto transfers<2>::gather_quantized(const shard_tensor&) -> full_tensor;
template auto transfers<1>::reduce_quantized(std::size_t, aligned_vector<float>) -> shard_tensor;
template auto transfers<2>::reduce_quantized(std::size_t, aligned_vector<float>) -> shard_tensor;

}  // namespace flexpar::zero::detail
