// flexpar/actor/actor_graph.hpp — actors with typed ports, placed on ranks, connected into a graph.
//
//   flexpar::actor_graph g;                                   // one rank (or actor_graph g(comm))
//   auto& numbers = g.add_actor<flexpar::out<int, 2>>("numbers",
//       [i = 0](int& x) mutable { if (i == 100) return flexpar::fire_result::done; x = i++; return
//       flexpar::fire_result::emit; });
//   auto& square = g.add_actor<flexpar::in<int>, flexpar::out<long, 2>>("square",
//       [](const int& x, long& y) { y = long{x} * x; });
//   long sum = 0;
//   auto& total = g.add_actor<flexpar::in<long>>("sum", [&sum](const long& y) { sum += y; });
//   g.connect(numbers.output<0>(), square.input<0>());
//   g.connect(square.output<0>(), total.input<0>());
//   flexpar::actor_executor pool(2);
//   pool.run(g, flexpar::deadline_after(std::chrono::seconds(10)));
//
// An actor is a callable and its ports, inputs first: `add_actor<in<A>, in<B>, out<C, N>>(label,
// body)` calls `body(const A&, const B&, C&)` each time it fires, with the oldest message of every
// input and a free register of every output. The body returns void (publish), or a fire_result.
// A body may keep state (a mutable lambda): an actor never fires concurrently with itself.
//
// Placement: every rank builds the same graph, naming the rank of each actor (`add_actor(rank,
// ...)`); each rank runs only its own actors. An edge between ranks moves its messages with the
// pull protocol of remote_edge.hpp. Cross-rank edges are numbered in the order connect() is
// called, so every rank must call it in the same order.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <flexpar/actor/graph_core.hpp>
#include <flexpar/actor/regst.hpp>
#include <flexpar/actor/remote_edge.hpp>
#include <flexpar/comm/communicator.hpp>

namespace flexpar {

namespace detail {
template <class... Ports>
constexpr bool inputs_before_outputs() {
  constexpr bool is_input[] = {is_in_port<Ports>::value..., false};
  bool seen_output = false;
  for (std::size_t i = 0; i < sizeof...(Ports); ++i) {
    if (!is_input[i]) seen_output = true;
    if (is_input[i] && seen_output) return false;
  }
  return true;
}
template <class... Ports>
constexpr std::size_t count_inputs() {
  return (std::size_t{0} + ... + (is_in_port<Ports>::value ? 1 : 0));
}
template <class P>
using payload_t = typename P::value_type;
template <class P>
using argument_t = std::conditional_t<is_in_port<P>::value, const payload_t<P>&, payload_t<P>&>;
}  // namespace detail

/// An actor with ports `Ports...` (in<T>... then out<T, N>...). Built by actor_graph::add_actor.
template <class... Ports>
class actor : public detail::actor_node {
  static_assert(((detail::is_in_port<Ports>::value || detail::is_out_port<Ports>::value) && ...),
                "flexpar::actor: every port must be flexpar::in<T> or flexpar::out<T, N>");
  static_assert(detail::inputs_before_outputs<Ports...>(),
                "flexpar::actor: list the input ports (in<T>) before the output ports (out<T, N>)");

 public:
  /// Number of input ports.
  static constexpr std::size_t input_count = detail::count_inputs<Ports...>();
  /// Number of output ports.
  static constexpr std::size_t output_count = sizeof...(Ports) - input_count;

  /// The `I`-th input mailbox (0-based among inputs).
  template <std::size_t I>
  [[nodiscard]] auto& input() noexcept {
    static_assert(I < input_count, "flexpar::actor::input<I>: this actor has fewer inputs");
    return std::get<I>(ports_);
  }
  /// The `I`-th output port (0-based among outputs).
  template <std::size_t I>
  [[nodiscard]] auto& output() noexcept {
    static_assert(I < output_count, "flexpar::actor::output<I>: this actor has fewer outputs");
    return std::get<input_count + I>(ports_);
  }

 protected:
  /// An actor labelled `label` on `rank`; `kind` says whether it runs here (built by add_actor).
  actor(std::string label, int rank, detail::node_kind kind) : actor_node(std::move(label), rank, kind) {
    register_ports(std::index_sequence_for<Ports...>{});
  }

