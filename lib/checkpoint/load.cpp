// lib/checkpoint/load.cpp — load() and read_contents() (flexpar/checkpoint/load.hpp): the reads each
// rank's target boxes need, chunk by chunk, every chunk's crc32 checked before a byte of it is used.

#include <flexpar/checkpoint/load.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include <flexpar/core/error.hpp>

#include "agree.hpp"
#include "files.hpp"
#include "manifest.hpp"
#include "state_names.hpp"

namespace flexpar::checkpoint {
namespace detail {
namespace {

constexpr std::string_view load_op = "checkpoint::load";

/// The bytes a window of chunks holds at most: a read of a large region goes through it in pieces.
constexpr std::uint64_t window_bytes = std::uint64_t{64} << 20;

/// One read: the part of a saved region that one target box needs.
struct read_op {
  const tensor_record* tensor = nullptr;
  const region* from = nullptr;
  sbp::box target;           // the target's box, the layout of `dst`
  sbp::box part;             // the intersection, in logical coordinates
  std::span<std::byte> dst;  // the target's bytes
};

/// Calls run(from_byte, to_byte, bytes) for each contiguous run of `part` (a box inside both the
/// row-major boxes `from` and `to`), in increasing order of from_byte. Inner axes that `part` covers
/// whole in both are merged first (sbp::merge_whole_inner_axes), so a box of whole rows is one run.
template <class Run>
void for_each_run(const sbp::box& from, const sbp::box& to, const sbp::box& part, std::size_t element_bytes,
                  Run&& run) {
  if (part.elements() == 0) return;
  const std::size_t axes = part.extent.size();
  if (axes == 0) {  // a scalar
    run(std::size_t{0}, std::size_t{0}, element_bytes);
    return;
  }
  sbp::shape_t from_offset(axes), to_offset(axes);
  for (std::size_t k = 0; k < axes; ++k) {
    from_offset[k] = part.offset[k] - from.offset[k];
    to_offset[k] = part.offset[k] - to.offset[k];
  }
  const sbp::box_pair b = sbp::merge_whole_inner_axes({from.extent, from_offset, to.extent, to_offset, part.extent});
  const std::size_t m = b.extent.size(), run_bytes = b.extent[m - 1] * element_bytes;
  const sbp::shape_t sst = sbp::strides_of(b.src_shape), tst = sbp::strides_of(b.dst_shape);
  sbp::shape_t index(m, 0);  // the odometer over the outer m - 1 axes
  for (;;) {
    std::size_t s = 0, t = 0;
    for (std::size_t k = 0; k < m; ++k) {
      s += (b.src_offset[k] + index[k]) * sst[k];
      t += (b.dst_offset[k] + index[k]) * tst[k];
    }
    run(s * element_bytes, t * element_bytes, run_bytes);
    std::size_t k = m - 1;
    for (;;) {
      if (k == 0) return;
      --k;
      if (++index[k] < b.extent[k]) break;
      index[k] = 0;
    }
  }
}

/// The region byte just past the last element of `part` that region `from` holds: a read needs no
/// chunk beyond it.
std::uint64_t end_in_region(const sbp::box& from, const sbp::box& part, std::size_t element_bytes) {
  const sbp::shape_t st = sbp::strides_of(from.extent);
  std::uint64_t last = 0;
  for (std::size_t k = 0; k < part.extent.size(); ++k)
    last += (part.offset[k] - from.offset[k] + part.extent[k] - 1) * st[k];
  return (last + 1) * element_bytes;
}

/// Reads one region's chunks [first byte's chunk, end byte's chunk) through a window, checking each
/// chunk's crc32 before any of its bytes is copied out.
class region_reader {
 public:
  region_reader(const io_context& io, file& f, const read_op& r, std::uint64_t chunk_bytes, std::uint64_t end_byte,
                std::vector<std::byte>& window)
      : io_(io), file_(f), read_(r), chunk_(chunk_bytes), end_(end_byte), window_(window) {}

  /// Copies region bytes [at, at + n) to `dst`; calls come in increasing `at`.
  void copy(std::uint64_t at, std::byte* dst, std::uint64_t n) {
    while (n > 0) {
      if (at < low_ || at >= high_) fill(at / chunk_);
      const std::uint64_t take = std::min(n, high_ - at);
      std::memcpy(dst, window_.data() + (at - low_), take);
      at += take;
      dst += take;
      n -= take;
    }
  }

