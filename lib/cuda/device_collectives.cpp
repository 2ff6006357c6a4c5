// lib/cuda/device_collectives.cpp — flexpar/cuda/collective.hpp: device collectives, NCCL or staged through pinned host
// memory.
#include <flexpar/cuda/collective.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/cuda/kernels.hpp>
#include <flexpar/version.hpp>
#if FLEXPAR_HAVE_NCCL
#include <flexpar/cuda/nccl.hpp>
#endif

namespace flexpar::cuda {

bool transport_reads_device_memory(const communicator& host) {
  if (host.transport().kind() != transport_kind::mpi) return false;
#if defined(MPIX_GPU_SUPPORT_CUDA)
  int supported = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) != MPI_SUCCESS) return false;
  return supported != 0;
#else
  return false;
#endif
}

struct device_communicator::state {
  communicator* host = nullptr;
  int device = 0;
  device_options options;
#if FLEXPAR_HAVE_NCCL
  std::optional<nccl_communicator> nccl;
#endif
  flexpar::cuda::stream own;
  event ordered{false};
  event done{false};
  std::vector<event> chunk_ready;  // D2H of a chunk has landed
  pinned_buffer<std::byte> staging;
  device_buffer<std::byte> ring_scratch;  // the block the ring receives before reducing it

  std::string prefix(std::string_view op) const {
    std::string text = "[rank " + std::to_string(host->rank()) + "] device ";
    text += op;
    text += ": ";
    return text;
  }
  std::byte* staging_of(std::size_t bytes) {
    if (staging.size() < bytes) staging = pinned_buffer<std::byte>(std::max(bytes, staging.size() * 2));
    return staging.data();
  }
  void wait_for(const event& e, std::string_view what) {
    wait(e, std::chrono::duration_cast<std::chrono::milliseconds>(host->settings().timeout), what, host->rank());
  }
};

device_communicator::device_communicator(communicator& host, int device, device_options options) {
  const device_guard on(device);
  auto s = std::make_unique<state>();
  s->host = &host;
  s->device = device;
  s->options = options;
  s->chunk_ready.emplace_back(false);
  s->chunk_ready.emplace_back(false);
#if FLEXPAR_HAVE_NCCL
  if (options.use_nccl) s->nccl.emplace(host, device);
#endif
  s_ = std::move(s);
}

device_communicator::~device_communicator() = default;
device_communicator::device_communicator(device_communicator&&) noexcept = default;
device_communicator& device_communicator::operator=(device_communicator&&) noexcept = default;

int device_communicator::rank() const noexcept { return s_->host->rank(); }
int device_communicator::size() const noexcept { return s_->host->size(); }
int device_communicator::device() const noexcept { return s_->device; }
bool device_communicator::has_nccl() const noexcept {
#if FLEXPAR_HAVE_NCCL
  return s_->nccl.has_value();
#else
  return false;
#endif
}
nccl_communicator* device_communicator::nccl() noexcept {
#if FLEXPAR_HAVE_NCCL
  return s_->nccl ? &*s_->nccl : nullptr;
#else
  return nullptr;
#endif
}

void device_communicator::check_sizes(std::string_view op, std::size_t have, std::size_t need) const {
  if (have == need) return;
  throw usage_error(s_->prefix(op) + "the buffers do not match: " + std::to_string(have) + " elements where " +
                    std::to_string(need) + " are needed");
}

device_communicator::choice device_communicator::choose(std::string_view op, std::size_t bytes) {
  const int p = size();
  const double b = static_cast<double>(bytes);
  const cost_params& host_machine = machine_of(*s_->host);
  const cost_params& link = s_->options.device_link;
  double nccl_cost = 0;
  double copies = 0;  // bytes through PCIe on this rank
  double host_cost = 0;
  if (op == "allreduce") {
    nccl_cost = allreduce_ring_cost(p, b).seconds(link);
    copies = 2 * b;
    host_cost = allreduce_ring_cost(p, b).seconds(host_machine);
  } else if (op == "allgather") {  // bytes: the whole output
    nccl_cost = allgather_ring_cost(p, b).seconds(link);
    copies = b / p + b;
    host_cost = allgather_ring_cost(p, b).seconds(host_machine);
  } else if (op == "reduce_scatter") {  // bytes: the whole input
    nccl_cost = reduce_scatter_ring_cost(p, b).seconds(link);
    copies = b + b / p;
    host_cost = reduce_scatter_ring_cost(p, b).seconds(host_machine);
  } else if (op == "broadcast") {
    nccl_cost = broadcast_chain_cost(p, b).seconds(link);
    copies = b;
    host_cost = broadcast_chain_cost(p, b).seconds(host_machine);
  } else {
    throw usage_error(s_->prefix(op) + "is not one of allreduce, allgather, reduce_scatter, broadcast");
  }
  const double inf = std::numeric_limits<double>::infinity();
  choice c{device_path::staged, inf, inf, copies * s_->options.pcie_beta + host_cost};
  if (has_nccl()) {
    c.nccl_seconds = nccl_cost;
    if (op == "allreduce" && p > 1) {
      // the same ring on the same link, plus a launch and a pass of the reduction kernel per step
      const double steps = 2.0 * (p - 1);
      c.ring_seconds =
          nccl_cost + steps * s_->options.kernel_alpha + 3.0 * (p - 1) * (b / p) * s_->options.device_gamma;
    }
    if (c.ring_seconds < c.nccl_seconds && c.ring_seconds < c.staged_seconds)
      c.path = device_path::ring;
    else if (c.nccl_seconds <= c.staged_seconds)
      c.path = device_path::nccl;
  }
  return c;
}

