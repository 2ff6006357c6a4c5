// lib/engine/gradient_sync.cpp — gradient_sync (flexpar/engine/gradient_sync.hpp): host gradients
// reduced and scaled on the CPU, device gradients through the engine's device backend (the scaling
// and the wire casts as device kernels on the caller's stream); each reduced either as its own tensor
// (a gradient the caller owns) or as part of a bucket of the sync's arena.
#include <flexpar/engine/gradient_sync.hpp>

#include <flexpar/core/aligned_vector.hpp>
#include <flexpar/core/error.hpp>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>

namespace flexpar {

namespace {

constexpr std::size_t none = std::numeric_limits<std::size_t>::max();

struct parameter {
  std::string name;
  dtype type = dtype::f32;
  memory_kind memory = memory_kind::host;
  std::size_t count = 0;
  std::span<std::byte> value;     // host parameters
  std::span<std::byte> gradient;  // host parameters: the caller's, or the arena's once laid out
  void* device_value = nullptr;
  void* device_gradient = nullptr;  // device parameters: the caller's, or the arena's once laid out
  bool in_arena = false;
  bool laid_out = false;  // in the arena: its gradient has its place
  bool frozen = false;
  // this step
  std::size_t unit = none;  // what reduces it (nothing while frozen)
  bool ready = false;
};

/// What one allreduce reduces: a parameter's own gradient, or a bucket of the arena (its members'
/// gradients back to back).
struct unit {
  std::string name;  // the engine's tensor
  dtype type = dtype::f32;
  memory_kind memory = memory_kind::host;
  std::byte* host = nullptr;  // the gradients, `count` elements
  void* device = nullptr;
  std::size_t count = 0;
  std::vector<std::size_t> members;   // parameters
  std::vector<std::byte> wire;        // host compression: the gradients as they travel (f16 or bf16)
  std::shared_ptr<void> device_wire;  // device compression buffer
  // this step
  std::size_t ready = 0;       // members marked ready
  std::vector<void*> streams;  // device: the streams the ready members came from
  handle in_flight;
  bool submitted = false;
};

/// Where the arena's gradients live: one block per dtype and memory for the parameters laid out
/// together (host: zeroed, on a cache line; device: the backend's memory).
struct arena_block {
  std::vector<std::byte, cache_line_allocator<std::byte>> host;
  std::shared_ptr<void> device;
  std::vector<std::size_t> members;  // parameters, in their order in the block
};

/// Multiplies `count` elements of `type` at `data` by `factor` (in the accumulation type).
void scale(dtype type, std::byte* data, std::size_t count, double factor) {
  visit_dtype(type, [&](auto zero) {
    using T = decltype(zero);
    using A = accumulate_t<T>;
    T* p = reinterpret_cast<T*>(data);
    for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<T>(static_cast<A>(static_cast<A>(p[i]) * factor));
  });
}

/// The type gradients travel as under `c` (f32 when they travel as they are).
dtype wire_type(wire_compression c) {
  return c == wire_compression::fp16 ? dtype::f16 : c == wire_compression::bf16 ? dtype::bf16 : dtype::f32;
}

/// f32 `in` into the 16-bit `out` (round to nearest even), or back with `factor`: the host forms of
/// the device backend's convert().
template <class W>
void compress(const float* in, std::byte* out, std::size_t count) {
  W* w = reinterpret_cast<W*>(out);
  for (std::size_t i = 0; i < count; ++i) w[i] = W(in[i]);
}
template <class W>
void decompress(const std::byte* in, float* out, std::size_t count, double factor) {
  const W* w = reinterpret_cast<const W*>(in);
  for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<float>(static_cast<float>(w[i]) * factor);
}

}  // namespace

struct gradient_sync::state {
  state(engine& e, const gradient_sync_options& o) : eng(e), options(o) {}
  engine& eng;
  gradient_sync_options options;
  std::mutex mutex;
  std::vector<parameter> parameters;
  std::map<std::string, std::size_t, std::less<>> index;
  std::vector<arena_block> blocks;
  std::vector<unit> units;
  bool stale = true;  // registrations or freezes since the units were made
  int pass = 0;       // backward passes of the current step done so far

