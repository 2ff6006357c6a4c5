// flexpar/zero/sharded_data_parallel.hpp — sharded data parallelism (ZeRO-1/2/3, hybrid sharding) as
// three SBP annotations on buckets of parameters.
//
//   flexpar::sbp::placement<1> ranks(comm, {comm.size()});
//   flexpar::zero::sharded_data_parallel<1> model(ranks, {.stage = 3});
//   model.add("fc1.weight", w1_initial);            // same names, sizes and order on every rank
//   model.start();                                  // collective: buckets, shards, checks
//   flexpar::relax::adam opt({.learning_rate = 1e-3f});
//   for (each step) {
//     { auto w = model.gather("fc1.weight"); forward(w.values()); }     // S(0) -> B, prefetched
//     backward(model.gradient("fc1.weight")); model.gradient_ready("fc1.weight");  // P -> S(0)
//     model.step(opt);                                                  // the optimizer on S(0)
//   }
//
// The parameters are flattened, in registration order, into buckets of at most options::bucket_bytes.
// Each bucket is a global_tensor<float, split<0>> (the balanced split: uneven sizes are fine) on a
// placement of its own (a split of the given placement's communicator: its messages never mix with
// the caller's), and the whole scheme is three annotations of that bucket:
//
//   tensor            SBP    boxing that makes it               when
//   parameters        S(0)   (held: the fp32 master copy)       always
//   parameters, full  B      S(0) -> B  allgather               stage 1/2: after step(); stage 3: gather()
//   gradients         P      (the caller's backward writes it)  each backward pass
//   gradients         S(0)   P -> S(0)  reduce-scatter          when a bucket's last gradient is ready
//   optimizer state   S(0)   (updated locally by step())        always
//
// The two boxings may travel quantized to 8 bits (ZeRO++ qwZ and qgZ: options::quantize_weights,
// quantize_gradients); full_parameters() and full_optimizer_state() always gather exact values.
//
// Stages: 1 keeps full gradients for the whole step (as data parallelism does: they can be read after
// step()), accumulates the backward passes of a step in them and reduces a copy once, on the last
// pass; 2 reduces every pass into the gradient shard and frees each bucket's full gradient once it is reduced; 3 also
// frees each bucket's full parameters once they are used, and gathers them again when they are next asked for. On a
// placement<2> {nodes, ranks per node} the shard SBP is (B, S(0)): replicated across nodes and sharded within a node
// (hybrid sharding, ZeRO++ hpZ), gradients (P, P) -> (B, S(0)) by the route the nd boxing planner picks.
//
// Communication runs on a background thread (options::overlap; the MPI transport then needs
// MPI_THREAD_MULTIPLE) in the order the calls were made, which is the same on every rank: gather(),
// gradient_ready() and step() are collective in order, as the layers of a model are. The reduce-scatter
// of a bucket starts when its last gradient is ready, so it overlaps the rest of the backward pass; in
// stage 3 the gather of the next options::prefetch buckets, in the order of the previous step's
// gathers, starts when a bucket is asked for, so it overlaps the computation with this one.
//
// A bucket's gathered parameters (stage 3) are freed when no view of it is alive, it was viewed since
// it was gathered, and a view of another bucket is asked for (or at step()); so at most the buckets
// with live views, the prefetched ones and the last one used are held in full.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/core/optimizer.hpp>
#include <flexpar/sbp/placement.hpp>

