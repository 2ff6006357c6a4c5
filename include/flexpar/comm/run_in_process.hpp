// flexpar/comm/run_in_process.hpp — threads as ranks: communicators over an in-process world, for
// tests.
#pragma once

#include <functional>

#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/config.hpp>

namespace flexpar {

/// Runs `body(comm)` on `size` threads, one communicator each, over one inproc_world; `ranks_per_node`
/// (0 = all ranks on one node) sets the node topology. After every thread has ended, rethrows the
/// exception of the lowest rank that threw one. Give `cfg.timeout` a short value in tests so that
/// a rank waiting on a failed one ends soon.
void run_in_process(int size, const std::function<void(communicator&)>& body, config cfg = {}, int ranks_per_node = 0);

}  // namespace flexpar
