// sharded_data_parallel: the buckets, their three SBP annotations and the order of their boxings
// (flexpar/zero/sharded_data_parallel.hpp has the scheme).
#include <flexpar/zero/sharded_data_parallel.hpp>

#include <algorithm>
#include <functional>
#include <mutex>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>

#include <flexpar/comm/thread_level.hpp>
#include <flexpar/compress/minmax_uint8.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/core/hash.hpp>
#include <flexpar/sbp/boxing.hpp>
#include <flexpar/sbp/global_tensor.hpp>

#include "comm_queue.hpp"

namespace flexpar::zero {

namespace {

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

}  // namespace

template <std::size_t MeshRank>
struct sharded_data_parallel<MeshRank>::state {
  using shard_sbp = typename annotations<MeshRank>::shard;
  using full_sbp = typename annotations<MeshRank>::full;
  using gradient_sbp = typename annotations<MeshRank>::gradient;
  using shard_tensor = sbp::global_tensor<float, shard_sbp>;
  using full_tensor = sbp::global_tensor<float, full_sbp>;
  using gradient_tensor = sbp::global_tensor<float, gradient_sbp>;
  /// After the quantized step within a node of a 2-D mesh: reduced within the node, partial across.
  using node_reduced_tensor = sbp::global_tensor<float, sbp::sbp<sbp::partial_sum, sbp::split<0>>>;

  struct member {
    std::string name;
    std::size_t count = 0;
    initializer init;
    std::size_t bucket = 0, offset = 0;  // where it lies in its bucket
    bool ready = false;                  // gradient_ready() this pass
  };

  struct bucket {
    std::vector<std::size_t> members;
    std::size_t elements = 0;
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

  state(const sbp::placement<MeshRank>& ranks, options o)
      : opts(o),
        parent(&ranks.parent()),
        comm(make_comm(ranks, o)),
        mesh(*comm, ranks.shape(), {}, std::make_shared<sbp::buffer_pool>(pool_bytes(o))),
        codec{o.quantization_chunk},
        queue(o.overlap) {}

  static std::size_t pool_bytes(const options& o) { return o.bucket_bytes * static_cast<std::size_t>(o.prefetch + 4); }

  static std::unique_ptr<communicator> make_comm(const sbp::placement<MeshRank>& ranks, const options& o) {
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

  // ---- lookups and errors ----------------------------------------------------------------------

  [[nodiscard]] std::string at(std::string_view op) const {
    return on_rank(parent->rank(), std::string("zero::").append(op));
  }

  member& find(std::string_view op, std::string_view name) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      std::string text = at(op);
      text.append("parameter \"").append(name).append("\" was never registered (");
      text.append(std::to_string(members.size())).append(" are");
      for (std::size_t i = 0; i < members.size() && i < 4; ++i)
        text.append(i ? ", \"" : ": \"").append(members[i].name).append("\"");
      if (members.size() > 4) text.append(", ...");
      throw usage_error(text.append(")"));
    }
    if (!started) throw usage_error(at(op) + "called before start()");
    return members[it->second];
  }

  [[nodiscard]] std::size_t full_bytes(const bucket& b) const { return b.elements * sizeof(float); }
  [[nodiscard]] std::size_t shard_elements(const bucket& b) const {
    return sbp::shard_box({b.elements}, sbp::nd_of<shard_sbp>::value, mesh.shape(), mesh.coords()).elements();
  }
  [[nodiscard]] int replicas() const noexcept { return comm->size(); }

  // ---- start -----------------------------------------------------------------------------------