namespace flexpar::zero {

/// How a sharded_data_parallel shards, buckets and overlaps.
struct options {
  /// ZeRO stage: 1 (optimizer state sharded), 2 (+ gradients), 3 (+ parameters).
  int stage = 3;
  /// A bucket holds consecutive parameters (registration order) of at most this many bytes of f32; a
  /// larger parameter is a usage_error at start() (raise the limit).
  std::size_t bucket_bytes = std::size_t{4} << 20;
  /// Communication on a background thread, overlapping backward (reduce-scatters) and forward
  /// (prefetched gathers). false: every boxing runs on the calling thread when it is asked for.
  bool overlap = true;
  /// Stage 3: how many buckets are gathered ahead, along the order of the previous step's gathers.
  int prefetch = 1;
  /// true: gradients are averaged over ranks and passes (data parallelism's mean); false: summed.
  bool average = true;
  /// Backward passes accumulated per optimizer step: stage 1 adds them up in its full gradients and
  /// reduces once; stages 2 and 3 reduce each pass and add it into the gradient shard.
  int backward_passes_per_step = 1;
  /// ZeRO++ qwZ: gathers send each rank's shard min-max quantized to 8 bits (compress::minmax_uint8,
  /// per chunk of quantization_chunk values) and every rank decodes every part, its own too, so the
  /// full parameters are the same on every rank; the shards (the master copy) stay f32.
  bool quantize_weights = false;
  /// ZeRO++ qgZ: the reduce-scatter of a gradient bucket sends each destination's part quantized to 8
  /// bits (one alltoall, BAGUA's bytegrad pattern on a reduce-scatter); each rank decodes and sums its
  /// part in f32, in rank order. On a 2-D mesh this is the step within a node; across nodes the shard
  /// is allreduced in f32.
  bool quantize_gradients = false;
  /// Values per min-max chunk of the quantized forms (each chunk carries its min and max: 8 bytes).
  std::size_t quantization_chunk = 512;
};

/// Fills values [first, first + values.size()) of one parameter: the same values on every rank (a
/// seeded rule, a file): each rank fills only the part it holds.
using initializer = std::function<void(std::size_t first, std::span<float> values)>;

/// Bytes held by one rank now and at most since start(), by the library's own accounting.
struct memory_report {
  std::size_t parameter_bytes = 0;       ///< parameter shards + full parameter buffers held now
  std::size_t peak_parameter_bytes = 0;  ///< the most parameter_bytes was
  std::size_t gradient_bytes = 0;        ///< gradient shards + full gradient buffers held now
  std::size_t peak_gradient_bytes = 0;   ///< the most gradient_bytes was
  std::size_t optimizer_bytes = 0;       ///< the optimizer's state for this rank's shards (after a step)
  std::size_t data_parallel_bytes = 0;   ///< what data parallelism holds: full parameters, gradients, state
};

/// What one rank has communicated so far, by the boxing cost model (boxing_cost's wire bytes).
struct traffic_report {
  std::uint64_t wire_bytes = 0;       ///< bytes on the transport
  std::uint64_t gathers = 0;          ///< bucket gathers (S(0) -> B)
  std::uint64_t reduce_scatters = 0;  ///< bucket reductions (P -> S(0))
  std::uint64_t steps = 0;            ///< optimizer steps
};

/// Sharded data parallelism over a placement<1> (ZeRO) or placement<2> (hybrid); usage above.
template <std::size_t MeshRank>
class sharded_data_parallel {
  static_assert(MeshRank == 1 || MeshRank == 2,
                "flexpar::zero::sharded_data_parallel<N>: N = 1 (shard over every rank) or 2 ({nodes, ranks per "
                "node}: replicate across nodes, shard within one)");

 public:
  struct state;  ///< the implementation's (lib/zero)

  /// A gathered parameter (B): its full values, valid while the view lives.
  class view {
   public:
    view(view&& other) noexcept;            ///< takes over `other`'s hold on the bucket
    view& operator=(view&&) = delete;       ///< a view stays on one parameter
    view(const view&) = delete;             ///< one hold per view
    view& operator=(const view&) = delete;  ///< one hold per view
    ~view();                                ///< releases the hold (stage 3 may then free the bucket)
    /// The parameter's full values.
    [[nodiscard]] std::span<const float> values() const noexcept { return values_; }

