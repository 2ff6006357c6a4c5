// lib/engine/protocol.cpp — the byte layout of the engine's reports and response lists:
// fixed-width fields and length-prefixed strings (wire.hpp).
#include "protocol.hpp"

#include <algorithm>

#include "response_cache.hpp"
#include "wire.hpp"

namespace flexpar::detail {
namespace {

constexpr std::uint8_t flag_joined = 1, flag_shutdown = 2, flag_quiet = 4;

std::uint8_t flags_of(bool joined, bool shutdown) {
  return static_cast<std::uint8_t>((joined ? flag_joined : 0) | (shutdown ? flag_shutdown : 0));
}

void put_description(wire_writer& w, const description& d) {
  w.put(static_cast<std::uint8_t>(d.kind));
  w.put(static_cast<std::uint8_t>(d.type));
  w.put(static_cast<std::uint8_t>(d.op));
  w.put(d.root);
  w.put(d.count);
  w.put(static_cast<std::uint8_t>(d.memory));
  w.put(d.step);
}

description get_description(wire_reader& r) {
  description d;
  d.kind = static_cast<collective_kind>(r.get<std::uint8_t>());
  d.type = static_cast<dtype>(r.get<std::uint8_t>());
  d.op = static_cast<reduce_op>(r.get<std::uint8_t>());
  d.root = r.get<std::int32_t>();
  d.count = r.get<std::uint64_t>();
  d.memory = static_cast<memory_kind>(r.get<std::uint8_t>());
  d.step = r.get<std::uint32_t>();
  return d;
}

}  // namespace

std::vector<std::byte> encode(const report& r) {
  wire_writer w;
  w.put(flags_of(r.joined, r.shutting_down));
  w.put(static_cast<std::uint32_t>(r.slots.size()));
  for (auto s : r.slots) w.put(s);
  // the slots' steps, when one is not 0 (a loop that calls end_step): as many as slots, or none
  const bool steps = std::any_of(r.slot_steps.begin(), r.slot_steps.end(), [](std::uint32_t x) { return x != 0; });
  w.put(static_cast<std::uint8_t>(steps ? 1 : 0));
  if (steps)
    for (std::size_t i = 0; i < r.slots.size(); ++i) w.put(r.slot_steps.at(i));
  w.put(static_cast<std::uint32_t>(r.full.size()));
  for (const reported_tensor& t : r.full) {
    w.put(t.name);
    put_description(w, t.desc);
  }
  w.put(static_cast<std::uint32_t>(r.skipped.size()));
  for (const skipped_tensor& s : r.skipped) {
    w.put(s.slot);
    w.put(s.step);
  }
  return std::move(w.bytes());
}

report decode_report(std::span<const std::byte> bytes) {
  wire_reader in(bytes);
  report r;
  const auto flags = in.get<std::uint8_t>();
  r.joined = (flags & flag_joined) != 0;
  r.shutting_down = (flags & flag_shutdown) != 0;
  const auto n_slots = in.get<std::uint32_t>();
  for (std::uint32_t i = 0; i < n_slots; ++i) r.slots.push_back(in.get<std::uint32_t>());
  if (in.get<std::uint8_t>() != 0)
    for (std::uint32_t i = 0; i < n_slots; ++i) r.slot_steps.push_back(in.get<std::uint32_t>());
  const auto n_full = in.get<std::uint32_t>();
  for (std::uint32_t i = 0; i < n_full; ++i) {
    std::string name = in.get_string();
    r.full.push_back({std::move(name), get_description(in)});
  }
  const auto n_skipped = in.get<std::uint32_t>();
  for (std::uint32_t i = 0; i < n_skipped; ++i) {
    skipped_tensor& x = r.skipped.emplace_back();
    x.slot = in.get<std::uint32_t>();
    x.step = in.get<std::uint32_t>();
  }
  in.expect_end();
  return r;
}

std::vector<std::byte> encode(const response_list& list) {
  wire_writer out;
  out.put(static_cast<std::uint8_t>(flags_of(list.all_joined, list.all_shutdown) | (list.quiet ? flag_quiet : 0)));
  out.put(list.last_joined);
  out.put(static_cast<std::uint32_t>(list.responses.size()));
  for (const response& r : list.responses) {
    out.put(static_cast<std::uint8_t>(r.type));
    if (r.type == response_type::run_cached) {
      out.put(r.slot);
    } else if (r.type == response_type::run_full) {
      out.put(r.name);
      put_description(out, r.desc);
      for (auto c : r.counts) out.put(c);
    } else {
      out.put(r.name);
      out.put(static_cast<std::uint8_t>(r.error));
      out.put(r.text);
      out.put(r.step);
    }
  }
  out.put(static_cast<std::uint32_t>(list.plan.size()));
  for (const auto& bucket : list.plan) {
    out.put(static_cast<std::uint32_t>(bucket.size()));
    for (auto slot : bucket) out.put(slot);
  }
  return std::move(out.bytes());
}

response_list decode_response_list(std::span<const std::byte> bytes, const response_cache& cache, int ranks) {
  wire_reader in(bytes);
  response_list list;
  const auto flags = in.get<std::uint8_t>();
  list.all_joined = (flags & flag_joined) != 0;
  list.all_shutdown = (flags & flag_shutdown) != 0;
  list.quiet = (flags & flag_quiet) != 0;
  list.last_joined = in.get<std::int32_t>();
  list.responses.resize(in.get<std::uint32_t>());
  for (auto& r : list.responses) {
    r.type = static_cast<response_type>(in.get<std::uint8_t>());
    if (r.type == response_type::run_cached) {
      r.slot = in.get<std::uint32_t>();
      const cache_entry& c = cache.at(r.slot);
      r.name = c.name;
      r.desc = c.desc;
      r.counts = c.counts;
    } else if (r.type == response_type::run_full) {
      r.name = in.get_string();
      r.desc = get_description(in);
      r.counts.resize(static_cast<std::size_t>(ranks));
      for (auto& c : r.counts) c = in.get<std::uint64_t>();
    } else {
      r.name = in.get_string();
      r.error = static_cast<error_kind>(in.get<std::uint8_t>());
      r.text = in.get_string();
      r.step = in.get<std::uint32_t>();
    }
  }
  list.plan.resize(in.get<std::uint32_t>());
  for (auto& bucket : list.plan) {
    bucket.resize(in.get<std::uint32_t>());
    for (auto& slot : bucket) slot = in.get<std::uint32_t>();
  }
  in.expect_end();
  return list;
}

}  // namespace flexpar::detail
