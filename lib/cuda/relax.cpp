// lib/cuda/relax.cpp — flexpar/cuda/relax.hpp: the device relaxations over a device_communicator.
#include <flexpar/cuda/nn.hpp>
#include <flexpar/cuda/relax.hpp>
#include <flexpar/relax/compressed_average.hpp>
#include <flexpar/relax/flat_model.hpp>
#include <flexpar/relax/momentum_adam.hpp>
#include <flexpar/version.hpp>

#if FLEXPAR_HAVE_NCCL
#include <flexpar/cuda/nccl.hpp>
#endif

#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "relax_kernels.hpp"

namespace flexpar::cuda {

// ---- sgd --------------------------------------------------------------------------------------------

void sgd::apply(std::size_t index, device_span<float> weight, device_span<const float> gradient, cudaStream_t s) {
  const std::size_t n = weight.size();
  if (index >= buffer_.size()) buffer_.resize(index + 1);
  const bool momentum = options_.momentum != 0.0f;
  if (momentum && buffer_[index].size() == 0 && n != 0) {  // its first use (a 0-length buffer holds nothing)
    buffer_[index] = device_buffer<float>(n);
    fill(buffer_[index].span(), 0.0f, s);
  }
  const std::size_t had = momentum ? buffer_[index].size() : n;
  if (gradient.size() != n || had != n)
    throw error_on<usage_error>(no_rank, "cuda::sgd::apply", "parameter ", index, " has ", n, " weights and ",
                                gradient.size(), " gradient values",
                                had != n ? "; its momentum buffer holds " + std::to_string(had) : std::string(),
                                "; they must have the same length");
  sgd_momentum(weight, momentum ? buffer_[index].span() : device_span<float>{}, gradient, options_.learning_rate,
               options_.momentum, factor_, s, options_.weight_decay);
}

// ---- the device model ------------------------------------------------------------------------------

namespace {
// the collectives move u8 elements; the codecs write std::byte
template <class B, class U = std::conditional_t<std::is_const_v<B>, const std::uint8_t, std::uint8_t>>
device_span<U> octets(device_span<B> b) {
  return device_span<U>(reinterpret_cast<U*>(b.data()), b.size());
}

using part = detail::device_model::part;

// `flat` <-> that tensor of every parameter (offsets of `model`): one fusion_packer launch on `s`.
void pack_flat(const relax::detail::flat_model& model, std::span<const parameter> params, part w, float* flat,
               bool into_flat, fusion_packer& packer, std::vector<copy_region>& regions, cudaStream_t s) {
  regions.clear();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const device_span<float> t = w == part::weights ? params[i].weight : params[i].gradient;
    float* f = flat + model.offset(i);
    regions.push_back(into_flat ? copy_region{t.data(), f, t.size_bytes()} : copy_region{f, t.data(), t.size_bytes()});
  }
  packer.copy(regions, s);
}

// opt.apply on every parameter, in order, on `s`.
void apply_all(std::span<const parameter> params, optimizer& opt, cudaStream_t s) {
  for (std::size_t i = 0; i < params.size(); ++i)
    opt.apply(i, params[i].weight, device_span<const float>(params[i].gradient), s);
}

// mine = (mine + others[0] + others[1] ...) / (others + 1): the host's sums in that order, one division.
void average_in_order(device_span<float> mine, std::span<const device_span<const float>> others, cudaStream_t s) {
  std::vector<device_span<const float>> sources{device_span<const float>(mine)};
  sources.insert(sources.end(), others.begin(), others.end());
  reduce_into(mine, std::span<const device_span<const float>>(sources), reduce_op::sum, s);
  scale_for_average(mine, static_cast<int>(others.size()) + 1, s);
}
}  // namespace

