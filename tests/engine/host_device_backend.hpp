// A device_backend over host memory, for testing on machines without a GPU what the engine does with
// device tensors: negotiation with the memory kind, fusion that never mixes the kinds, joined ranks,
// outputs too small, completion by polling, order_after. Its "device addresses" are host pointers and
// its collectives are flexpar's host collectives on a communicator of its own (used from the engine's
// background thread only); it finishes every response before run() returns, so done() is true at once.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/collective/reduce_kernel.hpp>
#include <flexpar/engine/engine.hpp>

namespace flexpar::testing_support {

class host_device_backend final : public device_backend {
 public:
  /// Collective over `comm` (splits its own communicator).
  explicit host_device_backend(communicator& comm) : comm_(std::move(*comm.split(0, comm.rank()))) {}

  device_marker capture(void* stream) override {
    captures_.fetch_add(1);
    return std::make_shared<void*>(stream);
  }

  device_marker run(collective_kind kind, dtype type, reduce_op op, int root, std::span<const device_item> items,
                    std::span<const std::uint64_t> counts, std::string& path) override {
    path = "host (test backend)";
    {
      std::lock_guard lock(mutex_);
      items_per_run_.push_back(items.size());
    }
    visit_dtype(type, [&](auto zero) {
      using T = decltype(zero);
      run_typed<T>(kind, op, root, items, counts);
    });
    return std::make_shared<void*>(nullptr);
  }

  bool done(const device_marker& m) override { return m != nullptr; }
  device_phases phases(const device_marker&) override { return {}; }
  void order_after(const device_marker&, void*) override { orders_.fetch_add(1); }

  void convert(dtype from, const void* in, dtype to, void* out, std::size_t count, double factor, void*) override {
    auto typed = [&](auto from_zero, auto to_zero) {
      using F = decltype(from_zero);
      using T = decltype(to_zero);
      using A = accumulate_t<T>;
      const F* x = static_cast<const F*>(in);
      T* y = static_cast<T*>(out);
      for (std::size_t i = 0; i < count; ++i)
        y[i] = static_cast<T>(static_cast<A>(static_cast<double>(static_cast<accumulate_t<F>>(x[i])) * factor));
    };
    if (from == to)
      visit_dtype(from, [&](auto zero) { typed(zero, zero); });
    else if (from == dtype::f32 && to == dtype::f16)
      typed(float{}, half{});
    else if (from == dtype::f16 && to == dtype::f32)
      typed(half{}, float{});
    else if (from == dtype::f32 && to == dtype::bf16)
      typed(float{}, bfloat16{});
    else if (from == dtype::bf16 && to == dtype::f32)
      typed(bfloat16{}, float{});
    else
      throw usage_error("host_device_backend::convert: unsupported pair");
    converts_.fetch_add(1);
  }

  std::shared_ptr<void> allocate(std::size_t bytes) override {
    auto buffer = std::make_shared<std::vector<std::byte>>(bytes);
    return std::shared_ptr<void>(buffer, buffer->data());
  }

  int converts() const { return converts_.load(); }

  /// Tensors per run() so far.
  std::vector<std::size_t> items_per_run() const {
    std::lock_guard lock(mutex_);
    return items_per_run_;
  }
  int captures() const { return captures_.load(); }
  int orders() const { return orders_.load(); }

 private:
  template <class T>
  static T* as(std::byte* p) {
    return reinterpret_cast<T*>(p);
  }
  template <class T>
  static const T* as(const std::byte* p) {
    return reinterpret_cast<const T*>(p);
  }

  template <class T>
  void run_typed(collective_kind kind, reduce_op op, int root, std::span<const device_item> items,
                 std::span<const std::uint64_t> counts) {
    const auto p = static_cast<std::size_t>(comm_.size()), me = static_cast<std::size_t>(comm_.rank());
    if (kind == collective_kind::allreduce) {  // fused or one tensor: through a buffer
      std::vector<T> fused;
      for (const device_item& item : items) {
        if (item.in)
          fused.insert(fused.end(), as<T>(item.in), as<T>(item.in) + item.count);
        else
          fused.insert(fused.end(), item.count, static_cast<T>(identity_of<accumulate_t<T>>(op)));
      }
      allreduce(comm_, std::span<T>(fused), op);
      std::size_t at = 0;
      for (const device_item& item : items) {
        if (item.out) std::memcpy(item.out, fused.data() + at, item.count * sizeof(T));
        at += item.count;
      }
      return;
    }
    const device_item& item = items.front();
    switch (kind) {
      case collective_kind::broadcast: {
        std::vector<T> data(item.count);
        if (item.in) std::memcpy(data.data(), item.in, item.count * sizeof(T));
        broadcast(comm_, std::span<T>(data), root);
        if (item.out) std::memcpy(item.out, data.data(), item.count * sizeof(T));
        return;
      }
      case collective_kind::allgather: {
        std::vector<std::size_t> sizes(counts.begin(), counts.end());
        std::size_t total = 0;
        for (auto c : sizes) total += c;
        std::vector<T> all(total);
        allgather_v(comm_, std::span<const T>(as<T>(item.in), item.count), std::span<T>(all),
                    std::span<const std::size_t>(sizes));
        if (item.out) std::memcpy(item.out, all.data(), total * sizeof(T));
        return;
      }
      case collective_kind::reduce_scatter: {
        const block_layout layout = block_layout::even(item.count, static_cast<int>(p));
        std::vector<T> mine(layout.count(static_cast<int>(me)));
        reduce_scatter_v(comm_, std::span<const T>(as<T>(item.in), item.count), std::span<T>(mine),
                         std::span<const std::size_t>(layout.counts), op);
        if (item.out) std::memcpy(item.out, mine.data(), mine.size() * sizeof(T));
        return;
      }
      case collective_kind::alltoall: {
        std::vector<T> out(item.count);
        alltoall(comm_, std::span<const T>(as<T>(item.in), item.count), std::span<T>(out));
        if (item.out) std::memcpy(item.out, out.data(), out.size() * sizeof(T));
        return;
      }
      default: return;
    }
  }

  communicator comm_;
  mutable std::mutex mutex_;
  std::vector<std::size_t> items_per_run_;
  std::atomic<int> captures_{0}, orders_{0}, converts_{0};
};

}  // namespace flexpar::testing_support
