// lib/zero/registration.cpp — every rank agrees on the registered parameters at start()
// (registration.hpp).
#include "registration.hpp"

#include <algorithm>
#include <cstdint>
#include <flexpar/collective.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/core/hash.hpp>
#include <string_view>
#include <vector>

namespace flexpar::zero::detail {

void agree_on_registrations(communicator& comm, std::span<const member> members, const options& opts, int rank,
                            std::string_view op) {
  enum : std::size_t { count, total, names, sizes, oversize, oversize_count, stage, bucket, fields };
  std::vector<std::int64_t> mine(fields, 0);
  std::uint64_t name_hash = fnv1a(""), size_hash = fnv1a("");
  std::int64_t over = -1, over_n = 0, all_n = 0;
  const std::size_t limit = opts.bucket_bytes / sizeof(float);
  for (std::size_t i = 0; i < members.size(); ++i) {
    name_hash = fnv1a(std::string_view(members[i].name.c_str(), members[i].name.size() + 1), name_hash);
    size_hash = fnv1a(std::to_string(members[i].count).append(","), size_hash);
    all_n += static_cast<std::int64_t>(members[i].count);
    if (over < 0 && members[i].count > limit) {
      over = static_cast<std::int64_t>(i);
      over_n = static_cast<std::int64_t>(members[i].count);
    }
  }
  mine = {static_cast<std::int64_t>(members.size()),
          all_n,
          static_cast<std::int64_t>(name_hash),
          static_cast<std::int64_t>(size_hash),
          over,
          over_n,
          opts.stage,
          static_cast<std::int64_t>(opts.bucket_bytes)};
  const auto p = static_cast<std::size_t>(comm.size());
  std::vector<std::int64_t> all(p * fields);
  allgather(comm, std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  auto field = [&](std::size_t r, std::size_t f) { return all[r * fields + f]; };
  for (std::size_t r = 1; r < p; ++r)
    if (field(r, stage) != field(0, stage) || field(r, bucket) != field(0, bucket))
      throw error_on<usage_error>(rank, op, "rank ", r, " has stage ", field(r, stage), " and bucket_bytes ",
                                  field(r, bucket), ", rank 0 stage ", field(0, stage), " and bucket_bytes ",
                                  field(0, bucket), "; every rank must shard the same way");
  bool same = true;
  for (std::size_t r = 1; r < p; ++r)
    for (std::size_t f : {count, total, names, sizes}) same = same && field(r, f) == field(0, f);
  if (same) {
    const std::int64_t i = field(0, oversize);
    if (i < 0) return;
    const member& m = members[static_cast<std::size_t>(i)];
    throw error_on<usage_error>(
        rank, op, "parameter ", i, " (\"", m.name, "\") has ", m.count, " values (", m.count * sizeof(float),
        " bytes), more than a bucket holds (bucket_bytes = ", opts.bucket_bytes, "); raise options::bucket_bytes");
  }
  // The first index at which some rank's (name, size) differs from rank 0's: gather the pairs.
  std::size_t longest = 0;
  for (std::size_t r = 0; r < p; ++r) longest = std::max(longest, static_cast<std::size_t>(field(r, count)));
  std::vector<std::int64_t> pairs(2 * longest, -1), every(2 * longest * p);
  for (std::size_t i = 0; i < members.size(); ++i) {
    pairs[2 * i] = static_cast<std::int64_t>(fnv1a(members[i].name) >> 1);
    pairs[2 * i + 1] = static_cast<std::int64_t>(members[i].count);
  }
  allgather(comm, std::span<const std::int64_t>(pairs), std::span<std::int64_t>(every));
  std::size_t index = longest;
  int other = 0;
  for (std::size_t i = 0; i < longest && index == longest; ++i)
    for (std::size_t r = 1; r < p; ++r)
      if (every[r * 2 * longest + 2 * i] != every[2 * i] || every[r * 2 * longest + 2 * i + 1] != every[2 * i + 1]) {
        index = i;
        other = static_cast<int>(r);
        break;
      }
  // Their names: every rank sends its name at `index` (or nothing), gathered with their lengths.
  const std::string my_name = index < members.size() ? members[index].name : std::string();
  std::vector<std::int64_t> lengths(p);
  const std::int64_t my_length = static_cast<std::int64_t>(my_name.size());
  allgather(comm, std::span<const std::int64_t>(&my_length, 1), std::span<std::int64_t>(lengths));
  std::vector<std::size_t> counts(p);
  std::size_t chars = 0;
  for (std::size_t r = 0; r < p; ++r) chars += counts[r] = static_cast<std::size_t>(lengths[r]);
  std::vector<std::uint8_t> names_all(chars);
  allgather_v(comm,
              std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(my_name.data()), my_name.size()),
              std::span<std::uint8_t>(names_all), std::span<const std::size_t>(counts));
  auto describe = [&](int r) {
    std::size_t off = 0;
    for (int q = 0; q < r; ++q) off += counts[static_cast<std::size_t>(q)];
    const std::int64_t n = every[static_cast<std::size_t>(r) * 2 * longest + 2 * index + 1];
    if (n < 0) return std::string("no parameter");
    const auto* first = reinterpret_cast<const char*>(names_all.data()) + off;
    return "\"" + std::string(first, counts[static_cast<std::size_t>(r)]) + "\" of " + std::to_string(n) + " values";
  };
  throw error_on<usage_error>(rank, op, "parameter ", index, " is ", describe(0), " on rank 0 but ", describe(other),
                              " on rank ", other, "; every rank must register the same parameters in the same order");
}

}  // namespace flexpar::zero::detail
