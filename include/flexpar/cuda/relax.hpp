// flexpar/cuda/relax.hpp — BAGUA's relaxations on device parameters: the host forms' steps and wire
// formats (flexpar/relax/), with the data, the codecs and the collectives on the GPU.
//
// The training loop is the host one's (relax/relaxation.hpp) with device spans and a stream:
//
//   flexpar::cuda::device_communicator gpu(comm, device);
//   flexpar::cuda::sgd opt({.learning_rate = 0.05f, .momentum = 0.9f});
//   flexpar::cuda::bytegrad algo(gpu);                 // or gradient_allreduce, make_relaxation(name, gpu)
//   algo.start(params, stream);                        // collective: every rank starts from rank 0's weights
//   for (each step) { forward(stream); backward(stream); algo.step(params, opt, stream); }
//   algo.finish(params, stream);
//
// Every call enqueues its work on `stream` after the work already there (the backward pass) and
// before the work queued after it returns (the next forward pass). What is written once for both
// memories (the host form's code, not a copy of it):
//
// | what                                | where                                                     |
// |-------------------------------------|-----------------------------------------------------------|
// | the parameter list's cross-rank check | relax::detail::flat_model::bind / check                 |
// | each algorithm's steps, peers, bytes | its rule in relax/ (gradient_allreduce_step, local_sgd_rule,
// decentralized_rule, compressed_average_steps) over a Model: relax::detail::host_model, detail::device_model here | |
// the min-max format, SGD's rule      | cuda::minmax_uint8 (the host codec's bytes), cuda::sgd_momentum (relax::sgd's
// bits) |
//
// Results against the host forms on the same inputs: bytegrad's weights are bit-identical (same
// codes, same decode and sum order, same division, same SGD rounding); gradient_allreduce's are
// bit-identical where the average is exact, within float rounding otherwise (the device path sums in
// its own order). Bytes on the wire: bytegrad's step 5 is an allgather of partitions padded to the
// widest (the device collectives move equal blocks), which sends at most p - 1 bytes per step more
// than the host form's allgather_v; traffic_so_far() counts what was sent.
//
// Results: decentralized's and local_sgd's weights are bit-identical to the host forms' (the same sums
// in the same order: cuda::reduce_into over the sources, then one division).
//
// Built: every algorithm of relax/ — gradient_allreduce, bytegrad, local_sgd, decentralized (all,
// shift_one, ring), low_precision_decentralized, onebit_adam, qadam, async_model_average (its thread
// averages on a stream and a device communicator of its own; the weights are read and written on the
// training stream only).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <flexpar/cuda/collective.hpp>
#include <flexpar/cuda/kernels.hpp>
#include <flexpar/cuda/runtime.hpp>
#include <flexpar/relax/async_model_average.hpp>
#include <flexpar/relax/decentralized.hpp>
#include <flexpar/relax/flat_model.hpp>
#include <flexpar/relax/gradient_allreduce.hpp>
#include <flexpar/relax/local_sgd.hpp>
#include <flexpar/relax/low_precision_decentralized.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/relax/registry.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::cuda {

/// One trainable tensor in device memory (relax::parameter's device twin): f32 weights and this
/// step's gradient, same length; the same names, lengths and order on every rank.
struct parameter {
  std::string name;             ///< the tensor's name (in error messages; must agree across ranks)
  device_span<float> weight;    ///< the weights, updated in place by step()
  device_span<float> gradient;  ///< this step's gradient; the centralized algorithms overwrite it with the average
};

/// A local optimizer rule on device parameters (relax::optimizer's device twin): enqueues
/// weight -= f(gradient) for parameter `index` on `s`.
class optimizer {
 public:
  virtual ~optimizer() = default;
  /// Enqueues the update of parameter `index` on `s` (the optimizer keeps per-index state on the device).
  virtual void apply(std::size_t index, device_span<float> weight, device_span<const float> gradient,
                     cudaStream_t s) = 0;
};

