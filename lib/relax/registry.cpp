// lib/relax/registry.cpp — relax::make: every relaxation by name (include/flexpar/relax/registry.hpp).
#include <flexpar/relax/registry.hpp>

#include <array>
#include <string>

#include <flexpar/relax/async_model_average.hpp>
#include <flexpar/relax/bytegrad.hpp>
#include <flexpar/relax/decentralized.hpp>
#include <flexpar/relax/gradient_allreduce.hpp>
#include <flexpar/relax/local_sgd.hpp>
#include <flexpar/relax/low_precision_decentralized.hpp>
#include <flexpar/relax/onebit_adam.hpp>
#include <flexpar/relax/qadam.hpp>

namespace flexpar::relax {

namespace {
constexpr std::array<std::string_view, 8> names{"gradient_allreduce",          "bytegrad",    "decentralized",
                                                "low_precision_decentralized", "onebit_adam", "qadam",
                                                "async_model_average",         "local_sgd"};
}  // namespace

std::span<const std::string_view> algorithm_names() noexcept { return names; }

std::unique_ptr<relaxation> make(std::string_view name, communicator& comm, const options& o) {
  if (name == "gradient_allreduce") return std::make_unique<gradient_allreduce>(comm, o.hierarchical);
  if (name == "bytegrad") return std::make_unique<bytegrad>(comm, o.chunk);
  if (name == "decentralized") return std::make_unique<decentralized>(comm, peer_selection_of(o.peers), o.interval);
  if (name == "local_sgd") return std::make_unique<local_sgd>(comm, o.interval);
  if (name == "low_precision_decentralized")
    return std::make_unique<low_precision_decentralized>(comm, o.interval, o.chunk);
  if (name == "onebit_adam") return std::make_unique<onebit_adam>(comm, o.warmup_steps, o.adam, o.onebit_chunk);
  if (name == "qadam") return std::make_unique<qadam>(comm, o.warmup_steps, o.adam, o.chunk);
  if (name == "async_model_average") return std::make_unique<async_model_average>(comm, o.period_ms);
  std::string text = error_text(comm.rank(), "relax::make", "unknown algorithm '", name, "'; known:");
  for (std::string_view n : names) text.append(" ").append(n);
  throw usage_error(text);
}

}  // namespace flexpar::relax
