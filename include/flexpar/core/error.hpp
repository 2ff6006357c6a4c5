// flexpar/core/error.hpp — the exception hierarchy every layer throws.
//
// One base (`flexpar::error`) and a few kinds that callers can act on differently:
//
//   error
//   ├── usage_error      the caller broke a documented precondition (bad rank, bad tag, ...)
//   ├── mismatch_error   ranks disagree about a collective (count, dtype, op, root, ...)
//   ├── timeout_error    a blocking wait reached its deadline
//   ├── peer_failure     a remote rank died or reported an error
//   └── transport_error  a C communication API (MPI, UCX, NCCL, CUDA) returned a failure
//
// Messages carry their context in the text (rank, operation, tensor, file:line) because that text
// is what reaches a log from a job of 512 ranks; the structured fields are there for code.
#pragma once

#include <chrono>
#include <cstdio>
#include <source_location>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace flexpar {

/// Base of every exception flexpar throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A documented precondition was violated by the caller (e.g. a peer rank out of range).
class usage_error : public error {
 public:
  using error::error;
};

/// Ranks disagree about an operation that must match across ranks.
class mismatch_error : public error {
 public:
  using error::error;
};

/// A blocking wait reached its deadline before the operation completed.
class timeout_error : public error {
 public:
  using error::error;
};

/// A peer rank failed (died, aborted, or reported an error of its own).
class peer_failure : public error {
 public:
  using error::error;
};

/// A call into a communication library (MPI, UCX, NCCL, CUDA) failed.
/// `library()` is "MPI", "UCX", ...; `code()` is the library's own return code.
class transport_error : public error {
 public:
  /// `library` ("MPI", "UCX", ...) failed with its return code `code`; `what` is the full message.
  transport_error(std::string library, long code, const std::string& what)
      : error(what), library_(std::move(library)), code_(code) {}
  /// The library that failed: "MPI", "UCX", "NCCL" or "CUDA".
  [[nodiscard]] const std::string& library() const noexcept { return library_; }
  /// The library's own return code (MPI error code, ucs_status_t, ncclResult_t, cudaError_t).
  [[nodiscard]] long code() const noexcept { return code_; }

 private:
  std::string library_;
  long code_;
};

namespace detail {

/// "file.cpp:123" of a source location, without the directories.
inline std::string where(const std::source_location& loc) {
  std::string_view file = loc.file_name();
  if (auto slash = file.find_last_of('/'); slash != std::string_view::npos) file.remove_prefix(slash + 1);
  return std::string(file) + ":" + std::to_string(loc.line());
}

/// "rank {1}" or "ranks {0,2,3}": the ranks an error names.
inline std::string rank_set(std::span<const int> ranks) {
  std::string s = ranks.size() == 1 ? "rank {" : "ranks {";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i != 0) s += ',';  // appended apart: "," + to_string(...) trips a false -Wrestrict in GCC 12
    s += std::to_string(ranks[i]);
  }
  return s + "}";
}

/// "3 s", "0.25 s", "300 s": a duration in an error message (three significant digits).
template <class Rep, class Period>
std::string seconds_text(std::chrono::duration<Rep, Period> d) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3g s", std::chrono::duration<double>(d).count());
  return buffer;
}

/// Text of a failed C-API call: "[rank 3] MPI_Isend(buf, n, ...) failed: Invalid rank (code 6) at mpi.cpp:42".
inline std::string api_failure_text(int rank, std::string_view call, std::string_view library_message, long code,
                                    const std::source_location& loc) {
  std::string text = "[rank " + (rank >= 0 ? std::to_string(rank) : std::string("?")) + "] ";
  text += call;
  text += " failed: ";
  text += library_message;
  text += " (code " + std::to_string(code) + ") at " + where(loc);
  return text;
}

}  // namespace detail
}  // namespace flexpar
