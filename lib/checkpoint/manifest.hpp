// lib/checkpoint/manifest.hpp — metadata.json as values: what each data file holds, where, and the
// crc32 of every chunk; written by rank 0 at the end of a save, read by every rank of a load.
//
// The text is JSON (nlohmann, kept inside lib/): a reader without flexpar can list a checkpoint. It
// carries a crc32 of its own (of the compact dump of everything else), so a damaged metadata.json is
// refused rather than believed. parse() checks everything a load relies on — every region inside its
// tensor and its file, its bytes and chunk count agreeing with its box, the regions of a tensor
// covering all its elements — so that the loader can trust the values it gets.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <flexpar/checkpoint/load.hpp>
#include <flexpar/checkpoint/state.hpp>
#include <flexpar/core/dtype.hpp>
#include <flexpar/sbp/layout.hpp>

#include "files.hpp"

namespace flexpar::checkpoint::detail {

/// The format name and version metadata.json carries.
inline constexpr std::string_view format_name = "flexpar-checkpoint";
inline constexpr int format_version = 1;
/// The file that makes a directory a checkpoint; written last.
inline constexpr std::string_view metadata_file = "metadata.json";

/// "rank_3.data": the data file of saving rank `rank`.
std::string data_file_name(int rank);

/// crc32 (zlib) of `bytes`, continuing from `crc` (0 to start).
std::uint32_t crc32_of(std::span<const std::byte> bytes, std::uint32_t crc = 0);

/// The chunks of a region of `bytes` bytes: ceil(bytes / chunk_bytes).
constexpr std::uint64_t chunks_of(std::uint64_t bytes, std::uint64_t chunk_bytes) noexcept {
  return (bytes + chunk_bytes - 1) / chunk_bytes;
}

/// One contiguous run of a data file: the row-major elements of a box of one tensor.
struct region {
  int file = 0;                    ///< the saving rank whose rank_R.data holds it
  std::int64_t mesh_index = -1;    ///< global: the saving mesh index that wrote it
  std::uint64_t offset = 0;        ///< bytes into the file
  std::uint64_t bytes = 0;         ///< its length
  sbp::box box;                    ///< of the logical tensor (per-rank: the whole of that rank's tensor)
  std::vector<std::uint32_t> crc;  ///< one per chunk
};

/// One tensor and its regions.
struct tensor_record {
  std::string name;
  holding kind = holding::global;
  dtype type = dtype::f32;
  sbp::shape_t shape;     ///< per-rank: rank 0's (each region has its rank's)
  std::string sbp;        ///< global: as the saving type said
  std::string saved_as;   ///< global: the layout of the bytes
  std::vector<int> mesh;  ///< global: the saving mesh's extents
  std::vector<region> regions;
};

/// metadata.json.
struct manifest {
  int world_size = 0;
  std::uint64_t chunk_bytes = 0;
  std::vector<std::uint64_t> file_bytes;  ///< per saving rank, the size of its data file
  std::vector<std::pair<std::string, std::int64_t>> integers;
  std::vector<tensor_record> tensors;
};

/// The JSON text of `m`, with its crc32.
std::string serialize(const manifest& m);
/// `text` (the contents of `file`) as a manifest, every field checked (header).
/// @throws error naming `file` and what is wrong with it.
manifest parse(std::string_view text, const io_context& io, const std::filesystem::path& file);
/// The manifest of the checkpoint in `dir`. @throws error naming metadata.json when it is missing
/// (not a checkpoint, or a save that did not finish) or damaged.
manifest read_manifest(const io_context& io, const std::filesystem::path& dir);
/// True when `dir/metadata.json` is JSON of this format (damaged or not): a checkpoint a save may replace.
bool looks_like_checkpoint(const std::filesystem::path& dir);
/// What read_contents() returns.
contents contents_of(const manifest& m);

/// The dtype named `name` ("f32", ...), or false.
bool dtype_named(std::string_view name, dtype& out) noexcept;

}  // namespace flexpar::checkpoint::detail
