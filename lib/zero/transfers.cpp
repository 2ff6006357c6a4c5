// lib/zero/transfers.cpp — a bucket's boxings in f32 by the nd boxing, and the choice between them and
// the quantized forms (transfers.hpp).
#include "transfers.hpp"

#include <flexpar/sbp/boxing.hpp>
#include <utility>

namespace flexpar::zero::detail {

template <std::size_t MeshRank>
auto transfers<MeshRank>::gather(const shard_tensor& shard) -> full_tensor {
  return quantize_weights ? gather_quantized(shard) : gather_exact(shard.clone());
}

template <std::size_t MeshRank>
auto transfers<MeshRank>::gather_exact(shard_tensor shard) -> full_tensor {
  return sbp::to<full_sbp>(std::move(shard));
}

template <std::size_t MeshRank>
auto transfers<MeshRank>::reduce(std::size_t n, aligned_vector<float> summand) -> shard_tensor {
  return quantize_gradients ? reduce_quantized(n, std::move(summand))
                            : sbp::to<shard_sbp>(gradient_tensor::adopt(mesh, {n}, std::move(summand)));
}

template <std::size_t MeshRank>
std::uint64_t transfers<MeshRank>::gather_bytes(std::size_t n) const {
  return quantize_weights ? quantized_gather_bytes(n)
                          : static_cast<std::uint64_t>(sbp::boxing_cost<shard_sbp, full_sbp>({n}, mesh).wire_bytes);
}

template <std::size_t MeshRank>
std::uint64_t transfers<MeshRank>::reduce_bytes(std::size_t n) const {
  return quantize_gradients
             ? quantized_reduce_bytes(n)
             : static_cast<std::uint64_t>(sbp::boxing_cost<gradient_sbp, shard_sbp>({n}, mesh).wire_bytes);
}

template class transfers<1>;
template class transfers<2>;

}  // namespace flexpar::zero::detail