  /// The ports, in the order of `Ports...`.
  std::tuple<Ports...> ports_;

 private:
  template <std::size_t... I>
  void register_ports(std::index_sequence<I...>) {
    (register_port(std::get<I>(ports_), static_cast<int>(I)), ...);
  }
  template <class T>
  void register_port(in<T>& p, int i) {
    p.consumer = this;
    p.index = i;
    inputs.push_back(&p);
  }
  template <class T, std::size_t N>
  void register_port(out<T, N>& p, int i) {
    p.producer = this;
    p.index = i - static_cast<int>(input_count);
    outputs.push_back(&p);
  }
};

namespace detail {
/// An actor with its body.
template <class Body, class... Ports>
class actor_with_body final : public actor<Ports...> {
  using base = actor<Ports...>;
  static_assert(std::is_invocable_v<Body&, argument_t<Ports>...>,
                "flexpar::add_actor: the body must be callable as body(const In&..., Out&...) with the payload "
                "types of the ports, inputs first (in<T> gives const T&, out<T, N> gives T&)");
  using result_t = std::invoke_result_t<Body&, argument_t<Ports>...>;
  static_assert(std::is_void_v<result_t> || std::is_same_v<result_t, fire_result>,
                "flexpar::add_actor: the body must return void (always publish) or flexpar::fire_result");

 public:
  actor_with_body(std::string label, int rank, node_kind kind, Body body)
      : base(std::move(label), rank, kind), body_(std::move(body)) {}

  fire_result invoke(std::span<regst_base* const> in, std::span<regst_base* const> out) override {
    return call(std::index_sequence_for<Ports...>{}, in, out);
  }

 private:
  template <std::size_t I>
  decltype(auto) argument(std::span<regst_base* const> in, std::span<regst_base* const> out) {
    using port = std::tuple_element_t<I, std::tuple<Ports...>>;
    using T = payload_t<port>;
    if constexpr (I < base::input_count)
      return static_cast<const T&>(static_cast<regst<T>*>(in[I])->value);
    else
      return static_cast<T&>(static_cast<regst<T>*>(out[I - base::input_count])->value);
  }
  template <std::size_t... I>
  fire_result call(std::index_sequence<I...>, std::span<regst_base* const> in, std::span<regst_base* const> out) {
    if constexpr (std::is_void_v<result_t>) {
      body_(argument<I>(in, out)...);
      return fire_result::emit;
    } else {
      return body_(argument<I>(in, out)...);
    }
  }

  Body body_;
};
}  // namespace detail

/// An actor whose number of ports is a run-time value: `inputs` in<T> then `outputs`
/// out<T, dynamic_registers>, all of one payload type (OneFlow's boxing actors: gather k pieces,
/// split into k). The body gets the oldest message of every input and a free register of every
/// output, as pointers in port order. Built by actor_graph::add_dynamic_actor.
template <class T>
class dynamic_actor final : public detail::actor_node {
 public:
  /// The body: body(inputs, outputs) -> fire_result.
  using body_type = std::function<fire_result(std::span<const T* const>, std::span<T* const>)>;

  /// An actor labelled `label` on `rank` (built by add_dynamic_actor).
  dynamic_actor(std::string label, int rank, detail::node_kind kind, std::size_t inputs, std::size_t outputs,
                body_type body)
      : actor_node(std::move(label), rank, kind), body_(std::move(body)) {
    for (std::size_t i = 0; i < inputs; ++i) {
      in_.push_back(std::make_unique<in<T>>());
      in_.back()->consumer = this;
      in_.back()->index = static_cast<int>(i);
      this->inputs.push_back(in_.back().get());
    }
    for (std::size_t i = 0; i < outputs; ++i) {
      out_.push_back(std::make_unique<out<T, dynamic_registers>>());
      out_.back()->producer = this;
      out_.back()->index = static_cast<int>(i);
      this->outputs.push_back(out_.back().get());
    }
  }
  /// Input `i`.
  [[nodiscard]] in<T>& input(std::size_t i) noexcept { return *in_[i]; }
  /// Output `i` (set its register count before connecting it; 1 by default).
  [[nodiscard]] out<T, dynamic_registers>& output(std::size_t i) noexcept { return *out_[i]; }
  /// Number of inputs.
  [[nodiscard]] std::size_t input_count() const noexcept { return in_.size(); }
  /// Number of outputs.
  [[nodiscard]] std::size_t output_count() const noexcept { return out_.size(); }

