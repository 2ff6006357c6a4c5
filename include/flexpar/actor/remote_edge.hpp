// flexpar/actor/remote_edge.hpp — the two ends of a cross-rank edge: the pull protocol that keeps register counts
// across ranks.
//
// An edge `out<T, N>` on rank P -> `in<T>` on rank C becomes, on P, a `remote_sender<T>` consuming
// the output like any local consumer, and on C a `remote_receiver<T, N>` producing into the input
// with N registers of its own. Three tags per edge (channel c): control 3c, message 3c+1, payload 3c+2.
//
// Protocol (all messages of one tag arrive in the order sent):
//  1. C has a free register: it posts a receive for one message (header plus up to
//     `edge_inline_bytes` of payload) and asks for it with a `pull`.
//  2. P has a pull credit and a message in its mailbox: it sends the header, with the payload
//     inline if it is small, or else the header alone followed by the payload on the payload tag,
//     straight from the producer's register. The register stays held by P (not returned to the
//     producer) either way.
//  3. C receives the header (and the payload, inline or on the payload tag, into its register),
//     publishes the register to its local consumers and acknowledges it (`ack`).
//  4. P receives the ack and returns the producer's register: only now can the producer reuse it.
//  Pulls and acks travel as counts in one control message per poll (`edge_control`).
//  End: when P's producer has ended and its mailbox is empty, P answers every pull with an
//  end-of-stream header; C, having seen it for all its pulls, ends its output and sends `close`;
//  P finishes on `close`, C when `close` is sent. Nothing stays posted after the end.
//  Abort: a rank whose graph stops early (an actor threw, or its deadline passed) tells the peer of
//  each unfinished edge: C sets `abort` in a control message (P always has one posted), P sends an
//  abort header (C receives it with its next pull). The peer throws peer_failure naming the rank and
//  the edge, stops its graph and tells its own peers in turn.
// So the producer never has more than N messages unacknowledged, and C never more than N received
// and unconsumed: the register counts hold across ranks. Every wait is a poll from the executor's
// run() loop, under run()'s deadline.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <flexpar/actor/graph_core.hpp>
#include <flexpar/actor/wire.hpp>

namespace flexpar::detail {

/// Payloads up to this size travel inside the header message (one message instead of two).
inline constexpr std::size_t edge_inline_bytes = 4096;

/// A control message of the pull protocol, consumer to producer.
struct edge_control {
  std::uint32_t pulls = 0;  ///< registers newly free on the consumer (pull credits)
  std::uint32_t acks = 0;   ///< messages received since the last control message
  std::uint32_t close = 0;  ///< 1: the consumer has seen the end of the stream; nothing follows
  std::uint32_t abort = 0;  ///< 1: the consumer's graph stopped on a failure; nothing follows
};

/// The header of each message (or alone, at end of stream); an inline payload follows it.
struct edge_header {
  std::uint64_t bytes = 0;           ///< payload size
  std::uint32_t end_of_stream = 0;   ///< 1: no payload, the producer has ended; 2: it aborted
  std::uint32_t inline_payload = 0;  ///< 1: the payload follows in this message, else on the payload tag
};

/// What both ends share: the peer and the tags.
class remote_end : public actor_node {
 public:
  remote_end(std::string label, int rank, node_kind kind, int peer, tag_t channel)
      : actor_node(std::move(label), rank, kind),
        peer_(peer),
        control_tag_(3 * channel),
        message_tag_(3 * channel + 1),
        payload_tag_(3 * channel + 2) {}

  /// Never fired by an executor: the cross-rank ends move through poll().
  fire_result invoke(std::span<regst_base* const>, std::span<regst_base* const>) override { return fire_result::skip; }

  /// This rank's graph stopped early: tell the peer (best effort, a small eager message; waits at
  /// most until `until` for it to leave). Nothing if the edge finished or the peer told us first.
  void abort(transport& t, deadline until) {
    if (finished_ || peer_aborted_) return;
    finished_ = true;
    abort_sent_ = send_abort(t);
    while (!abort_sent_.test() && clock::now() < until) std::this_thread::yield();
  }

 protected:
  virtual request send_abort(transport& t) = 0;
  [[noreturn]] void throw_peer_failure() {
    peer_aborted_ = true;
    finished_ = true;
    throw error_on<peer_failure>(rank(), "", "actor edge '", label(), "': rank ", peer_,
                                 " stopped its graph (an actor failed there or its deadline passed)");
  }

  int peer_;
  tag_t control_tag_, message_tag_, payload_tag_;
  bool finished_ = false;
  bool peer_aborted_ = false;
  request abort_sent_;
  edge_control abort_control_{0, 0, 0, 1};
  edge_header abort_header_{0, 2, 0};
};

/// Producer side of a cross-rank edge: a consumer of the local output that forwards to the peer.
template <class T>
class remote_sender final : public remote_end {
 public:
  remote_sender(std::string label, int rank, int peer, tag_t channel)
      : remote_end(std::move(label), rank, node_kind::remote_sender, peer, channel) {
    mailbox_.consumer = this;
    inputs.push_back(&mailbox_);
  }
  /// The mailbox the local producer's output feeds.
  [[nodiscard]] in<T>& mailbox() noexcept { return mailbox_; }