  parameter& find(std::string_view name) {
    auto it = index.find(name);
    if (it == index.end())
      throw error_on<usage_error>(eng.rank(), "gradient_sync", '"', name, "\" is not a registered parameter");
    return parameters[it->second];
  }

  [[nodiscard]] bool compressed() const noexcept { return options.compression != wire_compression::none; }
  /// The collective averages (reduce_op::avg: the division in its reduction, no pass of its own),
  /// where the average is over the ranks alone and nothing is decompressed after it.
  [[nodiscard]] bool averaged_by_collective() const noexcept {
    return options.reduction == gradient_reduction::average && options.backward_passes_per_step == 1 && !compressed();
  }

  /// A step has begun: a pass ended, or a gradient was marked ready.
  [[nodiscard]] bool in_step() const {
    return pass != 0 || std::any_of(units.begin(), units.end(), [](const unit& u) { return u.ready != 0; });
  }
  void between_steps(std::string_view op, std::string_view name) const {
    if (in_step())
      throw error_on<usage_error>(eng.rank(), "gradient_sync", op, " \"", name,
                                  "\" while a step is in progress: do it between steps (after synchronize() "
                                  "returned true)");
  }

  /// Gives the arena parameters registered since the last layout their place: one block per dtype and
  /// memory, the gradients in the reverse of their registration order (the order a backward pass
  /// produces them, so that the buckets that fill first lie first).
  void lay_out() {
    std::vector<std::pair<std::pair<dtype, memory_kind>, std::vector<std::size_t>>> groups;
    for (std::size_t i = parameters.size(); i-- > 0;) {
      const parameter& p = parameters[i];
      if (!p.in_arena || p.laid_out) continue;
      const auto key = std::pair(p.type, p.memory);
      auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == key; });
      if (g == groups.end()) g = groups.insert(groups.end(), {key, {}});
      g->second.push_back(i);
    }
    for (auto& [key, members] : groups) {
      const std::size_t element = size_of(key.first);
      std::size_t total = 0;
      for (std::size_t i : members) total += parameters[i].count;
      arena_block& b = blocks.emplace_back();
      b.members = members;
      if (key.second == memory_kind::cuda)
        b.device = eng.device()->allocate(total * element);
      else
        b.host.assign(total * element, std::byte{0});
      std::size_t at = 0;
      for (std::size_t i : members) {
        parameter& p = parameters[i];
        if (b.device)
          p.device_gradient = static_cast<std::byte*>(b.device.get()) + at;
        else
          p.gradient = std::span<std::byte>(b.host.data() + at, p.count * element);
        p.laid_out = true;
        at += p.count * element;
      }
    }
  }

  /// The units of the steps from now on: each parameter with a gradient of its own, and the arena's
  /// buckets (runs of neighbouring, unfrozen parameters of one block, of about bucket_bytes each).
  void make_units() {
    lay_out();
    units.clear();
    for (parameter& p : parameters) p.unit = none;
    auto begin_unit = [&](const parameter& p) -> unit& {
      unit& u = units.emplace_back();
      u.type = p.type;
      u.memory = p.memory;
      u.host = p.gradient.data();
      u.device = p.device_gradient;
      return u;
    };
    auto add_member = [&](unit& u, std::size_t i) {
      parameters[i].unit = units.size() - 1;
      u.members.push_back(i);
      u.count += parameters[i].count;
    };
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      if (parameters[i].in_arena || parameters[i].frozen) continue;
      unit& u = begin_unit(parameters[i]);
      u.name = "grad." + parameters[i].name;
      add_member(u, i);
    }
    for (const arena_block& b : blocks) {
      unit* open = nullptr;
      for (std::size_t i : b.members) {
        const parameter& p = parameters[i];
        if (p.frozen) {
          open = nullptr;  // a frozen gradient is not reduced: the bucket ends before it
          continue;
        }
        if (open && (open->count + p.count) * size_of(p.type) > options.bucket_bytes) open = nullptr;
        if (!open) open = &begin_unit(p);
        add_member(*open, i);
      }
    }
    for (unit& u : units) {
      if (u.name.empty()) {  // a bucket: named by its first and last parameter
        u.name = "grad[" + parameters[u.members.front()].name;
        if (u.members.size() > 1) u.name += ".." + parameters[u.members.back()].name;
        u.name += "]";
      }
      if (!compressed()) continue;
      if (u.memory == memory_kind::cuda)
        u.device_wire = eng.device()->allocate(u.count * 2);
      else
        u.wire.resize(u.count * 2);
    }
    stale = false;
  }

  void units_for_this_step() {
    if (stale) make_units();
  }

  [[nodiscard]] reduce_op op() const noexcept { return averaged_by_collective() ? reduce_op::avg : reduce_op::sum; }

  /// Starts `u`'s allreduce (under mutex); a device gradient after the work on `stream` and on every
  /// other stream its members came from.
  void submit(unit& u, void* stream) {
    if (u.submitted) return;
    u.submitted = true;
    if (u.memory == memory_kind::cuda) {
      device_backend& device = *eng.device();
      for (void* other : u.streams)
        if (other != stream) device.order_after(device.capture(other), stream);
      void* travels = u.device;
      if (compressed()) {
        device.convert(dtype::f32, u.device, wire_type(options.compression), u.device_wire.get(), u.count, 1.0, stream);
        travels = u.device_wire.get();
      }
      const dtype t = compressed() ? wire_type(options.compression) : u.type;
      u.in_flight = eng.submit_device(u.name, collective_kind::allreduce, t, op(), -1, travels, travels, u.count,
                                      u.count, stream);
      return;
    }
    if (compressed()) {
      const float* g = reinterpret_cast<const float*>(u.host);
      if (options.compression == wire_compression::fp16)
        compress<half>(g, u.wire.data(), u.count);
      else
        compress<bfloat16>(g, u.wire.data(), u.count);
      u.in_flight = eng.allreduce_async(u.name, std::span<const std::byte>(u.wire), u.wire,
                                        wire_type(options.compression), u.count, reduce_op::sum);
    } else {
      const std::span<std::byte> g(u.host, u.count * size_of(u.type));
      u.in_flight = eng.allreduce_async(u.name, std::span<const std::byte>(g), g, u.type, u.count, op());
    }
  }

  /// After `u`'s reduction: the scaling (and the decompression) of its gradients. Host: done here.
  /// Device: enqueued on `stream`, which first waits on the device for the reduction.
  void finish(unit& u, double factor, void* stream) {
    if (u.memory == memory_kind::cuda) {
      device_backend& device = *eng.device();
      u.in_flight.order_after(stream);
      if (compressed())
        device.convert(wire_type(options.compression), u.device_wire.get(), dtype::f32, u.device, u.count, factor,
                       stream);
      else if (factor != 1.0)
        device.convert(u.type, u.device, u.type, u.device, u.count, factor, stream);
      return;
    }
    u.in_flight.wait();
    float* g = reinterpret_cast<float*>(u.host);
    if (options.compression == wire_compression::fp16)
      decompress<half>(u.wire.data(), g, u.count, factor);
    else if (options.compression == wire_compression::bf16)
      decompress<bfloat16>(u.wire.data(), g, u.count, factor);
    else if (factor != 1.0)
      scale(u.type, u.host, u.count, factor);
  }

  /// A gradient is final for this step (under mutex): its unit starts once all its members are.
  void mark_ready(parameter& p, void* stream) {
    units_for_this_step();
    if (p.frozen || p.ready) return;
    p.ready = true;
    unit& u = units[p.unit];
    if (p.memory == memory_kind::cuda && std::find(u.streams.begin(), u.streams.end(), stream) == u.streams.end())
      u.streams.push_back(stream);
    if (++u.ready == u.members.size()) submit(u, stream);
  }

  void check_new(const std::string& name, dtype type, std::size_t parameter_count, std::size_t gradient_count) {
    if (index.contains(name))
      throw error_on<usage_error>(eng.rank(), "gradient_sync", '"', name, "\" is registered twice");
    if (parameter_count != gradient_count)
      throw error_on<usage_error>(eng.rank(), "gradient_sync", '"', name, "\" has ", parameter_count,
                                  " parameters but a gradient of ", gradient_count);
    if (compressed() && type != dtype::f32)
      throw error_on<usage_error>(eng.rank(), "gradient_sync", name_of(wire_type(options.compression)),
                                  " wire compression needs f32 gradients; \"", name, "\" is ", name_of(type));
    between_steps("registering", name);
  }

  void add_device(std::string name, dtype type, void* value, std::size_t parameter_count, void* gradient,
                  std::size_t count, bool in_arena) {
    if (!eng.device())
      throw error_on<usage_error>(
          eng.rank(), "gradient_sync", '"', name,
          "\" is a device parameter, but the engine has no device backend (flexpar::cuda::engine_backend)");
    check_new(name, type, parameter_count, count);
    parameter p;
    p.name = std::move(name);
    p.type = type;
    p.count = count;
    p.memory = memory_kind::cuda;
    p.device_value = value;
    p.device_gradient = gradient;
    p.in_arena = in_arena;
    enter(std::move(p));
  }

  void enter(parameter p) {
    index.emplace(p.name, parameters.size());
    parameters.push_back(std::move(p));
    stale = true;
  }

  /// synchronize() and synchronize(stream): the end of a backward pass.
  bool end_pass(void* stream, bool device_allowed) {
    std::unique_lock lock(mutex);
    if (!device_allowed)
      for (const parameter& p : parameters)
        if (p.memory == memory_kind::cuda)
          throw error_on<usage_error>(eng.rank(), "gradient_sync", '"', p.name,
                                      "\" is a device parameter: end the pass with synchronize(stream)");
    if (++pass < options.backward_passes_per_step) return false;
    pass = 0;
    units_for_this_step();
    // Gradients never marked ready (unused parameters) are reduced too: every rank reduces the same set.
    for (unit& u : units) submit(u, stream);
    eng.end_step();
    // the reductions are collected below without the lock; the next step's on_gradient_ready may come
    // from other threads meanwhile (it sees submitted units and does nothing until they are reset)
    std::vector<unit*> running;
    running.reserve(units.size());
    for (unit& u : units) running.push_back(&u);
    lock.unlock();
    const double ranks = static_cast<double>(eng.size());
    const double factor = options.reduction == gradient_reduction::average && !averaged_by_collective()
                              ? 1.0 / (ranks * options.backward_passes_per_step)
                              : 1.0;
    // Every reduction is settled before an error reaches the caller: none still writes a gradient then.
    std::exception_ptr first_error;
    for (unit* u : running) {
      try {
        if (first_error)
          u->in_flight.wait();
        else
          finish(*u, factor, stream);
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
    }
    lock.lock();
    for (unit& u : units) {
      u.submitted = false;
      u.ready = 0;
      u.streams.clear();
    }
    for (parameter& p : parameters) p.ready = false;
    lock.unlock();
    if (first_error) std::rethrow_exception(first_error);
    return true;
  }
};