namespace detail {

/// The point-to-point channel of exchange_weights where the ranks have no NCCL (they share a GPU):
/// a communicator of its own for the host transport, and pinned staging.
struct device_model::links {
  communicator comm;
  pinned_buffer<std::byte> mine;
  std::vector<pinned_buffer<std::byte>> theirs;
};

device_model::device_model(device_communicator& gpu) : gpu_(gpu) {}
device_model::~device_model() = default;

void device_model::pack(std::span<const parameter> params, part w, device_span<float> flat, bool into_flat) {
  pack_flat(model_, params, w, flat.data(), into_flat, packer_, regions_, s_);
}

void device_model::start(std::string_view algo, std::span<const parameter> params, bool links) {
  model_.bind(gpu_.host(), algo, params);
  if (flat_.size() < model_.size()) flat_ = device_buffer<float>(model_.size());
  // every rank's weights become rank 0's: pack, one broadcast, unpack
  pack(params, part::weights, data(), true);
  gpu_.broadcast(data(), 0, s_);
  pack(params, part::weights, data(), false);
  if (links && gpu_.nccl() == nullptr && !links_)
    links_ = std::make_unique<device_model::links>(device_model::links{*gpu_.host().split(0, gpu_.rank()), {}, {}});
}

void device_model::check(std::string_view op, std::span<const parameter> params) const {
  model_.check(gpu_.rank(), op, params);
}

void device_model::apply(std::span<const parameter> params, optimizer& opt) { apply_all(params, opt, s_); }

std::uint64_t device_model::average_gradients(std::span<const parameter> params, flexpar::algorithm) {
  // one flat gradient buffer (in one allocation): reduced in place, no gather and no scatter
  if (float* g = relax::detail::flat_model::back_to_back_gradients(params);
      g != nullptr && ranges_.one_allocation(g, model_.size() * sizeof(float))) {
    gpu_.allreduce(device_span<float>(g, model_.size()), reduce_op::avg, s_);
    return relax::detail::ring_allreduce_bytes(model_.size(), gpu_.size());
  }
  gather_gradients(params);
  gpu_.allreduce(data(), reduce_op::avg, s_);
  scatter_gradients(params);
  return relax::detail::ring_allreduce_bytes(model_.size(), gpu_.size());
}

std::uint64_t device_model::average_weights(std::span<const parameter> params) {
  pack(params, part::weights, data(), true);
  gpu_.allreduce(data(), reduce_op::avg, s_);
  pack(params, part::weights, data(), false);
  return relax::detail::ring_allreduce_bytes(model_.size(), gpu_.size());
}

void device_model::exchange_bytes(std::span<const int> peers, device_span<const std::byte> mine,
                                  std::span<const device_span<std::byte>> theirs) {
  const std::size_t n = mine.size();
#if FLEXPAR_HAVE_NCCL
  if (nccl_communicator* nccl = gpu_.nccl()) {
    nccl_communicator::group_scope group(*nccl);
    for (std::size_t i = 0; i < peers.size(); ++i) nccl->recv(octets(theirs[i]), peers[i], s_);
    for (int peer : peers) nccl->send(octets(mine), peer, s_);
    return;
  }
#endif
  links& l = *links_;
  if (l.mine.size() < n) l.mine = pinned_buffer<std::byte>(n);
  while (l.theirs.size() < peers.size()) l.theirs.emplace_back(n);
  for (auto& b : l.theirs)
    if (b.size() < n) b = pinned_buffer<std::byte>(n);
  copy_async(std::span<std::byte>(l.mine.data(), n), mine, s_);
  cuda::synchronize(s_, l.comm.settings().timeout, "device relaxation: the bytes to send to its peers", rank());
  std::vector<request> requests;
  transport& t = l.comm.transport();
  for (std::size_t i = 0; i < peers.size(); ++i)
    requests.push_back(t.irecv(peers[i], 0, std::span<std::byte>(l.theirs[i].data(), n)));
  for (int peer : peers) requests.push_back(t.isend(peer, 0, std::span<const std::byte>(l.mine.data(), n)));
  wait_all(requests, l.comm.default_deadline());
  for (std::size_t i = 0; i < peers.size(); ++i)
    copy_async(theirs[i], std::span<const std::byte>(l.theirs[i].data(), n), s_);
  // the staging is reused by the next exchange: the copies out of it end first
  cuda::synchronize(s_, l.comm.settings().timeout, "device relaxation: the bytes its peers sent", rank());
}

std::uint64_t device_model::exchange_weights(std::span<const parameter> params, std::span<const int> peers) {
  const std::size_t n = model_.size();
  pack(params, part::weights, data(), true);
  // the peers' weights, each in a device buffer of its own (kept: the stream may still read them)
  while (theirs_.size() < peers.size()) theirs_.emplace_back(n);
  for (auto& b : theirs_)
    if (b.size() < n) b = device_buffer<float>(n);
  std::vector<device_span<std::byte>> into;
  for (std::size_t i = 0; i < peers.size(); ++i) into.push_back(theirs_[i].span().first(n).as_bytes());
  exchange_bytes(peers, device_span<const float>(data()).as_bytes(), into);
  std::vector<device_span<const float>> others;
  for (std::size_t i = 0; i < peers.size(); ++i) others.emplace_back(theirs_[i].span().first(n));
  average_in_order(data(), others, s_);
  pack(params, part::weights, data(), false);
  return peers.size() * n * sizeof(float);
}

// ---- low_precision_decentralized's model ---------------------------------------------------------------

device_lpd_model::device_lpd_model(device_communicator& gpu, std::size_t chunk) : device_model(gpu), q_(chunk) {}

void device_lpd_model::reset(std::span<const parameter> params, std::size_t k) {
  const std::size_t n = model_.size();
  for (device_buffer<float>* b : {&x_, &sent_, &decoded_}) *b = device_buffer<float>(n);
  pack(params, part::weights, x_.span(), true);
  copy_async(sent_.span(), device_span<const float>(x_.span()), s_);
  replicas_.clear();
  received_.clear();
  encoded_ = device_buffer<std::byte>(q_.encoded_size(n));
  for (std::size_t j = 0; j < k; ++j) {
    replicas_.emplace_back(n);
    copy_async(replicas_.back().span(), device_span<const float>(x_.span()), s_);
    received_.emplace_back(encoded_.size());
  }
}

void device_lpd_model::average_with_replicas(std::span<const parameter> params) {
  pack(params, part::weights, x_.span(), true);
  std::vector<device_span<const float>> others;
  for (auto& r : replicas_) others.emplace_back(r.span());
  average_in_order(x_.span(), others, s_);
  pack(params, part::weights, x_.span(), false);
}

void device_lpd_model::send_difference(std::span<const parameter> params) {
  pack(params, part::weights, x_.span(), true);
  detail::subtract(x_.span(), sent_.span(), x_.span(), s_);
  q_.encode_checked(x_.span(), encoded_.span(), s_, gpu_.host().settings().timeout, rank());
  q_.decode(encoded_.span(), decoded_.span(), s_);
  reduce_into(sent_.span(), device_span<const float>(decoded_.span()), reduce_op::sum, s_);
  pack(params, part::weights, sent_.span(), false);
}

std::uint64_t device_lpd_model::exchange(std::span<const int> peers) {
  std::vector<device_span<std::byte>> into;
  for (auto& r : received_) into.push_back(r.span());
  exchange_bytes(peers, device_span<const std::byte>(encoded_.span()), into);
  return peers.size() * encoded_.size();
}

void device_lpd_model::update_replicas() {
  for (std::size_t j = 0; j < replicas_.size(); ++j) q_.decode_add(received_[j].span(), replicas_[j].span(), s_);
}

}  // namespace detail

