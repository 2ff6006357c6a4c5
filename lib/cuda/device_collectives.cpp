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

#include "ipc_group.hpp"
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
  device_buffer<std::byte> ring_scratch;   // the block the ring receives before reducing it
  std::unique_ptr<detail::ipc_group> ipc;  // the intra-node path, when every rank is on one node

  std::string prefix(std::string_view op) const { return on_rank(host->rank(), std::string("device ").append(op)); }
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
  if (options.use_ipc && host.size() > 1) s->ipc = detail::ipc_group::create(host, device, options);
  s_ = std::move(s);
}

device_communicator::~device_communicator() = default;
device_communicator::device_communicator(device_communicator&&) noexcept = default;
device_communicator& device_communicator::operator=(device_communicator&&) noexcept = default;

int device_communicator::rank() const noexcept { return s_->host->rank(); }
int device_communicator::size() const noexcept { return s_->host->size(); }
int device_communicator::device() const noexcept { return s_->device; }
communicator& device_communicator::host() const noexcept { return *s_->host; }
bool device_communicator::has_nccl() const noexcept {
#if FLEXPAR_HAVE_NCCL
  return s_->nccl.has_value();
#else
  return false;
#endif
}
bool device_communicator::has_ipc() const noexcept { return s_->ipc != nullptr; }
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

void device_communicator::check_blocks(std::string_view op, std::size_t elements) const {
  if (elements % static_cast<std::size_t>(size()) == 0) return;
  throw usage_error(s_->prefix(op) + std::to_string(elements) + " elements do not split into " +
                    std::to_string(size()) + " equal blocks");
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
  } else if (op == "alltoall") {  // bytes: the whole input
    nccl_cost = alltoall_pairwise_cost(p, b).seconds(link);
    copies = 2 * b;
    host_cost = alltoall_pairwise_cost(p, b).seconds(host_machine);
  } else {
    throw usage_error(s_->prefix(op) + "is not one of allreduce, allgather, reduce_scatter, broadcast, alltoall");
  }
  const double inf = std::numeric_limits<double>::infinity();
  choice c{device_path::staged, inf, inf, copies * s_->options.pcie_beta + host_cost, inf};
  if (s_->ipc) c.ipc_seconds = s_->ipc->cost(op, b);
  if (has_nccl()) {
    c.nccl_seconds = nccl_cost;
    if (op == "allreduce" && p > 1) {
      // the same ring on the same link, plus a launch and a pass of the reduction kernel per step
      const double steps = 2.0 * (p - 1);
      c.ring_seconds =
          nccl_cost + steps * s_->options.kernel_alpha + 3.0 * (p - 1) * (b / p) * s_->options.device_gamma;
    }
  }
  // the cheapest; ties go to the earlier path in this order
  const std::pair<double, device_path> ranked[] = {{c.nccl_seconds, device_path::nccl},
                                                   {c.ipc_seconds, device_path::ipc},
                                                   {c.ring_seconds, device_path::ring},
                                                   {c.staged_seconds, device_path::staged}};
  double best = inf;
  for (const auto& [seconds, path] : ranked)
    if (seconds < best) best = seconds, c.path = path;
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