  /// Calls the body with the payloads of the firing's registers.
  fire_result invoke(std::span<detail::regst_base* const> in, std::span<detail::regst_base* const> out) override {
    in_values_.clear();
    out_values_.clear();
    for (detail::regst_base* r : in) in_values_.push_back(&static_cast<regst<T>*>(r)->value);
    for (detail::regst_base* r : out) out_values_.push_back(&static_cast<regst<T>*>(r)->value);
    return body_(in_values_, out_values_);
  }

 private:
  std::vector<std::unique_ptr<in<T>>> in_;
  std::vector<std::unique_ptr<out<T, dynamic_registers>>> out_;
  body_type body_;
  std::vector<const T*> in_values_;
  std::vector<T*> out_values_;
};

/// A graph of actors on one rank or across the ranks of a communicator. Run it with an
/// actor_executor (executor.hpp) or step it with a deterministic_scheduler. A graph runs once.
class actor_graph {
 public:
  /// A graph on one rank (every actor is local).
  actor_graph() : core_(std::make_unique<detail::graph_core>(0, 1)) {}

  /// Collective over `comm`: a graph whose actors may sit on any rank of `comm`. Cross-rank edges
  /// move bytes on a private split of comm's transport (never mixing with comm's own messages);
  /// the internal waits of the protocol use comm's timeout, and an idle run() polls for comm's
  /// spin time before it sleeps between polls (config::spin, FLEXPAR_SPIN_US). `comm` must outlive nothing here.
  explicit actor_graph(communicator& comm) : core_(std::make_unique<detail::graph_core>(comm.rank(), comm.size())) {
    core_->bus = comm.transport().split(0, comm.rank());
    core_->bus_timeout = comm.settings().timeout;
    core_->bus_spin = comm.settings().spin;
  }

  /// A graph over `comm` whose cross-rank edges use `bus`, a split of comm's transport that the
  /// caller keeps for a series of graphs (one split, then a graph per step, as pipeline does). The
  /// graphs on one bus must run one after another, each completing on every rank before the next
  /// starts (an edge's tags are reused by the next graph's edge of the same number).
  actor_graph(communicator& comm, std::shared_ptr<transport> bus)
      : core_(std::make_unique<detail::graph_core>(comm.rank(), comm.size())) {
    if (!bus) throw error_on<usage_error>(comm.rank(), "actor_graph", "the bus transport is null");
    core_->bus = std::move(bus);
    core_->bus_timeout = comm.settings().timeout;
    core_->bus_spin = comm.settings().spin;
  }

  /// Adds an actor on this rank (a one-rank graph) or on every rank (each runs its own copy).
  /// See the file comment for the body's signature.
  template <class... Ports, class Body>
  actor<Ports...>& add_actor(std::string label, Body body) {
    return add_actor<Ports...>(core_->rank(), std::move(label), std::move(body));
  }

  /// Adds an actor placed on `rank` (0 <= rank < size()); other ranks keep only its ports.
  /// @throws usage_error if `rank` is out of range.
  template <class... Ports, class Body>
  actor<Ports...>& add_actor(int rank, std::string label, Body body) {
    if (rank < 0 || rank >= core_->size()) {
      throw error_on<usage_error>(core_->rank(), "", "add_actor '", label, "': placed on rank ", rank,
                                  " of a graph of ", core_->size(), " rank(s)");
    }
    const auto kind = rank == core_->rank() ? detail::node_kind::local : detail::node_kind::elsewhere;
    auto node =
        std::make_unique<detail::actor_with_body<Body, Ports...>>(std::move(label), rank, kind, std::move(body));
    return static_cast<actor<Ports...>&>(core_->add(std::move(node)));
  }

