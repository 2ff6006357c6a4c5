// What the nccl-tests-style benchmarks share on their command lines.
#pragma once

#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstddef>
#include <optional>
#include <string>

namespace flexpar::bench {

/// "4K", "64M", "1G", "4096" -> bytes (K, M, G are powers of 1024, as in nccl-tests).
inline std::size_t parse_size(const std::string& text) {
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw CLI::ValidationError("size", "'" + text + "' is not a size (e.g. 4096, 4K, 64M, 1G)");
  }
  double scale = 1;
  if (pos < text.size()) {
    switch (text[pos]) {
      case 'K':
      case 'k': scale = 1024.0; break;
      case 'M':
      case 'm': scale = 1024.0 * 1024; break;
      case 'G':
      case 'g': scale = 1024.0 * 1024 * 1024; break;
      default: throw CLI::ValidationError("size", "unknown suffix in '" + text + "' (use K, M or G)");
    }
  }
  return static_cast<std::size_t>(value * scale);
}

/// Parses `app` from the command line of an MPI benchmark. On --help or a mistake, rank 0 prints what
/// CLI11 says (the other ranks nothing: a job says it once), MPI is finalized, and the exit status to
/// return from main is returned; nullopt when the benchmark goes on.
///   if (const auto done = flexpar::bench::parse_or_finalize(app, argc, argv, rank)) return *done;
inline std::optional<int> parse_or_finalize(CLI::App& app, int argc, char** argv, int rank) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    const int code = rank == 0 ? app.exit(e) : 0;
    MPI_Finalize();
    return code;
  }
}

}  // namespace flexpar::bench