// ---- gradient_allreduce: its rule over the device model ---------------------------------------------

void gradient_allreduce::start(std::span<const parameter> params, cudaStream_t s) {
  model_.on(s);
  model_.start(name(), params, false);
}
void gradient_allreduce::step(std::span<const parameter> params, optimizer& opt, cudaStream_t s) {
  model_.on(s);
  relax::detail::gradient_allreduce_step(model_, params, opt, flexpar::algorithm::automatic, traffic_);
}
void gradient_allreduce::finish(std::span<const parameter> params, cudaStream_t) { model_.check("finish", params); }

// ---- the compressed average on the device -----------------------------------------------------------

namespace {
/// The device twin of relax::detail::minmax_codec (bytegrad, qadam): one encoder per partition, so
/// that each keeps its own non-finite status until check().
class minmax_device_codec {
 public:
  explicit minmax_device_codec(std::size_t chunk) : chunk_(chunk), sizer_(chunk) {}
  void prepare(const block_layout& parts, int) {
    while (q_.size() < parts.counts.size()) q_.emplace_back(chunk_);
  }
  [[nodiscard]] std::size_t encoded_size(std::size_t n) const { return sizer_.encoded_size(n); }
  void encode(int j, device_span<const float> in, device_span<std::byte> out, cudaStream_t s) {
    q_[static_cast<std::size_t>(j)].encode(in, out, s);
  }
  void check(int j, cudaStream_t s, std::chrono::milliseconds deadline, int rank) {
    q_[static_cast<std::size_t>(j)].check(s, deadline, rank);
  }
  void encode_reduced(int me, device_span<const float> in, device_span<std::byte> out, cudaStream_t s) {
    encode(me, in, out, s);
  }
  void check_reduced(int me, cudaStream_t s, std::chrono::milliseconds deadline) { check(me, s, deadline, me); }
  void decode(device_span<const std::byte> in, device_span<float> out, cudaStream_t s) { sizer_.decode(in, out, s); }
  /// acc += decode(in) (bit-identical to decoding into a temporary and adding it, as the host does).
  void decode_add(device_span<const std::byte> in, device_span<float> acc, device_span<float>, cudaStream_t s) {
    sizer_.decode_add(in, acc, s);
  }

