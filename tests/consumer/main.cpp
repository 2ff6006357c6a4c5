// A flexpar consumer: a ring exchange of a few bytes over the communicator's transport.
// Built by tests/consumer/CMakeLists.txt (CMake package, subproject or FetchContent) and by
// scripts/consumer-test with pkg-config; run under `mpiexec -n 2` (any size >= 1 works).
// Exit status 0 when every rank received what its left neighbour sent.
#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <string>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/version.hpp>

// With a component target linked (find_package(flexpar COMPONENTS ...)), its header must compile
// and its library must link: use each check macro once on a success code.
#ifdef FLEXPAR_CONSUMER_WITH_UCX
#include <flexpar/core/check_ucx.hpp>
#endif
#if defined(FLEXPAR_CONSUMER_WITH_CUDA) || defined(FLEXPAR_CONSUMER_WITH_NCCL)
#include <flexpar/core/check_cuda.hpp>
#include <flexpar/cuda/collective.hpp>
#endif

namespace {

constexpr std::size_t message_size = 7;
constexpr flexpar::tag_t ring_tag = 3;

std::byte expected_byte(int sender, std::size_t i) {
  return static_cast<std::byte>(0x40 + 16 * sender + static_cast<int>(i));
}

// Sends to rank + 1, receives from rank - 1; true when the bytes received are the ones sent.
bool ring_exchange(flexpar::communicator& comm) {
  const int right = (comm.rank() + 1) % comm.size();
  const int left = (comm.rank() + comm.size() - 1) % comm.size();

  std::array<std::byte, message_size> out{};
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = expected_byte(comm.rank(), i);
  std::array<std::byte, message_size + 5> in{};  // larger than the message: bytes() tells the size

  std::array<flexpar::request, 2> requests{comm.transport().irecv(left, ring_tag, in),
                                           comm.transport().isend(right, ring_tag, out)};
  flexpar::wait_all(requests, comm.default_deadline());

  bool ok = requests[0].bytes() == message_size;
  for (std::size_t i = 0; i < message_size; ++i) ok = ok && in[i] == expected_byte(left, i);
  if (!ok)
    std::fprintf(stderr, "[rank %d] ring exchange: received %zu bytes from rank %d, not the %zu it sent\n", comm.rank(),
                 requests[0].bytes(), left, message_size);
  return ok;
}

void use_components([[maybe_unused]] int rank) {
#ifdef FLEXPAR_CONSUMER_WITH_UCX
  FLEXPAR_CHECK_UCX(rank, UCS_OK);
#endif
#ifdef FLEXPAR_CONSUMER_WITH_CUDA
  FLEXPAR_CHECK_CUDA(rank, cudaSuccess);
  // libflexpar_cuda links: its device query answers (0 devices on a machine without a GPU).
  std::printf("[rank %d] consumer: %d CUDA device(s); device paths: %s\n", rank, flexpar::cuda::device_count(),
              flexpar::built_with_nccl ? "nccl, ring, staged" : "staged");
#endif
#ifdef FLEXPAR_CONSUMER_WITH_NCCL
  FLEXPAR_CHECK_NCCL(rank, ncclSuccess);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return 2;

  int all_ok = 0;
  try {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    use_components(comm.rank());
    int ok = ring_exchange(comm) ? 1 : 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (comm.rank() == 0)
      std::printf("flexpar %s consumer: ring over %d ranks (%s transport) %s\n", FLEXPAR_VERSION_STRING, comm.size(),
                  std::string(flexpar::name_of(comm.transport().kind())).c_str(), all_ok ? "ok" : "FAILED");
  } catch (const flexpar::error& e) {
    std::fprintf(stderr, "flexpar consumer: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flexpar consumer: unexpected exception: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  MPI_Finalize();
  return all_ok ? 0 : 1;
}