/// relax::sgd on the device, bit for bit (momentum and weight decay as there; cuda::sgd_momentum).
class sgd final : public optimizer {
 public:
  /// An SGD optimizer with relax::sgd's settings.
  explicit sgd(relax::sgd_options o = {}) : options_(o) {}
  /// See optimizer::apply. The momentum buffer of `index` is zeroed on its first use.
  /// @throws usage_error when the lengths differ, or differ from the last call for `index`.
  void apply(std::size_t index, device_span<float> weight, device_span<const float> gradient, cudaStream_t s) override;
  /// The settings.
  [[nodiscard]] const relax::sgd_options& options() const noexcept { return options_; }
  /// A learning-rate schedule: apply() updates with f * gradient from now on (relax::sgd on f * g,
  /// what the samples' scheduled_optimizer does on the host). 1 by default.
  void set_factor(float f) noexcept { factor_ = f; }

 private:
  relax::sgd_options options_;
  float factor_ = 1.0f;
  std::vector<device_buffer<float>> buffer_;  // momentum per index, made on first use
};

/// The interface of the device relaxations (relax::relaxation's twin with a stream).
class relaxation {
 public:
  virtual ~relaxation() = default;
  /// The registry name, as relax::make knows it.
  [[nodiscard]] virtual std::string_view name() const noexcept = 0;
  /// Collective, once before training: every rank's weights become rank 0's (the list is checked
  /// across ranks: one usage_error on every rank naming the first difference).
  virtual void start(std::span<const parameter> params, cudaStream_t s) = 0;
  /// One training step, after the local backward pass queued on `s`: communicate, apply `opt`.
  virtual void step(std::span<const parameter> params, optimizer& opt, cudaStream_t s) = 0;
  /// Collective, once after training (nothing for the centralized algorithms built so far).
  virtual void finish(std::span<const parameter> params, cudaStream_t s) = 0;
  /// Bytes and exchanges so far on this rank.
  [[nodiscard]] virtual relax::traffic traffic_so_far() const noexcept = 0;
};

namespace detail {
/// The relaxations' Model (relax/host_model.hpp) for device parameters: the list checked by the host
/// code (relax::detail::flat_model), one flat device buffer packed and unpacked by one fusion_packer
/// launch, the collectives of a device_communicator, and point-to-point exchanges over NCCL (a GPU
/// per rank) or staged through pinned host memory and the host transport (ranks sharing a GPU). The
/// work goes on the stream set by on().
class device_model {
 public:
  /// Over `gpu` (kept by reference).
  explicit device_model(device_communicator& gpu);
  ~device_model();
  device_model(const device_model&) = delete;             ///< not copyable
  device_model& operator=(const device_model&) = delete;  ///< not copyable
  /// The stream of the calls that follow.
  void on(cudaStream_t s) noexcept { s_ = s; }

  [[nodiscard]] int rank() const noexcept { return gpu_.rank(); }
  [[nodiscard]] int size() const noexcept { return gpu_.size(); }
  void start(std::string_view algo, std::span<const parameter> params, bool links);
  void check(std::string_view op, std::span<const parameter> params) const;
  void apply(std::span<const parameter> params, optimizer& opt);
  std::uint64_t average_gradients(std::span<const parameter> params, flexpar::algorithm how);
  std::uint64_t average_weights(std::span<const parameter> params);
  std::uint64_t exchange_weights(std::span<const parameter> params, std::span<const int> peers);
  /// Point-to-point with `peers`: `mine` to each, theirs[i] from peers[i], on the stream (NCCL), or
  /// staged through pinned host memory and the host transport (a host wait on each side). Needs the
  /// links of start().
  void exchange_bytes(std::span<const int> peers, device_span<const std::byte> mine,
                      std::span<const device_span<std::byte>> theirs);

  /// Which tensor of each parameter pack() moves.
  enum class part : std::uint8_t { weights, gradients };
  /// `flat` = that tensor of every parameter, back to back (into_flat), or back: one fusion_packer launch.
  void pack(std::span<const parameter> params, part w, device_span<float> flat, bool into_flat);
  /// The flat buffer = every gradient, packed in order (and back).
  void gather_gradients(std::span<const parameter> params) { pack(params, part::gradients, data(), true); }
  void scatter_gradients(std::span<const parameter> params) { pack(params, part::gradients, data(), false); }
  /// The flat buffer (all parameters' elements).
  [[nodiscard]] device_span<float> data() noexcept { return flat_.span().first(model_.size()); }
  /// The device communicator and the current stream.
  [[nodiscard]] device_communicator& gpu() noexcept { return gpu_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return s_; }