  /// Every rank contributes (count, total, hash of names, hash of sizes, first parameter over the
  /// bucket limit and its size); on a difference the first differing parameter's name and size on
  /// every rank are gathered to name both sides.
  void check_registrations() {
    enum : std::size_t { count, total, names, sizes, oversize, oversize_count, stage, bucket, fields };
    std::vector<std::int64_t> mine(fields, 0);
    std::uint64_t name_hash = fnv1a(""), size_hash = fnv1a("");
    std::int64_t over = -1, over_n = 0, all_n = 0;
    const std::size_t limit = opts.bucket_bytes / sizeof(float);
    for (std::size_t i = 0; i < members.size(); ++i) {
      name_hash = fnv1a(std::string_view(members[i].name.c_str(), members[i].name.size() + 1), name_hash);
      size_hash = fnv1a(std::to_string(members[i].count).append(","), size_hash);
      all_n += static_cast<std::int64_t>(members[i].count);
      if (over < 0 && members[i].count > limit) {
        over = static_cast<std::int64_t>(i);
        over_n = static_cast<std::int64_t>(members[i].count);
      }
    }
    mine = {static_cast<std::int64_t>(members.size()),
            all_n,
            static_cast<std::int64_t>(name_hash),
            static_cast<std::int64_t>(size_hash),
            over,
            over_n,
            opts.stage,
            static_cast<std::int64_t>(opts.bucket_bytes)};
    const auto p = static_cast<std::size_t>(comm->size());
    std::vector<std::int64_t> all(p * fields);
    allgather(*comm, std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
    auto field = [&](std::size_t r, std::size_t f) { return all[r * fields + f]; };
    const std::string where = at("start");
    for (std::size_t r = 1; r < p; ++r)
      if (field(r, stage) != field(0, stage) || field(r, bucket) != field(0, bucket))
        throw usage_error(where + "rank " + std::to_string(r) + " has stage " + std::to_string(field(r, stage)) +
                          " and bucket_bytes " + std::to_string(field(r, bucket)) + ", rank 0 stage " +
                          std::to_string(field(0, stage)) + " and bucket_bytes " + std::to_string(field(0, bucket)) +
                          "; every rank must shard the same way");
    bool same = true;
    for (std::size_t r = 1; r < p; ++r)
      for (std::size_t f : {count, total, names, sizes}) same = same && field(r, f) == field(0, f);
    if (same) {
      const std::int64_t i = field(0, oversize);
      if (i < 0) return;
      const member& m = members[static_cast<std::size_t>(i)];
      throw usage_error(where + "parameter " + std::to_string(i) + " (\"" + m.name + "\") has " +
                        std::to_string(m.count) + " values (" + std::to_string(m.count * sizeof(float)) +
                        " bytes), more than a bucket holds (bucket_bytes = " + std::to_string(opts.bucket_bytes) +
                        "); raise options::bucket_bytes");
    }
    // The first index at which some rank's (name, size) differs from rank 0's: gather the pairs.
    std::size_t longest = 0;
    for (std::size_t r = 0; r < p; ++r) longest = std::max(longest, static_cast<std::size_t>(field(r, count)));
    std::vector<std::int64_t> pairs(2 * longest, -1), every(2 * longest * p);
    for (std::size_t i = 0; i < members.size(); ++i) {
      pairs[2 * i] = static_cast<std::int64_t>(fnv1a(members[i].name) >> 1);
      pairs[2 * i + 1] = static_cast<std::int64_t>(members[i].count);
    }
    allgather(*comm, std::span<const std::int64_t>(pairs), std::span<std::int64_t>(every));
    std::size_t index = longest;
    int other = 0;
    for (std::size_t i = 0; i < longest && index == longest; ++i)
      for (std::size_t r = 1; r < p; ++r)
        if (every[r * 2 * longest + 2 * i] != every[2 * i] || every[r * 2 * longest + 2 * i + 1] != every[2 * i + 1]) {
          index = i;
          other = static_cast<int>(r);
          break;
        }
    // Their names: every rank sends its name at `index` (or nothing), gathered with their lengths.
    const std::string my_name = index < members.size() ? members[index].name : std::string();
    std::vector<std::int64_t> lengths(p);
    const std::int64_t my_length = static_cast<std::int64_t>(my_name.size());
    allgather(*comm, std::span<const std::int64_t>(&my_length, 1), std::span<std::int64_t>(lengths));
    std::vector<std::size_t> counts(p);
    std::size_t chars = 0;
    for (std::size_t r = 0; r < p; ++r) chars += counts[r] = static_cast<std::size_t>(lengths[r]);
    std::vector<std::uint8_t> names_all(chars);
    allgather_v(*comm,
                std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(my_name.data()), my_name.size()),
                std::span<std::uint8_t>(names_all), std::span<const std::size_t>(counts));
    auto describe = [&](int r) {
      std::size_t off = 0;
      for (int q = 0; q < r; ++q) off += counts[static_cast<std::size_t>(q)];
      const std::int64_t n = every[static_cast<std::size_t>(r) * 2 * longest + 2 * index + 1];
      if (n < 0) return std::string("no parameter");
      const auto* first = reinterpret_cast<const char*>(names_all.data()) + off;
      return "\"" + std::string(first, counts[static_cast<std::size_t>(r)]) + "\" of " + std::to_string(n) + " values";
    };
    throw usage_error(where + "parameter " + std::to_string(index) + " is " + describe(0) + " on rank 0 but " +
                      describe(other) + " on rank " + std::to_string(other) +
                      "; every rank must register the same parameters in the same order");
  }

