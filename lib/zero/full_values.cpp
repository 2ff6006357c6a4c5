// lib/zero/full_values.cpp — the exact full parameters and optimizer state, gathered from the shards
// (state.hpp).
#include <optional>

#include "state.hpp"

namespace flexpar::zero {

template <std::size_t MeshRank>
std::vector<std::pair<std::string, std::vector<float>>> sharded_data_parallel<MeshRank>::state::full_parameters() {
  if (!started) throw misuse("full_parameters", "called before start()");
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (std::size_t k = 0; k < buckets.size(); ++k)
    with_full(k, [&](std::span<const float> all) {
      for (std::size_t i : buckets[k].members) {
        const member& m = members[i];
        out.emplace_back(m.name, std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(m.offset),
                                                    all.begin() + static_cast<std::ptrdiff_t>(m.offset + m.count)));
      }
    });
  return out;
}

template <std::size_t MeshRank>
std::vector<std::pair<std::string, std::vector<float>>> sharded_data_parallel<MeshRank>::state::full_optimizer_state(
    optimizer& opt, std::string_view name) {
  member& m = find("full_optimizer_state", name);
  const std::size_t k = m.bucket;
  bucket& b = buckets[k];
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const optimizer_state& s : opt.state(k, shard_elements(b))) {
    if (!s.counters.empty()) continue;  // a counter (Adam's t) is per bucket, not per value
    std::optional<full_tensor> full;
    queue.wait(queue.submit([&] {
      full.emplace(moves.gather_exact(
          shard_tensor::adopt(mesh, {b.elements}, mesh.pool().acquire_copy(std::span<const float>(s.floats)))));
    }));
    std::span<const float> all = full->to_local();
    out.emplace_back(s.name, std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(m.offset),
                                                all.begin() + static_cast<std::ptrdiff_t>(m.offset + m.count)));
  }
  return out;
}

template std::vector<std::pair<std::string, std::vector<float>>> sharded_data_parallel<1>::state::full_parameters();
template std::vector<std::pair<std::string, std::vector<float>>> sharded_data_parallel<1>::state::full_optimizer_state(
    optimizer&, std::string_view);
template std::vector<std::pair<std::string, std::vector<float>>> sharded_data_parallel<2>::state::full_parameters();
template std::vector<std::pair<std::string, std::vector<float>>> sharded_data_parallel<2>::state::full_optimizer_state(
    optimizer&, std::string_view);

}  // namespace flexpar::zero
