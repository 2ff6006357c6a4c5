// lib/core/uncaught.cpp — write_error_line and report_uncaught_and_abort (flexpar/core/uncaught.hpp).

#include <flexpar/core/uncaught.hpp>

#include <cxxabi.h>
#include <mpi.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <string>

#include <flexpar/core/error.hpp>

namespace flexpar {

void write_error_line(std::string_view line) noexcept {
  std::string text(line);
  text += '\n';
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nothing more can be done from a terminate handler
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

namespace {

/// The demangled type of the exception in flight ("?" when none can be named).
std::string exception_type_name() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  if (type == nullptr) return "?";
  int status = 0;
  char* readable = abi::__cxa_demangle(type->name(), nullptr, nullptr, &status);
  std::string name = status == 0 && readable != nullptr ? readable : type->name();
  std::free(readable);
  return name;
}

/// This process's rank in MPI_COMM_WORLD, or -1 when MPI is not initialized or is finalized.
int world_rank() noexcept {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int rank = -1;
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

}  // namespace

void report_uncaught_and_abort() noexcept {
  std::string message;
  try {
    if (const std::exception_ptr in_flight = std::current_exception()) {
      try {
        std::rethrow_exception(in_flight);
      } catch (const std::exception& e) {
        message = e.what();
      } catch (...) {
        message = "an exception that is not a std::exception";
      }
      message += " (uncaught " + exception_type_name() + ")";
    } else {
      message = "std::terminate called with no exception in flight";
    }
    if (!message.starts_with("[rank ")) message.insert(0, rank_prefix(world_rank()));
  } catch (...) {
    message = "flexpar::report_uncaught_and_abort: out of memory while describing the uncaught exception";
  }
  write_error_line(message);
  std::abort();
}

}  // namespace flexpar
