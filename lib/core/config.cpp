// lib/core/config.cpp — reading the FLEXPAR_* environment into a config (flexpar/core/config.hpp),
// with errors that name the variable and what it expects.

#include <flexpar/core/config.hpp>
#include <flexpar/core/error.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace flexpar {

std::string_view name_of(transport_kind kind) noexcept {
  switch (kind) {
    case transport_kind::mpi: return "mpi";
    case transport_kind::ucx: return "ucx";
    case transport_kind::inproc: return "inproc";
  }
  return "?";
}

namespace {

[[noreturn]] void bad_value(std::string_view variable, const std::string& value, std::string_view expected) {
  throw error_on<usage_error>(no_rank, "", variable, "=\"", value, "\" is not valid: expected ", expected);
}

double parse_number(std::string_view variable, const std::string& value, double min, std::string_view expected) {
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || errno != 0 || !std::isfinite(x) || x < min)
    bad_value(variable, value, expected);
  return x;
}

}  // namespace

std::optional<std::string> config::environment_lookup(std::string_view name) {
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

config config::from_environment(const std::function<std::optional<std::string>(std::string_view)>& lookup) {
  config c;
  if (auto v = lookup("FLEXPAR_TIMEOUT"))
    c.timeout = std::chrono::milliseconds(static_cast<long long>(
        std::llround(1000.0 * parse_number("FLEXPAR_TIMEOUT", *v, 0.001, "a number of seconds >= 0.001"))));
  if (auto v = lookup("FLEXPAR_TRANSPORT")) {
    if (*v == "mpi")
      c.transport = transport_kind::mpi;
    else if (*v == "ucx")
      c.transport = transport_kind::ucx;
    else
      bad_value("FLEXPAR_TRANSPORT", *v, "\"mpi\" or \"ucx\"");
  }
  if (auto v = lookup("FLEXPAR_RANKS_PER_NODE")) {
    const double x = parse_number("FLEXPAR_RANKS_PER_NODE", *v, 0, "a whole number >= 0");
    if (x != std::floor(x) || x > 1 << 24) bad_value("FLEXPAR_RANKS_PER_NODE", *v, "a whole number >= 0");
    c.ranks_per_node = static_cast<int>(x);
  }
  if (auto v = lookup("FLEXPAR_SPIN_US"))
    c.spin = std::chrono::microseconds(
        static_cast<long long>(parse_number("FLEXPAR_SPIN_US", *v, 0, "a number of microseconds >= 0")));

  if (auto v = lookup("FLEXPAR_HEARTBEAT_MS"))
    c.heartbeat_interval = std::chrono::milliseconds(static_cast<long long>(
        std::llround(parse_number("FLEXPAR_HEARTBEAT_MS", *v, 0, "a number of milliseconds >= 0"))));
  if (auto v = lookup("FLEXPAR_BLAS_THREADS")) {
    const double x = parse_number("FLEXPAR_BLAS_THREADS", *v, -1, "-1, 0 (auto) or a number of threads");
    if (x != std::floor(x) || x > 1 << 16) bad_value("FLEXPAR_BLAS_THREADS", *v, "-1, 0 (auto) or a number of threads");
    c.blas_threads = static_cast<int>(x);
  }
  if (auto v = lookup("FLEXPAR_HEARTBEAT_MISSES")) {
    const double x = parse_number("FLEXPAR_HEARTBEAT_MISSES", *v, 1, "a whole number >= 1");
    if (x != std::floor(x) || x > 1 << 20) bad_value("FLEXPAR_HEARTBEAT_MISSES", *v, "a whole number >= 1");
    c.heartbeat_misses = static_cast<int>(x);
  }

  const auto seconds = [&](std::string_view name, double min) {
    auto v = lookup(name);
    return v ? std::optional<double>(
                   parse_number(name, *v, min, min > 0 ? "a number of seconds > 0" : "a number of seconds >= 0"))
             : std::nullopt;
  };
  const auto whole = [&](std::string_view name) -> std::optional<std::size_t> {
    auto v = lookup(name);
    if (!v) return std::nullopt;
    const double x = parse_number(name, *v, 0, "a whole number >= 0");
    if (x != std::floor(x) || x > 9.0e18) bad_value(name, *v, "a whole number >= 0");
    return static_cast<std::size_t>(x);
  };
  const auto millis = [](double s) {
    return std::chrono::milliseconds(static_cast<long long>(std::llround(1000.0 * s)));
  };
  if (auto v = whole("FLEXPAR_STREAMING_MIN_BYTES")) c.streaming_min_bytes = *v;
  if (auto v = whole("FLEXPAR_SOURCE_IN_MEMORY_MIN_BYTES")) c.source_in_memory_min_bytes = *v;
  if (auto v = whole("FLEXPAR_FUSION_THRESHOLD")) c.fusion_threshold = *v;
  if (auto v = lookup("FLEXPAR_CYCLE_TIME_MS"))
    c.cycle_time = std::chrono::microseconds(static_cast<long long>(
        std::llround(1000.0 * parse_number("FLEXPAR_CYCLE_TIME_MS", *v, 0, "a number of milliseconds >= 0"))));
  if (auto v = whole("FLEXPAR_CACHE_CAPACITY")) c.cache_capacity = *v;
  if (auto v = seconds("FLEXPAR_STALL_WARNING_S", 0.001)) c.stall_warning = millis(*v);
  if (auto v = seconds("FLEXPAR_STALL_SHUTDOWN_S", 0)) c.stall_shutdown = millis(*v);
  if (auto v = lookup("FLEXPAR_STEP_PLAN")) {
    if (*v != "0" && *v != "1") bad_value("FLEXPAR_STEP_PLAN", *v, "0 or 1");
    c.step_plan = *v == "1";
  }
  if (auto v = lookup("FLEXPAR_PLAN_PATIENCE_MS"))
    c.plan_patience = std::chrono::microseconds(static_cast<long long>(
        std::llround(1000.0 * parse_number("FLEXPAR_PLAN_PATIENCE_MS", *v, 0, "a number of milliseconds >= 0"))));
  if (auto v = lookup("FLEXPAR_TIMELINE")) c.timeline_path = *v;
  if (auto v = lookup("FLEXPAR_TIMELINE_MARK_CYCLES")) {
    if (*v != "0" && *v != "1") bad_value("FLEXPAR_TIMELINE_MARK_CYCLES", *v, "0 or 1");
    c.timeline_mark_cycles = *v == "1";
  }
  return c;
}

}  // namespace flexpar
