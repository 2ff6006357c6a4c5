// flexpar/core/uncaught.hpp — an error that ends a rank, printed once, whole, and on one line.
//
// An exception that leaves main() ends the process through std::terminate, whose default handler
// writes its text to stderr in several pieces; under mpiexec the pieces of the ranks that fail
// together interleave ("what():  what():  [rank 1] ... [rank 0] ..."). flexpar installs nothing behind
// your back: a program that wants each failing rank's error as one line asks for it in main():
//
//   int main(int argc, char** argv) {
//     std::set_terminate(flexpar::report_uncaught_and_abort);  // before anything can throw
//     MPI_Init_thread(...);
//     ...
//   }
//
// Each failing rank then writes "[rank R] op: what (uncaught flexpar::usage_error)" — the rank
// prefix added when the message lacks one — in a single write(2), and aborts (mpiexec then ends the
// job, as it does for the default handler).
#pragma once

#include <exception>  // std::set_terminate, for the caller
#include <string_view>

namespace flexpar {

/// Writes `line` and a newline to standard error in one write(2) call (retried for what a signal
/// interrupted), so that lines of processes sharing one pipe do not interleave within a line.
void write_error_line(std::string_view line) noexcept;

/// A std::terminate handler: the exception in flight, as one line on standard error ("[rank R] " in
/// front when its message does not start with it; R is the MPI world rank, "?" before MPI_Init or
/// after MPI_Finalize), then std::abort(). Install with std::set_terminate.
[[noreturn]] void report_uncaught_and_abort() noexcept;

}  // namespace flexpar
