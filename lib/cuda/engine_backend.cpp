// lib/cuda/engine_backend.cpp — flexpar/cuda/engine.hpp: the engine's device backend.
#include <flexpar/cuda/engine.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <flexpar/core/error.hpp>
#include <flexpar/cuda/kernels.hpp>
#include <flexpar/cuda/runtime.hpp>
#include <flexpar/engine/engine.hpp>

namespace flexpar::cuda {
namespace {

/// The timing events of a response's phases: begin, after the copy in, after the collective, end.
struct phase_events {
  event t0{true}, t1{true}, t2{true}, t3{true};
};

/// The marker behind a device_marker: an event at its position (without timing: a producer's position
/// costs one cheap event), and for a response the timing events of its phases.
struct marker {
  event end{false};
  cudaStream_t origin = nullptr;        // the stream it was recorded on (capture) or the backend's
  std::uint64_t sequence = 0;           // order of recording on that stream
  std::unique_ptr<phase_events> timed;  // a response's (run()), not a producer's (capture())
};

marker& of(const device_marker& m) {
  if (!m) throw error_on<usage_error>(no_rank, "cuda::engine_backend", "an empty device marker");
  return *static_cast<marker*>(m.get());
}

template <class T>
device_span<T> typed(std::byte* p, std::size_t n) {
  return {reinterpret_cast<T*>(p), n};
}
template <class T>
device_span<const T> typed(const std::byte* p, std::size_t n) {
  return {reinterpret_cast<const T*>(p), n};
}

}  // namespace

struct engine_backend::state {
  device_communicator* gpu = nullptr;
  stream own;
  fusion_packer packer;
  device_buffer<std::byte> fusion, scratch_in, scratch_out, discard;

  std::byte* grown(device_buffer<std::byte>& b, std::size_t bytes) {
    if (b.size() < bytes) b = device_buffer<std::byte>(std::max(bytes, b.size() * 2));
    return b.data();
  }
  std::uint64_t sequence = 0;  // markers made so far (capture and run)
  std::mutex capture_mutex;    // capture() comes from the submitting threads
  // the last marker each caller's stream was ordered after, by its sequence number (order_after of
  // the handles of one fused run share their marker: one stream wait serves them all). Not by its
  // address: a marker freed after one step and a new one allocated at the same address in the next
  // would skip that step's wait.
  std::vector<std::pair<cudaStream_t, std::uint64_t>> ordered;
  std::mutex ordered_mutex;

  allocation_ranges ranges;  // tensors back to back are reduced as one only within one allocation

  /// My stream waits for every item's producer: for each producing stream only for its latest
  /// position among the items (a stream runs in order), so a fused run of many gradients of one
  /// backward pass costs one stream wait, not one per gradient.
  void wait_for(std::span<const device_item> items) {
    std::vector<marker*> latest;
    for (const device_item& item : items) {
      if (!item.ready) continue;
      marker& m = of(item.ready);
      auto it = std::find_if(latest.begin(), latest.end(), [&](marker* k) { return k->origin == m.origin; });
      if (it == latest.end())
        latest.push_back(&m);
      else if ((*it)->sequence < m.sequence)
        *it = &m;
    }
    for (marker* m : latest) stream_wait(own, m->end);
  }
  void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0 || dst == src) return;
    FLEXPAR_CHECK_CUDA(gpu->rank(), cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, own));
  }
};

engine_backend::engine_backend(device_communicator& gpu) {
  const device_guard on(gpu.device());
  s_ = std::make_unique<state>();
  s_->gpu = &gpu;
}

engine_backend::~engine_backend() {
  if (!s_) return;
  const device_guard on(s_->gpu->device());
  try {  // the fusion buffer and scratch may still be read by queued work
    synchronize(s_->own, std::chrono::seconds(60), "cuda::engine_backend: teardown", s_->gpu->rank());
  } catch (const error&) {
  }
}

device_marker engine_backend::capture(void* stream) {
  const device_guard on(s_->gpu->device());
  auto m = std::make_shared<marker>();
  m->origin = static_cast<cudaStream_t>(stream);
  std::lock_guard lock(s_->capture_mutex);  // the sequence follows the order of the records
  m->end.record(m->origin);
  m->sequence = ++s_->sequence;
  return m;
}

