// lib/core/mpi_comm.cpp — the MPI communicators flexpar owns: duplicated (with a deadline), split,
// freed; and the one exchange over MPI that bootstraps a transport.
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/core/mpi_comm.hpp>

#include <algorithm>
#include <climits>
#include <memory>
#include <string>
#include <thread>

namespace flexpar::detail {
namespace {

/// Polls `done()` until it is true or `until`: back to back for the first polls, then sleeping
/// between polls, 2 us doubling to 256 us. `done` makes MPI progress (MPI_Test, MPI_Improbe).
template <class Done>
bool poll_until(Done&& done, deadline until) {
  for (unsigned polls = 0; polls < 1000; ++polls) {
    if (done()) return true;
    if ((polls & 63u) == 63u && clock::now() >= until) return done();
  }
  for (std::chrono::microseconds pause{2};; pause = std::min(pause * 2, std::chrono::microseconds{256})) {
    if (done()) return true;
    if (clock::now() >= until) return done();
    std::this_thread::sleep_for(pause);
  }
}

/// My rank in `comm` for an error message; -1 ("[rank ?]") when MPI cannot say.
int rank_of(MPI_Comm comm) {
  int rank = -1;
  if (MPI_Comm_rank(comm, &rank) != MPI_SUCCESS) rank = -1;
  return rank;
}

}  // namespace

void owned_mpi_comm::reset() noexcept {
  if (comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
  comm_ = MPI_COMM_NULL;
}

bool wait_for_mpi(MPI_Request& request, deadline until) {
  return poll_until(
      [&] {
        int done = 0;
        FLEXPAR_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
        return done != 0;
      },
      until);
}

owned_mpi_comm duplicate_for_flexpar(MPI_Comm comm, deadline until, std::string_view what) {
  const clock::time_point started = clock::now();
  // MPI writes the duplicate's handle when the operation completes, which after a timeout may be
  // later (when the missing ranks arrive): the handle lives on the heap and is left to MPI then.
  auto dup = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
  MPI_Request request = MPI_REQUEST_NULL;
  FLEXPAR_CHECK_MPI(MPI_Comm_idup(comm, dup.get(), &request));
  if (!wait_for_mpi(request, until)) {
    // A non-blocking collective's request may be neither freed nor cancelled (MPI 4.0 §6.12): it
    // stays pending, and so does its handle.
    (void)dup.release();
    int size = 0;
    FLEXPAR_CHECK_MPI(MPI_Comm_size(comm, &size));
    throw error_on<timeout_error>(rank_of(comm), what, "not every one of the ", size,
                                  " ranks of the communicator arrived within ", seconds_text(clock::now() - started),
                                  " (FLEXPAR_TIMEOUT); it is collective: every rank must call it (MPI_Comm_idup "
                                  "cannot say which ranks are missing)");
  }
  owned_mpi_comm owned(*dup);
  FLEXPAR_CHECK_MPI(MPI_Comm_set_errhandler(owned.get(), MPI_ERRORS_RETURN));
  return owned;
}

owned_mpi_comm split_for_flexpar(MPI_Comm comm, int color, int key) {
  MPI_Comm sub = MPI_COMM_NULL;
  FLEXPAR_CHECK_MPI(MPI_Comm_split(comm, color < 0 ? MPI_UNDEFINED : color, key, &sub));
  owned_mpi_comm owned(sub);
  if (sub != MPI_COMM_NULL) FLEXPAR_CHECK_MPI(MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN));
  return owned;
}

std::vector<std::vector<std::byte>> exchange_for_flexpar(MPI_Comm comm, std::span<const std::byte> mine, deadline until,
                                                         std::string_view what) {
  constexpr int tag = 0;
  const clock::time_point started = clock::now();
  int rank = 0, size = 0;
  FLEXPAR_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  FLEXPAR_CHECK_MPI(MPI_Comm_size(comm, &size));
  if (mine.size() > static_cast<std::size_t>(INT_MAX))
    throw error_on<usage_error>(rank_of(comm), what, mine.size(), " bytes are too many for one exchange");
  std::vector<std::vector<std::byte>> all(static_cast<std::size_t>(size));
  all[static_cast<std::size_t>(rank)].assign(mine.begin(), mine.end());
  // The sends read from a copy on the heap: should one of them outlive this call (its peer never
  // came), it is left to MPI with its buffer.
  auto sent = std::make_unique<std::vector<std::byte>>(mine.begin(), mine.end());
  std::vector<MPI_Request> sends;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    sends.push_back(MPI_REQUEST_NULL);
    FLEXPAR_CHECK_MPI(
        MPI_Isend(sent->data(), static_cast<int>(sent->size()), MPI_BYTE, peer, tag, comm, &sends.back()));
  }
  std::vector<bool> arrived(static_cast<std::size_t>(size), false);
  arrived[static_cast<std::size_t>(rank)] = true;
  int missing = size - 1;
  const bool everyone = poll_until(
      [&] {
        for (int peer = 0; peer < size && missing > 0; ++peer) {
          if (arrived[static_cast<std::size_t>(peer)]) continue;
          int found = 0;
          MPI_Message message = MPI_MESSAGE_NULL;
          MPI_Status status;
          FLEXPAR_CHECK_MPI(MPI_Improbe(peer, tag, comm, &found, &message, &status));
          if (!found) continue;
          int count = 0;
          FLEXPAR_CHECK_MPI(MPI_Get_count(&status, MPI_BYTE, &count));
          auto& bytes = all[static_cast<std::size_t>(peer)];
          bytes.resize(static_cast<std::size_t>(count));
          FLEXPAR_CHECK_MPI(MPI_Mrecv(bytes.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE));
          arrived[static_cast<std::size_t>(peer)] = true;
          --missing;
        }
        return missing == 0;
      },
      until);
  const bool sent_all = poll_until(
      [&] {
        int done = 0;
        FLEXPAR_CHECK_MPI(MPI_Testall(static_cast<int>(sends.size()), sends.data(), &done, MPI_STATUSES_IGNORE));
        return done != 0;
      },
      everyone ? until : clock::now());
  if (!sent_all) {
    for (MPI_Request& r : sends)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);  // completes when its peer takes it
    (void)sent.release();                               // ... reading from here
  }
  if (!everyone) {
    std::vector<int> absent;
    for (int peer = 0; peer < size; ++peer)
      if (!arrived[static_cast<std::size_t>(peer)]) absent.push_back(peer);
    throw error_on<timeout_error>(rank_of(comm), "", what, " over ", size, " ranks: ", rank_set(absent),
                                  " did not take part within ", seconds_text(clock::now() - started),
                                  " (FLEXPAR_TIMEOUT); it is collective: every rank must call it");
  }
  if (!sent_all)
    throw error_on<timeout_error>(rank_of(comm), what, "a send did not complete within ",
                                  seconds_text(clock::now() - started), " (FLEXPAR_TIMEOUT)");
  return all;
}

}  // namespace flexpar::detail
