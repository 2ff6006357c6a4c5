// flexpar/relax/flat_model.hpp — what every relaxation does with its parameter list: check it across ranks, fuse it
// into one flat buffer (a bucket, as in Horovod and BAGUA) and copy back.
//
// start() of every algorithm calls flat_model::bind, which is collective: every rank contributes
// (number of parameters, total elements, a hash of the names, a hash of the lengths, and the first
// parameter whose weight and gradient lengths differ). All ranks see all of them, so all ranks throw
// the same usage_error together on a mismatch (no rank is left waiting). step() calls check(), which
// is local: the list must keep its length and lengths.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/core/hash.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax::detail {

/// "[rank 2] relax::bytegrad step: ": on_rank with the relaxation and its method as the operation.
inline std::string where(int rank, std::string_view algo, std::string_view op) {
  return on_rank(rank, std::string("relax::").append(algo).append(" ").append(op));
}

/// The parameter list of one relaxation as one flat f32 buffer (see the file header).
class flat_model {
 public:
  /// Collective over `comm`: checks that every rank passes the same list (count, names, lengths) and
  /// that weight and gradient lengths agree, then records the layout.
  /// @throws usage_error on every rank, naming the first mismatching rank and tensor and both sides.
  /// `Param`: relax::parameter, or any type with a `name` and `weight` and `gradient` that have a
  /// size() (cuda::parameter: the device relaxations bind through this same check).
  template <class Param>
  void bind(communicator& comm, std::string_view algo, std::span<const Param> params) {
    algo_ = std::string(algo);
    enum : std::size_t { count, total, names, lengths, bad_index, bad_weight, bad_gradient, fields };
    std::vector<std::int64_t> mine(fields, 0);
    std::uint64_t name_hash = fnv1a(""), length_hash = fnv1a("");
    std::int64_t bad = -1, bad_w = 0, bad_g = 0;
    std::size_t n = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Param& p = params[i];
      name_hash = fnv1a(p.name, name_hash);
      name_hash = fnv1a(std::string_view("\0", 1), name_hash);
      length_hash = fnv1a(std::to_string(p.weight.size()).append(","), length_hash);
      n += p.weight.size();
      if (bad < 0 && p.weight.size() != p.gradient.size()) {
        bad = static_cast<std::int64_t>(i);
        bad_w = static_cast<std::int64_t>(p.weight.size());
        bad_g = static_cast<std::int64_t>(p.gradient.size());
      }
    }
    mine[count] = static_cast<std::int64_t>(params.size());
    mine[total] = static_cast<std::int64_t>(n);
    mine[names] = static_cast<std::int64_t>(name_hash);
    mine[lengths] = static_cast<std::int64_t>(length_hash);
    mine[bad_index] = bad;
    mine[bad_weight] = bad_w;
    mine[bad_gradient] = bad_g;
    const auto p = static_cast<std::size_t>(comm.size());
    std::vector<std::int64_t> all(p * fields);
    flexpar::allgather(comm, std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
    const std::string at = where(comm.rank(), algo_, "start");
    auto field = [&](std::size_t r, std::size_t f) { return all[r * fields + f]; };
    for (std::size_t r = 0; r < p; ++r)
      if (field(r, bad_index) >= 0) {
        std::string text(at);
        text.append("parameter ").append(std::to_string(field(r, bad_index)));
        if (r == static_cast<std::size_t>(comm.rank()))
          text.append(" (\"").append(params[static_cast<std::size_t>(field(r, bad_index))].name).append("\")");
        text.append(" of rank ")
            .append(std::to_string(r))
            .append(" has ")
            .append(std::to_string(field(r, bad_weight)))
            .append(" weights but ")
            .append(std::to_string(field(r, bad_gradient)))
            .append(" gradient values; they must have the same length");
        throw usage_error(text);
      }
    for (std::size_t r = 1; r < p; ++r) {
      if (field(r, count) != field(0, count)) {
        std::string text(at);
        text.append("rank ")
            .append(std::to_string(r))
            .append(" passes ")
            .append(std::to_string(field(r, count)))
            .append(" parameters of ")
            .append(std::to_string(field(r, total)))
            .append(" elements in all, rank 0 passes ")
            .append(std::to_string(field(0, count)))
            .append(" parameters of ")
            .append(std::to_string(field(0, total)))
            .append("; every rank must pass the same parameter list");
        throw usage_error(text);
      }
    }
    bool same = true;
    for (std::size_t r = 1; r < p; ++r)
      same = same && field(r, total) == field(0, total) && field(r, names) == field(0, names) &&
             field(r, lengths) == field(0, lengths);
    if (!same) report_tensor_mismatch(comm, params, at);
    sizes_.clear();
    offsets_.clear();
    std::size_t offset = 0;
    for (const Param& q : params) {
      sizes_.push_back(q.weight.size());
      offsets_.push_back(offset);
      offset += q.weight.size();
    }
    total_ = offset;
  }

  /// Local: the list has the count and lengths bind() saw, and weight and gradient lengths agree.
  /// @throws usage_error naming the rank, the algorithm, the tensor and both sizes.
  template <class Param>
  void check(int rank, std::string_view op, std::span<const Param> params) const {
    const std::string at = where(rank, algo_, op);
    if (params.size() != sizes_.size()) {
      std::string text(at);
      text.append(std::to_string(params.size()))
          .append(" parameters; start() was given ")
          .append(std::to_string(sizes_.size()));
      throw usage_error(text);
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Param& p = params[i];
      if (p.weight.size() != sizes_[i] || p.gradient.size() != sizes_[i]) {
        std::string text(at);
        text.append("parameter ")
            .append(std::to_string(i))
            .append(" (\"")
            .append(p.name)
            .append("\") has ")
            .append(std::to_string(p.weight.size()))
            .append(" weights and ")
            .append(std::to_string(p.gradient.size()))
            .append(" gradient values; start() saw ")
            .append(std::to_string(sizes_[i]))
            .append(" of each");
        throw usage_error(text);
      }
    }
  }