  void build_buckets() {
    const std::size_t limit = opts.bucket_bytes / sizeof(float);
    for (std::size_t i = 0; i < members.size(); ++i) {
      member& m = members[i];
      if (buckets.empty() || buckets.back().elements + m.count > limit) buckets.emplace_back();
      bucket& b = buckets.back();
      m.bucket = buckets.size() - 1;
      m.offset = b.elements;
      b.members.push_back(i);
      b.elements += m.count;
    }
    for (bucket& b : buckets) {
      b.gather_bytes =
          opts.quantize_weights
              ? quantized_gather_bytes(b.elements)
              : static_cast<std::uint64_t>(sbp::boxing_cost<shard_sbp, full_sbp>({b.elements}, mesh).wire_bytes);
      b.reduce_bytes =
          opts.quantize_gradients
              ? quantized_reduce_bytes(b.elements)
              : static_cast<std::uint64_t>(sbp::boxing_cost<gradient_sbp, shard_sbp>({b.elements}, mesh).wire_bytes);
    }
  }

  /// Fills my shard of bucket `k` from the members' initializers.
  void fill_shard(std::size_t k) {
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

  void start() {
    if (started) throw usage_error(at("start") + "called twice");
    check_registrations();
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

  // ---- gathers (S(0) -> B) ---------------------------------------------------------------------

  /// Starts bucket k's gather unless it is held or on its way.
  void begin_gather(std::size_t k) {
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
      c.full.emplace(opts.quantize_weights ? gather_quantized(*c.shard) : sbp::to<full_sbp>(c.shard->clone()));
      if (old) {
        old.reset();
        parameters.sub(full_bytes(c));
      }
    });
  }

  /// Frees bucket k's full parameters (stage 3; none viewing them, gathered).
  void free_full(std::size_t k) {
    bucket& b = buckets[k];
    queue.wait(b.gathered);
    b.full.reset();
    b.gathering = false;
    b.viewed = false;
    parameters.sub(full_bytes(b));
  }