namespace {

// The staged scripts. Each starts after the caller's work (`ordered`) and ends with the caller's
// stream waiting on `done`; the host collective in the middle runs on the host communicator.

template <class T>
void staged_allreduce(auto& s, T* data, std::size_t count, reduce_op op) {
  const std::size_t chunk = std::max<std::size_t>(1, s.options.staging_chunk_bytes / sizeof(T));
  const std::size_t chunks = (count + chunk - 1) / chunk;
  T* host = reinterpret_cast<T*>(s.staging_of(count * sizeof(T)));
  auto d2h = [&](std::size_t c) {
    const std::size_t begin = c * chunk, n = std::min(chunk, count - begin);
    detail::copy_bytes_async(host + begin, data + begin, n * sizeof(T), cudaMemcpyDeviceToHost, s.own);
    s.chunk_ready[c % 2].record(s.own);
  };
  // Pipeline: while the host reduces chunk c, the copy engine brings chunk c + 1 (stream order:
  // D2H 0, D2H 1, H2D 0, D2H 2, H2D 1, ...).
  if (chunks > 0) d2h(0);
  for (std::size_t c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) d2h(c + 1);
    s.wait_for(s.chunk_ready[c % 2], "staged allreduce: copy of a chunk to the host");
    const std::size_t begin = c * chunk, n = std::min(chunk, count - begin);
    flexpar::allreduce(*s.host, std::span<T>(host + begin, n), op);
    detail::copy_bytes_async(data + begin, host + begin, n * sizeof(T), cudaMemcpyHostToDevice, s.own);
  }
}

#if FLEXPAR_HAVE_NCCL
// flexpar's ring allreduce over NCCL point-to-point, everything on the NCCL communicator's stream:
//   reduce-scatter  p-1 steps: send block (me - k) to the right, receive block (me - k - 1) from the
//                   left into scratch (one group), then reduce_into(block, scratch)
//   allgather       p-1 steps: send block (me + 1 - k) to the right, receive block (me - k) from the
//                   left straight into place
//   avg             one scale_for_average at the end
// Blocks are the balanced split of `count` (uneven sizes allowed).
void ring_allreduce(auto& s, nccl_communicator& nccl, dtype t, std::byte* data, std::size_t count, reduce_op op) {
  const int p = nccl.size(), me = nccl.rank();
  if (p == 1 || count == 0) return;
  const std::size_t element = size_of(t);
  const block_layout blocks = block_layout::even(count, p);
  if (s.ring_scratch.size() < blocks.max_count() * element)
    s.ring_scratch = device_buffer<std::byte>(blocks.max_count() * element);
  const cudaStream_t own = nccl.stream();
  const int right = (me + 1) % p, left = (me + p - 1) % p;
  auto block = [&](int b) {
    const int k = ((b % p) + p) % p;
    return device_span<std::byte>(data + blocks.displ(k) * element, blocks.count(k) * element);
  };
  auto count_of = [&](int b) { return blocks.count(((b % p) + p) % p); };
  for (int k = 0; k < p - 1; ++k) {
    const device_span<std::byte> out = block(me - k), in = block(me - k - 1);
    {
      auto g = nccl.group();
      nccl.send(device_span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(out.data()), out.size()), right,
                own);
      nccl.recv(device_span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(s.ring_scratch.data()), in.size()), left,
                own);
    }
    reduce_into(t, in.data(), s.ring_scratch.data(), count_of(me - k - 1), op == reduce_op::avg ? reduce_op::sum : op,
                own);
  }
  for (int k = 0; k < p - 1; ++k) {
    const device_span<std::byte> out = block(me + 1 - k), in = block(me - k);
    auto g = nccl.group();
    nccl.send(device_span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(out.data()), out.size()), right,
              own);
    nccl.recv(device_span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(in.data()), in.size()), left, own);
  }
  if (op == reduce_op::avg) {
    visit_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      scale_for_average(device_span<T>(reinterpret_cast<T*>(data), count), p, own);
    });
  }
}
#endif
}  // namespace

