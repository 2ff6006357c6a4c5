// lib/zero/reductions.cpp — the gradient buffers of a backward pass and when a bucket's gradients are
// reduced (P -> S(0)): when its last gradient is ready, or at step() (state.hpp).
#include <algorithm>

#include "state.hpp"

namespace flexpar::zero {

template <std::size_t MeshRank>
std::span<float> sharded_data_parallel<MeshRank>::state::gradient(std::string_view name) {
  member& m = find("gradient", name);
  bucket& b = buckets[m.bucket];
  if (m.ready)
    throw misuse("gradient", "parameter \"", m.name,
                 "\": its gradient was marked ready this pass already; ask for the buffer before");
  if (!b.gradient_open) {
    b.gradient_open = true;
    if (accumulating_pass()) {
      b.pass_gradient = mesh.pool().template acquire<float>(b.elements, 0.0f);
      gradients.add(full_bytes(b));
    } else if (opts.stage == 1 && !b.gradient.empty()) {
      queue.wait(b.reduction);  // the last reduction copied it already; it is reused
      std::fill(b.gradient.begin(), b.gradient.end(), 0.0f);
    } else {
      b.gradient = mesh.pool().template acquire<float>(b.elements, 0.0f);
      gradients.add(full_bytes(b));
    }
  }
  return std::span<float>(accumulating_pass() ? b.pass_gradient : b.gradient).subspan(m.offset, m.count);
}

template <std::size_t MeshRank>
void sharded_data_parallel<MeshRank>::state::gradient_ready(std::string_view name) {
  member& m = find("gradient_ready", name);
  if (m.ready) throw misuse("gradient_ready", "parameter \"", m.name, "\" was marked ready twice in one pass");
  m.ready = true;
  bucket& b = buckets[m.bucket];
  if (accumulating_pass() && b.gradient_open) add_pass(b, m);
  if (++b.ready == b.members.size()) reduce(m.bucket);
}

/// Submits bucket k's P -> S(0); the thread adds the result into the gradient shard.
template <std::size_t MeshRank>
void sharded_data_parallel<MeshRank>::state::reduce(std::size_t k) {
  bucket& b = buckets[k];
  if (b.reduced) return;
  b.reduced = true;
  if (accumulating_pass()) {  // the members not marked ready are added now; the pass's buffer goes
    if (b.gradient_open) {
      for (std::size_t i : b.members)
        if (!members[i].ready) add_pass(b, members[i]);
      mesh.pool().give_back(std::move(b.pass_gradient));
      gradients.sub(full_bytes(b));
    }
  } else if (!b.gradient_open) {  // nothing asked for this pass: it contributes zeros
    b.gradient_open = true;
    if (b.gradient.empty()) {
      b.gradient = mesh.pool().template acquire<float>(b.elements, 0.0f);
      gradients.add(full_bytes(b));
    } else {
      queue.wait(b.reduction);
      std::fill(b.gradient.begin(), b.gradient.end(), 0.0f);
    }
  }
  if (opts.stage == 1 && pass + 1 < opts.backward_passes_per_step) return;  // reduced on the last pass
  ++traffic.reduce_scatters;
  traffic.wire_bytes += b.reduce_bytes;
  const bool keep = opts.stage == 1;  // stage 1 keeps the full gradient and reduces a copy
  aligned_vector<float> summand =
      keep ? aligned_vector<float>() : std::move(b.gradient);  // stage 2/3: the thread frees it
  b.reduction = queue.submit([this, k, keep, summand = std::move(summand)]() mutable {
    bucket& c = buckets[k];
    aligned_vector<float> p = keep ? mesh.pool().acquire_copy(std::span<const float>(c.gradient)) : std::move(summand);
    if (!keep) gradients.sub(full_bytes(c));
    shard_tensor s = moves.reduce(c.elements, std::move(p));
    std::span<const float> reduced = s.to_local();
    if (!c.gradient_written) {
      std::copy(reduced.begin(), reduced.end(), c.gradient_shard.begin());
      c.gradient_written = true;
    } else {
      for (std::size_t i = 0; i < reduced.size(); ++i) c.gradient_shard[i] += reduced[i];
    }
  });
  if (!keep) b.gradient = aligned_vector<float>();
}

template std::span<float> sharded_data_parallel<1>::state::gradient(std::string_view);
template void sharded_data_parallel<1>::state::gradient_ready(std::string_view);
template void sharded_data_parallel<1>::state::reduce(std::size_t);
template std::span<float> sharded_data_parallel<2>::state::gradient(std::string_view);
template void sharded_data_parallel<2>::state::gradient_ready(std::string_view);
template void sharded_data_parallel<2>::state::reduce(std::size_t);

}  // namespace flexpar::zero