 protected:
  struct links;

  device_communicator& gpu_;
  cudaStream_t s_ = nullptr;
  relax::detail::flat_model model_;
  device_buffer<float> flat_;
  fusion_packer packer_;
  std::vector<copy_region> regions_;
  std::vector<device_buffer<float>> theirs_;  // the peers' weights in exchange_weights
  std::unique_ptr<links> links_;
  allocation_ranges ranges_;  // whether back-to-back gradients are one buffer
};
}  // namespace detail

/// Gradients averaged by one device allreduce per step (relax::gradient_allreduce on the GPU; its
/// rule, detail::gradient_allreduce_step; the device path by cost: NCCL, the ipc path of one node, or
/// staged through the host).
class gradient_allreduce final : public relaxation {
 public:
  /// Over `gpu` (kept by reference; it must outlive this object).
  explicit gradient_allreduce(device_communicator& gpu) : model_(gpu) {}
  [[nodiscard]] std::string_view name() const noexcept override { return "gradient_allreduce"; }
  void start(std::span<const parameter> params, cudaStream_t s) override;
  void step(std::span<const parameter> params, optimizer& opt, cudaStream_t s) override;
  void finish(std::span<const parameter> params, cudaStream_t s) override;
  [[nodiscard]] relax::traffic traffic_so_far() const noexcept override { return traffic_; }

 private:
  detail::device_model model_;
  relax::traffic traffic_;
};

/// Gradients averaged through min-max uint8 compression (relax::bytegrad on the GPU: the same steps,
/// relax::detail::compressed_average_steps, and the same wire format).
class bytegrad final : public relaxation {
 public:
  /// Over `gpu` (kept by reference), `chunk` elements per min-max chunk. @throws usage_error if chunk is 0.
  explicit bytegrad(device_communicator& gpu, std::size_t chunk = 512);
  ~bytegrad() override;
  [[nodiscard]] std::string_view name() const noexcept override { return "bytegrad"; }
  void start(std::span<const parameter> params, cudaStream_t s) override;
  /// One step. Waits on the host (with the host communicator's deadline) after encoding, to refuse a
  /// non-finite gradient with relax::bytegrad's usage_error before anything is sent.
  void step(std::span<const parameter> params, optimizer& opt, cudaStream_t s) override;
  void finish(std::span<const parameter> params, cudaStream_t s) override;
  [[nodiscard]] relax::traffic traffic_so_far() const noexcept override { return traffic_; }

 private:
  struct buffers;
  detail::device_model model_;
  std::unique_ptr<buffers> b_;
  relax::traffic traffic_;
};

namespace detail {
/// A device relaxation made of a rule of relax/ (which checks its settings first) over a Model made
/// of the device communicator and `model_args` (local_sgd, decentralized, low_precision_decentralized).
template <class Rule, class Model = device_model>
class device_ruled : public relaxation {
 public:
  void start(std::span<const parameter> params, cudaStream_t s) override {
    model_.on(s);
    rule_.start(model_, params);
  }
  void step(std::span<const parameter> params, optimizer& opt, cudaStream_t s) override {
    model_.on(s);
    rule_.step(model_, params, opt);
  }
  void finish(std::span<const parameter> params, cudaStream_t s) override {
    model_.on(s);
    rule_.finish(model_, params);
  }
  [[nodiscard]] relax::traffic traffic_so_far() const noexcept override { return rule_.so_far(); }

 protected:
  template <class... ModelArgs>
  device_ruled(Rule rule, device_communicator& gpu, ModelArgs&&... model_args)
      : rule_(std::move(rule)), model_(gpu, std::forward<ModelArgs>(model_args)...) {}

 private:
  Rule rule_;
  Model model_;
};

/// low_precision_decentralized_rule's Model on the device (relax/low_precision_decentralized.hpp
/// lists what it provides): x, xh_me and the replicas in device memory, cuda::minmax_uint8, the
/// difference and sums as kernels, the encoded differences exchanged by exchange_bytes.
class device_lpd_model : public device_model {
 public:
  device_lpd_model(device_communicator& gpu, std::size_t chunk);
  void reset(std::span<const parameter> params, std::size_t k);
  void average_with_replicas(std::span<const parameter> params);
  void send_difference(std::span<const parameter> params);
  std::uint64_t exchange(std::span<const int> peers);
  void update_replicas();