 private:
  std::size_t chunk_;
  minmax_uint8 sizer_;  // sizes and decodes
  std::vector<minmax_uint8> q_;
};

/// The device twin of relax::detail::onebit_codec (onebit_adam): a 1-bit compressor with its residual
/// per partition (worker side) and one for my partition (server side).
class onebit_device_codec {
 public:
  explicit onebit_device_codec(std::size_t chunk) : chunk_(chunk), sizer_(0, chunk) {}
  void prepare(const block_layout& parts, int rank) {
    workers_.clear();
    for (std::size_t c : parts.counts) workers_.emplace_back(c, chunk_);
    server_.clear();
    server_.emplace_back(parts.count(rank), chunk_);
  }
  [[nodiscard]] std::size_t encoded_size(std::size_t n) const { return sizer_.encoded_size(n); }
  void encode(int j, device_span<const float> in, device_span<std::byte> out, cudaStream_t s) {
    workers_.at(static_cast<std::size_t>(j)).encode(in, out, s);
  }
  void check(int j, cudaStream_t s, std::chrono::milliseconds deadline, int rank) {
    workers_.at(static_cast<std::size_t>(j)).check(s, deadline, rank);
  }
  void encode_reduced(int, device_span<const float> in, device_span<std::byte> out, cudaStream_t s) {
    server_.at(0).encode(in, out, s);
  }
  void check_reduced(int me, cudaStream_t s, std::chrono::milliseconds deadline) {
    server_.at(0).check(s, deadline, me);
  }
  void decode(device_span<const std::byte> in, device_span<float> out, cudaStream_t s) { sizer_.decode(in, out, s); }
  /// acc += decode(in), through `tmp` (the host decodes into a temporary and adds).
  void decode_add(device_span<const std::byte> in, device_span<float> acc, device_span<float> tmp, cudaStream_t s) {
    sizer_.decode(in, tmp, s);
    reduce_into(acc, device_span<const float>(tmp), reduce_op::sum, s);
  }

 private:
  std::size_t chunk_;
  onebit sizer_;  // sizes and decodes (decode needs no residual)
  std::vector<onebit> workers_;
  std::vector<onebit> server_;
};

/// Reusable device buffers of the compressed average.
struct device_scratch {
  device_buffer<std::byte> send, recv, gathered;
  device_buffer<float> acc, tmp;
};

/// relax::detail::compressed_average_steps' memory on the device: the codec's kernels, a device
/// alltoall of the padded slots, the sum of my partition in rank order, scale_for_average, and an
/// allgather of the reduced partitions in slots of the widest encoding (in place). A host wait after
/// each encoding step refuses a non-finite value as the host codec does, before anything is sent.
template <class Codec>
class device_steps {
 public:
  device_steps(device_communicator& gpu, device_span<float> data, Codec& codec, device_scratch& b, cudaStream_t s)
      : gpu_(gpu), data_(data), codec_(codec), b_(b), s_(s), deadline_(gpu.host().settings().timeout) {}

