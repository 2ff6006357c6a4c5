// lib/zero/step.cpp — the optimizer step: the last reductions, the scaling, the optimizer on each
// bucket's shard, and (stages 1/2) the gathers of the new parameters (state.hpp).
#include "state.hpp"

namespace flexpar::zero {

template <std::size_t MeshRank>
bool sharded_data_parallel<MeshRank>::state::step(optimizer& opt) {
  if (!started) throw misuse("step", "called before start()");
  for (std::size_t k = 0; k < buckets.size(); ++k)
    if (buckets[k].views > 0)
      throw misuse("step", "a view of parameter \"", members[buckets[k].members.front()].name,
                   "\"'s bucket is alive; views end before step() updates the parameters");
  for (std::size_t k = 0; k < buckets.size(); ++k) reduce(k);
  for (bucket& b : buckets) {
    b.gradient_open = false;
    b.ready = 0;
    b.reduced = false;
  }
  for (member& m : members) m.ready = false;
  if (++pass < opts.backward_passes_per_step) return false;
  pass = 0;
  queue.drain();
  const float scale = opts.average ? 1.0f / static_cast<float>(replicas() * opts.backward_passes_per_step) : 1.0f;
  std::size_t state_bytes = 0, full_state_bytes = 0;
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    bucket& b = buckets[k];
    if (opts.stage == 3 && b.gathering) free_full(k);
    if (scale != 1.0f)
      for (float& g : b.gradient_shard) g *= scale;
    std::span<float> w = b.shard->to_local();
    opt.apply(k, w, b.gradient_shard);
    b.gradient_written = false;
    for (const optimizer_state& s : opt.state(k, w.size())) {
      state_bytes += s.floats.size_bytes() + s.counters.size_bytes();
      full_state_bytes += (s.counters.empty() ? b.elements * sizeof(float) : 0) + s.counters.size_bytes();
    }
  }
  optimizer_bytes = state_bytes;
  data_parallel_state_bytes = full_state_bytes;
  if (opts.stage < 3) {
    for (std::size_t k = 0; k < buckets.size(); ++k) {
      buckets[k].gathering = false;
      begin_gather(k);
    }
  }
  last_order = std::move(order);
  order.clear();
  ++traffic.steps;
  return true;
}

template bool sharded_data_parallel<1>::state::step(optimizer&);
template bool sharded_data_parallel<2>::state::step(optimizer&);

}  // namespace flexpar::zero
