// lib/comm/run_in_process.cpp — communicators over an in-process world, one thread per rank.
#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/transport/inproc.hpp>

#include <exception>
#include <thread>
#include <vector>

namespace flexpar {

void run_in_process(int size, const std::function<void(communicator&)>& body, config cfg, int ranks_per_node) {
  inproc_world world(size);
  cfg.transport = transport_kind::inproc;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        communicator comm(world.make_transport(r),
                          node_topology::blocks(size, ranks_per_node > 0 ? ranks_per_node : size, r), cfg);
        body(comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  // Every message of flexpar's own errors already names the rank; rethrow the first as it is.
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace flexpar
