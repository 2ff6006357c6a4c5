// flexpar/checkpoint/load.hpp — reading a checkpoint into tensors on any ranks and SBPs.
//
//   w2 = global_tensor<float, split<1>>::from_full(new_mesh, shape, zeros);  // any mesh, any SBP
//   flexpar::checkpoint::state s;
//   s.add("fc1.weight", w2).add_integer("step", step);
//   flexpar::checkpoint::load(comm, "ckpt/step_1000", s);
//
// Resharding is done by reading: each rank reads from the data files only the regions of the saved
// tensor that its target shard needs (the intersection of its box with each saved region), in whole
// chunks whose crc32 it checks, and copies them into place. Nothing moves between ranks, and a
// load on m ranks of a save on n needs no step in between. The steps (every rank):
//   step 1: read and check metadata.json (its format, version and crc32).
//   step 2: match every entry of the state: present, same holding class (a global or replicated
//           tensor loads into either; a per-rank one only into a per-rank one, on as many ranks),
//           same dtype, same shape.
//   step 3: plan the reads: my target box intersected with every saved region; rank 0 also checks
//           that every data file exists with the size metadata.json gives it.
//   step 4: per file, the reads in file order: whole chunks, each crc32 checked, then the box copy.
//   step 5: the ranks agree: when one failed, it throws its error and every other rank a
//           peer_failure carrying that text; the targets' contents are then unspecified.
// A rank reads whole chunks from the first byte it needs of a region to the last: a transposed
// reshard (saved S(0), loaded S(1)) reads every saved shard whole on every rank (see
// doc/checkpoint.md for when to box after loading instead).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <flexpar/checkpoint/state.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/dtype.hpp>
#include <flexpar/sbp/layout.hpp>

namespace flexpar::checkpoint {

/// Collective over `comm`: loads every entry of `s` from the checkpoint in `dir` (the steps above).
/// Entries of the checkpoint that `s` does not name are not read. Any number of ranks, any
/// placements and SBPs (per-rank tensors: as many ranks as saved them).
/// @throws error: no metadata.json in `dir` (not a checkpoint, or a save that did not finish), a
///         metadata.json or data file that is damaged (truncated, a checksum that differs), a
///         missing data file: the text names the file and the tensor.
/// @throws mismatch_error: an entry the checkpoint lacks, or whose holding, dtype or shape differs
///         from the checkpoint's (both named, with metadata.json's path); per-rank tensors on
///         another number of ranks.
/// @throws usage_error: two entries share a name; a host tensor's shape does not match its span.
/// @throws peer_failure: another rank failed (carries its message). timeout_error: a rank did not come.
void load(communicator& comm, const std::filesystem::path& dir, const state& s);

/// One tensor of a checkpoint, as metadata.json describes it.
struct tensor_info {
  std::string name;                ///< its name
  holding kind = holding::global;  ///< how the saving ranks held it
  dtype type = dtype::f32;         ///< element type
  sbp::shape_t shape;              ///< logical shape (per-rank tensors: rank 0's)
  std::string sbp;                 ///< global: the SBP it had, "(P(sum), S(1))"; empty otherwise
  std::string saved_as;            ///< global: the layout of its bytes in the files, "(S(0), S(1))"
  std::vector<int> mesh;           ///< global: the saving mesh's extents
};

/// What a checkpoint holds (read_contents).
struct contents {
  int world_size = 0;                                          ///< ranks that saved it
  std::vector<tensor_info> tensors;                            ///< in the order they were saved
  std::vector<std::pair<std::string, std::int64_t>> integers;  ///< named integers

  /// The tensor named `name`, or nullptr.
  [[nodiscard]] const tensor_info* find(std::string_view name) const noexcept {
    for (const tensor_info& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  /// The integer named `name`, if it has one.
  [[nodiscard]] std::optional<std::int64_t> integer(std::string_view name) const noexcept {
    for (const auto& [n, v] : integers)
      if (n == name) return v;
    return std::nullopt;
  }
};

/// Not collective: the checkpoint's contents, from its metadata.json (checked as load checks it), to
/// build the targets of a load (shapes, dtypes) or to inspect a checkpoint. `rank` only prefixes the
/// error messages. @throws error as load() does for metadata.json.
contents read_contents(const std::filesystem::path& dir, int rank = -1);

}  // namespace flexpar::checkpoint