   private:
    friend class sharded_data_parallel;
    view(state* s, std::size_t bucket, std::span<const float> values) : s_(s), bucket_(bucket), values_(values) {}
    state* s_;
    std::size_t bucket_;
    std::span<const float> values_;
  };

  /// Collective over the placement's parent communicator (it splits off the one it communicates on;
  /// `ranks` must outlive this object). Every parent rank must be in the mesh.
  /// @throws usage_error for a stage other than 1-3, a zero bucket_bytes, prefetch < 0,
  ///         backward_passes_per_step < 1, a rank outside the mesh, or overlap over MPI without
  ///         MPI_THREAD_MULTIPLE.
  explicit sharded_data_parallel(const sbp::placement<MeshRank>& ranks, options o = {});
  ~sharded_data_parallel();
  sharded_data_parallel(const sharded_data_parallel&) = delete;
  sharded_data_parallel& operator=(const sharded_data_parallel&) = delete;

  /// Registers a parameter of `count` f32 values, filled by `init` at start() (each rank fills only
  /// the values it holds). Before start(); names unique. @throws usage_error otherwise.
  void add(std::string name, std::size_t count, initializer init);
  /// Registers a parameter with its initial values; `initial` must stay valid until start().
  void add(std::string name, std::span<const float> initial);

  /// Collective: checks that every rank registered the same parameters (count, names, sizes, order)
  /// and that each fits in a bucket, builds the buckets and fills each rank's shards.
  /// @throws usage_error on every rank, naming the first rank and parameter that differ (both sides)
  ///         or the parameter larger than bucket_bytes.
  void start();

  /// Collective in order: the full values of `name` (S(0) -> B of its bucket, unless held or
  /// prefetched). @throws usage_error (local) for a name never registered, naming it.
  [[nodiscard]] view gather(std::string_view name);

  /// The buffer of this backward pass's gradient of `name` (full size, zero-filled when first asked
  /// for in the pass): write or add the gradient into it, then call gradient_ready(name).
  [[nodiscard]] std::span<float> gradient(std::string_view name);
  /// `name`'s gradient of this pass is final. When its bucket's last one is, the bucket's P -> S(0)
  /// starts (collective in order). @throws usage_error for an unknown name or a second call per pass.
  void gradient_ready(std::string_view name);

  /// Ends a backward pass. On the last pass of a step: reduces the buckets whose gradients were not
  /// all marked ready (every rank reduces every bucket), waits for the reductions, scales them, applies
  /// `opt` to each bucket's shard (bucket index = the optimizer's parameter index), starts the gathers
  /// of the new parameters (stages 1/2) and returns true. On the other passes returns false. `opt` is
  /// any flexpar::optimizer (core/optimizer.hpp), e.g. relax::sgd or relax::adam.
  bool step(optimizer& opt);

  /// Collective in order: the full values of every parameter, by name (stage 3 gathers each bucket).
  [[nodiscard]] std::vector<std::pair<std::string, std::vector<float>>> full_parameters();
  /// Collective in order: the full values of `opt`'s state (e.g. Adam's "m" and "v") of parameter
  /// `name`, gathered from the shards: {state name, values}. Counters (Adam's "t") are per bucket.
  [[nodiscard]] std::vector<std::pair<std::string, std::vector<float>>> full_optimizer_state(optimizer& opt,
                                                                                             std::string_view name);

  /// The names of the parameters of bucket `b`, and the number of buckets (after start()).
  [[nodiscard]] std::vector<std::string> bucket_members(std::size_t b) const;
  [[nodiscard]] std::size_t buckets() const noexcept;      ///< number of buckets (after start())
  [[nodiscard]] memory_report memory() const;              ///< bytes held (see memory_report)
  [[nodiscard]] traffic_report traffic() const;            ///< communication so far
  [[nodiscard]] const options& settings() const noexcept;  ///< the options it was built with

 private:
  std::unique_ptr<state> s_;
};

}  // namespace flexpar::zero