gradient_sync::gradient_sync(engine& eng, gradient_sync_options options)
    : state_(std::make_unique<state>(eng, options)) {
  if (options.backward_passes_per_step < 1)
    throw error_on<usage_error>(eng.rank(), "gradient_sync", "backward_passes_per_step must be at least 1, got ",
                                options.backward_passes_per_step);
}

gradient_sync::~gradient_sync() = default;

const gradient_sync_options& gradient_sync::options() const noexcept { return state_->options; }

void gradient_sync::add(std::string name, dtype type, std::span<std::byte> value, std::span<std::byte> gradient,
                        std::size_t parameter_count, std::size_t gradient_count, bool in_arena) {
  std::lock_guard lock(state_->mutex);
  state_->check_new(name, type, parameter_count, gradient_count);
  parameter p;
  p.name = std::move(name);
  p.type = type;
  p.value = value;
  p.gradient = gradient;
  p.count = gradient_count;
  p.in_arena = in_arena;
  state_->enter(std::move(p));
}

void gradient_sync::register_device_parameter(std::string name, dtype type, void* value, std::size_t parameter_count,
                                              void* gradient, std::size_t count) {
  std::lock_guard lock(state_->mutex);
  state_->add_device(std::move(name), type, value, parameter_count, gradient, count, false);
}