device_marker engine_backend::run(collective_kind kind, dtype type, reduce_op op, int root,
                                  std::span<const device_item> items, std::span<const std::uint64_t> counts,
                                  std::string& path) {
  state& s = *s_;
  device_communicator& gpu = *s.gpu;
  const device_guard on(gpu.device());
  if (items.empty()) throw error_on<usage_error>(no_rank, "cuda::engine_backend::run", "no tensors");
  const std::size_t e = size_of(type);
  const auto p = static_cast<std::size_t>(gpu.size());
  const auto me = static_cast<std::size_t>(gpu.rank());
  auto m = std::make_shared<marker>();
  m->timed = std::make_unique<phase_events>();
  m->origin = s.own;
  {
    std::lock_guard lock(s.capture_mutex);
    m->sequence = ++s.sequence;
  }
  std::size_t total = 0;
  for (const device_item& item : items) total += item.count;
  if (p == 1 && kind == collective_kind::allreduce) {  // one rank: every tensor is its own result
    s.wait_for(items);
    m->timed->t0.record(s.own);
    m->timed->t1.record(s.own);
    for (const device_item& item : items) s.copy(item.out, item.in, item.count * e);
    m->timed->t2.record(s.own);
    m->timed->t3.record(s.own);
    m->end.record(s.own);
    path = "none (one rank)";
    return m;
  }
  // Tensors that lie back to back in one buffer, each in place (a flat gradient buffer cut into
  // parameters): reduced where they lie, as one tensor, without the copies through the fusion buffer.
  // Back to back in one allocation only: separate allocations may be adjacent too.
  bool contiguous = kind == collective_kind::allreduce && items.size() > 1;
  for (std::size_t k = 0; contiguous && k < items.size(); ++k)
    contiguous = items[k].in && items[k].in == items[k].out &&
                 (k == 0 || items[k].in == items[k - 1].in + items[k - 1].count * e);
  contiguous = contiguous && s.ranges.one_allocation(items[0].in, total * e);
  std::byte* fused = kind == collective_kind::allreduce && items.size() > 1 && !contiguous
                         ? s.grown(s.fusion, total * e)
                         : nullptr;  // allocated before the timing starts
  s.wait_for(items);
  m->timed->t0.record(s.own);
  auto collective_done = [&] { m->timed->t2.record(s.own); };

  if (contiguous) {
    m->timed->t1.record(s.own);
    path = std::string(name_of(gpu.choose("allreduce", total * e).path));
    visit_dtype(type, [&](auto zero) {
      using T = decltype(zero);
      gpu.allreduce(typed<T>(const_cast<std::byte*>(items[0].in), total), op, s.own);
    });
    collective_done();
  } else if (kind == collective_kind::allreduce && (items.size() > 1 || !items[0].in)) {
    // fused, or a joined rank's identity: pack, reduce, unpack
    if (!fused) fused = s.grown(s.fusion, total * e);
    std::vector<copy_region> in, out;
    std::size_t at = 0;
    for (const device_item& item : items) {
      if (item.in) {
        in.push_back({item.in, fused + at * e, item.count * e});
        out.push_back({fused + at * e, item.out, item.count * e});
      } else {
        visit_dtype(type, [&](auto zero) {
          using T = decltype(zero);
          fill(typed<T>(fused + at * e, item.count), static_cast<T>(identity_of<accumulate_t<T>>(op)), s.own);
        });
      }
      at += item.count;
    }
    s.packer.copy(in, s.own);
    m->timed->t1.record(s.own);
    path = std::string(name_of(gpu.choose("allreduce", total * e).path));
    visit_dtype(type, [&](auto zero) {
      using T = decltype(zero);
      gpu.allreduce(typed<T>(fused, total), op, s.own);
    });
    collective_done();
    s.packer.copy(out, s.own);
  } else {
    m->timed->t1.record(s.own);
    device_item item = items[0];
    if (!item.out && item.in && kind != collective_kind::broadcast) {
      // the engine's caller gave too small an output: the collective runs into scratch (the other
      // ranks need this rank's part) and the engine fails that handle alone
      std::size_t result = item.count;
      if (kind == collective_kind::allgather) {
        result = 0;
        for (auto c : counts) result += c;
      }
      item.out = s.grown(s.discard, result * e);
    }
    switch (kind) {
      case collective_kind::allreduce:
        s.copy(item.out, item.in, item.count * e);
        path = std::string(name_of(gpu.choose("allreduce", item.count * e).path));
        visit_dtype(type, [&](auto zero) {
          using T = decltype(zero);
          gpu.allreduce(typed<T>(item.out, item.count), op, s.own);
        });
        break;
      case collective_kind::broadcast: {
        std::byte* data = item.out ? item.out : s.grown(s.scratch_out, item.count * e);
        if (item.in && item.in != data) s.copy(data, item.in, item.count * e);
        path = std::string(name_of(gpu.choose("broadcast", item.count * e).path));
        visit_dtype(type, [&](auto zero) {
          using T = decltype(zero);
          gpu.broadcast(typed<T>(data, item.count), root, s.own);
        });
        break;
      }
      case collective_kind::allgather: {
        // rank q contributes counts[q] elements; the result holds them back to back in rank order
        const std::size_t most = *std::max_element(counts.begin(), counts.end());
        const bool even = std::all_of(counts.begin(), counts.end(), [&](std::uint64_t c) { return c == most; });
        path = std::string(name_of(gpu.choose("allgather", most * p * e).path));
        if (even) {
          visit_dtype(type, [&](auto zero) {
            using T = decltype(zero);
            gpu.allgather(typed<T>(item.in, most), typed<T>(item.out, most * p), s.own);
          });
          break;
        }
        // uneven: every block padded to the largest, then the blocks packed back to back
        std::byte* padded_in = s.grown(s.scratch_in, most * e);
        std::byte* padded_out = s.grown(s.scratch_out, most * p * e);
        FLEXPAR_CHECK_CUDA(static_cast<int>(me), cudaMemsetAsync(padded_in, 0, most * e, s.own));
        s.copy(padded_in, item.in, counts[me] * e);
        visit_dtype(type, [&](auto zero) {
          using T = decltype(zero);
          gpu.allgather(typed<T>(const_cast<const std::byte*>(padded_in), most), typed<T>(padded_out, most * p), s.own);
        });
        std::vector<copy_region> blocks;
        std::size_t at = 0;
        for (std::size_t q = 0; q < p; ++q) {
          blocks.push_back({padded_out + q * most * e, item.out + at * e, counts[q] * e});
          at += counts[q];
        }
        s.packer.copy(blocks, s.own);
        break;
      }
      case collective_kind::reduce_scatter: {
        // blocks as equal as can be, the first count % p one longer (the engine's split)
        const std::size_t count = item.count, base = count / p, extra = count % p;
        auto block_count = [&](std::size_t q) { return base + (q < extra ? 1 : 0); };
        auto block_at = [&](std::size_t q) { return q * base + std::min(q, extra); };
        path = std::string(name_of(gpu.choose("reduce_scatter", count * e).path));
        if (extra == 0) {
          visit_dtype(type, [&](auto zero) {
            using T = decltype(zero);
            gpu.reduce_scatter(typed<T>(item.in, count), typed<T>(item.out, base), op, s.own);
          });
          break;
        }
        // uneven: every block padded to base + 1 (the padding is reduced and dropped)
        const std::size_t most = base + 1;
        std::byte* padded = s.grown(s.scratch_in, most * p * e);
        std::byte* mine = s.grown(s.scratch_out, most * e);
        FLEXPAR_CHECK_CUDA(static_cast<int>(me), cudaMemsetAsync(padded, 0, most * p * e, s.own));
        std::vector<copy_region> blocks;
        for (std::size_t q = 0; q < p; ++q)
          blocks.push_back({item.in + block_at(q) * e, padded + q * most * e, block_count(q) * e});
        s.packer.copy(blocks, s.own);
        visit_dtype(type, [&](auto zero) {
          using T = decltype(zero);
          gpu.reduce_scatter(typed<T>(const_cast<const std::byte*>(padded), most * p), typed<T>(mine, most), op, s.own);
        });
        s.copy(item.out, mine, block_count(me) * e);
        break;
      }
      case collective_kind::alltoall:
        path = std::string(name_of(gpu.choose("alltoall", item.count * e).path));
        visit_dtype(type, [&](auto zero) {
          using T = decltype(zero);
          gpu.alltoall(typed<T>(item.in, item.count), typed<T>(item.out, item.count), s.own);
        });
        break;
    }
    collective_done();
  }
  m->timed->t3.record(s.own);
  m->end.record(s.own);
  return m;
}

