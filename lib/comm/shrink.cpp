// lib/comm/shrink.cpp — communicator::shrink(): the survivors of a failure agree on who failed and
// build a communicator over the others (flexpar/comm/communicator.hpp).
//
// The agreement runs over the old transport with its liveness view in peer-only mode (a request
// fails only when its own peer failed), so that messages among the survivors still flow:
//  1. Every rank knows a set D of failed ranks (the heartbeats' view, growing as it learns).
//  2. The coordinator is the lowest rank not in D. The others send it D (again whenever D grows or
//     the coordinator changes); it takes the union of its own D and every proposal, and once it
//     holds a proposal from every rank not in D, that union is the decision.
//  3. A rank that receives a decision (from the coordinator, or passed on by another rank, which
//     is how a decision outlives a coordinator that fails while sending it) adopts it and passes it
//     on to every survivor; it returns once every other survivor's copy has arrived and matches.
// A coordinator that fails before any decision left it is replaced by the next live rank, to which
// the others send their proposals; one that fails after some copies left is outlived by them.
// A survivor that fails before confirming ends the agreement with peer_failure on the others (call
// shrink() again); one that fails after confirming is not seen by this agreement, and the new
// communicator's creation then waits for it (MPI_Comm_create_group has no deadline).
#include <flexpar/comm/communicator.hpp>
#include <flexpar/core/check_mpi.hpp>
#include <flexpar/transport/liveness.hpp>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

namespace flexpar {
namespace {

constexpr std::uint32_t shrink_magic = 0x46585348;  // "FXSH"
enum class kind : std::uint32_t { proposal = 1, decision = 2 };

struct message_header {
  std::uint32_t magic;
  std::uint32_t kind;
  std::uint32_t sender;
  std::uint32_t size;  // the group's size: one byte per rank follows, 1 = failed
};

std::vector<std::byte> encode(kind k, int sender, const std::vector<bool>& failed) {
  std::vector<std::byte> out(sizeof(message_header) + failed.size());
  const message_header h{shrink_magic, static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(sender),
                         static_cast<std::uint32_t>(failed.size())};
  std::memcpy(out.data(), &h, sizeof h);
  for (std::size_t r = 0; r < failed.size(); ++r)
    out[sizeof h + r] = std::byte{failed[r] ? std::uint8_t{1} : std::uint8_t{0}};
  return out;
}

/// The agreement of one rank (see the file's comment).
class agreement {
 public:
  agreement(transport& t, detail::liveness_view& view, deadline until)
      : t_(t),
        view_(view),
        until_(until),
        p_(t.size()),
        me_(t.rank()),
        failed_(static_cast<std::size_t>(p_)),
        got_proposal_(static_cast<std::size_t>(p_)),
        confirmed_(static_cast<std::size_t>(p_)),
        proposed_to_(-1),
        tag_(t.max_tag() - 1),
        buffers_(static_cast<std::size_t>(p_)),
        receives_(static_cast<std::size_t>(p_)) {}

  std::vector<bool> run() {
    learn(view_.failed());
    for (int q = 0; q < p_; ++q)
      if (q != me_ && !failed_[static_cast<std::size_t>(q)]) post(q);
    std::chrono::microseconds pause{5};
    for (;;) {
      learn(view_.failed());
      bool progressed = poll();
      if (!decided_) {
        const int c = coordinator();
        if (c == me_) {
          if (all_others_outside(failed_, [&](int q) { return got_proposal_[static_cast<std::size_t>(q)]; })) {
            decide(failed_);
            progressed = true;
          }
        } else if (c != proposed_to_ || proposal_stale_) {
          send(c, kind::proposal, failed_);
          proposed_to_ = c;
          proposal_stale_ = false;
        }
      }
      if (decided_) {
        for (int q = 0; q < p_; ++q)
          if (q != me_ && !decision_[static_cast<std::size_t>(q)] && failed_[static_cast<std::size_t>(q)])
            throw error_on<peer_failure>(me_, "communicator::shrink", "rank ", q,
                                         " failed before it confirmed the agreement (", view_.failures_text(),
                                         "); call shrink() again");
        if (all_others_outside(decision_, [&](int q) { return confirmed_[static_cast<std::size_t>(q)]; })) break;
      }
      if (clock::now() >= until_)
        throw error_on<timeout_error>(
            me_, "communicator::shrink", "no agreement among the survivors within ",
            "the deadline (FLEXPAR_TIMEOUT); ranks that have not answered: ", rank_set(silent()));
      if (progressed) {
        pause = std::chrono::microseconds{5};
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds{1000});
      }
    }
    finish_sends();
    return decision_;
  }