  /// Adds an actor placed on `rank` with `inputs` in<T> and `outputs` out<T, dynamic_registers>
  /// (see dynamic_actor). @throws usage_error if `rank` is out of range or it has no port at all.
  template <class T>
  dynamic_actor<T>& add_dynamic_actor(int rank, std::string label, std::size_t inputs, std::size_t outputs,
                                      typename dynamic_actor<T>::body_type body) {
    if (rank < 0 || rank >= core_->size() || inputs + outputs == 0) {
      throw error_on<usage_error>(core_->rank(), "", "add_dynamic_actor '", label, "': placed on rank ", rank,
                                  " of a graph of ", core_->size(), " rank(s) with ", inputs, " input(s) and ", outputs,
                                  " output(s); it needs a rank of the graph and at least one port");
    }
    const auto kind = rank == core_->rank() ? detail::node_kind::local : detail::node_kind::elsewhere;
    auto node = std::make_unique<dynamic_actor<T>>(std::move(label), rank, kind, inputs, outputs, std::move(body));
    return static_cast<dynamic_actor<T>&>(core_->add(std::move(node)));
  }

  /// Fixes the order in which the actors of this rank's stream `stream` fire (graph_core::set_stream_order):
  /// exactly `order`, an actor possibly many times. @throws usage_error if an actor is on another stream.
  void set_stream_order(int stream, std::vector<detail::actor_node*> order) {
    core_->set_stream_order(stream, std::move(order));
  }

  /// Connects an output to an input of the same payload type; the input's messages are the
  /// output's, in order. An output may feed several inputs (each register is returned by all);
  /// an input has one producer. Between ranks this creates the two ends of a cross-rank edge.
  /// @throws usage_error if `to` is already connected.
  template <class T, std::size_t N, class U>
  void connect(out<T, N>& from, in<U>& to) {
    static_assert(std::is_same_v<T, U>,
                  "flexpar::connect: the output's payload type differs from the input's; an in<T> can only be "
                  "fed by an out<T, N> of the same T");
    if (to.producer != nullptr || to.consumer == nullptr || from.producer == nullptr) {
      std::string consumer = "of no actor";
      if (to.consumer) consumer.assign("of '").append(to.consumer->label()).append("'");
      throw error_on<usage_error>(core_->rank(), "connect", "input ", to.index, " ", consumer,
                                  " already has a producer; an input takes messages from one output");
    }
    const int p = from.producer->rank();
    const int c = to.consumer->rank();
    const int me = core_->rank();
    if (p == c) {  // a local edge (or one between two actors elsewhere)
      to.producer = &from;
      from.consumers.push_back(&to);
      return;
    }
    const tag_t channel = next_channel_++;
    std::string label = from.producer->label();
    label += "->";
    label += to.consumer->label();
    if (p == me || c == me) check_channel(channel, label);
    if (p == me) {
      auto end = std::make_unique<detail::remote_sender<T>>(label, me, c, channel);
      auto& mailbox = end->mailbox();
      core_->add(std::move(end));
      mailbox.producer = &from;
      from.consumers.push_back(&mailbox);
      to.producer = &from;  // marks `to` connected on this rank too
    } else if (c == me) {
      auto end = std::make_unique<detail::remote_receiver<T, N>>(label, me, p, channel, from.register_count());
      auto& output = end->output();
      core_->add(std::move(end));
      to.producer = &output;
      output.consumers.push_back(&to);
    } else {
      to.producer = &from;
    }
  }

  /// This rank in the graph's communicator (0 for a one-rank graph).
  [[nodiscard]] int rank() const noexcept { return core_->rank(); }
  /// Number of ranks of the graph.
  [[nodiscard]] int size() const noexcept { return core_->size(); }
  /// Records every firing of this rank's actors as a span on a track named after the actor.
  /// `t` must outlive the run.
  void record(timeline& t) noexcept { core_->trace = &t; }
  /// The type-erased state (executors).
  [[nodiscard]] detail::graph_core& core() noexcept { return *core_; }

 private:
  void check_channel(tag_t channel, const std::string& label) const {
    if (!core_->bus) {
      throw error_on<usage_error>(core_->rank(), "connect", "'", label,
                                  "': a cross-rank edge needs a graph built over a communicator (actor_graph(comm))");
    }
    if (3 * channel + 2 >= core_->bus->max_tag()) {
      throw error_on<usage_error>(core_->rank(), "", "connect '", label,
                                  "': too many cross-rank edges for the transport's tag range");
    }
  }

  std::unique_ptr<detail::graph_core> core_;
  tag_t next_channel_ = 0;
};

}  // namespace flexpar