  /// Elements of all parameters together.
  [[nodiscard]] std::size_t size() const noexcept { return total_; }
  /// Number of parameters.
  [[nodiscard]] std::size_t count() const noexcept { return sizes_.size(); }
  /// Offset of parameter i in the flat buffer.
  [[nodiscard]] std::size_t offset(std::size_t i) const { return offsets_[i]; }

  /// Copies every gradient into `flat` (size() elements).
  void gather_gradients(std::span<const parameter> params, std::span<float> flat) const {
    for (std::size_t i = 0; i < params.size(); ++i)
      std::copy(params[i].gradient.begin(), params[i].gradient.end(), flat.begin() + offset_of(i));
  }
  /// Copies `flat` back into every gradient.
  void scatter_gradients(std::span<const float> flat, std::span<const parameter> params) const {
    for (std::size_t i = 0; i < params.size(); ++i)
      std::copy_n(flat.begin() + offset_of(i), params[i].gradient.size(), params[i].gradient.begin());
  }
  /// The gradients as one buffer, when they lie back to back in the list's order (a flat gradient
  /// buffer cut into parameters): its first element, or null. Reduced there in place, they need no
  /// gather into the flat buffer and no scatter back (and give what the gathered buffer gives, bit
  /// for bit: the same elements in the same places). `Param`: as bind()'s.
  template <class Param>
  [[nodiscard]] static float* back_to_back_gradients(std::span<const Param> params) noexcept {
    float* first = nullptr;
    float* next = nullptr;
    for (const Param& p : params) {
      if (p.gradient.empty()) continue;  // an empty one may point anywhere
      if (first == nullptr) first = next = p.gradient.data();
      if (p.gradient.data() != next) return nullptr;
      next += p.gradient.size();
    }
    return first;
  }
  /// Copies every weight into `flat`.
  void gather_weights(std::span<const parameter> params, std::span<float> flat) const {
    for (std::size_t i = 0; i < params.size(); ++i)
      std::copy(params[i].weight.begin(), params[i].weight.end(), flat.begin() + offset_of(i));
  }
  /// Copies `flat` back into every weight.
  void scatter_weights(std::span<const float> flat, std::span<const parameter> params) const {
    for (std::size_t i = 0; i < params.size(); ++i)
      std::copy_n(flat.begin() + offset_of(i), params[i].weight.size(), params[i].weight.begin());
  }

  /// Collective: every rank's weights become rank 0's (the start of every algorithm).
  void broadcast_weights(communicator& comm, std::span<const parameter> params) const {
    std::vector<float> flat(total_);
    gather_weights(params, flat);
    flexpar::broadcast(comm, std::span<float>(flat), 0);
    scatter_weights(flat, params);
  }

 private:
  [[nodiscard]] std::ptrdiff_t offset_of(std::size_t i) const { return static_cast<std::ptrdiff_t>(offsets_[i]); }

  // Counts agree but names or lengths do not: find the first such tensor (collective, all ranks).
  template <class Param>
  static void report_tensor_mismatch(communicator& comm, std::span<const Param> params, const std::string& at) {
    const std::size_t k = params.size();
    std::vector<std::int64_t> mine(2 * k), all(2 * k * static_cast<std::size_t>(comm.size()));
    for (std::size_t i = 0; i < k; ++i) {
      mine[2 * i] = static_cast<std::int64_t>(params[i].weight.size());
      mine[2 * i + 1] = static_cast<std::int64_t>(fnv1a(params[i].name));
    }
    flexpar::allgather(comm, std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
    for (std::size_t r = 1; r < static_cast<std::size_t>(comm.size()); ++r)
      for (std::size_t i = 0; i < k; ++i) {
        const std::int64_t* theirs = &all[r * 2 * k + 2 * i];
        const std::int64_t* first = &all[2 * i];
        if (theirs[0] == first[0] && theirs[1] == first[1]) continue;
        std::string text(at);
        text.append("parameter ").append(std::to_string(i)).append(" (\"").append(params[i].name).append("\" here)");
        if (theirs[0] != first[0])
          text.append(" has ")
              .append(std::to_string(theirs[0]))
              .append(" elements on rank ")
              .append(std::to_string(r))
              .append(" and ")
              .append(std::to_string(first[0]))
              .append(" on rank 0");
        else
          text.append(" has a different name on rank ").append(std::to_string(r)).append(" than on rank 0");
        text.append("; every rank must pass the same parameter list");
        throw usage_error(text);
      }
    throw usage_error(at + "the parameter lists differ between ranks");
  }

  std::string algo_;
  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> offsets_;
  std::size_t total_ = 0;
};

/// Bytes a ring allreduce of n floats over p ranks makes one rank send: 2 (p - 1) / p of the buffer.
constexpr std::uint64_t ring_allreduce_bytes(std::size_t n, int p) noexcept {
  if (p <= 1) return 0;
  const auto pp = static_cast<std::uint64_t>(p);
  return 2 * (pp - 1) * (static_cast<std::uint64_t>(n) * sizeof(float)) / pp;
}

}  // namespace flexpar::relax::detail
