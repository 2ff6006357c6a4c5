// flexpar/actor/regst.hpp — registers, output ports with a register count, and input mailboxes.
//
// The model (OneFlow's): an actor writes each result into one of its output's registers
// (`regst`). An output owns a fixed number of registers, its register count N (1 = no overlap,
// 2 = double buffering, ...). Publishing a register puts a pointer to it into the mailbox of every
// consumer; each consumer returns it when its firing is done (a reference count per register).
// A register is free again when every consumer has returned it. An actor fires only when every
// input mailbox holds a message and every output has a free register, so a fast producer stops
// after N messages ahead of its slowest consumer: back-pressure with no unbounded queue.
//
// The port types carry the payload type, so `connect(out<float, 2>&, in<int>&)` does not compile.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <flexpar/core/error.hpp>

namespace flexpar {

namespace detail {
class actor_node;
class graph_core;
class out_base;

/// One register: the payload lives in the derived `regst<T>`.
class regst_base {
 public:
  regst_base() = default;
  regst_base(const regst_base&) = delete;
  regst_base& operator=(const regst_base&) = delete;

  out_base* owner = nullptr;   ///< the output port this register belongs to
  int readers_left = 0;        ///< consumers that have not returned it yet (under the graph's lock)
  std::uint64_t sequence = 0;  ///< the producer's message number carried by this register
};

/// What every input mailbox is, whatever its payload type.
class in_base {
 public:
  in_base() = default;
  in_base(const in_base&) = delete;
  in_base& operator=(const in_base&) = delete;
  virtual ~in_base() = default;

  actor_node* consumer = nullptr;  ///< the actor this mailbox feeds
  out_base* producer = nullptr;    ///< the output connected to it (one producer per mailbox)
  std::deque<regst_base*> queue;   ///< published registers not yet consumed, oldest first
  bool closed = false;             ///< the consumer has finished: arriving registers are returned at once
  int index = 0;                   ///< position among the consumer's inputs
};

/// What every output port is, whatever its payload type.
class out_base {
 public:
  out_base() = default;
  out_base(const out_base&) = delete;
  out_base& operator=(const out_base&) = delete;
  virtual ~out_base() = default;

  /// Number of registers of this output (its register count).
  [[nodiscard]] virtual std::size_t register_count() const noexcept = 0;
  /// Register `i` (0 <= i < register_count()).
  [[nodiscard]] virtual regst_base& register_at(std::size_t i) noexcept = 0;

  actor_node* producer = nullptr;      ///< the actor that writes this output
  std::vector<in_base*> consumers;     ///< mailboxes it feeds (a register is returned by all of them)
  std::vector<regst_base*> free_list;  ///< registers no consumer holds and the producer is not writing
  std::size_t in_use = 0;              ///< registers being written or held by consumers
  std::size_t peak_in_use = 0;         ///< the most registers ever in use at once (measured)
  std::uint64_t published = 0;         ///< messages published so far
  bool ended = false;                  ///< the producer will publish nothing more
  int index = 0;                       ///< position among the producer's outputs
};
}  // namespace detail

/// A register holding one `T`: the payload an output publishes and its consumers read. Its value
/// is reused (not reconstructed) from message to message, so a large payload is allocated once.
template <class T>
class regst final : public detail::regst_base {
 public:
  T value{};  ///< the payload
};

/// An input mailbox of type `T`: holds the registers published to it, oldest first. The actor's
/// body receives the front message as `const T&`; the register is returned after the firing.
template <class T>
class in final : public detail::in_base {
 public:
  using value_type = T;  ///< the payload type of this mailbox
};

/// An output port of type `T` with `N` registers (the register count; N >= 1). The body writes into
/// a free register as `T&`; the register is published to every consumer when the firing returns.
template <class T, std::size_t N = 2>
class out final : public detail::out_base {
  static_assert(N >= 1, "flexpar::out<T, N>: an output needs at least one register (N >= 1)");

 public:
  using value_type = T;  ///< the payload type of this output
  /// The register count (compile-time).
  static constexpr std::size_t count = N;

  out() {
    for (auto& r : registers_) {
      r.owner = this;
      free_list.push_back(&r);
    }
  }
  /// Number of registers of this output.
  [[nodiscard]] std::size_t register_count() const noexcept override { return N; }
  /// Register `i`.
  [[nodiscard]] detail::regst_base& register_at(std::size_t i) noexcept override { return registers_[i]; }
  /// The most registers this output ever had in use at once (being written or held by a consumer).
  [[nodiscard]] std::size_t peak_registers_in_use() const noexcept { return peak_in_use; }
  /// Messages this output has published.
  [[nodiscard]] std::uint64_t messages_published() const noexcept { return published; }

 private:
  std::array<regst<T>, N> registers_;
};

/// The register count of an `out<T, dynamic_registers>`: chosen at run time with
/// `set_register_count(n)` (before the output is connected), as std::dynamic_extent is for a span.
inline constexpr std::size_t dynamic_registers = std::numeric_limits<std::size_t>::max();

/// An output whose register count is a run-time value (1 until set): a pipeline stage's stash, whose
/// count is the schedule's, is one.
template <class T>
class out<T, dynamic_registers> final : public detail::out_base {
 public:
  using value_type = T;  ///< the payload type of this output
  /// The register count is not a compile-time value.
  static constexpr std::size_t count = dynamic_registers;

  out() { set_register_count(1); }
  /// Sets the register count to `n` (>= 1). Call it before connect(): a cross-rank consumer takes
  /// the count when the edge is made. @throws usage_error for 0 or once the output is connected.
  void set_register_count(std::size_t n) {
    if (n == 0)
      throw error_on<usage_error>(no_rank, "flexpar::out<T, dynamic_registers>",
                                  "an output needs at least one register");
    if (!consumers.empty()) {
      throw error_on<usage_error>(no_rank, "flexpar::out<T, dynamic_registers>::set_register_count",
                                  "the output is already connected; set the register count before connect()");
    }
    registers_.clear();
    free_list.clear();
    for (std::size_t i = 0; i < n; ++i) {
      registers_.push_back(std::make_unique<regst<T>>());
      registers_.back()->owner = this;
      free_list.push_back(registers_.back().get());
    }
  }
  /// Number of registers of this output.
  [[nodiscard]] std::size_t register_count() const noexcept override { return registers_.size(); }
  /// Register `i`.
  [[nodiscard]] detail::regst_base& register_at(std::size_t i) noexcept override { return *registers_[i]; }
  /// The most registers this output ever had in use at once (being written or held by a consumer).
  [[nodiscard]] std::size_t peak_registers_in_use() const noexcept { return peak_in_use; }
  /// Messages this output has published.
  [[nodiscard]] std::uint64_t messages_published() const noexcept { return published; }

 private:
  std::vector<std::unique_ptr<regst<T>>> registers_;
};

namespace detail {
template <class P>
struct is_in_port : std::false_type {};
template <class T>
struct is_in_port<in<T>> : std::true_type {};
template <class P>
struct is_out_port : std::false_type {};
template <class T, std::size_t N>
struct is_out_port<out<T, N>> : std::true_type {};
}  // namespace detail

}  // namespace flexpar