 private:
  minmax_uint8 q_;
  device_buffer<float> x_, sent_, decoded_;
  std::vector<device_buffer<float>> replicas_;
  device_buffer<std::byte> encoded_;
  std::vector<device_buffer<std::byte>> received_;
};
}  // namespace detail

/// Local steps, weights averaged every `interval` steps (relax::local_sgd on the GPU; its rule,
/// relax::detail::local_sgd_rule).
class local_sgd final : public detail::device_ruled<relax::detail::local_sgd_rule> {
 public:
  /// Over `gpu` (kept by reference). @throws usage_error if interval < 1.
  explicit local_sgd(device_communicator& gpu, int interval = 4)
      : device_ruled(relax::detail::local_sgd_rule(gpu.rank(), interval), gpu) {}
  [[nodiscard]] std::string_view name() const noexcept override { return "local_sgd"; }
};

/// Local steps, then the weights averaged with peers (relax::decentralized on the GPU; its rule,
/// relax::detail::decentralized_rule: all, shift_one, ring). The peers' weights come by NCCL
/// point-to-point where every rank has its own GPU, staged through the host transport otherwise.
class decentralized final : public detail::device_ruled<relax::detail::decentralized_rule> {
 public:
  /// Over `gpu` (kept by reference). @throws usage_error if interval < 1.
  decentralized(device_communicator& gpu, relax::peer_selection peers = relax::peer_selection::shift_one,
                int interval = 1)
      : device_ruled(relax::detail::decentralized_rule(gpu.rank(), peers, interval), gpu) {}
  [[nodiscard]] std::string_view name() const noexcept override { return "decentralized"; }
};

/// Ring gossip of min-max uint8 weight differences with neighbour replicas (relax::low_precision_
/// decentralized on the GPU; its rule, relax::detail::low_precision_decentralized_rule). Bit-identical
/// to the host form.
class low_precision_decentralized final
    : public detail::device_ruled<relax::detail::low_precision_decentralized_rule, detail::device_lpd_model> {
 public:
  /// Over `gpu` (kept by reference). @throws usage_error if interval < 1 or chunk == 0.
  explicit low_precision_decentralized(device_communicator& gpu, int interval = 1, std::size_t chunk = 512)
      : device_ruled(relax::detail::low_precision_decentralized_rule(gpu.rank(), interval, chunk), gpu, chunk) {}
  [[nodiscard]] std::string_view name() const noexcept override { return "low_precision_decentralized"; }
};

namespace detail {
/// The Adam family on the device (onebit_adam, qadam): relax::detail::momentum_adam_rule, the host
/// form's rule, over device memory (lib/cuda/relax.cpp). They are their own Adam: the optimizer
/// passed to step() is not used.
class adam_family : public relaxation {
 public:
  ~adam_family() override;
  [[nodiscard]] std::string_view name() const noexcept override;
  void start(std::span<const parameter> params, cudaStream_t s) override;
  void step(std::span<const parameter> params, optimizer& opt, cudaStream_t s) override;
  void finish(std::span<const parameter> params, cudaStream_t s) override;
  [[nodiscard]] relax::traffic traffic_so_far() const noexcept override;
  struct impl;  ///< the rule and its device model

 protected:
  explicit adam_family(std::unique_ptr<impl> i);

 private:
  std::unique_ptr<impl> impl_;
};
}  // namespace detail

/// 1-bit Adam on the GPU (relax::onebit_adam's rule and format: cuda::onebit with a worker residual
/// per partition and a server residual for mine). The 1-bit scale is summed in another order than on
/// the host (cuda::onebit), so the weights match the host form's within float rounding.
class onebit_adam final : public detail::adam_family {
 public:
  /// Over `gpu` (kept by reference); `warmup` exact Adam steps, then 1-bit momentum with `chunk`
  /// elements per chunk. @throws usage_error if warmup < 0 or chunk == 0.
  onebit_adam(device_communicator& gpu, int warmup, relax::adam_options adam = {}, std::size_t chunk = 2048);
};