// alltoall as grouped point-to-point on NCCL's stream: my own block by a device copy, then in one
// group a send of block q to rank q and a receive of block q from rank q for every other rank.
// Out of place only (a block sent may be overwritten by one received): an in-place call goes
// through a scratch copy of the input.
template <class T>
void nccl_alltoall(auto& s, nccl_communicator& nccl, const T* in, T* out, std::size_t count, cudaStream_t caller) {
  const int p = nccl.size(), me = nccl.rank();
  const cudaStream_t own = nccl.stream();
  s.ordered.record(caller);
  stream_wait(own, s.ordered);
  const std::size_t bytes = count * static_cast<std::size_t>(p) * sizeof(T);
  if (in == out && p > 1) {
    if (s.ring_scratch.size() < bytes) s.ring_scratch = device_buffer<std::byte>(bytes);
    detail::copy_bytes_async(s.ring_scratch.data(), in, bytes, cudaMemcpyDeviceToDevice, own);
    in = reinterpret_cast<const T*>(s.ring_scratch.data());
  }
  const auto block = [&](int q) { return static_cast<std::size_t>(q) * count; };
  detail::copy_bytes_async(out + block(me), in + block(me), count * sizeof(T), cudaMemcpyDeviceToDevice, own);
  if (p > 1 && count > 0) {
    auto g = nccl.group();
    for (int q = 0; q < p; ++q) {
      if (q == me) continue;
      nccl.send(device_span<const T>(in + block(q), count), q, own);
      nccl.recv(device_span<T>(out + block(q), count), q, own);
    }
  }
  s.done.record(own);
  stream_wait(caller, s.done);
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
  if (caller != nullptr) {  // the legacy default stream belongs to whichever device is current
    int stream_device = -1;
    FLEXPAR_CHECK_CUDA(rank(), cudaStreamGetDevice(caller, &stream_device));
    if (stream_device != s.device)
      throw usage_error(s.prefix(op) + "the caller's stream belongs to GPU " + std::to_string(stream_device) +
                        ", this communicator's is GPU " + std::to_string(s.device) + " (" + std::to_string(count) +
                        " elements of " + std::string(name_of(t)) + "); make the stream on the communicator's device");
  }
  std::size_t bytes = count * element;  // what choose() is asked about: the whole buffer
  if (op == "allgather" || op == "reduce_scatter" || op == "alltoall") bytes *= p;
  if (path == device_path::automatic) path = choose(op, bytes).path;
  if ((path == device_path::nccl || path == device_path::ring) && !has_nccl())
    throw usage_error(s.prefix(op) + "device_path::" + std::string(name_of(path)) +
                      " was asked for, but this communicator has no NCCL (" +
                      (built_with_nccl ? "device_options::use_nccl is false" : "flexpar was built without NCCL") + ")");
  if (path == device_path::ring && op != "allreduce")
    throw usage_error(s.prefix(op) + "device_path::ring is an allreduce; use nccl, staged, ipc or automatic");
  if (path == device_path::ipc && !s.ipc)
    throw usage_error(s.prefix(op) + "device_path::ipc was asked for, but this communicator has no ipc path (" +
                      (!s.options.use_ipc                     ? "device_options::use_ipc is false"
                       : size() == 1                          ? "one rank needs none"
                       : s.host->topology().node_count() != 1 ? "its ranks span several nodes"
                                                              : "a rank could not map its peers' memory") +
                      ")");

  if (path == device_path::ipc) {
    detail::ipc_group& g = *s.ipc;
    if (op == "allreduce")
      g.allreduce(t, data, count, rop, caller);
    else if (op == "allgather")
      g.allgather(t, send, data, count, caller);
    else if (op == "reduce_scatter")
      g.reduce_scatter(t, send, data, count, rop, caller);
    else if (op == "alltoall")
      g.alltoall(t, send, data, count, caller);
    else
      g.broadcast(t, data, count, root, caller);
    return;
  }

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
      } else if (op == "alltoall") {
        nccl_alltoall(s, *s.nccl, in, d, count, caller);
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
    } else if (op == "alltoall") {
      T* host = reinterpret_cast<T*>(s.staging_of(2 * count * p * sizeof(T)));
      detail::copy_bytes_async(host, in, count * p * sizeof(T), cudaMemcpyDeviceToHost, s.own);
      s.done.record(s.own);
      s.wait_for(s.done, "staged alltoall: copy to the host");
      flexpar::alltoall(*s.host, std::span<const T>(host, count * p), std::span<T>(host + count * p, count * p));
      detail::copy_bytes_async(d, host + count * p, count * p * sizeof(T), cudaMemcpyHostToDevice, s.own);
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
