// lib/transport/inproc/inproc_transport.cpp — the in-process transport: threads as ranks, one copy from sender to
// receiver.
//
// Matching: each receiver has, per (sender, tag), a FIFO of posted receives and a FIFO of sends
// not yet received. A new send takes the oldest posted receive (or queues), a new receive takes
// the oldest queued send (or queues). The pair is claimed under the world's lock and copied
// outside it, so that large copies between different pairs run in parallel.
#include <flexpar/transport/inproc.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace flexpar {
namespace detail {

struct inproc_op {
  enum class phase { queued, copying, done };
  message_direction direction;
  std::span<std::byte> recv_buffer;        // receives
  std::span<const std::byte> send_buffer;  // sends
  phase state = phase::queued;
  std::size_t bytes = 0;
  std::string error;  // set when the match failed (truncation)
};

class inproc_state {
 public:
  explicit inproc_state(int size) : mailboxes_(static_cast<std::size_t>(size)) {}

  [[nodiscard]] int size() const noexcept { return static_cast<int>(mailboxes_.size()); }

  /// Posts `op` from `from` to `to` (a send) or at `to` from `from` (a receive) and matches it.
  void post(int to, int from, tag_t tag, const std::shared_ptr<inproc_op>& op) {
    std::shared_ptr<inproc_op> partner;
    {
      std::lock_guard lock(mutex_);
      mailbox& box = mailboxes_[static_cast<std::size_t>(to)];
      const key k{from, tag};
      auto& partners = op->direction == message_direction::send ? box.receives[k] : box.sends[k];
      if (partners.empty()) {
        (op->direction == message_direction::send ? box.sends[k] : box.receives[k]).push_back(op);
        return;
      }
      partner = partners.front();
      partners.pop_front();
      op->state = partner->state = inproc_op::phase::copying;
    }
    transfer(op->direction == message_direction::send ? *op : *partner,
             op->direction == message_direction::send ? *partner : *op);
    {
      std::lock_guard lock(mutex_);
      op->state = partner->state = inproc_op::phase::done;
    }
    changed_.notify_all();
  }

  bool test(const inproc_op& op) {
    std::lock_guard lock(mutex_);
    return op.state == inproc_op::phase::done;
  }

  bool wait_until(const inproc_op& op, deadline until) {
    std::unique_lock lock(mutex_);
    return changed_.wait_until(lock, until, [&] { return op.state == inproc_op::phase::done; });
  }

  /// Removes a still-queued op; waits out a copy in progress (the buffers stay in use until then).
  void abandon(int to, int from, tag_t tag, const std::shared_ptr<inproc_op>& op) noexcept {
    std::unique_lock lock(mutex_);
    if (op->state == inproc_op::phase::queued) {
      mailbox& box = mailboxes_[static_cast<std::size_t>(to)];
      auto& queue = op->direction == message_direction::send ? box.sends[key{from, tag}] : box.receives[key{from, tag}];
      queue.erase(std::remove(queue.begin(), queue.end(), op), queue.end());
      op->state = inproc_op::phase::done;
      return;
    }
    changed_.wait(lock, [&] { return op->state == inproc_op::phase::done; });
  }

  /// The group of a split: the first member to arrive creates it, the last to take it erases it.
  std::shared_ptr<inproc_state> take_split_group(std::uint64_t sequence, int color, int members) {
    std::lock_guard lock(mutex_);
    auto& slot = splits_[{sequence, color}];
    if (!slot.group) slot.group = std::make_shared<inproc_state>(members);
    auto group = slot.group;
    if (++slot.taken == members) splits_.erase({sequence, color});
    return group;
  }

 private:
  static void transfer(inproc_op& send, inproc_op& recv) {
    if (send.send_buffer.size() > recv.recv_buffer.size()) {
      recv.error = send.error = "message of " + std::to_string(send.send_buffer.size()) +
                                " bytes does not fit the receive buffer of " + std::to_string(recv.recv_buffer.size()) +
                                " bytes (truncation)";
      return;
    }
    if (!send.send_buffer.empty())
      std::memcpy(recv.recv_buffer.data(), send.send_buffer.data(), send.send_buffer.size());
    recv.bytes = send.bytes = send.send_buffer.size();
  }

  using key = std::pair<int, tag_t>;  // (sender, tag)
  struct mailbox {
    std::map<key, std::deque<std::shared_ptr<inproc_op>>> sends;     // arrived, not yet received
    std::map<key, std::deque<std::shared_ptr<inproc_op>>> receives;  // posted, not yet matched
  };
  struct split_slot {
    std::shared_ptr<inproc_state> group;
    int taken = 0;
  };

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<mailbox> mailboxes_;
  std::map<std::pair<std::uint64_t, int>, split_slot> splits_;
};

}  // namespace detail