 private:
  void fill(std::uint64_t chunk) {
    const region& g = *read_.from;
    const std::uint64_t per_window = std::max<std::uint64_t>(1, window_bytes / chunk_);
    const std::uint64_t stop = std::min(chunks_of(end_, chunk_), chunk + per_window);
    low_ = chunk * chunk_;
    high_ = std::min(stop * chunk_, g.bytes);
    window_.resize(high_ - low_);
    const std::size_t got = file_.read_at(g.offset + low_, window_);
    if (got < window_.size())
      throw error_on<error>(io_.rank, io_.op, file_.path().string(), ": ends at byte ", g.offset + low_ + got,
                            ", inside tensor \"", read_.tensor->name, "\"'s region [", g.offset, ", ",
                            g.offset + g.bytes, "): the file is truncated");
    for (std::uint64_t k = chunk; k < stop; ++k) {
      const std::uint64_t a = k * chunk_, b = std::min(a + chunk_, g.bytes);
      const std::uint32_t crc = crc32_of(std::span<const std::byte>(window_).subspan(a - low_, b - a));
      if (crc != g.crc[k])
        throw error_on<error>(io_.rank, io_.op, file_.path().string(), ": bytes [", g.offset + a, ", ", g.offset + b,
                              ") of tensor \"", read_.tensor->name, "\" (chunk ", k, " of its region) have crc32 ", crc,
                              " but ", metadata_file, " records ", g.crc[k], ": the file is damaged");
    }
  }

