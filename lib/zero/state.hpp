// lib/zero/state.hpp — the state of a sharded_data_parallel: its parameters, buckets and the order of
// their boxings (flexpar/zero/sharded_data_parallel.hpp has the scheme). Its parts, each in a file:
//
//   registration.cpp   every rank agrees on the parameters (start())
//   bucket_plan.cpp    parameters packed into buckets (start())
//   transfers.cpp      a bucket's boxings, exact; quantized_transfers.cpp: quantized (qwZ, qgZ)
//   gathers.cpp        when a bucket is gathered (S(0) -> B), prefetched and freed
//   reductions.cpp     the gradient buffers of a pass and when a bucket is reduced (P -> S(0))
//   step.cpp           the optimizer step on the shards
//   full_values.cpp    the exact full parameters and optimizer state (exports)
//   sharded_data_parallel.cpp   construction, start(), the memory report and the public class
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <flexpar/core/error.hpp>
#include <flexpar/sbp/global_tensor.hpp>
#include <flexpar/zero/sharded_data_parallel.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bucket_plan.hpp"
#include "comm_queue.hpp"
#include "registration.hpp"
#include "transfers.hpp"

namespace flexpar::zero {

namespace detail {

/// Hashes std::string and std::string_view alike: names are looked up without a copy.
struct name_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view name) const noexcept { return std::hash<std::string_view>{}(name); }
};

/// Bytes held now and at most, updated from the caller's thread and the communication thread.
class byte_meter {
 public:
  void add(std::size_t n) {
    std::lock_guard lock(mutex_);
    now_ += n;
    peak_ = std::max(peak_, now_);
  }
  void sub(std::size_t n) {
    std::lock_guard lock(mutex_);
    now_ -= std::min(n, now_);
  }
  [[nodiscard]] std::pair<std::size_t, std::size_t> read() const {
    std::lock_guard lock(mutex_);
    return {now_, peak_};
  }

 private:
  mutable std::mutex mutex_;
  std::size_t now_ = 0, peak_ = 0;
};

}  // namespace detail

template <std::size_t MeshRank>
struct sharded_data_parallel<MeshRank>::state {
  using moves_t = detail::transfers<MeshRank>;
  using shard_sbp = typename moves_t::shard_sbp;
  using full_sbp = typename moves_t::full_sbp;
  using shard_tensor = typename moves_t::shard_tensor;
  using full_tensor = typename moves_t::full_tensor;
  using member = detail::member;

  struct bucket : detail::bucket_layout {  // members, elements: from the bucket plan
    std::optional<shard_tensor> shard;     // S(0): the parameters' master copy
    aligned_vector<float> gradient_shard;  // S(0): this step's reduced gradients (written by the thread)
    bool gradient_written = false;         // gradient_shard holds this step's first pass already
    std::optional<full_tensor> full;       // B: written by the communication thread
    detail::comm_queue::ticket gathered;   // the gather that fills `full`
    bool gathering = false;                // full exists or is being gathered
    bool viewed = false;                   // viewed since it was gathered
    int views = 0;                         // live views
    aligned_vector<float> gradient;        // P: this pass's (stage 1: all passes', kept for the whole step)
    aligned_vector<float> pass_gradient;   // stage 1, passes after the first: added into `gradient`
    bool gradient_open = false;            // gradient() was asked for this pass
    std::size_t ready = 0;                 // members ready this pass
    bool reduced = false;                  // its P -> S(0) was submitted this pass
    detail::comm_queue::ticket reduction;  // the last P -> S(0)
    std::uint64_t gather_bytes = 0;        // wire bytes of one gather, one reduction (set by start())
    std::uint64_t reduce_bytes = 0;
  };

  state(const sbp::placement<MeshRank>& ranks, options o);  // sharded_data_parallel.cpp
  static std::size_t pool_bytes(const options& o) { return o.bucket_bytes * static_cast<std::size_t>(o.prefetch + 4); }
  static std::unique_ptr<communicator> make_comm(const sbp::placement<MeshRank>& ranks, const options& o);

  // ---- lookups and errors ----------------------------------------------------------------------

  /// "zero::gather": the operation a message names (the public member that was called).
  [[nodiscard]] static std::string op_name(std::string_view op) { return std::string("zero::").append(op); }

