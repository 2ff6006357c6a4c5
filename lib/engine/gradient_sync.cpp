// lib/engine/gradient_sync.cpp — gradient_sync (flexpar/engine/gradient_sync.hpp): host parameters
// reduced and scaled on the CPU, device parameters through the engine's device backend (the scaling
// and the wire casts as device kernels on the caller's stream).
#include <flexpar/engine/gradient_sync.hpp>

#include <flexpar/core/error.hpp>

#include <algorithm>
#include <map>
#include <mutex>

namespace flexpar {

namespace {

struct parameter {
  std::string name;
  dtype type = dtype::f32;
  std::span<std::byte> value;     // host parameters
  std::span<std::byte> gradient;  // host parameters
  std::size_t count = 0;
  std::vector<std::byte> wire;  // host compression: the gradient as it travels (f16 or bf16)
  handle in_flight;
  bool submitted = false;
  // device parameters
  memory_kind memory = memory_kind::host;
  void* device_value = nullptr;
  void* device_gradient = nullptr;
  std::shared_ptr<void> device_wire;  // device compression buffer
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
  int pass = 0;  // backward passes of the current step done so far

  parameter& find(std::string_view name) {
    auto it = index.find(name);
    if (it == index.end())
      throw error_on<usage_error>(eng.rank(), "gradient_sync", '"', name, "\" is not a registered parameter");
    return parameters[it->second];
  }

  [[nodiscard]] bool compressed() const noexcept { return options.compression != wire_compression::none; }

  /// Starts `p`'s allreduce (under mutex); a device gradient after the work on `stream`.
  void submit(parameter& p, void* stream) {
    if (p.submitted) return;
    p.submitted = true;
    std::string name = "grad." + p.name;
    if (p.memory == memory_kind::cuda) {
      device_backend& device = *eng.device();
      void* travels = p.device_gradient;
      if (compressed()) {
        device.convert(dtype::f32, p.device_gradient, wire_type(options.compression), p.device_wire.get(), p.count, 1.0,
                       stream);
        travels = p.device_wire.get();
      }
      const dtype t = compressed() ? wire_type(options.compression) : p.type;
      p.in_flight = eng.submit_device(std::move(name), collective_kind::allreduce, t, reduce_op::sum, -1, travels,
                                      travels, p.count, p.count, device.capture(stream));
      return;
    }
    if (compressed()) {
      const float* g = reinterpret_cast<const float*>(p.gradient.data());
      if (options.compression == wire_compression::fp16)
        compress<half>(g, p.wire.data(), p.count);
      else
        compress<bfloat16>(g, p.wire.data(), p.count);
      p.in_flight = eng.allreduce_async(std::move(name), std::span<const std::byte>(p.wire), p.wire,
                                        wire_type(options.compression), p.count, reduce_op::sum);
    } else {
      p.in_flight = eng.allreduce_async(std::move(name), std::span<const std::byte>(p.gradient), p.gradient, p.type,
                                        p.count, reduce_op::sum);
    }
  }

  /// After `p`'s reduction: the scaling (and the decompression) of its gradient. Host: done here.
  /// Device: enqueued on `stream`, which first waits on the device for the reduction.
  void finish(parameter& p, double factor, void* stream) {
    if (p.memory == memory_kind::cuda) {
      device_backend& device = *eng.device();
      p.in_flight.order_after(stream);
      if (compressed())
        device.convert(wire_type(options.compression), p.device_wire.get(), dtype::f32, p.device_gradient, p.count,
                       factor, stream);
      else if (factor != 1.0)
        device.convert(p.type, p.device_gradient, p.type, p.device_gradient, p.count, factor, stream);
      return;
    }
    p.in_flight.wait();
    float* g = reinterpret_cast<float*>(p.gradient.data());
    if (options.compression == wire_compression::fp16)
      decompress<half>(p.wire.data(), g, p.count, factor);
    else if (options.compression == wire_compression::bf16)
      decompress<bfloat16>(p.wire.data(), g, p.count, factor);
    else if (factor != 1.0)
      scale(p.type, p.gradient.data(), p.count, factor);
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
    // Gradients never marked ready (unused parameters) are reduced too: every rank reduces the same set.
    for (parameter& p : parameters) submit(p, stream);
    lock.unlock();  // on_gradient_ready of the next step may come from other threads meanwhile
    const double ranks = static_cast<double>(eng.size());
    const double factor =
        options.reduction == gradient_reduction::average ? 1.0 / (ranks * options.backward_passes_per_step) : 1.0;
    // Every reduction is settled before an error reaches the caller: none still writes a gradient then.
    std::exception_ptr first_error;
    for (parameter& p : parameters) {
      try {
        if (first_error)
          p.in_flight.wait();
        else
          finish(p, factor, stream);
      } catch (...) {
        if (!first_error) first_error = std::current_exception();
      }
      p.submitted = false;
    }
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
                        std::size_t parameter_count, std::size_t gradient_count) {
  std::lock_guard lock(state_->mutex);
  state_->check_new(name, type, parameter_count, gradient_count);
  parameter p;
  p.name = name;
  p.type = type;
  p.value = value;
  p.gradient = gradient;
  p.count = gradient_count;
  if (state_->compressed()) p.wire.resize(gradient_count * 2);
  state_->index.emplace(name, state_->parameters.size());
  state_->parameters.push_back(std::move(p));
}

void gradient_sync::register_device_parameter(std::string name, dtype type, void* value, std::size_t parameter_count,
                                              void* gradient, std::size_t count) {
  std::lock_guard lock(state_->mutex);
  if (!state_->eng.device())
    throw error_on<usage_error>(
        state_->eng.rank(), "gradient_sync", '"', name,
        "\" is a device parameter, but the engine has no device backend (flexpar::cuda::engine_backend)");
  state_->check_new(name, type, parameter_count, count);
  parameter p;
  p.name = name;
  p.type = type;
  p.count = count;
  p.memory = memory_kind::cuda;
  p.device_value = value;
  p.device_gradient = gradient;
  if (state_->compressed()) p.device_wire = state_->eng.device()->allocate(count * 2);
  state_->index.emplace(name, state_->parameters.size());
  state_->parameters.push_back(std::move(p));
}

void gradient_sync::on_gradient_ready(std::string_view name) {
  std::lock_guard lock(state_->mutex);
  parameter& p = state_->find(name);
  if (p.memory == memory_kind::cuda)
    throw error_on<usage_error>(state_->eng.rank(), "gradient_sync", '"', p.name,
                                "\" is a device parameter: name the stream that produced its gradient "
                                "(on_gradient_ready(name, stream))");
  if (state_->pass + 1 == state_->options.backward_passes_per_step) state_->submit(p, nullptr);
}

void gradient_sync::on_gradient_ready(std::string_view name, void* stream) {
  std::lock_guard lock(state_->mutex);
  parameter& p = state_->find(name);
  if (state_->pass + 1 == state_->options.backward_passes_per_step) state_->submit(p, stream);
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
                                                    root, p.device_value, p.device_value, p.count, p.count,
                                                    stream ? state_->eng.device()->capture(stream) : nullptr));
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