 private:
  void learn(const std::vector<int>& failed) {
    for (int r : failed) mark(r);
  }
  void mark(int r) {
    if (failed_[static_cast<std::size_t>(r)]) return;
    failed_[static_cast<std::size_t>(r)] = true;
    proposal_stale_ = true;
  }
  [[nodiscard]] int coordinator() const {
    for (int r = 0; r < p_; ++r)
      if (!failed_[static_cast<std::size_t>(r)]) return r;
    return me_;
  }
  /// True when pred(q) holds for every other rank q that `gone` does not mark.
  template <class Pred>
  [[nodiscard]] bool all_others_outside(const std::vector<bool>& gone, Pred pred) const {
    for (int q = 0; q < p_; ++q)
      if (q != me_ && !gone[static_cast<std::size_t>(q)] && !pred(q)) return false;
    return true;
  }
  [[nodiscard]] std::vector<int> silent() const {
    std::vector<int> out;
    for (int q = 0; q < p_; ++q)
      if (q != me_ && !failed_[static_cast<std::size_t>(q)] &&
          !(decided_ ? confirmed_[static_cast<std::size_t>(q)] : got_proposal_[static_cast<std::size_t>(q)]))
        out.push_back(q);
    return out;
  }

  void post(int q) {
    auto& buffer = buffers_[static_cast<std::size_t>(q)];
    buffer.assign(sizeof(message_header) + static_cast<std::size_t>(p_), std::byte{0});
    receives_[static_cast<std::size_t>(q)] = t_.irecv(q, tag_, buffer);
  }

  void send(int q, kind k, const std::vector<bool>& failed) {
    outgoing_.push_back(std::make_unique<std::vector<std::byte>>(encode(k, me_, failed)));
    try {
      sends_.push_back(t_.isend(q, tag_, *outgoing_.back()));
    } catch (const peer_failure&) {
      mark(q);
    }
  }

  void decide(const std::vector<bool>& decision) {
    decided_ = true;
    decision_ = decision;
    for (std::size_t r = 0; r < decision_.size(); ++r)
      if (decision_[r]) mark(static_cast<int>(r));
    for (int q = 0; q < p_; ++q)
      if (q != me_ && !decision_[static_cast<std::size_t>(q)]) send(q, kind::decision, decision_);
  }

  /// Tests every posted receive; true when one completed.
  bool poll() {
    bool any = false;
    for (int q = 0; q < p_; ++q) {
      request& r = receives_[static_cast<std::size_t>(q)];
      if (!r.pending()) continue;
      bool done = false;
      try {
        done = r.test();
      } catch (const peer_failure&) {
        r = request();
        mark(q);
        continue;
      }
      if (!done) continue;
      any = true;
      const std::size_t bytes = r.bytes();
      take(q, bytes);
      post(q);
    }
    return any;
  }