namespace {

class inproc_request final : public detail::request_state {
 public:
  inproc_request(const detail::request_info& info, std::shared_ptr<detail::inproc_state> state,
                 std::shared_ptr<detail::inproc_op> op)
      : request_state(info), state_(std::move(state)), op_(std::move(op)) {}

  bool test() override { return check(state_->test(*op_)); }
  bool wait_until(deadline until) override { return check(state_->wait_until(*op_, until)); }
  void abandon() noexcept override {
    const bool send = info_.direction == message_direction::send;
    state_->abandon(send ? info_.peer : info_.rank, send ? info_.rank : info_.peer, info_.tag, op_);
  }
  [[nodiscard]] std::size_t bytes() const noexcept override { return op_->bytes; }

 private:
  bool check(bool done) const {
    if (done && !op_->error.empty())
      throw transport_error("inproc", 0, detail::describe(info_) + " failed: " + op_->error);
    return done;
  }

  std::shared_ptr<detail::inproc_state> state_;
  std::shared_ptr<detail::inproc_op> op_;
};

class inproc_transport final : public transport {
 public:
  inproc_transport(std::shared_ptr<detail::inproc_state> state, int rank) : state_(std::move(state)), rank_(rank) {}

  [[nodiscard]] int rank() const noexcept override { return rank_; }
  [[nodiscard]] int size() const noexcept override { return state_->size(); }
  [[nodiscard]] transport_kind kind() const noexcept override { return transport_kind::inproc; }
  [[nodiscard]] tag_t max_tag() const noexcept override { return ~tag_t{0}; }

  [[nodiscard]] std::unique_ptr<transport> split(int color, int key) override {
    check_open("split");
    // Everyone learns everyone's (color, key); the members of each color agree on their order and
    // meet in the parent's registry under this split's sequence number.
    const int mine[2] = {color, key};
    std::vector<int> all(2 * static_cast<std::size_t>(size()));
    detail::bootstrap_allgather(*this, std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)),
                                deadline_after(std::chrono::minutes(5)));
    const std::uint64_t sequence = splits_++;
    if (color < 0) return nullptr;
    std::vector<std::pair<int, int>> members;  // (key, parent rank)
    for (int r = 0; r < size(); ++r)
      if (all[2 * static_cast<std::size_t>(r)] == color)
        members.emplace_back(all[2 * static_cast<std::size_t>(r) + 1], r);
    std::sort(members.begin(), members.end());
    const int new_rank =
        static_cast<int>(std::find(members.begin(), members.end(), std::pair{key, rank_}) - members.begin());
    return std::make_unique<inproc_transport>(
        state_->take_split_group(sequence, color, static_cast<int>(members.size())), new_rank);
  }

 protected:
  request do_isend(int peer, tag_t tag, std::span<const std::byte> data) override {
    check_peer("isend", peer);
    auto op = std::make_shared<detail::inproc_op>();
    op->direction = message_direction::send;
    op->send_buffer = data;
    state_->post(peer, rank_, tag, op);
    return request(std::make_unique<inproc_request>(
        detail::request_info{"inproc", message_direction::send, rank_, peer, tag, data.size()}, state_, op));
  }

  request do_irecv(int peer, tag_t tag, std::span<std::byte> data) override {
    check_peer("irecv", peer);
    auto op = std::make_shared<detail::inproc_op>();
    op->direction = message_direction::recv;
    op->recv_buffer = data;
    state_->post(rank_, peer, tag, op);
    return request(std::make_unique<inproc_request>(
        detail::request_info{"inproc", message_direction::recv, rank_, peer, tag, data.size()}, state_, op));
  }

 private:
  std::shared_ptr<detail::inproc_state> state_;
  int rank_;
  std::uint64_t splits_ = 0;
};

}  // namespace

inproc_world::inproc_world(int size) {
  if (size < 1) throw error_on<usage_error>(no_rank, "inproc_world", "size must be at least 1, got ", size);
  state_ = std::make_shared<detail::inproc_state>(size);
}
inproc_world::~inproc_world() = default;

int inproc_world::size() const noexcept { return state_->size(); }

std::unique_ptr<transport> inproc_world::make_transport(int rank) {
  if (rank < 0 || rank >= size())
    throw error_on<usage_error>(no_rank, "inproc_world::make_transport", "rank ", rank, " outside a world of ", size());
  return std::make_unique<inproc_transport>(state_, rank);
}

}  // namespace flexpar