bool engine_backend::done(const device_marker& m) {
  const device_guard on(s_->gpu->device());
  return of(m).end.done();
}

device_phases engine_backend::phases(const device_marker& m) {
  const device_guard on(s_->gpu->device());
  marker& k = of(m);
  if (!k.timed || !k.end.done()) return {};
  const phase_events& t = *k.timed;
  return {event::elapsed_ms(t.t0, t.t1), event::elapsed_ms(t.t1, t.t2), event::elapsed_ms(t.t2, t.t3)};
}

void engine_backend::order_after(const device_marker& m, void* stream) {
  const device_guard on(s_->gpu->device());
  const auto caller = static_cast<cudaStream_t>(stream);
  marker& k = of(m);
  {
    std::lock_guard lock(s_->ordered_mutex);
    auto it = std::find_if(s_->ordered.begin(), s_->ordered.end(), [&](const auto& o) { return o.first == caller; });
    if (it != s_->ordered.end() && it->second == k.sequence) return;  // this stream already waits for it
    if (it == s_->ordered.end())
      s_->ordered.emplace_back(caller, k.sequence);
    else
      it->second = k.sequence;
  }
  stream_wait(caller, k.end);
}

void engine_backend::convert(dtype from, const void* in, dtype to, void* out, std::size_t count, double factor,
                             void* stream) {
  const device_guard on(s_->gpu->device());
  cuda::convert(from, in, to, out, count, factor, static_cast<cudaStream_t>(stream));
}

std::shared_ptr<void> engine_backend::allocate(std::size_t bytes) {
  const device_guard on(s_->gpu->device());
  auto buffer = std::make_shared<device_buffer<std::byte>>(bytes);
  return std::shared_ptr<void>(buffer, buffer->data());
}

}  // namespace flexpar::cuda