  [[nodiscard]] std::size_t encoded_size(std::size_t count) const { return codec_.encoded_size(count); }
  void size(const std::vector<std::size_t>& bytes, std::size_t widest, std::size_t mine) {
    enc_ = bytes;
    widest_ = widest;
    mine_ = mine;
    const std::size_t slots = bytes.size() * widest;
    for (device_buffer<std::byte>* b : {&b_.send, &b_.recv, &b_.gathered})
      if (b->size() < slots) *b = device_buffer<std::byte>(slots);
    for (device_buffer<float>* b : {&b_.acc, &b_.tmp})
      if (b->size() < mine) *b = device_buffer<float>(mine);
  }
  void encode_part(int j, std::size_t first, std::size_t count) {
    codec_.encode(j, device_span<const float>(data_).subspan(first, count), slot(b_.send, j), s_);
  }
  std::uint64_t exchange_parts() {
    for (int j = 0; j < gpu_.size(); ++j) codec_.check(j, s_, deadline_, gpu_.rank());
    gpu_.alltoall(octets(device_span<const std::byte>(all(b_.send))), octets(all(b_.recv)), s_);
    return static_cast<std::uint64_t>(enc_.size() - 1) * widest_;
  }
  void reduce_mine(int i, std::size_t bytes, std::size_t count) {
    const auto in = device_span<const std::byte>(b_.recv.data() + at(i) * widest_, bytes);
    if (i == 0)
      codec_.decode(in, b_.acc.span().first(count), s_);
    else
      codec_.decode_add(in, b_.acc.span().first(count), b_.tmp.span().first(count), s_);
  }
  void average(int p) { scale_for_average(b_.acc.span().first(mine_), p, s_); }
  void encode_reduced() {
    const int me = gpu_.rank();
    codec_.encode_reduced(me, device_span<const float>(b_.acc.data(), mine_), slot(b_.gathered, me), s_);
    codec_.check_reduced(me, s_, deadline_);  // an average that overflowed: the host encoders throw too
  }
  std::uint64_t gather_reduced() {
    const device_span<std::byte> everyone = all(b_.gathered);
    gpu_.allgather(octets(device_span<const std::byte>(everyone.data() + at(gpu_.rank()) * widest_, widest_)),
                   octets(everyone), s_);
    return static_cast<std::uint64_t>(enc_.size() - 1) * widest_;
  }
  void decode_part(int j, std::size_t first, std::size_t count) {
    codec_.decode(device_span<const std::byte>(b_.gathered.data() + at(j) * widest_, enc_[at(j)]),
                  data_.subspan(first, count), s_);
  }

 private:
  static std::size_t at(int j) { return static_cast<std::size_t>(j); }
  [[nodiscard]] device_span<std::byte> slot(device_buffer<std::byte>& b, int j) const {
    return {b.data() + at(j) * widest_, enc_[at(j)]};
  }
  [[nodiscard]] device_span<std::byte> all(device_buffer<std::byte>& b) const {
    return {b.data(), enc_.size() * widest_};
  }

  device_communicator& gpu_;
  device_span<float> data_;
  Codec& codec_;
  device_scratch& b_;
  cudaStream_t s_;
  std::chrono::milliseconds deadline_;
  std::vector<std::size_t> enc_;
  std::size_t widest_ = 0, mine_ = 0;
};

// `data` = the compressed average over every rank (the codec prepared for data.size() at start).
template <class Codec>
std::uint64_t device_compressed_average(device_communicator& gpu, device_span<float> data, Codec& codec,
                                        device_scratch& b, cudaStream_t s) {
  device_steps<Codec> m(gpu, data, codec, b, s);
  return relax::detail::compressed_average_steps(m, data.size(), gpu.size(), gpu.rank());
}
}  // namespace

// ---- bytegrad ---------------------------------------------------------------------------------------

struct bytegrad::buffers {
  explicit buffers(std::size_t chunk) : codec(chunk) {}
  minmax_device_codec codec;
  device_scratch scratch;
};

