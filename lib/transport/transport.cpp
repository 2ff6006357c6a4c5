// lib/transport/transport.cpp — the transport-independent parts of flexpar/transport/transport.hpp:
// requests and their deadlines, peer and tag checks, the bootstrap allgather.

#include <flexpar/transport/transport.hpp>

#include <algorithm>
#include <thread>

#include <cstring>
#include <vector>

namespace flexpar {
namespace detail {

std::string describe(const request_info& info) {
  std::string text = on_rank(info.rank, info.transport_name);
  text += info.direction == message_direction::send ? "send of " : "recv of up to ";
  text += std::to_string(info.size) + " bytes ";
  text += info.direction == message_direction::send ? "to" : "from";
  text += " rank " + std::to_string(info.peer) + " (tag " + std::to_string(info.tag) + ")";
  return text;
}

bool request_state::wait_until(deadline until) {
  // Poll for `spin` (transfers progress only while polled: rendezvous stages need both sides in
  // MPI), yielding the core between polls, then sleep between polls, doubling from 2 us to 256 us:
  // a rank waiting long for a slow peer leaves the core to the ranks and threads that do work.
  const clock::time_point spin_until = clock::now() + info_.spin;
  for (unsigned polls = 0;; ++polls) {
    if (test()) return true;
    if (polls >= 64) std::this_thread::yield();  // more pollers than cores: let the others run
    if ((polls & 15u) != 15u) continue;
    const clock::time_point now = clock::now();
    if (now >= until) return test();
    if (now >= spin_until) break;
  }
  for (std::chrono::microseconds pause{2};; pause = std::min(pause * 2, std::chrono::microseconds{256})) {
    std::this_thread::sleep_for(pause);
    if (test()) return true;
    if (clock::now() >= until) return test();
  }
}

}  // namespace detail

void request::wait(deadline until) {
  if (!state_) return;
  const auto started = clock::now();
  if (!state_->wait_until(until)) {
    const auto waited = clock::now() - started;
    throw timeout_error(detail::describe(state_->info()) + " did not complete before its deadline (waited " +
                        seconds_text(waited) + ")" +
                        state_->stall_text(std::chrono::duration_cast<std::chrono::milliseconds>(waited)));
  }
  finish();
}

void request::throw_inexact() {
  const detail::request_info info = state_->info();
  const std::size_t got = bytes_;
  state_.reset();
  throw mismatch_error(detail::describe(info) + " received a message of " + std::to_string(got) +
                       " bytes: the sender's side of this exchange has another size (the ranks disagree about a "
                       "collective's counts, or call different collectives)");
}

void wait_all(std::span<request> requests, deadline until) {
  for (request& r : requests) r.wait(until);
}

void transport::check_peer(std::string_view op, int peer) const {
  if (peer < 0 || peer >= size())
    throw error_on<usage_error>(rank(), name_of(kind()), op, " names peer rank ", peer, ", outside the group of ",
                                size(), " ranks");
}

void transport::throw_closed(std::string_view op) const {
  throw error_on<usage_error>(rank(), name_of(kind()), op,
                              " after MPI_Finalize shut this transport down (destroy flexpar's objects before calling "
                              "MPI_Finalize)");
}

void transport::check_tag(std::string_view op, tag_t tag) const {
  if (tag >= max_tag())
    throw error_on<usage_error>(rank(), name_of(kind()), op, " uses tag ", tag, ", but this transport's tags end at ",
                                max_tag(), " (exclusive; max_tag() is reserved for flexpar)");
}

namespace detail {

void bootstrap_allgather(transport& t, std::span<const std::byte> mine, std::span<std::byte> all, deadline until,
                         std::string_view what) {
  const int p = t.size(), me = t.rank();
  const std::size_t n = mine.size();
  if (all.size() != n * static_cast<std::size_t>(p))
    throw error_on<usage_error>(me, "bootstrap_allgather", "output holds ", all.size(), " bytes, needs ",
                                n * static_cast<std::size_t>(p));
  const clock::time_point started = clock::now();
  if (n != 0) std::memcpy(all.data() + n * static_cast<std::size_t>(me), mine.data(), n);
  std::vector<request> receives, sends;
  receives.reserve(static_cast<std::size_t>(p));
  sends.reserve(static_cast<std::size_t>(p));
  const tag_t tag = t.max_tag();
  for (int peer = 0; peer < p; ++peer)
    if (peer != me) receives.push_back(t.do_irecv(peer, tag, all.subspan(n * static_cast<std::size_t>(peer), n)));
  for (int peer = 0; peer < p; ++peer)
    if (peer != me) sends.push_back(t.do_isend(peer, tag, mine));
  // Every receive is waited for (past the deadline each is only tested once more), so that the
  // error names every rank that did not take part, not just the first.
  std::vector<int> missing;
  for (std::size_t k = 0; k < receives.size(); ++k) {
    try {
      receives[k].wait(until);
    } catch (const timeout_error&) {
      missing.push_back(static_cast<int>(k) < me ? static_cast<int>(k) : static_cast<int>(k) + 1);
    }
  }
  if (!missing.empty())
    throw error_on<timeout_error>(me, name_of(t.kind()), what, " over ", p, " ranks: ", rank_set(missing),
                                  " did not take part within ", seconds_text(clock::now() - started),
                                  " (FLEXPAR_TIMEOUT); it is collective: every rank must call it");
  wait_all(sends, until);
}

void bootstrap_barrier(transport& t, std::string_view what, deadline until) {
  bootstrap_allgather(t, {}, {}, until, what);
}

}  // namespace detail
}  // namespace flexpar
