// sharded_data_parallel: construction, start() and the public class over the state (state.hpp lists
// its parts; flexpar/zero/sharded_data_parallel.hpp has the scheme).
#include <algorithm>
#include <flexpar/comm/thread_level.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/zero/sharded_data_parallel.hpp>
#include <optional>
#include <tuple>
#include <utility>

#include "state.hpp"

namespace flexpar::zero {

template <std::size_t MeshRank>
sharded_data_parallel<MeshRank>::state::state(const sbp::placement<MeshRank>& ranks, options o)
    : opts(o),
      parent(&ranks.parent()),
      comm(make_comm(ranks, o)),
      mesh(*comm, ranks.shape(), {}, std::make_shared<sbp::buffer_pool>(pool_bytes(o))),
      moves(mesh, o),
      queue(o.overlap) {}

template <std::size_t MeshRank>
std::unique_ptr<communicator> sharded_data_parallel<MeshRank>::state::make_comm(const sbp::placement<MeshRank>& ranks,
                                                                                const options& o) {
  communicator& parent = ranks.parent();
  const int me = parent.rank();
  auto fail = [&](auto... parts) { return error_on<usage_error>(me, "zero::sharded_data_parallel", parts...); };
  if (o.stage < 1 || o.stage > 3) throw fail("stage ", o.stage, "; ZeRO has stages 1, 2 and 3");
  if (o.bucket_bytes < sizeof(float)) throw fail("bucket_bytes ", o.bucket_bytes, " holds no f32 value");
  if (o.prefetch < 0) throw fail("prefetch ", o.prefetch, " < 0");
  if (o.backward_passes_per_step < 1) throw fail("backward_passes_per_step ", o.backward_passes_per_step, " < 1");
  if ((o.quantize_weights || o.quantize_gradients) && o.quantization_chunk == 0)
    throw fail("quantization_chunk 0; a min-max chunk holds at least one value");
  if (static_cast<int>(ranks.ranks().size()) != parent.size())
    throw fail("the mesh ", ranks.describe(), " holds ", ranks.ranks().size(), " of the parent's ", parent.size(),
               " ranks; every rank of the parent communicator must be in it");
  if (o.overlap)
    flexpar::require_thread_multiple(parent, on_rank(me, "zero::sharded_data_parallel").append("options::overlap"),
                                     "its communication thread", "set overlap = false, or use FLEXPAR_TRANSPORT=ucx");
  const auto mine = std::find(ranks.ranks().begin(), ranks.ranks().end(), me) - ranks.ranks().begin();
  std::optional<communicator> split = parent.split(0, static_cast<int>(mine));
  return std::make_unique<communicator>(std::move(*split));
}

/// The bucket plan, and each bucket's wire bytes per gather and reduction.
template <std::size_t MeshRank>
void sharded_data_parallel<MeshRank>::state::build_buckets() {
  for (detail::bucket_layout& layout : detail::plan_buckets(members, opts.bucket_bytes)) {
    bucket& b = buckets.emplace_back();
    static_cast<detail::bucket_layout&>(b) = std::move(layout);
  }
  for (bucket& b : buckets) {
    b.gather_bytes = moves.gather_bytes(b.elements);
    b.reduce_bytes = moves.reduce_bytes(b.elements);
  }
}

/// Fills my shard of bucket `k` from the members' initializers.
template <std::size_t MeshRank>
void sharded_data_parallel<MeshRank>::state::fill_shard(std::size_t k) {
  bucket& b = buckets[k];
  const sbp::box mine = sbp::shard_box({b.elements}, sbp::nd_of<shard_sbp>::value, mesh.shape(), mesh.coords());
  const std::size_t first = mine.offset[0], last = first + mine.extent[0];
  aligned_vector<float> local = mesh.pool().template acquire<float>(mine.extent[0]);
  for (std::size_t i : b.members) {
    member& m = members[i];
    const std::size_t lo = std::max(first, m.offset), hi = std::min(last, m.offset + m.count);
    if (lo >= hi) continue;
    m.init(lo - m.offset, std::span<float>(local).subspan(lo - first, hi - lo));
  }
  b.shard.emplace(shard_tensor::adopt(mesh, {b.elements}, std::move(local)));
  parameters.add(mine.extent[0] * sizeof(float));
}

template <std::size_t MeshRank>
void sharded_data_parallel<MeshRank>::state::start() {
  if (started) throw misuse("start", "called twice");
  detail::agree_on_registrations(*comm, members, opts, parent->rank(), op_name("start"));
  build_buckets();
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    fill_shard(k);
    buckets[k].gradient_shard = aligned_vector<float>(shard_elements(buckets[k]), 0.0f);
    gradients.add(buckets[k].gradient_shard.size() * sizeof(float));
  }
  for (member& m : members) m.init = nullptr;  // the initial values (and what they captured) are not needed
  started = true;
  if (opts.stage < 3)
    for (std::size_t k = 0; k < buckets.size(); ++k) begin_gather(k);
}