  /// A usage_error "[rank R] zero::op: parts...", R the caller's rank in the parent communicator.
  template <class... Parts>
  [[nodiscard]] usage_error misuse(std::string_view op, const Parts&... parts) const {
    return error_on<usage_error>(parent->rank(), op_name(op), parts...);
  }

  member& find(std::string_view op, std::string_view name) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      std::string text = error_text(parent->rank(), op_name(op), "parameter \"", name, "\" was never registered (",
                                    members.size(), " are");
      for (std::size_t i = 0; i < members.size() && i < 4; ++i)
        text.append(i ? ", \"" : ": \"").append(members[i].name).append("\"");
      if (members.size() > 4) text.append(", ...");
      throw usage_error(text.append(")"));
    }
    if (!started) throw misuse(op, "called before start()");
    return members[it->second];
  }

  [[nodiscard]] std::size_t full_bytes(const bucket& b) const { return b.elements * sizeof(float); }
  [[nodiscard]] std::size_t shard_elements(const bucket& b) const {
    return sbp::shard_box({b.elements}, sbp::nd_of<shard_sbp>::value, mesh.shape(), mesh.coords()).elements();
  }
  [[nodiscard]] int replicas() const noexcept { return comm->size(); }

  // ---- start (sharded_data_parallel.cpp) -------------------------------------------------------

  void build_buckets();
  void fill_shard(std::size_t k);
  void start();

  // ---- gathers, S(0) -> B (gathers.cpp) --------------------------------------------------------

  void begin_gather(std::size_t k);
  void free_full(std::size_t k);
  view gather(std::string_view name);
  void release(std::size_t k) { --buckets[k].views; }

  // ---- gradients, P -> S(0) (reductions.cpp) ---------------------------------------------------

  /// Stage 1 accumulates the passes of a step in its full gradient (a pass after the first writes a
  /// buffer of its own, added in when ready) and reduces once, on the last pass; stages 2 and 3
  /// reduce every pass and accumulate in the gradient shard.
  [[nodiscard]] bool accumulating_pass() const noexcept { return opts.stage == 1 && pass > 0; }
  std::span<float> gradient(std::string_view name);
  void gradient_ready(std::string_view name);
  /// Stage 1: adds member m's part of this pass's buffer into the step's full gradient.
  static void add_pass(bucket& b, const member& m) {
    for (std::size_t i = m.offset; i < m.offset + m.count; ++i) b.gradient[i] += b.pass_gradient[i];
  }
  void reduce(std::size_t k);

  // ---- the optimizer step (step.cpp) -----------------------------------------------------------

  bool step(optimizer& opt);

  // ---- full values (full_values.cpp) and the memory report ---------------------------------------

  /// Runs `body` with bucket k's exact full parameters (a gather of their own, after what is queued).
  template <class Body>
  void with_full(std::size_t k, Body&& body) {
    std::optional<full_tensor> full;
    queue.wait(queue.submit([&] { full.emplace(moves.gather_exact(buckets[k].shard->clone())); }));
    body(std::span<const float>(full->to_local()));
  }
  std::vector<std::pair<std::string, std::vector<float>>> full_parameters();
  std::vector<std::pair<std::string, std::vector<float>>> full_optimizer_state(optimizer& opt, std::string_view name);
  memory_report memory() const;

  options opts;
  communicator* parent;
  std::unique_ptr<communicator> comm;  // split off the parent: the boxings' messages never mix with the caller's
  sbp::placement<MeshRank> mesh;       // the caller's mesh shape over `comm`
  std::vector<member> members;
  std::unordered_map<std::string, std::size_t, detail::name_hash, std::equal_to<>> by_name;
  std::vector<bucket> buckets;                 // made by start(), never resized after (the thread holds indices)
  std::vector<std::size_t> order, last_order;  // stage 3: buckets in the order gather() switched to them
  int pass = 0;
  bool started = false;
  detail::byte_meter parameters, gradients;
  moves_t moves;  // a bucket's boxings, exact or quantized
  std::size_t optimizer_bytes = 0, data_parallel_state_bytes = 0;
  traffic_report traffic;
  detail::comm_queue queue;  // last: destroyed (joined) first, before what its tasks use
};

}  // namespace flexpar::zero