  bool poll(graph_core& g, transport& t) override {
    if (finished_) return false;
    bool moved = false;
    // Step 4 (and the credits of step 1): control messages from the consumer.
    while (!closed_) {
      if (!control_posted_) {
        control_in_ = t.irecv(peer_, control_tag_, std::as_writable_bytes(std::span(&control_buffer_, 1)));
        control_posted_ = true;
      }
      if (!control_in_.test()) break;
      control_posted_ = false;
      moved = true;
      if (control_buffer_.abort != 0) throw_peer_failure();
      credits_ += control_buffer_.pulls;
      if (control_buffer_.acks > awaiting_ack_.size()) throw_protocol("more acks than messages in flight");
      for (std::uint32_t a = 0; a < control_buffer_.acks; ++a) {
        // The consumer has the bytes, so our sends of them are complete; return the register.
        auto& front = awaiting_ack_.front();
        front.message_sent.wait(deadline_after(g.bus_timeout));
        front.payload_sent.wait(deadline_after(g.bus_timeout));
        {
          std::lock_guard lock(g.mutex);
          g.release(*front.reg);
        }
        awaiting_ack_.pop_front();
      }
      if (control_buffer_.close != 0) closed_ = true;
    }
    // Step 2: answer pulls with a message, or with end-of-stream once the producer ended.
    while (credits_ > 0) {
      regst_base* r = nullptr;
      bool ended = false;
      {
        std::lock_guard lock(g.mutex);
        r = g.take(mailbox_);
        ended = r == nullptr && graph_core::drained(mailbox_);
      }
      if (r == nullptr && !ended) break;
      auto& s = awaiting_ack_.emplace_back();
      edge_header h;
      std::span<const std::byte> payload;
      if (r != nullptr) {
        s.reg = r;
        payload = wire<T>::bytes(static_cast<regst<T>*>(r)->value);
        h.bytes = payload.size();
        h.inline_payload = payload.size() <= edge_inline_bytes ? 1 : 0;
      } else {
        h.end_of_stream = 1;
      }
      s.message.resize(sizeof(h) + (h.inline_payload ? payload.size() : 0));
      std::memcpy(s.message.data(), &h, sizeof(h));
      if (h.inline_payload && !payload.empty())
        std::memcpy(s.message.data() + sizeof(h), payload.data(), payload.size());
      s.message_sent = t.isend(peer_, message_tag_, s.message);
      if (r != nullptr && !h.inline_payload) s.payload_sent = t.isend(peer_, payload_tag_, payload);
      if (r == nullptr) {  // end of stream: nothing to acknowledge; keep only the send
        end_sends_.push_back(std::move(s));
        awaiting_ack_.pop_back();
      }
      --credits_;
      moved = true;
    }
    while (!end_sends_.empty() && end_sends_.front().message_sent.test()) end_sends_.pop_front();
    for (auto& s : awaiting_ack_) {  // progress (some transports move bytes only when tested)
      (void)s.message_sent.test();
      (void)s.payload_sent.test();
    }
    if (closed_ && awaiting_ack_.empty() && end_sends_.empty()) {
      finished_ = true;
      std::lock_guard lock(g.mutex);
      g.finish(*this);
      moved = true;
    }
    return moved;
  }

  [[nodiscard]] std::string waiting_for() const override {
    std::string s = "the pull protocol with rank ";
    s += std::to_string(peer_);
    s += " (control tag ";
    s += std::to_string(control_tag_);
    s += "): ";
    s += std::to_string(credits_);
    s += " pull credit(s), ";
    s += std::to_string(awaiting_ack_.size());
    s += " message(s) awaiting ack, ";
    s += std::to_string(mailbox_.queue.size());
    s += " queued";
    s += closed_ ? ", closed" : "";
    return s;
  }

 private:
  request send_abort(transport& t) override {
    return t.isend(peer_, message_tag_, std::as_bytes(std::span(&abort_header_, 1)));
  }
  // A breach of the edge's own protocol is a bug or a corrupted message, not a failed library
  // call: a plain flexpar::error (transport_error is for MPI, UCX, NCCL and CUDA failures).
  [[noreturn]] void throw_protocol(const char* what) const {
    throw error_on<error>(rank(), "", "actor edge '", label(), "': rank ", peer_, " sent ", what);
  }
  struct in_flight {
    regst_base* reg = nullptr;
    std::vector<std::byte> message;  // header (+ inline payload)
    request message_sent, payload_sent;
  };
  in<T> mailbox_;
  edge_control control_buffer_;
  request control_in_;
  bool control_posted_ = false;
  bool closed_ = false;
  std::uint64_t credits_ = 0;
  std::deque<in_flight> awaiting_ack_;
  std::deque<in_flight> end_sends_;
};

/// Consumer side of a cross-rank edge: an output of N registers filled from the peer.
template <class T, std::size_t N>
class remote_receiver final : public remote_end {
 public:
  /// `registers`: the producer's register count (used when N is dynamic_registers).
  remote_receiver(std::string label, int rank, int peer, tag_t channel, std::size_t registers)
      : remote_end(std::move(label), rank, node_kind::remote_receiver, peer, channel) {
    if constexpr (N == dynamic_registers) output_.set_register_count(registers);
    output_.producer = this;
    outputs.push_back(&output_);
  }
  /// The output the local consumer's input is connected to.
  [[nodiscard]] out<T, N>& output() noexcept { return output_; }

