// async_model_average refuses an MPI initialized below MPI_THREAD_MULTIPLE, with a usage_error that
// says what to ask MPI_Init_thread for. Its own main: the shared test main asks for MULTIPLE.
#include <mpi.h>

#include <cstdio>
#include <string>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/relax/registry.hpp>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int failed = 0;
  if (provided >= MPI_THREAD_MULTIPLE) {
    std::puts("SKIP: this MPI gave MPI_THREAD_MULTIPLE when asked for SERIALIZED");
    MPI_Finalize();
    return 77;
  }
  {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    try {
      (void)flexpar::relax::make("async_model_average", comm);
      std::puts("FAIL: make(\"async_model_average\") accepted a communicator without MPI_THREAD_MULTIPLE");
      failed = 1;
    } catch (const flexpar::usage_error& e) {
      const std::string text = e.what();
      if (text.find("MPI_THREAD_MULTIPLE") == std::string::npos ||
          text.find("relax::async_model_average") == std::string::npos) {
        std::printf("FAIL: unclear message: %s\n", e.what());
        failed = 1;
      } else {
        std::printf("ok: %s\n", e.what());
      }
    }
    // The other algorithms need no thread support.
    try {
      (void)flexpar::relax::make("bytegrad", comm);
    } catch (const flexpar::error& e) {
      std::printf("FAIL: bytegrad: %s\n", e.what());
      failed = 1;
    }
  }
  MPI_Finalize();
  return failed;
}