  view gather(std::string_view name) {
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

  void release(std::size_t k) { --buckets[k].views; }

  // ---- gradients (P -> S(0)) -------------------------------------------------------------------

  /// Stage 1 accumulates the passes of a step in its full gradient (a pass after the first writes a
  /// buffer of its own, added in when ready) and reduces once, on the last pass; stages 2 and 3
  /// reduce every pass and accumulate in the gradient shard.
  [[nodiscard]] bool accumulating_pass() const noexcept { return opts.stage == 1 && pass > 0; }

  std::span<float> gradient(std::string_view name) {
    member& m = find("gradient", name);
    bucket& b = buckets[m.bucket];
    if (m.ready)
      throw usage_error(at("gradient") + "parameter \"" + m.name +
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

  void gradient_ready(std::string_view name) {
    member& m = find("gradient_ready", name);
    if (m.ready)
      throw usage_error(at("gradient_ready") + "parameter \"" + m.name + "\" was marked ready twice in one pass");
    m.ready = true;
    bucket& b = buckets[m.bucket];
    if (accumulating_pass() && b.gradient_open) add_pass(b, m);
    if (++b.ready == b.members.size()) reduce(m.bucket);
  }

  /// Stage 1: adds member m's part of this pass's buffer into the step's full gradient.
  static void add_pass(bucket& b, const member& m) {
    for (std::size_t i = m.offset; i < m.offset + m.count; ++i) b.gradient[i] += b.pass_gradient[i];
  }

  /// Submits bucket k's P -> S(0); the thread adds the result into the gradient shard.
  void reduce(std::size_t k) {
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
      aligned_vector<float> p =
          keep ? mesh.pool().acquire_copy(std::span<const float>(c.gradient)) : std::move(summand);
      if (!keep) gradients.sub(full_bytes(c));
      shard_tensor s = opts.quantize_gradients
                           ? reduce_quantized(c.elements, std::move(p))
                           : sbp::to<shard_sbp>(gradient_tensor::adopt(mesh, {c.elements}, std::move(p)));
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

  // ---- the quantized forms (ZeRO++ qwZ, qgZ) ------------------------------------------------

  /// The group a bucket is sharded over: every rank (1-D), the ranks of my node (2-D: mesh axis 1).
  [[nodiscard]] communicator& shard_group() const { return MeshRank == 1 ? mesh.group() : mesh.axis(1); }

  /// Encoded bytes of each rank's part of n values over the shard group.
  [[nodiscard]] std::vector<std::size_t> encoded_parts(std::size_t n) const {
    const int p = shard_group().size();
    std::vector<std::size_t> bytes(static_cast<std::size_t>(p));
    for (int q = 0; q < p; ++q)
      bytes[static_cast<std::size_t>(q)] = codec.encoded_size(sbp::balanced_part(n, p, q).count);
    return bytes;
  }

  /// Bytes a quantized gather sends from this rank: every part but its own, once (allgather).
  [[nodiscard]] std::uint64_t quantized_gather_bytes(std::size_t n) const {
    const std::vector<std::size_t> bytes = encoded_parts(n);
    const auto me = static_cast<std::size_t>(shard_group().rank());
    std::uint64_t sum = 0;
    for (std::size_t q = 0; q < bytes.size(); ++q) sum += q == me ? 0 : bytes[q];
    return sum;
  }

  /// Bytes a quantized reduction sends from this rank: every other rank's part (alltoall), plus the
  /// f32 allreduce of the shard across nodes on a 2-D mesh.
  [[nodiscard]] std::uint64_t quantized_reduce_bytes(std::size_t n) const {
    std::uint64_t sum = quantized_gather_bytes(n);
    if constexpr (MeshRank == 2)
      sum += static_cast<std::uint64_t>(
          sbp::boxing_cost<sbp::sbp<sbp::partial_sum, sbp::split<0>>, shard_sbp>({n}, mesh).wire_bytes);
    return sum;
  }

  /// qwZ: S(0) -> B with every part min-max quantized; every rank decodes every part (its own too).
  full_tensor gather_quantized(const shard_tensor& shard) {
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

  /// qgZ: P -> S(0) with each destination's part min-max quantized (one alltoall); my part decoded
  /// and summed in rank order; on a 2-D mesh then (P, S(0)) -> (B, S(0)) across nodes in f32.
  shard_tensor reduce_quantized(std::size_t n, aligned_vector<float> summand) {
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
      codec.encode(
          std::span<const float>(summand).subspan(part.offset, part.count),
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

  bool step(optimizer& opt) {
    if (!started) throw usage_error(at("step") + "called before start()");
    for (std::size_t k = 0; k < buckets.size(); ++k)
      if (buckets[k].views > 0)
        throw usage_error(at("step") + "a view of parameter \"" + members[buckets[k].members.front()].name +
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

  // ---- full values -----------------------------------------------------------------------------

  /// Runs `body` with bucket k's exact full parameters (a gather of their own, after what is queued).
  template <class Body>
  void with_full(std::size_t k, Body&& body) {
    std::optional<full_tensor> full;
    queue.wait(queue.submit([&] { full.emplace(sbp::to<full_sbp>(buckets[k].shard->clone())); }));
    body(std::span<const float>(full->to_local()));
  }

  std::vector<std::pair<std::string, std::vector<float>>> full_parameters() {
    if (!started) throw usage_error(at("full_parameters") + "called before start()");
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

  std::vector<std::pair<std::string, std::vector<float>>> full_optimizer_state(optimizer& opt, std::string_view name) {
    member& m = find("full_optimizer_state", name);
    const std::size_t k = m.bucket;
    bucket& b = buckets[k];
    std::vector<std::pair<std::string, std::vector<float>>> out;
    for (const optimizer_state& s : opt.state(k, shard_elements(b))) {
      if (!s.counters.empty()) continue;  // a counter (Adam's t) is per bucket, not per value
      std::optional<full_tensor> full;
      queue.wait(queue.submit([&] {
        full.emplace(sbp::to<full_sbp>(
            shard_tensor::adopt(mesh, {b.elements}, mesh.pool().acquire_copy(std::span<const float>(s.floats)))));
      }));
      std::span<const float> all = full->to_local();
      out.emplace_back(s.name, std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(m.offset),
                                                  all.begin() + static_cast<std::ptrdiff_t>(m.offset + m.count)));
    }
    return out;
  }

  memory_report memory() const {
    memory_report r;
    std::tie(r.parameter_bytes, r.peak_parameter_bytes) = parameters.read();
    std::tie(r.gradient_bytes, r.peak_gradient_bytes) = gradients.read();
    r.optimizer_bytes = optimizer_bytes;
    std::size_t total = 0;
    for (const bucket& b : buckets) total += full_bytes(b);
    r.data_parallel_bytes = 2 * total + data_parallel_state_bytes;
    return r;
  }

  options opts;
  communicator* parent;
  std::unique_ptr<communicator> comm;  // split off the parent: the boxings' messages never mix with the caller's
  sbp::placement<MeshRank> mesh;       // the caller's mesh shape over `comm`
  std::vector<member> members;
  std::unordered_map<std::string, std::size_t, name_hash, std::equal_to<>> by_name;
  std::vector<bucket> buckets;                 // made by start(), never resized after (the thread holds indices)
  std::vector<std::size_t> order, last_order;  // stage 3: buckets in the order gather() switched to them
  int pass = 0;
  bool started = false;
  byte_meter parameters, gradients;
  compress::minmax_uint8 codec;
  std::size_t optimizer_bytes = 0, data_parallel_state_bytes = 0;
  traffic_report traffic;
  detail::comm_queue queue;  // last: destroyed (joined) first, before what its tasks use
};

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
  if (s.started) throw usage_error(s.at("add") + "parameter \"" + name + "\" added after start()");
  if (!init) throw usage_error(s.at("add") + "parameter \"" + name + "\" has no initializer");
  if (!s.by_name.emplace(name, s.members.size()).second)
    throw usage_error(s.at("add") + "parameter \"" + name + "\" is registered twice");
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