  bool poll(graph_core& g, transport& t) override {
    if (finished_) return false;
    bool moved = false;
    // Step 1: a pull for every free register (until end of stream).
    while (!end_seen_) {
      regst_base* r = nullptr;
      {
        std::lock_guard lock(g.mutex);
        r = g.acquire(output_);
      }
      if (r == nullptr) break;
      auto& p = pulled_.emplace_back();
      p.reg = static_cast<regst<T>*>(r);
      p.message.resize(sizeof(edge_header) + message_room());
      p.message_in = t.irecv(peer_, message_tag_, p.message);
      ++control_.pulls;
      moved = true;
    }
    // Step 3: messages and payloads, in the order pulled.
    while (!pulled_.empty()) {
      auto& p = pulled_.front();
      if (!p.header_done) {
        if (!p.message_in.test()) break;
        p.header_done = true;
        moved = true;
        edge_header h;
        std::memcpy(&h, p.message.data(), sizeof(h));
        if (h.end_of_stream == 2) throw_peer_failure();
        if (h.end_of_stream != 0) {
          end_seen_ = true;
          {
            std::lock_guard lock(g.mutex);
            g.unacquire(*p.reg);
          }
          pulled_.pop_front();
          continue;
        }
        const auto room = wire<T>::prepare(p.reg->value, h.bytes);
        if (h.inline_payload != 0) {
          if (!room.empty()) std::memcpy(room.data(), p.message.data() + sizeof(h), room.size());
        } else {
          p.payload_in = t.irecv(peer_, payload_tag_, room);
        }
      }
      if (!p.payload_in.test()) break;
      ++control_.acks;
      {
        std::lock_guard lock(g.mutex);
        g.publish(*p.reg);
      }
      pulled_.pop_front();
      moved = true;
    }
    // End: every pull answered with end-of-stream.
    if (end_seen_ && pulled_.empty() && !close_sent_) {
      control_.close = 1;
      close_sent_ = true;
      std::lock_guard lock(g.mutex);
      g.end_output(output_);
      moved = true;
    }
    // One control message carries this poll's pulls, acks and close.
    if (control_.pulls != 0 || control_.acks != 0 || control_.close != 0) {
      auto& c = controls_.emplace_back();
      c.message = control_;
      c.sent = t.isend(peer_, control_tag_, std::as_bytes(std::span(&c.message, 1)));
      control_ = {};
    }
    while (!controls_.empty() && controls_.front().sent.test()) controls_.pop_front();
    if (close_sent_ && controls_.empty()) {
      finished_ = true;
      std::lock_guard lock(g.mutex);
      g.finish(*this);
      moved = true;
    }
    return moved;
  }

  [[nodiscard]] std::string waiting_for() const override {
    std::string s = "the pull protocol with rank ";
    s += std::to_string(peer_);
    s += " (message tag ";
    s += std::to_string(message_tag_);
    s += "): ";
    s += std::to_string(pulled_.size());
    s += " pull(s) unanswered, ";
    s += std::to_string(output_.in_use);
    s += " of ";
    s += std::to_string(output_.register_count());
    s += " register(s) in use";
    s += end_seen_ ? ", end of stream seen" : "";
    return s;
  }

 private:
  request send_abort(transport& t) override {
    return t.isend(peer_, control_tag_, std::as_bytes(std::span(&abort_control_, 1)));
  }
  /// Room for an inline payload: the whole of a small fixed-size T, else the inline limit.
  static constexpr std::size_t message_room() {
    if constexpr (std::is_trivially_copyable_v<T>)
      return sizeof(T) <= edge_inline_bytes ? sizeof(T) : 0;
    else
      return edge_inline_bytes;
  }
  struct pulled {
    regst<T>* reg = nullptr;
    std::vector<std::byte> message;
    request message_in, payload_in;
    bool header_done = false;
  };
  struct control_send {
    edge_control message;
    request sent;
  };
  out<T, N> output_;
  std::deque<pulled> pulled_;
  edge_control control_;
  std::deque<control_send> controls_;
  bool end_seen_ = false;
  bool close_sent_ = false;
};

}  // namespace flexpar::detail
