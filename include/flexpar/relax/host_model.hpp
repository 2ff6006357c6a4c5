// flexpar/relax/host_model.hpp — the memory side of the relaxations for host parameters: what an algorithm's rule
// (its steps, peers and bytes, written once in its header) asks of the memory the model lives in.
//
// The rules of gradient_allreduce, local_sgd and decentralized are templates over a `Model` that
// does each step's data movement where the parameters live: host_model here, cuda::detail::
// device_model (flexpar/cuda/relax.hpp) on the GPU. A Model provides:
//
// | call                                   | what                                                         |
// |----------------------------------------|--------------------------------------------------------------|
// | rank(), size()                         | this rank, the ranks                                         |
// | start(algo, params, links)             | collective: check the list (flat_model::bind), every rank takes rank 0's
// weights; `links`: open the point-to-point channel exchange_weights uses | | check(op, params)                      |
// local: the list keeps its lengths                            | | apply(params, opt)                     | opt.apply
// every parameter with its gradient                  | | average_gradients(params, algorithm)   | gradients =
// allreduce(avg) of the fused gradients; returns the bytes sent | | average_weights(params)                | weights =
// allreduce(avg) of the fused weights; bytes sent    | | exchange_weights(params, peers)        | weights = (mine +
// peers' in the order given) / (peers + 1), sums and division in f32; bytes sent |
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/relax/flat_model.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax::detail {

/// mine = (mine + others[0] + others[1] ...) / (others + 1), summed in that order in f32, one division
/// (decentralized's and low_precision_decentralized's average with their peers).
inline void average_in_order(std::span<float> mine, const std::vector<std::vector<float>>& others) {
  const float divisor = static_cast<float>(others.size() + 1);
  for (std::size_t k = 0; k < mine.size(); ++k) {
    float sum = mine[k];
    for (const auto& other : others) sum += other[k];
    mine[k] = sum / divisor;
  }
}

/// The relaxations' Model for host parameters (file header), over `comm` (kept by reference).
class host_model {
 public:
  explicit host_model(communicator& comm) : comm_(comm) {}

  [[nodiscard]] int rank() const noexcept { return comm_.rank(); }
  [[nodiscard]] int size() const noexcept { return comm_.size(); }

  void start(std::string_view algo, std::span<const parameter> params, bool links) {
    model_.bind(comm_, algo, params);
    model_.broadcast_weights(comm_, params);
    flat_.assign(model_.size(), 0.0f);
    if (links && !links_) links_ = comm_.split(0, comm_.rank());  // p2p messages of our own
  }
  void check(std::string_view op, std::span<const parameter> params) const { model_.check(comm_.rank(), op, params); }
  static void apply(std::span<const parameter> params, optimizer& opt) {
    for (std::size_t i = 0; i < params.size(); ++i) opt.apply(i, params[i].weight, params[i].gradient);
  }
  std::uint64_t average_gradients(std::span<const parameter> params, flexpar::algorithm how) {
    if (float* g = flat_model::back_to_back_gradients(params)) {  // one flat gradient buffer: in place
      flexpar::allreduce(comm_, std::span<float>(g, model_.size()), reduce_op::avg, how);
      return ring_allreduce_bytes(model_.size(), comm_.size());
    }
    model_.gather_gradients(params, flat_);
    flexpar::allreduce(comm_, std::span<float>(flat_), reduce_op::avg, how);
    model_.scatter_gradients(flat_, params);
    return ring_allreduce_bytes(flat_.size(), comm_.size());
  }
  std::uint64_t average_weights(std::span<const parameter> params) {
    model_.gather_weights(params, flat_);
    flexpar::allreduce(comm_, std::span<float>(flat_), reduce_op::avg);
    model_.scatter_weights(flat_, params);
    return ring_allreduce_bytes(flat_.size(), comm_.size());
  }
  std::uint64_t exchange_weights(std::span<const parameter> params, std::span<const int> peers) {
    model_.gather_weights(params, flat_);
    theirs_.resize(peers.size());
    std::vector<request> requests;
    transport& t = links_->transport();
    for (std::size_t i = 0; i < peers.size(); ++i) {
      theirs_[i].resize(flat_.size());
      requests.push_back(t.irecv(peers[i], 0, std::as_writable_bytes(std::span<float>(theirs_[i]))));
    }
    for (int peer : peers) requests.push_back(t.isend(peer, 0, std::as_bytes(std::span<const float>(flat_))));
    wait_all(requests, links_->default_deadline());
    average_in_order(flat_, theirs_);
    model_.scatter_weights(flat_, params);
    return peers.size() * flat_.size() * sizeof(float);
  }

 protected:
  communicator& comm_;
  flat_model model_;
  std::optional<communicator> links_;
  std::vector<float> flat_;
  std::vector<std::vector<float>> theirs_;
};

/// A host relaxation made of a rule over host_model (local_sgd, decentralized): the rule gets the
/// rank and the constructor's other arguments.
template <class Rule>
class host_ruled : public relaxation {
 public:
  void start(std::span<const parameter> params) override { rule_.start(model_, params); }
  void step(std::span<const parameter> params, optimizer& opt) override { rule_.step(model_, params, opt); }
  void finish(std::span<const parameter> params) override { rule_.finish(model_, params); }
  [[nodiscard]] traffic traffic_so_far() const noexcept override { return rule_.so_far(); }

 protected:
  template <class... Args>
  explicit host_ruled(communicator& comm, Args&&... args)
      : model_(comm), rule_(comm.rank(), std::forward<Args>(args)...) {}

 private:
  host_model model_;
  Rule rule_;
};

}  // namespace flexpar::relax::detail
