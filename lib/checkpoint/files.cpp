// lib/checkpoint/files.cpp — the POSIX calls of a checkpoint (lib/checkpoint/files.hpp).

#include "files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
#include <system_error>
#include <utility>

#include <flexpar/core/error.hpp>

namespace flexpar::checkpoint::detail {

namespace {

std::string reason(int code) { return std::system_category().message(code); }

// One write() or read() moves at most this much (Linux moves at most 0x7ffff000 bytes per call).
constexpr std::size_t max_call_bytes = std::size_t{1} << 30;

}  // namespace

file file::create(const io_context& io, const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int code = errno;
    throw error_on<error>(io.rank, io.op, path.string(), ": cannot be created: ", reason(code));
  }
  return file(fd, io, path);
}

file file::open_read(const io_context& io, const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int code = errno;
    throw error_on<error>(io.rank, io.op, path.string(),
                          code == ENOENT ? std::string(" does not exist") : ": cannot be opened: " + reason(code));
  }
  return file(fd, io, path);
}

file::file(file&& other) noexcept : fd_(std::exchange(other.fd_, -1)), io_(other.io_), path_(std::move(other.path_)) {}

file& file::operator=(file&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    io_ = other.io_;
    path_ = std::move(other.path_);
  }
  return *this;
}

file::~file() {
  if (fd_ >= 0) ::close(fd_);
}

void file::fail(std::string_view call) const {
  const int code = errno;
  throw error_on<error>(io_.rank, io_.op, path_.string(), ": ", call, " failed: ", reason(code));
}

void file::write_all(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), std::min(bytes.size(), max_call_bytes));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
}

std::size_t file::read_at(std::uint64_t offset, std::span<std::byte> out) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n =
        ::pread(fd_, out.data() + done, std::min(out.size() - done, max_call_bytes), static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("pread");
    }
    if (n == 0) break;  // the end of the file
    done += static_cast<std::size_t>(n);
  }
  return done;
}

void file::sync() {
  if (::fsync(fd_) != 0) fail("fsync");
}

std::uint64_t file::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("fstat");
  return static_cast<std::uint64_t>(st.st_size);
}

void file::close_synced() {
  sync();
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) fail("close");
}

void sync_directory(const io_context& io, const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int code = errno;
    throw error_on<error>(io.rank, io.op, "directory ", dir.string(), ": cannot be opened to fsync: ", reason(code));
  }
  const int rc = ::fsync(fd), code = errno;
  ::close(fd);
  if (rc != 0) throw error_on<error>(io.rank, io.op, "directory ", dir.string(), ": fsync failed: ", reason(code));
}

std::optional<std::filesystem::path> rename_into_place(const io_context& io, const std::filesystem::path& from,
                                                       const std::filesystem::path& to) {
  auto rename_failed = [&](const std::filesystem::path& a, const std::filesystem::path& b, int code) {
    return error_on<error>(io.rank, io.op, "cannot rename ", a.string(), " to ", b.string(), ": ", reason(code));
  };
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return std::nullopt;
  int code = errno;
  if (code == EEXIST || code == ENOTEMPTY) {
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) return from;
    code = errno;
    if (code != EINVAL) throw rename_failed(from, to, code);
  } else if (code != EINVAL) {
    throw rename_failed(from, to, code);
  }
  // No RENAME_NOREPLACE / RENAME_EXCHANGE on this file system: the old one aside first, then ours.
  std::filesystem::path aside = from;
  aside += ".old";
  bool had_old = false;
  if (::rename(to.c_str(), aside.c_str()) == 0) {
    had_old = true;
  } else if (errno != ENOENT) {
    throw rename_failed(to, aside, errno);
  }
  if (::rename(from.c_str(), to.c_str()) != 0) throw rename_failed(from, to, errno);
  return had_old ? std::optional<std::filesystem::path>(aside) : std::nullopt;
}

}  // namespace flexpar::checkpoint::detail