bytegrad::bytegrad(device_communicator& gpu, std::size_t chunk) : model_(gpu) {
  if (chunk == 0) throw usage_error(relax::detail::where(gpu.rank(), "bytegrad", "make") + "chunk must be positive");
  b_ = std::make_unique<buffers>(chunk);
}

bytegrad::~bytegrad() = default;

void bytegrad::start(std::span<const parameter> params, cudaStream_t s) {
  model_.on(s);
  model_.start(name(), params, false);
  b_->codec.prepare(block_layout::even(model_.data().size(), model_.size()), model_.rank());
}

void bytegrad::step(std::span<const parameter> params, optimizer& opt, cudaStream_t s) {
  model_.on(s);
  model_.check("step", params);
  model_.gather_gradients(params);
  traffic_.bytes_sent += device_compressed_average(model_.gpu(), model_.data(), b_->codec, b_->scratch, s);
  model_.scatter_gradients(params);
  model_.apply(params, opt);
  ++traffic_.steps;
  ++traffic_.exchanges;
}

void bytegrad::finish(std::span<const parameter> params, cudaStream_t) { model_.check("finish", params); }

// ---- onebit_adam, qadam: relax::detail::momentum_adam_rule over the device ------------------------------

namespace {
/// momentum_adam_rule's Model on the device (relax/momentum_adam.hpp lists what it provides): the
/// flat g, x, m, v in device memory, relax_kernels.cu's element-wise steps, and the compressed average of m
/// with the device codec.
template <class Codec>
class device_adam_model {
 public:
  device_adam_model(device_communicator& gpu, Codec codec) : model_(gpu), codec_(std::move(codec)) {}
  void on(cudaStream_t s) { model_.on(s); }

  [[nodiscard]] int rank() const noexcept { return model_.rank(); }
  [[nodiscard]] int size() const noexcept { return model_.size(); }
  void start(std::string_view algo, std::span<const parameter> params, bool) { model_.start(algo, params, false); }
  void check(std::string_view op, std::span<const parameter> params) const { model_.check(op, params); }
  void reset() {
    const std::size_t n = model_.data().size();
    for (device_buffer<float>* b : {&g_, &x_, &m_, &v_}) {
      *b = device_buffer<float>(n);
      fill(b->span(), 0.0f, s());
    }
    codec_.prepare(block_layout::even(n, size()), rank());
  }
  void load(std::span<const parameter> params) {
    model_.pack(params, detail::device_model::part::gradients, g_.span(), true);
    model_.pack(params, detail::device_model::part::weights, x_.span(), true);
  }
  void store(std::span<const parameter> params) {
    model_.pack(params, detail::device_model::part::weights, x_.span(), false);
  }
  std::uint64_t average_gradients() {
    model_.gpu().allreduce(g_.span(), reduce_op::avg, s());
    return relax::detail::ring_allreduce_bytes(g_.size(), size());
  }
  void warmup_update(const relax::adam_options& a, float c1, float c2) {
    detail::adam_warmup_update(g_.span(), x_.span(), m_.span(), v_.span(), a, c1, c2, s());
  }
  void freeze(float c2) { detail::adam_freeze(v_.span(), c2, s()); }
  void momentum_update(float b1, float wd) {
    detail::adam_momentum_update(g_.span(), x_.span(), m_.span(), b1, wd, s());
  }
  std::uint64_t average_momentum() { return device_compressed_average(model_.gpu(), m_.span(), codec_, scratch_, s()); }
  void frozen_update(const relax::adam_options& a, float c1) {
    detail::adam_frozen_update(x_.span(), m_.span(), v_.span(), a, c1, s());
  }

 private:
  [[nodiscard]] cudaStream_t s() const { return model_.stream(); }
  detail::device_model model_;
  Codec codec_;
  device_scratch scratch_;
  device_buffer<float> g_, x_, m_, v_;
};
}  // namespace

/// The rule and the model of one member of the Adam family.
struct detail::adam_family::impl {
  virtual ~impl() = default;
  virtual void start(std::span<const parameter> params, cudaStream_t s) = 0;
  virtual void step(std::span<const parameter> params, cudaStream_t s) = 0;
  virtual void finish(std::span<const parameter> params, cudaStream_t s) = 0;
  [[nodiscard]] virtual const relax::detail::momentum_adam_rule& rule() const = 0;
};

