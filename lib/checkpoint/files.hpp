// lib/checkpoint/files.hpp — the POSIX calls of a checkpoint (open, write, pread, fsync, rename), each
// failure a flexpar::error that names the path and the system's reason.
//
// std::fstream cannot fsync or say why a write failed, and std::filesystem::rename cannot exchange
// two directories; the save's atomicity rests on both (flexpar/checkpoint/save.hpp, step 5).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

namespace flexpar::checkpoint::detail {

/// Who is asking: the rank and the operation that every error message starts with.
struct io_context {
  int rank = -1;        ///< the rank, or -1 where none is known
  std::string_view op;  ///< "checkpoint::save", "checkpoint::load"
};

/// A file descriptor, closed by the destructor.
class file {
 public:
  /// Creates (or truncates) `path` for writing. @throws error naming it.
  static file create(const io_context& io, const std::filesystem::path& path);
  /// Opens `path` for reading. @throws error naming it ("does not exist" when it does not).
  static file open_read(const io_context& io, const std::filesystem::path& path);

  file(file&& other) noexcept;
  file& operator=(file&& other) noexcept;
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  ~file();

  /// Writes all of `bytes` at the current position. @throws error (a full disk names ENOSPC).
  void write_all(std::span<const std::byte> bytes);
  /// Reads up to out.size() bytes at `offset`; returns how many there were before the end of the file.
  [[nodiscard]] std::size_t read_at(std::uint64_t offset, std::span<std::byte> out);
  /// fsync. @throws error.
  void sync();
  /// The file's size now. @throws error.
  [[nodiscard]] std::uint64_t size() const;
  /// fsync, then close, each checked (the destructor closes without checking). @throws error.
  void close_synced();
  /// The path it was opened with.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

 private:
  file(int fd, const io_context& io, std::filesystem::path path) : fd_(fd), io_(io), path_(std::move(path)) {}
  [[noreturn]] void fail(std::string_view call) const;
  int fd_ = -1;
  io_context io_;
  std::filesystem::path path_;
};

/// fsync of a directory (makes the entries made or renamed in it durable). @throws error.
void sync_directory(const io_context& io, const std::filesystem::path& dir);

/// Renames the directory `from` to `to`. When `to` exists it is exchanged with `from` in the same
/// call (renameat2 RENAME_EXCHANGE: there is no moment without a directory at `to`) and the old one
/// is then at `from`; where the file system cannot exchange (EINVAL), the old one is renamed aside to
/// `from` + ".old" first (a crash between the two renames leaves no directory at `to`, never a wrong
/// one). Returns where the old one is now (to be removed), or nullopt when `to` did not exist.
/// @throws error naming both paths.
std::optional<std::filesystem::path> rename_into_place(const io_context& io, const std::filesystem::path& from,
                                                       const std::filesystem::path& to);

}  // namespace flexpar::checkpoint::detail