  void take(int q, std::size_t bytes) {
    const auto& buffer = buffers_[static_cast<std::size_t>(q)];
    message_header h{};
    if (bytes != sizeof h + static_cast<std::size_t>(p_)) return;  // not this agreement's message
    std::memcpy(&h, buffer.data(), sizeof h);
    if (h.magic != shrink_magic || h.sender != static_cast<std::uint32_t>(q) ||
        h.size != static_cast<std::uint32_t>(p_))
      return;
    std::vector<bool> set(static_cast<std::size_t>(p_));
    for (std::size_t r = 0; r < set.size(); ++r) set[r] = buffer[sizeof h + r] != std::byte{0};
    if (h.kind == static_cast<std::uint32_t>(kind::proposal)) {
      if (decided_) return;
      got_proposal_[static_cast<std::size_t>(q)] = true;
      for (std::size_t r = 0; r < set.size(); ++r)
        if (set[r]) mark(static_cast<int>(r));
      return;
    }
    if (h.kind != static_cast<std::uint32_t>(kind::decision)) return;
    if (!decided_) decide(set);
    if (set != decision_)
      throw error_on<mismatch_error>(me_, "communicator::shrink", "rank ", q, " decided that ", text_of(set),
                                     " failed, this rank that ", text_of(decision_), " did");
    confirmed_[static_cast<std::size_t>(q)] = true;
  }

  static std::string text_of(const std::vector<bool>& set) {
    std::vector<int> ranks;
    for (std::size_t r = 0; r < set.size(); ++r)
      if (set[r]) ranks.push_back(static_cast<int>(r));
    return ranks.empty() ? std::string("no rank") : rank_set(ranks);
  }

  /// The decision's copies to the survivors leave before returning (small: they complete at once;
  /// a failed peer's is dropped).
  void finish_sends() {
    for (request& s : sends_) {
      try {
        s.wait(until_);
      } catch (const peer_failure&) {
      }
    }
  }

  transport& t_;
  detail::liveness_view& view_;
  deadline until_;
  int p_;
  int me_;
  std::vector<bool> failed_;
  std::vector<bool> got_proposal_;
  std::vector<bool> confirmed_;
  std::vector<bool> decision_;
  bool decided_ = false;
  bool proposal_stale_ = false;
  int proposed_to_;
  tag_t tag_;
  std::vector<std::vector<std::byte>> buffers_;
  std::vector<request> receives_;
  std::vector<std::unique_ptr<std::vector<std::byte>>> outgoing_;  // stable while their sends run
  std::vector<request> sends_;
};

}  // namespace

std::vector<int> communicator::failed_ranks() const {
  const detail::liveness_view* view = transport_->liveness();
  return view ? view->failed() : std::vector<int>{};
}

communicator communicator::shrink() {
  detail::liveness_view* view = transport_->liveness();
  if (view == nullptr)
    throw error_on<usage_error>(rank(), "communicator::shrink",
                                "this communicator has no heartbeats (FLEXPAR_HEARTBEAT_MS=0, or an in-process "
                                "group): nothing to agree with");
  if (mpi_.get() == MPI_COMM_NULL)
    throw error_on<usage_error>(rank(), "communicator::shrink", "this communicator has no MPI communicator to shrink");
  view->peer_only();
  const std::vector<bool> failed = agreement(*transport_, *view, default_deadline()).run();
  std::vector<int> survivors;
  for (int r = 0; r < size(); ++r)
    if (!failed[static_cast<std::size_t>(r)]) survivors.push_back(r);
  MPI_Group all = MPI_GROUP_NULL, living = MPI_GROUP_NULL;
  FLEXPAR_CHECK_MPI(MPI_Comm_group(mpi_.get(), &all));
  const int included = MPI_Group_incl(all, static_cast<int>(survivors.size()), survivors.data(), &living);
  MPI_Group_free(&all);
  FLEXPAR_CHECK_MPI(included);
  MPI_Comm shrunk = MPI_COMM_NULL;
  const int created = MPI_Comm_create_group(mpi_.get(), living, 0, &shrunk);
  MPI_Group_free(&living);
  FLEXPAR_CHECK_MPI(created);
  detail::owned_mpi_comm owned(shrunk);
  return communicator::from_mpi(owned.get(), config_);
}

}  // namespace flexpar