void device_communicator::run(std::string_view op, void* data, const void* send, std::size_t count, dtype t,
                              reduce_op rop, int root, cudaStream_t caller, device_path path) {
  state& s = *s_;
  const device_guard on(s.device);
  const std::size_t element = size_of(t);
  const auto p = static_cast<std::size_t>(size());
  if (op == "broadcast" && (root < 0 || root >= size()))
    throw usage_error(s.prefix(op) + "root " + std::to_string(root) + " is outside the communicator of " +
                      std::to_string(size()) + " ranks");
  std::size_t bytes = count * element;  // what choose() is asked about: the whole buffer
  if (op == "allgather" || op == "reduce_scatter") bytes *= p;
  if (path == device_path::automatic) path = choose(op, bytes).path;
  if ((path == device_path::nccl || path == device_path::ring) && !has_nccl())
    throw usage_error(s.prefix(op) + "device_path::" + std::string(name_of(path)) +
                      " was asked for, but this communicator has no NCCL (" +
                      (built_with_nccl ? "device_options::use_nccl is false" : "flexpar was built without NCCL") + ")");
  if (path == device_path::ring && op != "allreduce")
    throw usage_error(s.prefix(op) + "device_path::ring is an allreduce; use nccl, staged or automatic");

#if FLEXPAR_HAVE_NCCL
  if (path == device_path::ring) {
    nccl_communicator& n = *s.nccl;
    s.ordered.record(caller);
    stream_wait(n.stream(), s.ordered);
    ring_allreduce(s, n, t, static_cast<std::byte*>(data), count, rop);
    s.done.record(n.stream());
    stream_wait(caller, s.done);
    return;
  }
  if (path == device_path::nccl) {
    visit_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      auto* d = static_cast<T*>(data);
      const auto* in = static_cast<const T*>(send);
      if (op == "allreduce") {
        s.nccl->allreduce(device_span<T>(d, count), rop, caller);
      } else if (op == "allgather") {
        s.nccl->allgather(device_span<const T>(in, count), device_span<T>(d, count * p), caller);
      } else if (op == "reduce_scatter") {
        s.nccl->reduce_scatter(device_span<const T>(in, count * p), device_span<T>(d, count), rop, caller);
      } else {
        s.nccl->broadcast(device_span<T>(d, count), root, caller);
      }
    });
    return;
  }
#endif

  // Staged: after the caller's work, on our stream.
  s.ordered.record(caller);
  stream_wait(s.own, s.ordered);
  const int me = rank();
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    auto* d = static_cast<T*>(data);
    const auto* in = static_cast<const T*>(send);
    if (op == "allreduce") {
      staged_allreduce<T>(s, d, count, rop);
    } else if (op == "allgather") {
      T* host = reinterpret_cast<T*>(s.staging_of(count * p * sizeof(T)));
      detail::copy_bytes_async(host + count * static_cast<std::size_t>(me), in, count * sizeof(T),
                               cudaMemcpyDeviceToHost, s.own);
      s.done.record(s.own);
      s.wait_for(s.done, "staged allgather: copy to the host");
      flexpar::allgather(*s.host, std::span<T>(host, count * p));
      detail::copy_bytes_async(d, host, count * p * sizeof(T), cudaMemcpyHostToDevice, s.own);
    } else if (op == "reduce_scatter") {
      T* host = reinterpret_cast<T*>(s.staging_of(count * p * sizeof(T)));
      detail::copy_bytes_async(host, in, count * p * sizeof(T), cudaMemcpyDeviceToHost, s.own);
      s.done.record(s.own);
      s.wait_for(s.done, "staged reduce_scatter: copy to the host");
      std::span<T> mine = flexpar::reduce_scatter(*s.host, std::span<T>(host, count * p), rop);
      detail::copy_bytes_async(d, mine.data(), count * sizeof(T), cudaMemcpyHostToDevice, s.own);
    } else {
      T* host = reinterpret_cast<T*>(s.staging_of(count * sizeof(T)));
      if (me == root) {
        detail::copy_bytes_async(host, d, count * sizeof(T), cudaMemcpyDeviceToHost, s.own);
        s.done.record(s.own);
        s.wait_for(s.done, "staged broadcast: copy to the host");
      }
      flexpar::broadcast(*s.host, std::span<T>(host, count), root);
      if (me != root) detail::copy_bytes_async(d, host, count * sizeof(T), cudaMemcpyHostToDevice, s.own);
    }
  });
  s.done.record(s.own);
  stream_wait(caller, s.done);
  // The staging buffer is reused by the next call: its H2D copies must have read it by then. The
  // next call's first copy is ordered after them on our stream, and a growth reallocates only after
  // this wait.
  s.wait_for(s.done, "staged " + std::string(op) + ": copy back to the device");
}

void device_communicator::synchronize(cudaStream_t caller, std::string_view what) {
#if FLEXPAR_HAVE_NCCL
  if (s_->nccl) {
    s_->nccl->synchronize(caller, what);
    return;
  }
#endif
  cuda::synchronize(caller, std::chrono::duration_cast<std::chrono::milliseconds>(s_->host->settings().timeout), what,
                    rank());
}

}  // namespace flexpar::cuda