void gradient_sync::register_device_parameter(std::string name, dtype type, void* value, std::size_t count) {
  std::lock_guard lock(state_->mutex);
  state_->add_device(std::move(name), type, value, count, nullptr, count, true);
}

std::span<std::byte> gradient_sync::arena_gradient(std::string_view name, dtype type) {
  std::lock_guard lock(state_->mutex);
  parameter& p = state_->find(name);
  if (!p.in_arena)
    throw error_on<usage_error>(state_->eng.rank(), "gradient_sync", '"', p.name,
                                "\" was registered with a gradient buffer of its own, not in the arena");
  if (p.memory == memory_kind::cuda)
    throw error_on<usage_error>(state_->eng.rank(), "gradient_sync", '"', p.name,
                                "\" is a device parameter: its gradient is flexpar::cuda::gradient's");
  if (p.type != type)
    throw error_on<usage_error>(state_->eng.rank(), "gradient_sync", '"', p.name, "\" is ", name_of(p.type),
                                ", asked for as ", name_of(type));
  if (!p.laid_out) state_->lay_out();
  return p.gradient;
}

std::span<std::byte> gradient_sync::device_gradient(std::string_view name, dtype type) {
  std::lock_guard lock(state_->mutex);
  parameter& p = state_->find(name);
  if (!p.in_arena || p.memory != memory_kind::cuda)
    throw error_on<usage_error>(state_->eng.rank(), "gradient_sync", '"', p.name,
                                "\" is not a device parameter in the arena (registered without a gradient)");
  if (p.type != type)
    throw error_on<usage_error>(state_->eng.rank(), "gradient_sync", '"', p.name, "\" is ", name_of(p.type),
                                ", asked for as ", name_of(type));
  if (!p.laid_out) state_->lay_out();
  return {static_cast<std::byte*>(p.device_gradient), p.count * size_of(p.type)};
}

