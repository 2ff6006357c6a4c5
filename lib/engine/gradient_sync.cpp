#include <flexpar/engine/gradient_sync.hpp>

#include <algorithm>
#include <map>
#include <mutex>

namespace flexpar {

namespace {

struct parameter {
  std::string name;
  dtype type;
  std::span<std::byte> value;
  std::span<std::byte> gradient;
  std::size_t count;
  std::vector<half> wire;  // fp16 compression: the gradient as it travels
  handle in_flight;
  bool submitted = false;
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
      throw usage_error("gradient_sync: \"" + std::string(name) + "\" is not a registered parameter");
    return parameters[it->second];
  }

  /// Starts `p`'s allreduce (under mutex).
  void submit(parameter& p) {
    if (p.submitted) return;
    p.submitted = true;
    if (options.compression == wire_compression::fp16) {
      const float* g = reinterpret_cast<const float*>(p.gradient.data());
      for (std::size_t i = 0; i < p.count; ++i) p.wire[i] = half(g[i]);
      p.in_flight = eng.allreduce_async("grad." + p.name, std::span(p.wire), reduce_op::sum);
    } else {
      p.in_flight = eng.allreduce_async("grad." + p.name, std::span<const std::byte>(p.gradient), p.gradient, p.type,
                                        p.count, reduce_op::sum);
    }
  }
};

gradient_sync::gradient_sync(engine& eng, gradient_sync_options options)
    : state_(std::make_unique<state>(eng, options)) {
  if (options.backward_passes_per_step < 1)
    throw usage_error("gradient_sync: backward_passes_per_step must be at least 1, got " +
                      std::to_string(options.backward_passes_per_step));
}

gradient_sync::~gradient_sync() = default;

const gradient_sync_options& gradient_sync::options() const noexcept { return state_->options; }

void gradient_sync::add(std::string name, dtype type, std::span<std::byte> value, std::span<std::byte> gradient,
                        std::size_t parameter_count, std::size_t gradient_count) {
  std::lock_guard lock(state_->mutex);
  if (state_->index.contains(name)) throw usage_error("gradient_sync: \"" + name + "\" is registered twice");
  if (parameter_count != gradient_count)
    throw usage_error("gradient_sync: \"" + name + "\" has " + std::to_string(parameter_count) +
                      " parameters but a gradient of " + std::to_string(gradient_count));
  if (state_->options.compression == wire_compression::fp16 && type != dtype::f32)
    throw usage_error("gradient_sync: fp16 wire compression needs f32 gradients; \"" + name + "\" is " +
                      std::string(name_of(type)));
  parameter p{name, type, value, gradient, gradient_count, {}, {}, false};
  if (state_->options.compression == wire_compression::fp16) p.wire.resize(gradient_count);
  state_->index.emplace(name, state_->parameters.size());
  state_->parameters.push_back(std::move(p));
}

void gradient_sync::on_gradient_ready(std::string_view name) {
  std::lock_guard lock(state_->mutex);
  parameter& p = state_->find(name);
  if (state_->pass + 1 == state_->options.backward_passes_per_step) state_->submit(p);
}

bool gradient_sync::synchronize() {
  std::unique_lock lock(state_->mutex);
  if (++state_->pass < state_->options.backward_passes_per_step) return false;
  state_->pass = 0;
  // Gradients never marked ready (unused parameters) are reduced too: every rank reduces the same set.
  for (parameter& p : state_->parameters) state_->submit(p);
  lock.unlock();  // on_gradient_ready of the next step may come from other threads meanwhile
  const double ranks = static_cast<double>(state_->eng.size());
  const double factor = state_->options.reduction == gradient_reduction::average
                            ? 1.0 / (ranks * state_->options.backward_passes_per_step)
                            : 1.0;
  std::exception_ptr first_error;
  for (parameter& p : state_->parameters) {
    try {
      p.in_flight.wait();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
    p.submitted = false;
    if (first_error) continue;
    if (state_->options.compression == wire_compression::fp16) {
      float* g = reinterpret_cast<float*>(p.gradient.data());
      for (std::size_t i = 0; i < p.count; ++i) g[i] = static_cast<float>(static_cast<float>(p.wire[i]) * factor);
    } else if (factor != 1.0) {
      scale(p.type, p.gradient.data(), p.count, factor);
    }
  }
  if (first_error) std::rethrow_exception(first_error);
  return true;
}

void gradient_sync::broadcast_parameters(int root) {
  std::vector<handle> handles;
  {
    std::lock_guard lock(state_->mutex);
    for (parameter& p : state_->parameters)
      handles.push_back(state_->eng.broadcast_async("param." + p.name, p.value, p.type, p.count, root));
  }
  // Every handle is waited for before an error leaves: the parameters stay in use until then.
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
