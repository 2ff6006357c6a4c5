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
  throw usage_error(std::string(variable) + "=\"" + value + "\" is not valid: expected " + std::string(expected));
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
  if (auto v = lookup("FLEXPAR_UCX_SPIN_US"))
    c.ucx_spin = std::chrono::microseconds(
        static_cast<long long>(parse_number("FLEXPAR_UCX_SPIN_US", *v, 0, "a number of microseconds >= 0")));
  return c;
}

}  // namespace flexpar
