// lib/checkpoint/manifest.cpp — metadata.json to and from values, every field checked
// (lib/checkpoint/manifest.hpp).

#include "manifest.hpp"

#include <zlib.h>

#include <algorithm>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include <flexpar/core/error.hpp>

namespace flexpar::checkpoint::detail {

using nlohmann::json;

std::string data_file_name(int rank) { return "rank_" + std::to_string(rank) + ".data"; }

std::uint32_t crc32_of(std::span<const std::byte> bytes, std::uint32_t crc) {
  return static_cast<std::uint32_t>(
      ::crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<z_size_t>(bytes.size())));
}

bool dtype_named(std::string_view name, dtype& out) noexcept {
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i8, dtype::u8, dtype::i32, dtype::i64})
    if (name_of(t) == name) {
      out = t;
      return true;
    }
  return false;
}

namespace {

std::uint32_t crc32_of_text(const std::string& text) { return crc32_of(std::as_bytes(std::span(text))); }

json box_json(const sbp::shape_t& v) { return json(std::vector<std::uint64_t>(v.begin(), v.end())); }

/// `j` with one line per member, per data file, per tensor and per region (nlohmann's indented
/// dump puts every number of a box on a line of its own). Whitespace does not enter the checksum.
std::string readable(const json& j) {
  auto list = [](const json& items, const std::string& indent, auto&& line) {
    std::string out = "[";
    for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ",\n" : "\n") + indent + line(items[i]);
    return out + "\n" + indent.substr(1) + "]";
  };
  std::string out = "{";
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    out += (first ? "\n " : ",\n ") + json(it.key()).dump() + ": ";
    first = false;
    if (it.key() == "files") {
      out += list(*it, "  ", [](const json& f) { return f.dump(); });
    } else if (it.key() == "tensors") {
      out += list(*it, "  ", [&](const json& t) {
        json head = t;
        head.erase("regions");
        std::string text = head.dump();
        text.pop_back();  // the closing brace: the regions follow, one per line
        return text + ",\"regions\":" + list(t.at("regions"), "   ", [](const json& r) { return r.dump(); }) + "}";
      });
    } else {
      out += it->dump();
    }
  }
  return out + "\n}\n";
}

}  // namespace

std::string serialize(const manifest& m) {
  json j;
  j["format"] = format_name;
  j["version"] = format_version;
  j["world_size"] = m.world_size;
  j["chunk_bytes"] = m.chunk_bytes;
  json files = json::array();
  for (std::size_t r = 0; r < m.file_bytes.size(); ++r)
    files.push_back({{"name", data_file_name(static_cast<int>(r))}, {"bytes", m.file_bytes[r]}});
  j["files"] = std::move(files);
  json integers = json::object();
  for (const auto& [name, value] : m.integers) integers[name] = value;
  j["integers"] = std::move(integers);
  json tensors = json::array();
  for (const tensor_record& t : m.tensors) {
    json jt;
    jt["name"] = t.name;
    jt["holding"] = name_of(t.kind);
    jt["dtype"] = name_of(t.type);
    jt["shape"] = box_json(t.shape);
    if (t.kind == holding::global) {
      jt["sbp"] = t.sbp;
      jt["saved_as"] = t.saved_as;
      jt["mesh"] = t.mesh;
    }
    json regions = json::array();
    for (const region& g : t.regions) {
      json jr;
      jr["file"] = g.file;
      if (t.kind == holding::global) jr["mesh_index"] = g.mesh_index;
      jr["offset"] = g.offset;
      jr["bytes"] = g.bytes;
      jr["box_offset"] = box_json(g.box.offset);
      jr["box_extent"] = box_json(g.box.extent);
      jr["crc32"] = g.crc;
      regions.push_back(std::move(jr));
    }
    jt["regions"] = std::move(regions);
    tensors.push_back(std::move(jt));
  }
  j["tensors"] = std::move(tensors);
  j["checksum"] = crc32_of_text(j.dump());  // of the compact text of everything else
  return readable(j);
}

