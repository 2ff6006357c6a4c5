// lib/checkpoint/agree.hpp — after a step that can fail on some ranks only, every rank learns
// whether one failed, so that none goes on into a collective the failed one will never join.
#pragma once

#include <exception>
#include <string_view>

#include <flexpar/comm/communicator.hpp>

namespace flexpar::checkpoint::detail {

/// Collective over `comm`: returns when no rank passed an error. Otherwise every rank throws: one
/// that passed `mine` rethrows it, every other rank a peer_failure carrying the text of the lowest
/// failed rank ("[rank 0] checkpoint::load: rank 2 failed: [rank 2] checkpoint::load: ..."). Costs
/// one allreduce of 8 bytes, and on failure two broadcasts of the text.
void agree(communicator& comm, const std::exception_ptr& mine, std::string_view op);

}  // namespace flexpar::checkpoint::detail
