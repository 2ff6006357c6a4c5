// lib/checkpoint/agree.cpp — every rank learns whether one failed (lib/checkpoint/agree.hpp).

#include "agree.hpp"

#include <cstdint>
#include <span>
#include <string>

#include <flexpar/collective.hpp>
#include <flexpar/core/error.hpp>

namespace flexpar::checkpoint::detail {

namespace {

std::string text_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

void agree(communicator& comm, const std::exception_ptr& mine, std::string_view op) {
  // step 1: the lowest rank that failed (size() when none did)
  std::int64_t first = mine ? comm.rank() : comm.size();
  allreduce(comm, std::span<std::int64_t>(&first, 1), reduce_op::min);
  if (first == comm.size()) return;
  // step 2: its text, to every rank
  const int root = static_cast<int>(first);
  std::string text = comm.rank() == root ? text_of(mine) : std::string();
  std::int64_t length = static_cast<std::int64_t>(text.size());
  broadcast(comm, std::span<std::int64_t>(&length, 1), root);
  text.resize(static_cast<std::size_t>(length));
  broadcast(comm, std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(text.data()), text.size()), root);
  // step 3: every rank throws
  if (mine) std::rethrow_exception(mine);
  throw error_on<peer_failure>(comm.rank(), op, "rank ", root, " failed: ", text);
}

}  // namespace flexpar::checkpoint::detail