manifest parse(std::string_view text, const io_context& io, const std::filesystem::path& file) {
  auto bad = [&](const auto&... parts) { return error_on<error>(io.rank, io.op, file.string(), ": ", parts...); };
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) throw bad("is not valid JSON: damaged, or not a checkpoint's metadata");
  if (!j.is_object() || !j.contains("format") || j["format"] != format_name)
    throw bad("is not a flexpar checkpoint's metadata (it has no \"format\": \"", format_name, "\")");
  try {
    if (j.at("version") != format_version)
      throw bad("has format version ", j.at("version").dump(), "; this flexpar reads version ", format_version);
    if (!j.contains("checksum") || !j["checksum"].is_number_unsigned()) throw bad("has no checksum");
    const auto recorded = j["checksum"].get<std::uint64_t>();
    j.erase("checksum");
    const std::uint32_t computed = crc32_of_text(j.dump());
    if (computed != recorded)
      throw bad("its crc32 is ", std::to_string(computed), " but it records ", std::to_string(recorded),
                ": the file is damaged");

    auto unsigned_at = [&](const json& v, std::string_view field) -> std::uint64_t {
      if (!v.is_number_unsigned()) throw bad("field \"", field, "\" is not a non-negative integer: ", v.dump());
      return v.get<std::uint64_t>();
    };
    auto shape_at = [&](const json& v, std::string_view field) {
      if (!v.is_array()) throw bad("field \"", field, "\" is not an array");
      sbp::shape_t s;
      for (const json& e : v) s.push_back(static_cast<std::size_t>(unsigned_at(e, field)));
      return s;
    };

    manifest m;
    const std::uint64_t world = unsigned_at(j.at("world_size"), "world_size");
    if (world == 0 || world > static_cast<std::uint64_t>(std::numeric_limits<int>::max()))
      throw bad("world_size ", std::to_string(world), " is not a number of ranks");
    m.world_size = static_cast<int>(world);
    m.chunk_bytes = unsigned_at(j.at("chunk_bytes"), "chunk_bytes");
    if (m.chunk_bytes == 0) throw bad("chunk_bytes is 0");
    const json& files = j.at("files");
    if (!files.is_array() || files.size() != world)
      throw bad("lists ", std::to_string(files.is_array() ? files.size() : 0), " data files for ", m.world_size,
                " saving ranks");
    for (const json& f : files) m.file_bytes.push_back(unsigned_at(f.at("bytes"), "bytes"));
    for (const auto& [name, value] : j.at("integers").items()) {
      if (!value.is_number_integer()) throw bad("integer \"", name, "\" is not an integer: ", value.dump());
      m.integers.emplace_back(name, value.get<std::int64_t>());
    }

    std::set<std::string> names;
    for (const json& jt : j.at("tensors")) {
      tensor_record t;
      t.name = jt.at("name").get<std::string>();
      if (!names.insert(t.name).second) throw bad("names tensor \"", t.name, "\" twice");
      auto bad_tensor = [&](const auto&... parts) { return bad("tensor \"", t.name, "\": ", parts...); };
      const std::string kind = jt.at("holding").get<std::string>();
      if (kind == name_of(holding::global)) {
        t.kind = holding::global;
      } else if (kind == name_of(holding::replicated)) {
        t.kind = holding::replicated;
      } else if (kind == name_of(holding::per_rank)) {
        t.kind = holding::per_rank;
      } else {
        throw bad_tensor("unknown holding \"", kind, "\"");
      }
      const std::string type = jt.at("dtype").get<std::string>();
      if (!dtype_named(type, t.type)) throw bad_tensor("unknown dtype \"", type, "\"");
      t.shape = shape_at(jt.at("shape"), "shape");
      if (t.kind == holding::global) {
        t.sbp = jt.at("sbp").get<std::string>();
        t.saved_as = jt.at("saved_as").get<std::string>();
        t.mesh = jt.at("mesh").get<std::vector<int>>();
      }
      std::uint64_t covered = 0;
      for (const json& jr : jt.at("regions")) {
        region g;
        const std::uint64_t f = unsigned_at(jr.at("file"), "file");
        if (f >= world) throw bad_tensor("a region in file ", std::to_string(f), " of ", m.world_size);
        g.file = static_cast<int>(f);
        if (t.kind == holding::global) g.mesh_index = jr.at("mesh_index").get<std::int64_t>();
        g.offset = unsigned_at(jr.at("offset"), "offset");
        g.bytes = unsigned_at(jr.at("bytes"), "bytes");
        g.box.offset = shape_at(jr.at("box_offset"), "box_offset");
        g.box.extent = shape_at(jr.at("box_extent"), "box_extent");
        for (const json& c : jr.at("crc32")) g.crc.push_back(static_cast<std::uint32_t>(unsigned_at(c, "crc32")));
        const std::string where =
            " (region of " + data_file_name(g.file) + " at byte " + std::to_string(g.offset) + ")";
        if (g.box.offset.size() != g.box.extent.size())
          throw bad_tensor("a box with ", g.box.offset.size(), " offsets and ", g.box.extent.size(), " extents", where);
        if (t.kind == holding::per_rank) {
          if (std::any_of(g.box.offset.begin(), g.box.offset.end(), [](std::size_t o) { return o != 0; }))
            throw bad_tensor("a per-rank region that does not start at 0", where);
        } else {
          if (g.box.extent.size() != t.shape.size())
            throw bad_tensor("a box of ", g.box.extent.size(), " axes in a tensor of ", t.shape.size(), where);
          for (std::size_t k = 0; k < t.shape.size(); ++k)
            if (g.box.offset[k] > t.shape[k] || g.box.extent[k] > t.shape[k] - g.box.offset[k])
              throw bad_tensor("a box past the shape ", sbp::to_string(t.shape), " on axis ", k, where);
        }
        if (g.bytes != g.box.elements() * size_of(t.type))
          throw bad_tensor(std::to_string(g.bytes), " bytes for a box of ", g.box.elements(), " ", name_of(t.type),
                           " elements", where);
        if (g.crc.size() != chunks_of(g.bytes, m.chunk_bytes))
          throw bad_tensor(g.crc.size(), " checksums for ", chunks_of(g.bytes, m.chunk_bytes), " chunks", where);
        if (g.offset > m.file_bytes[f] || g.bytes > m.file_bytes[f] - g.offset)
          throw bad_tensor("a region past the end of its file of ", std::to_string(m.file_bytes[f]), " bytes", where);
        covered += g.box.elements();
        t.regions.push_back(std::move(g));
      }
      if (t.kind == holding::per_rank) {
        if (t.regions.size() != world)
          throw bad_tensor(t.regions.size(), " per-rank regions for ", m.world_size, " saving ranks");
        for (std::size_t r = 0; r < t.regions.size(); ++r)
          if (t.regions[r].file != static_cast<int>(r)) throw bad_tensor("per-rank regions out of rank order");
      } else if (covered != sbp::elements_of(t.shape)) {
        throw bad_tensor("its regions hold ", std::to_string(covered), " elements of the ", sbp::elements_of(t.shape),
                         " of its shape ", sbp::to_string(t.shape));
      }
      m.tensors.push_back(std::move(t));
    }
    return m;
  } catch (const json::exception& e) {
    throw bad("a field is missing or has the wrong type: ", e.what());
  }
}

