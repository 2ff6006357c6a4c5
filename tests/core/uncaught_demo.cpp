// tests/core/uncaught_demo.cpp — every rank throws a flexpar::usage_error out of main at once, with
// flexpar::report_uncaught_and_abort as the terminate handler (uncaught_lines.sh checks the lines);
// with the argument `plain`, a std::runtime_error whose text has no rank (the handler adds it).
#include <flexpar/core/error.hpp>
#include <flexpar/core/uncaught.hpp>

#include <mpi.h>

#include <stdexcept>
#include <string>
#include <string_view>

int main(int argc, char** argv) {
  std::set_terminate(flexpar::report_uncaught_and_abort);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Barrier(MPI_COMM_WORLD);  // all ranks fail together, as a bad argument makes them
  if (argc > 1 && std::string_view(argv[1]) == "plain") throw std::runtime_error("uncaught_demo: a plain error (end)");
  // long enough that the default handler's pieces (and an unbuffered stream's) would interleave
  throw flexpar::error_on<flexpar::usage_error>(rank, "uncaught_demo",
                                                "every rank fails here: ", std::string(1500, 'x'), " (end)");
}