namespace {
template <class Codec>
struct adam_impl final : detail::adam_family::impl {
  adam_impl(device_communicator& gpu, Codec codec, std::string_view name, int warmup, const relax::adam_options& a)
      : model(gpu, std::move(codec)), r(gpu.rank(), name, warmup, a) {}
  void start(std::span<const parameter> params, cudaStream_t s) override {
    model.on(s);
    r.start(model, params);
  }
  void step(std::span<const parameter> params, cudaStream_t s) override {
    model.on(s);
    int ignored = 0;  // the family is its own Adam: the optimizer is not used
    r.step(model, params, ignored);
  }
  void finish(std::span<const parameter> params, cudaStream_t s) override {
    model.on(s);
    r.finish(model, params);
  }
  [[nodiscard]] const relax::detail::momentum_adam_rule& rule() const override { return r; }
  device_adam_model<Codec> model;
  relax::detail::momentum_adam_rule r;
};
}  // namespace

detail::adam_family::adam_family(std::unique_ptr<impl> i) : impl_(std::move(i)) {}
detail::adam_family::~adam_family() = default;
std::string_view detail::adam_family::name() const noexcept { return impl_->rule().name(); }
void detail::adam_family::start(std::span<const parameter> params, cudaStream_t s) { impl_->start(params, s); }
void detail::adam_family::step(std::span<const parameter> params, optimizer&, cudaStream_t s) {
  impl_->step(params, s);
}
void detail::adam_family::finish(std::span<const parameter> params, cudaStream_t s) { impl_->finish(params, s); }
relax::traffic detail::adam_family::traffic_so_far() const noexcept { return impl_->rule().so_far(); }

onebit_adam::onebit_adam(device_communicator& gpu, int warmup, relax::adam_options adam, std::size_t chunk)
    : adam_family(std::make_unique<adam_impl<onebit_device_codec>>(gpu, onebit_device_codec(chunk), "onebit_adam",
                                                                   warmup, adam)) {}

qadam::qadam(device_communicator& gpu, int warmup, relax::adam_options adam, std::size_t chunk)
    : adam_family(chunk == 0
                      ? throw usage_error(relax::detail::where(gpu.rank(), "qadam", "make") + "chunk must be positive")
                      : std::make_unique<adam_impl<minmax_device_codec>>(gpu, minmax_device_codec(chunk), "qadam",
                                                                         warmup, adam)) {}

// ---- async_model_average's device model ---------------------------------------------------------------

struct detail::device_async_model::state {
  std::vector<parameter> params;                // the buffers given to start()
  std::optional<communicator> links;            // the background thread's host communicator
  std::optional<device_communicator> averager;  // and its device communicator over links
  stream own;                                   // the background thread's stream
  cudaStream_t train = nullptr;                 // the training stream of the last step (under the lock)
  device_buffer<float> snapshot, average, delta;
  fusion_packer packer, background_packer;  // the training thread's; the background thread's
  std::vector<copy_region> regions, background_regions;
  event snapshot_ready{false}, delta_done{false};
  bool delta_recorded = false;
};

detail::device_async_model::device_async_model(device_communicator& gpu) : gpu_(gpu), st_(std::make_unique<state>()) {}
detail::device_async_model::~device_async_model() = default;

communicator& detail::device_async_model::links() noexcept { return *st_->links; }

void detail::device_async_model::start(std::string_view algo, std::span<const parameter> params) {
  state& st = *st_;
  model_.bind(gpu_.host(), algo, params);
  const std::size_t n = model_.size();
  for (device_buffer<float>* b : {&st.snapshot, &st.average, &st.delta}) *b = device_buffer<float>(n);
  // every rank's weights become rank 0's: pack, one broadcast, unpack
  pack_flat(model_, params, part::weights, st.snapshot.data(), true, st.packer, st.regions, s_);
  gpu_.broadcast(st.snapshot.span(), 0, s_);
  pack_flat(model_, params, part::weights, st.snapshot.data(), false, st.packer, st.regions, s_);
  st.params.assign(params.begin(), params.end());
  st.train = s_;
  st.delta_recorded = false;
  if (!st.links) {
    st.links = gpu_.host().split(0, gpu_.rank());
    device_options o;
    o.use_nccl = gpu_.has_nccl();  // the same decision as the training communicator's (a GPU per rank)
    st.averager.emplace(*st.links, gpu_.device(), o);
  }
}

