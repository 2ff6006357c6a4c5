// flexpar/core/error.hpp — the exception hierarchy every layer throws.
//
// One base (`flexpar::error`) and a few kinds that callers can act on differently:
//
//   error                thrown as itself: a breach of flexpar's own protocol (a bug or a corrupted
//   │                    message), a file that cannot be written
//   ├── usage_error      the caller broke a documented precondition (bad rank, bad tag, ...)
//   ├── mismatch_error   ranks disagree about a collective (count, dtype, op, root, ...)
//   ├── timeout_error    a blocking wait reached its deadline
//   ├── peer_failure     a remote rank died or reported an error
//   └── transport_error  a C communication API (MPI, UCX, NCCL, CUDA) returned a failure
//
// Messages carry their context in the text (rank, operation, tensor, file:line) because that text
// is what reaches a log from a job of 512 ranks; the structured fields are there for code. Every
// message starts the same way, "[rank R] op: what", and is built by one helper (`error_on`,
// `error_text`, `on_rank`) so that a log can be grepped by rank and operation whatever layer threw;
// code with no rank at hand (a pure function, a parser) passes `no_rank` and its message reads "op: what".
#pragma once

#include <chrono>
#include <cstdio>
#include <source_location>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

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

/// "[rank 3] ": the start of every message; "[rank ?] " for a negative rank (the rank is not
/// known, e.g. MPI is not initialized or already finalized).
inline std::string rank_prefix(int rank) {
  std::string s = "[rank ";
  s += rank >= 0 ? std::to_string(rank) : std::string("?");
  s += "] ";
  return s;
}

/// "[rank 3] allreduce: ": the rank prefix and the operation that failed; "[rank 3] " when `op` is
/// empty (a message whose first words already name the operation).
inline std::string on_rank(int rank, std::string_view op) {
  std::string s = rank_prefix(rank);
  if (!op.empty()) s.append(op).append(": ");
  return s;
}

namespace detail {

/// Appends one part of a message: text as is, an integral number in decimal, a char as itself.
template <class Part>
void append_part(std::string& s, const Part& part) {
  if constexpr (std::is_same_v<Part, char>) {
    s += part;
  } else if constexpr (std::is_integral_v<Part>) {
    static_assert(!std::is_same_v<Part, bool>, "flexpar::error_text: write a bool as words, not as 0 or 1");
    s += std::to_string(part);
  } else {
    s += std::string_view(part);
  }
}

}  // namespace detail

/// on_rank(rank, op) followed by `parts`, each text (anything convertible to std::string_view), a
/// char, or an integral number (written in decimal): the text of an error that is not thrown at
/// once (stored, logged, wrapped in an exception_ptr).
template <class... Parts>
std::string error_text(int rank, std::string_view op, const Parts&... parts) {
  std::string s = on_rank(rank, op);
  (detail::append_part(s, parts), ...);
  return s;
}

/// An `E` (usage_error, mismatch_error, ...) whose text is error_text(rank, op, parts...):
/// `throw error_on<usage_error>(comm.rank(), "allreduce", "count ", n, " is not a multiple of ", p);`
template <class E, class... Parts>
E error_on(int rank, std::string_view op, const Parts&... parts) {
  return E(error_text(rank, op, parts...));
}

/// The rank argument of a message thrown where no rank is at hand: a pure function (a codec, a cost
/// model, a parser), a lookup before any communicator exists. Such a message reads "op: what"; the
/// caller that knows its rank and catches it may add the rank (e.g. with error_text(rank, "", e.what())).
struct no_rank_t {
  explicit constexpr no_rank_t() = default;
};
inline constexpr no_rank_t no_rank{};

/// error_text without a rank: "op: what" (`op` followed by ": ", then `parts`).
template <class... Parts>
std::string error_text(no_rank_t, std::string_view op, const Parts&... parts) {
  std::string s(op);
  if (!op.empty()) s += ": ";
  (detail::append_part(s, parts), ...);
  return s;
}

/// error_on without a rank: `throw error_on<usage_error>(no_rank, "onebit::encode", "chunk must be positive");`
template <class E, class... Parts>
E error_on(no_rank_t, std::string_view op, const Parts&... parts) {
  return E(error_text(no_rank, op, parts...));
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

namespace detail {

/// "file.cpp:123" of a source location, without the directories.
inline std::string where(const std::source_location& loc) {
  std::string_view file = loc.file_name();
  if (auto slash = file.find_last_of('/'); slash != std::string_view::npos) file.remove_prefix(slash + 1);
  return std::string(file) + ":" + std::to_string(loc.line());
}

/// Text of a failed C-API call: "[rank 3] MPI_Isend(buf, n, ...) failed: Invalid rank (code 6) at mpi.cpp:42".
inline std::string api_failure_text(int rank, std::string_view call, std::string_view library_message, long code,
                                    const std::source_location& loc) {
  return error_text(rank, "", call, " failed: ", library_message, " (code ", code, ") at ", where(loc));
}

}  // namespace detail
}  // namespace flexpar