manifest read_manifest(const io_context& io, const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw error_on<error>(io.rank, io.op, "checkpoint directory ", dir.string(), " does not exist");
  const std::filesystem::path path = dir / metadata_file;
  if (!std::filesystem::exists(path, ec))
    throw error_on<error>(io.rank, io.op, dir.string(), " has no ", metadata_file,
                          ": it is not a checkpoint, or its save did not finish (a save writes ", metadata_file,
                          " last)");
  file f = file::open_read(io, path);
  std::string text(f.size(), '\0');
  text.resize(f.read_at(0, std::as_writable_bytes(std::span(text))));
  return parse(text, io, path);
}

bool looks_like_checkpoint(const std::filesystem::path& dir) {
  try {
    file f = file::open_read({}, dir / metadata_file);
    std::string text(f.size(), '\0');
    text.resize(f.read_at(0, std::as_writable_bytes(std::span(text))));
    const json j = json::parse(text, nullptr, false);
    return j.is_object() && j.contains("format") && j["format"] == format_name;
  } catch (const error&) {
    return false;
  }
}

contents contents_of(const manifest& m) {
  contents c;
  c.world_size = m.world_size;
  c.integers = m.integers;
  for (const tensor_record& t : m.tensors)
    c.tensors.push_back({t.name, t.kind, t.type, t.shape, t.sbp, t.saved_as, t.mesh});
  return c;
}

}  // namespace flexpar::checkpoint::detail