void detail::device_async_model::check(std::string_view op, std::span<const parameter> params) const {
  model_.check(gpu_.rank(), op, params);
}

void detail::device_async_model::apply(std::span<const parameter> params, optimizer& opt) {
  st_->train = s_;  // under the weights' lock: the background thread queues its reads and writes here
  apply_all(params, opt, s_);
}

void detail::device_async_model::snapshot() {  // under the lock, on the background thread
  state& st = *st_;
  if (st.delta_recorded) FLEXPAR_CHECK_CUDA(gpu_.rank(), cudaStreamWaitEvent(st.train, st.delta_done.get(), 0));
  pack_flat(model_, st.params, part::weights, st.snapshot.data(), true, st.background_packer, st.background_regions,
            st.train);
  st.snapshot_ready.record(st.train);
}

void detail::device_async_model::average() {  // without the lock: the training thread goes on
  state& st = *st_;
  FLEXPAR_CHECK_CUDA(gpu_.rank(), cudaStreamWaitEvent(st.own.get(), st.snapshot_ready.get(), 0));
  copy_async(st.average.span(), device_span<const float>(st.snapshot.span()), st.own);
  st.averager->allreduce(st.average.span(), reduce_op::avg, st.own);
  st.averager->synchronize(st.own, "cuda::async_model_average: the background average");
}

void detail::device_async_model::apply_delta() {  // under the lock: x += a - s on the training stream
  state& st = *st_;
  detail::subtract(st.average.span(), st.snapshot.span(), st.delta.span(), st.train);
  for (std::size_t i = 0; i < st.params.size(); ++i) {
    const device_span<float> w = st.params[i].weight;
    reduce_into(w, device_span<const float>(st.delta.data() + model_.offset(i), w.size()), reduce_op::sum, st.train);
  }
  st.delta_done.record(st.train);
  st.delta_recorded = true;
}

std::uint64_t detail::device_async_model::final_average(std::span<const parameter> params) {
  state& st = *st_;
  pack_flat(model_, params, part::weights, st.snapshot.data(), true, st.packer, st.regions, s_);
  gpu_.allreduce(st.snapshot.span(), reduce_op::avg, s_);
  pack_flat(model_, params, part::weights, st.snapshot.data(), false, st.packer, st.regions, s_);
  return relax::detail::ring_allreduce_bytes(model_.size(), gpu_.size());
}

std::unique_ptr<relaxation> make_relaxation(std::string_view name, device_communicator& gpu, const relax::options& o) {
  if (name == "gradient_allreduce") return std::make_unique<gradient_allreduce>(gpu);
  if (name == "bytegrad") return std::make_unique<bytegrad>(gpu, o.chunk);
  if (name == "local_sgd") return std::make_unique<local_sgd>(gpu, o.interval);
  if (name == "decentralized")
    return std::make_unique<decentralized>(gpu, relax::peer_selection_of(o.peers), o.interval);
  if (name == "low_precision_decentralized")
    return std::make_unique<low_precision_decentralized>(gpu, o.interval, o.chunk);
  if (name == "async_model_average") return std::make_unique<async_model_average>(gpu, o.period_ms);
  if (name == "onebit_adam") return std::make_unique<onebit_adam>(gpu, o.warmup_steps, o.adam, o.onebit_chunk);
  if (name == "qadam") return std::make_unique<qadam>(gpu, o.warmup_steps, o.adam, o.chunk);
  std::string known;
  for (std::string_view n : relax::algorithm_names()) known.append(known.empty() ? "" : ", ").append(n);
  throw usage_error(relax::detail::where(gpu.rank(), std::string(name), "make") + "unknown algorithm; known: " + known);
}

}  // namespace flexpar::cuda