void gradient_sync::freeze(std::string_view name) {
  std::lock_guard lock(state_->mutex);
  parameter& p = state_->find(name);
  state_->between_steps("freezing", name);
  if (!p.frozen) state_->stale = true;
  p.frozen = true;
}

void gradient_sync::unfreeze(std::string_view name) {
  std::lock_guard lock(state_->mutex);
  parameter& p = state_->find(name);
  state_->between_steps("unfreezing", name);
  if (p.frozen) state_->stale = true;
  p.frozen = false;
}

void gradient_sync::on_gradient_ready(std::string_view name) {
  std::lock_guard lock(state_->mutex);
  parameter& p = state_->find(name);
  if (p.memory == memory_kind::cuda)
    throw error_on<usage_error>(state_->eng.rank(), "gradient_sync", '"', p.name,
                                "\" is a device parameter: name the stream that produced its gradient "
                                "(on_gradient_ready(name, stream))");
  if (state_->pass + 1 == state_->options.backward_passes_per_step) state_->mark_ready(p, nullptr);
}

void gradient_sync::on_gradient_ready(std::string_view name, void* stream) {
  std::lock_guard lock(state_->mutex);
  parameter& p = state_->find(name);
  if (state_->pass + 1 == state_->options.backward_passes_per_step) state_->mark_ready(p, stream);
}

bool gradient_sync::synchronize() { return state_->end_pass(nullptr, false); }

bool gradient_sync::synchronize(void* stream) { return state_->end_pass(stream, true); }

void gradient_sync::broadcast_parameters(int root, void* stream) {
  std::vector<handle> handles;
  {
    std::lock_guard lock(state_->mutex);
    for (parameter& p : state_->parameters) {
      std::string name = "param." + p.name;
      if (p.memory == memory_kind::cuda)
        handles.push_back(state_->eng.submit_device(std::move(name), collective_kind::broadcast, p.type, reduce_op::sum,
                                                    root, p.device_value, p.device_value, p.count, p.count, stream));
      else
        handles.push_back(state_->eng.broadcast_async(std::move(name), p.value, p.type, p.count, root));
    }
  }
  // Every broadcast is settled before an error reaches the caller: none still writes a parameter then.
  std::exception_ptr first_error;
  for (auto& h : handles) {
    try {
      h.wait();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace flexpar
