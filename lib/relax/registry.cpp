// lib/relax/registry.cpp — relax::make: every relaxation by name (include/flexpar/relax/registry.hpp).
#include <flexpar/relax/registry.hpp>

#include <array>
#include <string>

#include <flexpar/collective/algorithm.hpp>
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
// relax::make's names: the relaxations of the one naming (collective/algorithm.hpp), in its order.
constexpr std::array<std::string_view, relaxations.size()> names = [] {
  std::array<std::string_view, relaxations.size()> out{};
  for (std::size_t i = 0; i < relaxations.size(); ++i) out[i] = name_of(relaxations[i]);
  return out;
}();
}  // namespace

std::span<const std::string_view> algorithm_names() noexcept { return names; }

std::unique_ptr<relaxation> make(std::string_view name, communicator& comm, const options& o) {
  switch (algorithm_from(name).value_or(algorithm::none)) {
    case algorithm::gradient_allreduce: return std::make_unique<gradient_allreduce>(comm, o.hierarchical);
    case algorithm::bytegrad: return std::make_unique<bytegrad>(comm, o.chunk);
    case algorithm::decentralized: return std::make_unique<decentralized>(comm, peer_selection_of(o.peers), o.interval);
    case algorithm::local_sgd: return std::make_unique<local_sgd>(comm, o.interval);
    case algorithm::low_precision_decentralized:
      return std::make_unique<low_precision_decentralized>(comm, o.interval, o.chunk);
    case algorithm::onebit_adam: return std::make_unique<onebit_adam>(comm, o.warmup_steps, o.adam, o.onebit_chunk);
    case algorithm::qadam: return std::make_unique<qadam>(comm, o.warmup_steps, o.adam, o.chunk);
    case algorithm::async_model_average: return std::make_unique<async_model_average>(comm, o.period_ms);
    default: break;  // a collective's algorithm, `none` or an unknown name
  }
  std::string text = error_text(comm.rank(), "relax::make", "unknown algorithm '", name, "'; known:");
  for (std::string_view n : names) text.append(" ").append(n);
  throw usage_error(text);
}

}  // namespace flexpar::relax