  const io_context& io_;
  file& file_;
  const read_op& read_;
  std::uint64_t chunk_, end_;
  std::vector<std::byte>& window_;
  std::uint64_t low_ = 0, high_ = 0;  // the window holds region bytes [low_, high_)
};

/// Checks that data file `f` of the checkpoint is there with the size metadata.json gives it.
void check_file(const io_context& io, const std::filesystem::path& dir, const manifest& m, int f,
                std::string_view holder) {
  const std::filesystem::path path = dir / data_file_name(f);
  std::string holds = holder.empty() ? std::string(" (it holds no region)")
                                     : " (it holds a region of tensor \"" + std::string(holder) + "\")";
  std::error_code ec;
  const std::uint64_t size = std::filesystem::file_size(path, ec);
  if (ec)
    throw error_on<error>(io.rank, io.op, path.string(),
                          ec == std::errc::no_such_file_or_directory ? std::string(" is missing") : ": " + ec.message(),
                          holds);
  const std::uint64_t want = m.file_bytes[static_cast<std::size_t>(f)];
  if (size != want)
    throw error_on<error>(io.rank, io.op, path.string(), " has ", size, " bytes but ", metadata_file, " records ", want,
                          ": truncated or damaged", holds);
}

std::string names_of(const manifest& m) {
  std::string out;
  for (std::size_t i = 0; i < m.tensors.size() && i < 8; ++i) out += (i ? ", \"" : "\"") + m.tensors[i].name + "\"";
  if (m.tensors.size() > 8) out += ", ... (" + std::to_string(m.tensors.size()) + " in all)";
  return out.empty() ? "none" : out;
}

/// Everything load() does on this rank (steps 1-4).
void load_here(int rank, int size, const std::filesystem::path& dir, const state& s) {
  const io_context io{rank, load_op};
  // step 1
  const manifest m = read_manifest(io, dir);
  const std::string meta = (dir / metadata_file).string();

  // step 2
  check_unique_names(s, rank, load_op);
  for (const integer_entry& i : s.integers()) {
    auto it = std::find_if(m.integers.begin(), m.integers.end(), [&](const auto& v) { return v.first == i.name; });
    if (it == m.integers.end())
      throw error_on<mismatch_error>(rank, load_op, "integer \"", i.name, "\" is not in the checkpoint ", meta);
    *i.value = it->second;
  }
  std::unordered_map<std::string_view, const tensor_record*> by_name;
  for (const tensor_record& t : m.tensors) by_name.emplace(t.name, &t);

  // step 3
  std::vector<read_op> reads;
  std::vector<std::span<std::byte>> zeros;  // partial<sum> targets off coordinate 0
  for (const entry& e : s.entries()) {
    part p = e.get(purpose::load);
    const auto it = by_name.find(e.name);
    if (it == by_name.end())
      throw error_on<mismatch_error>(rank, load_op, "tensor \"", e.name, "\" is not in the checkpoint ", meta,
                                     " (it holds ", names_of(m), ")");
    const tensor_record& t = *it->second;
    auto mismatch = [&](const auto&... parts) {
      return error_on<mismatch_error>(rank, load_op, "tensor \"", e.name, "\": ", parts...);
    };
    if ((t.kind == holding::per_rank) != (e.kind == holding::per_rank))
      throw mismatch(meta, " holds it ", name_of(t.kind), " but the target is ", name_of(e.kind),
                     " (per-rank tensors load only into per-rank targets)");
    if (t.type != e.type) throw mismatch(meta, " has dtype ", name_of(t.type), " but the target has ", name_of(e.type));
    const std::size_t element_bytes = size_of(e.type);
    auto wrong_bytes = [&](std::size_t want) {
      return error_on<usage_error>(rank, load_op, "tensor \"", e.name, "\" has ", p.bytes.size(), " bytes here, but ",
                                   want, " are needed for its shape ", sbp::to_string(p.shape));
    };

    if (e.kind == holding::per_rank) {
      if (m.world_size != size)
        throw mismatch("a per-rank tensor saved by ", m.world_size, " ranks cannot be loaded on ", size,
                       " (rank r loads what rank r saved; save it as a global tensor to reshard it)");
      const region& g = t.regions[static_cast<std::size_t>(rank)];
      if (g.box.extent != p.shape)
        throw mismatch(meta, " has shape ", sbp::to_string(g.box.extent), " for rank ", rank,
                       " but the target has shape ", sbp::to_string(p.shape));
      if (p.bytes.size() != g.bytes) throw wrong_bytes(g.bytes);
      reads.push_back({&t, &g, g.box, g.box, p.bytes});
      continue;
    }
    if (t.shape != p.shape)
      throw mismatch(meta, " has shape ", sbp::to_string(t.shape), " but the target has shape ",
                     sbp::to_string(p.shape));
    sbp::box target{sbp::shape_t(p.shape.size(), 0), p.shape};
    if (e.kind == holding::global) {
      if (p.mesh_index < 0) continue;  // outside the target's mesh: nothing here
      target = sbp::shard_box(p.shape, p.sbp, p.mesh_shape, p.coords);
      if (p.bytes.size() != target.elements() * element_bytes) throw wrong_bytes(target.elements() * element_bytes);
      bool zero = false;  // partial<sum>: the values on coordinate 0 of each partial axis, zeros elsewhere
      for (std::size_t d = 0; d < p.sbp.rank; ++d)
        if (p.sbp[d].is_partial() && p.sbp[d].op == reduce_op::sum && p.coords[d] != 0) zero = true;
      if (zero) {
        zeros.push_back(p.bytes);
        continue;
      }
    } else if (p.bytes.size() != target.elements() * element_bytes) {
      throw wrong_bytes(target.elements() * element_bytes);
    }
    std::size_t covered = 0;
    for (const region& g : t.regions) {
      sbp::box common = sbp::intersect(target, g.box);
      if (common.elements() == 0) continue;
      covered += common.elements();
      reads.push_back({&t, &g, target, std::move(common), p.bytes});
    }
    if (covered != target.elements())
      throw error_on<error>(rank, load_op, "tensor \"", e.name, "\": the regions ", meta, " lists cover ", covered,
                            " of the ", target.elements(), " elements this rank needs: the metadata is damaged");
  }
  if (rank == 0)  // every data file, whether or not a rank reads it now: a checkpoint is whole or refused
    for (int f = 0; f < m.world_size; ++f) {
      std::string_view holder;
      for (const tensor_record& t : m.tensors)
        for (const region& g : t.regions)
          if (holder.empty() && g.file == f) holder = t.name;
      check_file(io, dir, m, f, holder);
    }

  // step 4: file by file, each file's reads in its order
  std::map<int, std::vector<const read_op*>> by_file;
  for (const read_op& r : reads) by_file[r.from->file].push_back(&r);
  std::vector<std::byte> window;
  for (auto& [f, list] : by_file) {
    std::sort(list.begin(), list.end(),
              [](const read_op* a, const read_op* b) { return a->from->offset < b->from->offset; });
    check_file(io, dir, m, f, list.front()->tensor->name);
    file in = file::open_read(io, dir / data_file_name(f));
    for (const read_op* r : list) {
      const std::size_t element_bytes = size_of(r->tensor->type);
      region_reader reader(io, in, *r, m.chunk_bytes, end_in_region(r->from->box, r->part, element_bytes), window);
      for_each_run(r->from->box, r->target, r->part, element_bytes,
                   [&](std::size_t from, std::size_t to, std::size_t n) { reader.copy(from, r->dst.data() + to, n); });
    }
  }
  for (std::span<std::byte> z : zeros) std::fill(z.begin(), z.end(), std::byte{0});
}

}  // namespace
}  // namespace detail

void load(communicator& comm, const std::filesystem::path& dir, const state& s) {
  std::exception_ptr failure;
  try {
    detail::load_here(comm.rank(), comm.size(), dir, s);
  } catch (...) {
    failure = std::current_exception();
  }
  // step 5
  detail::agree(comm, failure, detail::load_op);
}

contents read_contents(const std::filesystem::path& dir, int rank) {
  return detail::contents_of(detail::read_manifest({rank, "checkpoint::read_contents"}, dir));
}

}  // namespace flexpar::checkpoint
