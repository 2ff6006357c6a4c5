// lib/zero/gathers.cpp — when a bucket's parameters are gathered (S(0) -> B): at once in stages 1/2
// after each step, on demand in stage 3 with the next buckets of the previous step's order prefetched,
// and freed once viewed and no longer viewed (state.hpp).
#include <optional>

#include "state.hpp"

namespace flexpar::zero {

/// Starts bucket k's gather unless it is held or on its way.
template <std::size_t MeshRank>
void sharded_data_parallel<MeshRank>::state::begin_gather(std::size_t k) {
  bucket& b = buckets[k];
  if (b.gathering) return;
  b.gathering = true;
  b.viewed = false;
  ++traffic.gathers;
  traffic.wire_bytes += b.gather_bytes;
  b.gathered = queue.submit([this, k] {
    bucket& c = buckets[k];
    parameters.add(full_bytes(c));
    std::optional<full_tensor> old = std::move(c.full);  // stages 1/2: the previous step's, freed below
    c.full.emplace(moves.gather(*c.shard));
    if (old) {
      old.reset();
      parameters.sub(full_bytes(c));
    }
  });
}

/// Frees bucket k's full parameters (stage 3; none viewing them, gathered).
template <std::size_t MeshRank>
void sharded_data_parallel<MeshRank>::state::free_full(std::size_t k) {
  bucket& b = buckets[k];
  queue.wait(b.gathered);
  b.full.reset();
  b.gathering = false;
  b.viewed = false;
  parameters.sub(full_bytes(b));
}

template <std::size_t MeshRank>
auto sharded_data_parallel<MeshRank>::state::gather(std::string_view name) -> view {
  member& m = find("gather", name);
  const std::size_t k = m.bucket;
  if (opts.stage == 3 && (order.empty() || order.back() != k)) {
    order.push_back(k);
    for (std::size_t c = 0; c < buckets.size(); ++c)
      if (c != k && buckets[c].gathering && buckets[c].views == 0 && buckets[c].viewed) free_full(c);
    begin_gather(k);
    const std::size_t position = order.size() - 1;
    for (int ahead = 1; ahead <= opts.prefetch && position + static_cast<std::size_t>(ahead) < last_order.size();
         ++ahead)
      begin_gather(last_order[position + static_cast<std::size_t>(ahead)]);
  }
  bucket& b = buckets[k];
  queue.wait(b.gathered);
  ++b.views;
  b.viewed = true;
  return view(this, k, std::span<const float>(b.full->to_local()).subspan(m.offset, m.count));
}

template void sharded_data_parallel<1>::state::begin_gather(std::size_t);
template void sharded_data_parallel<1>::state::free_full(std::size_t);
template auto sharded_data_parallel<1>::state::gather(std::string_view) -> view;
template void sharded_data_parallel<2>::state::begin_gather(std::size_t);
template void sharded_data_parallel<2>::state::free_full(std::size_t);
template auto sharded_data_parallel<2>::state::gather(std::string_view) -> view;

}  // namespace flexpar::zero