/// QAdam on the GPU (relax::qadam's rule and format: min-max uint8 momentum); bit-identical to the
/// host form.
class qadam final : public detail::adam_family {
 public:
  /// Over `gpu` (kept by reference); `warmup` exact Adam steps, then min-max uint8 momentum with
  /// `chunk` elements per chunk. @throws usage_error if warmup < 0 or chunk == 0.
  qadam(device_communicator& gpu, int warmup, relax::adam_options adam = {}, std::size_t chunk = 512);
};

namespace detail {
/// relax::detail::async_average's Model on the device (relax/async_model_average.hpp lists what it
/// provides). Every read and write of the weights goes on the training stream (the one of the last
/// step()), in the order the weights' lock gives: the snapshot (step 3) and the update x += a - s
/// (step 5) are queued there, so they never race the optimizer's kernels; the average itself (step 4)
/// runs on a stream of the background thread's own, over a device communicator of its own (over the
/// private host communicator), and the training stream never waits for it.
class device_async_model {
 public:
  explicit device_async_model(device_communicator& gpu);
  ~device_async_model();
  device_async_model(const device_async_model&) = delete;             ///< not copyable
  device_async_model& operator=(const device_async_model&) = delete;  ///< not copyable
  /// The stream of the training thread's calls that follow.
  void on(cudaStream_t s) noexcept { s_ = s; }

  [[nodiscard]] communicator& comm() noexcept { return gpu_.host(); }
  [[nodiscard]] communicator& links() noexcept;
  [[nodiscard]] std::size_t size() const noexcept { return model_.size(); }
  void start(std::string_view algo, std::span<const parameter> params);
  void check(std::string_view op, std::span<const parameter> params) const;
  void apply(std::span<const parameter> params, optimizer& opt);
  void snapshot();
  void average();
  void apply_delta();
  std::uint64_t final_average(std::span<const parameter> params);

 private:
  struct state;
  device_communicator& gpu_;
  cudaStream_t s_ = nullptr;
  relax::detail::flat_model model_;
  std::unique_ptr<state> st_;
};
}  // namespace detail

/// A background thread averages the weights of every rank every `period_ms` while the training
/// thread steps (relax::async_model_average on the GPU; its thread and control,
/// relax::detail::async_average, over detail::device_async_model). Needs MPI_THREAD_MULTIPLE.
class async_model_average final : public relaxation {
 public:
  /// Over `gpu` (kept by reference). @throws usage_error if period_ms < 1, or below
  /// MPI_THREAD_MULTIPLE.
  async_model_average(device_communicator& gpu, int period_ms) : model_(gpu), rule_(model_, period_ms) {}
  [[nodiscard]] std::string_view name() const noexcept override { return "async_model_average"; }
  /// Collective: rank 0's weights everywhere, then the thread starts; the buffers in `params` are
  /// read by it until finish().
  void start(std::span<const parameter> params, cudaStream_t s) override {
    model_.on(s);
    rule_.start(params);
  }
  /// The optimizer step, queued on `s` under the weights' lock; rethrows the thread's error.
  void step(std::span<const parameter> params, optimizer& opt, cudaStream_t s) override {
    model_.on(s);
    rule_.step(params, opt);
  }
  /// Collective: stops the thread in a common round, then one average of the weights on `s`.
  void finish(std::span<const parameter> params, cudaStream_t s) override {
    model_.on(s);
    rule_.finish(params);
  }
  /// Collective: pauses the background averaging on every rank.
  void abort() { rule_.abort(); }
  /// Collective: resumes it after abort().
  void resume() { rule_.resume(); }
  /// Background averages completed so far on this rank.
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rule_.rounds(); }
  [[nodiscard]] relax::traffic traffic_so_far() const noexcept override { return rule_.so_far(); }

 private:
  detail::device_async_model model_;
  relax::detail::async_average<detail::device_async_model> rule_;  // after model_: its thread uses model_
};

/// The device relaxation called `name` (every name of relax::algorithm_names(): "gradient_allreduce",
/// "bytegrad", "decentralized", "low_precision_decentralized", "onebit_adam", "qadam",
/// "async_model_average", "local_sgd") over `gpu`, with relax::make's settings (the
/// fields those algorithms read).
/// @throws usage_error naming the algorithms built on the device when `name` is another, or for
/// invalid settings.
std::unique_ptr<relaxation> make_relaxation(std::string_view name, device_communicator& gpu,
                                            const relax::options& o = {});

}  // namespace flexpar::cuda