template <std::size_t MeshRank>
memory_report sharded_data_parallel<MeshRank>::state::memory() const {
  memory_report r;
  std::tie(r.parameter_bytes, r.peak_parameter_bytes) = parameters.read();
  std::tie(r.gradient_bytes, r.peak_gradient_bytes) = gradients.read();
  r.optimizer_bytes = optimizer_bytes;
  std::size_t total = 0;
  for (const bucket& b : buckets) total += full_bytes(b);
  r.data_parallel_bytes = 2 * total + data_parallel_state_bytes;
  return r;
}

// ---- the public class ------------------------------------------------------------------------------

template <std::size_t MeshRank>
sharded_data_parallel<MeshRank>::view::view(view&& other) noexcept
    : s_(other.s_), bucket_(other.bucket_), values_(other.values_) {
  other.s_ = nullptr;
}

template <std::size_t MeshRank>
sharded_data_parallel<MeshRank>::view::~view() {
  if (s_) s_->release(bucket_);
}

template <std::size_t MeshRank>
sharded_data_parallel<MeshRank>::sharded_data_parallel(const sbp::placement<MeshRank>& ranks, options o)
    : s_(std::make_unique<state>(ranks, o)) {}

template <std::size_t MeshRank>
sharded_data_parallel<MeshRank>::~sharded_data_parallel() = default;

template <std::size_t MeshRank>
void sharded_data_parallel<MeshRank>::add(std::string name, std::size_t count, initializer init) {
  state& s = *s_;
  if (s.started) throw s.misuse("add", "parameter \"", name, "\" added after start()");
  if (!init) throw s.misuse("add", "parameter \"", name, "\" has no initializer");
  if (!s.by_name.emplace(name, s.members.size()).second)
    throw s.misuse("add", "parameter \"", name, "\" is registered twice");
  s.members.push_back({std::move(name), count, std::move(init)});
}

template <std::size_t MeshRank>
void sharded_data_parallel<MeshRank>::add(std::string name, std::span<const float> initial) {
  add(std::move(name), initial.size(), [initial](std::size_t first, std::span<float> values) {
    std::copy_n(initial.begin() + static_cast<std::ptrdiff_t>(first), values.size(), values.begin());
  });
}

template <std::size_t MeshRank>
void sharded_data_parallel<MeshRank>::start() {
  s_->start();
}

template <std::size_t MeshRank>
typename sharded_data_parallel<MeshRank>::view sharded_data_parallel<MeshRank>::gather(std::string_view name) {
  return s_->gather(name);
}

template <std::size_t MeshRank>
std::span<float> sharded_data_parallel<MeshRank>::gradient(std::string_view name) {
  return s_->gradient(name);
}

template <std::size_t MeshRank>
void sharded_data_parallel<MeshRank>::gradient_ready(std::string_view name) {
  s_->gradient_ready(name);
}

template <std::size_t MeshRank>
bool sharded_data_parallel<MeshRank>::step(optimizer& opt) {
  return s_->step(opt);
}

template <std::size_t MeshRank>
std::vector<std::pair<std::string, std::vector<float>>> sharded_data_parallel<MeshRank>::full_parameters() {
  return s_->full_parameters();
}

template <std::size_t MeshRank>
std::vector<std::pair<std::string, std::vector<float>>> sharded_data_parallel<MeshRank>::full_optimizer_state(
    optimizer& opt, std::string_view name) {
  return s_->full_optimizer_state(opt, name);
}

template <std::size_t MeshRank>
std::vector<std::string> sharded_data_parallel<MeshRank>::bucket_members(std::size_t b) const {
  std::vector<std::string> names;
  for (std::size_t i : s_->buckets.at(b).members) names.push_back(s_->members[i].name);
  return names;
}

template <std::size_t MeshRank>
std::size_t sharded_data_parallel<MeshRank>::buckets() const noexcept {
  return s_->buckets.size();
}

template <std::size_t MeshRank>
memory_report sharded_data_parallel<MeshRank>::memory() const {
  return s_->memory();
}

template <std::size_t MeshRank>
traffic_report sharded_data_parallel<MeshRank>::traffic() const {
  return s_->traffic;
}

template <std::size_t MeshRank>
const options& sharded_data_parallel<MeshRank>::settings() const noexcept {
  return s_->opts;
}

template class sharded_data_parallel<1>;
template class sharded_data_parallel<2>;

}  // namespace flexpar::zero
