// lib/actor/graph_core.cpp — the register / mailbox state machine of an actor graph
// (include/flexpar/actor/graph_core.hpp).
#include <flexpar/actor/graph_core.hpp>
#include <flexpar/actor/remote_edge.hpp>
#include <flexpar/timeline.hpp>

#include <algorithm>
#include <utility>

namespace flexpar::detail {

std::string actor_node::waiting_for() const {
  std::string why;
  for (const in_base* i : inputs) {
    if (i->queue.empty()) {
      why += "a message on input ";
      why += std::to_string(i->index);
      if (i->producer && i->producer->producer) {
        why += " from '";
        why += i->producer->producer->label();
        why += "'";
      }
      why += "; ";
    }
  }
  for (const out_base* o : outputs) {
    if (o->free_list.empty()) {
      why += "a free register of output ";
      why += std::to_string(o->index);
      why += " (all ";
      why += std::to_string(o->register_count());
      why += " held by consumers); ";
    }
  }
  if (why.empty()) why = "its turn to run; ";
  why.resize(why.size() - 2);
  return why;
}

actor_node& graph_core::add(std::unique_ptr<actor_node> node) {
  if (started_) {
    throw error_on<usage_error>(rank_, "actor graph", "cannot add actor '", node->label(), "' after the graph started");
  }
  nodes_.push_back(std::move(node));
  actor_node& n = *nodes_.back();
  if (n.kind() == node_kind::remote_sender || n.kind() == node_kind::remote_receiver) remote_.push_back(&n);
  return n;
}

void graph_core::start() {
  std::unique_lock lock(mutex);
  if (started_) {
    throw error_on<usage_error>(rank_, "actor graph",
                                "run twice; a graph runs once (its registers and streams are spent)");
  }
  for (const auto& n : nodes_) {
    if (n->kind() != node_kind::local) continue;
    for (const in_base* i : n->inputs) {
      if (i->producer == nullptr) {
        throw error_on<usage_error>(rank_, "", "actor '", n->label(), "': input ", i->index,
                                    " is not connected to any output (connect(producer.output<k>(), this.input<i>()))");
      }
    }
    for (const out_base* o : n->outputs) {
      if (o->consumers.empty()) {
        throw error_on<usage_error>(rank_, "", "actor '", n->label(), "': output ", o->index,
                                    " feeds no input; every output needs at least one consumer");
      }
    }
  }
  started_ = true;
  unfinished_ = 0;
  for (const auto& n : nodes_)
    if (n->kind() != node_kind::elsewhere) ++unfinished_;
  for (const auto& n : nodes_) check(*n);
  if (unfinished_ == 0) done_cv.notify_all();
}

void graph_core::check(actor_node& n) {
  if (n.kind() != node_kind::local || n.state_ != node_state::idle || stopping_) return;
  for (const in_base* i : n.inputs) {
    if (drained(*i)) {
      finish(n);
      return;
    }
  }
  for (const in_base* i : n.inputs)
    if (i->queue.empty()) return;
  for (const out_base* o : n.outputs)
    if (o->free_list.empty()) return;
  n.state_ = node_state::queued;
  ready_.push_back(&n);
  // A caller that fires between polls takes one ready actor itself: wake a worker only for more.
  if (!caller_fires || ready_.size() > 1) work_cv.notify_one();
}

bool graph_core::drained(const in_base& i) noexcept { return i.queue.empty() && i.producer && i.producer->ended; }

void graph_core::set_stream_order(int s, std::vector<actor_node*> order) {
  if (started_ || s < 0) {
    throw error_on<usage_error>(rank_, "actor graph", "set_stream_order(", s,
                                "): needs a stream >= 0 and a graph that has not started");
  }
  for (const actor_node* n : order) {
    if (n->stream_ != s) {
      throw error_on<usage_error>(rank_, "actor graph", "set_stream_order(", s, "): actor '", n->label(),
                                  "' is on stream ", n->stream_);
    }
  }
  if (static_cast<std::size_t>(s) >= stream_plans_.size()) stream_plans_.resize(static_cast<std::size_t>(s) + 1);
  stream_plans_[static_cast<std::size_t>(s)] = {std::move(order), 0};
}

bool graph_core::in_turn(const actor_node& n) const noexcept {
  if (n.stream_ < 0) return true;
  const auto s = static_cast<std::size_t>(n.stream_);
  if (s < stream_busy_.size() && stream_busy_[s]) return false;
  if (s >= stream_plans_.size() || stream_plans_[s].order.empty()) return true;
  const stream_plan& plan = stream_plans_[s];
  return plan.next < plan.order.size() && plan.order[plan.next] == &n;
}

bool graph_core::goes_before(const actor_node& a, const actor_node& b) noexcept { return a.priority_ > b.priority_; }

std::deque<actor_node*>::iterator graph_core::next_ready() noexcept {
  auto best = ready_.end();
  for (auto it = ready_.begin(); it != ready_.end(); ++it) {
    if (!in_turn(**it)) continue;
    if (best == ready_.end() || goes_before(**it, **best)) best = it;
  }
  return best;
}

void graph_core::begin_fire(actor_node& n) {
  n.state_ = node_state::running;
  ++running_;
  if (n.stream_ >= 0) {
    const auto s = static_cast<std::size_t>(n.stream_);
    if (s >= stream_busy_.size()) stream_busy_.resize(s + 1, 0);
    stream_busy_[s] = 1;
    if (s < stream_plans_.size() && !stream_plans_[s].order.empty()) ++stream_plans_[s].next;
  }
  n.fire_in_.clear();
  n.fire_out_.clear();
  for (in_base* i : n.inputs) {
    n.fire_in_.push_back(i->queue.front());
    i->queue.pop_front();
  }
  for (out_base* o : n.outputs) n.fire_out_.push_back(acquire(*o));
}

std::exception_ptr graph_core::invoke(actor_node& n, fire_result& result) noexcept {
  try {
    if (trace) {
      const auto begin = clock::now();
      result = n.invoke(n.fire_in_, n.fire_out_);
      trace->span(n.label(), n.label(), begin, clock::now(), {{"firing", std::to_string(n.firings_)}});
    } else {
      result = n.invoke(n.fire_in_, n.fire_out_);
    }
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void graph_core::end_fire(actor_node& n, fire_result result) {
  --running_;
  n.state_ = node_state::idle;
  end_stream(n);
  ++n.firings_;
  for (regst_base* r : n.fire_out_) {
    if (result == fire_result::emit || result == fire_result::last)
      publish(*r);
    else
      unacquire(*r);
  }
  for (regst_base* r : n.fire_in_) release(*r);
  n.fire_in_.clear();
  n.fire_out_.clear();
  if (result == fire_result::done || result == fire_result::last)
    finish(n);
  else
    check(n);
  if (over()) done_cv.notify_all();
}

void graph_core::end_stream(actor_node& n) {
  if (n.stream_ < 0) return;
  stream_busy_[static_cast<std::size_t>(n.stream_)] = 0;
  if (!ready_.empty()) work_cv.notify_one();  // an actor of the stream may wait in the queue
}

void graph_core::fail(actor_node& n, std::exception_ptr e) {
  --running_;
  n.state_ = node_state::idle;
  end_stream(n);
  if (!error_) {
    error_ = std::move(e);
    error_label_ = n.label();
  }
  stop();
}

void graph_core::stop() {
  stopping_ = true;
  for (actor_node* q : ready_) q->state_ = node_state::idle;
  ready_.clear();
  work_cv.notify_all();
  done_cv.notify_all();
}

bool graph_core::fire_one(std::unique_lock<std::mutex>& lock) {
  if (stopping_) return false;
  const auto next = next_ready();
  if (next == ready_.end()) return false;
  actor_node& n = **next;
  ready_.erase(next);
  begin_fire(n);
  lock.unlock();
  fire_result result = fire_result::emit;
  std::exception_ptr e = invoke(n, result);
  lock.lock();
  if (e)
    fail(n, std::move(e));
  else
    end_fire(n, result);
  return true;
}

void graph_core::work() {
  std::unique_lock lock(mutex);
  for (;;) {
    work_cv.wait(lock, [&] { return next_ready() != ready_.end() || stopping_ || complete(); });
    if (stopping_ || (complete() && ready_.empty())) return;
    fire_one(lock);
  }
}

bool graph_core::poll_remote() {
  bool moved = false;
  for (actor_node* n : remote_) {
    try {
      moved = n->poll(*this, *bus) || moved;
    } catch (...) {
      std::lock_guard lock(mutex);
      if (!error_) {
        error_ = std::current_exception();
        error_label_ = n->label();
        error_is_remote_ = true;
      }
      stop();
      return true;
    }
  }
  return moved;
}

void graph_core::abort_remote(deadline until) {
  for (actor_node* n : remote_) static_cast<remote_end*>(n)->abort(*bus, until);
}

void graph_core::rethrow_failure() const {
  if (!error_) return;
  if (error_is_remote_) std::rethrow_exception(error_);
  std::string text = error_text(rank_, "", "actor '", error_label_, "' failed: ");
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    text += e.what();
    std::throw_with_nested(actor_failure(error_label_, text));
  } catch (...) {
    text += "an exception not derived from std::exception";
    std::throw_with_nested(actor_failure(error_label_, text));
  }
}

timeout_error graph_core::timeout(std::string_view op) const {
  std::string text = error_text(rank_, op, "deadline passed with ", unfinished_, " actor(s) of this rank unfinished:");
  for (const auto& n : nodes_) {
    if (n->kind() == node_kind::elsewhere || n->state_ == node_state::finished) continue;
    text += " '";
    text += n->label();
    text += "' waits for ";
    text += n->waiting_for();
    const auto s = static_cast<std::size_t>(n->stream_);
    if (n->stream_ >= 0 && s < stream_plans_.size() && !stream_plans_[s].order.empty()) {
      const stream_plan& plan = stream_plans_[s];
      text += " (stream ";
      text += std::to_string(n->stream_);
      text += "'s order is at ";
      text += std::to_string(plan.next);
      text += " of ";
      text += std::to_string(plan.order.size());
      if (plan.next < plan.order.size()) {
        text += ", next '";
        text += plan.order[plan.next]->label();
        text += "'";
      }
      text += ")";
    }
    text += ";";
  }
  return timeout_error(text);
}

regst_base* graph_core::acquire(out_base& o) {
  if (o.free_list.empty()) return nullptr;
  regst_base* r = o.free_list.back();
  o.free_list.pop_back();
  ++o.in_use;
  o.peak_in_use = std::max(o.peak_in_use, o.in_use);
  return r;
}

void graph_core::unacquire(regst_base& r) {
  out_base& o = *r.owner;
  o.free_list.push_back(&r);
  --o.in_use;
}

void graph_core::publish(regst_base& r) {
  out_base& o = *r.owner;
  r.sequence = o.published++;
  r.readers_left = static_cast<int>(o.consumers.size());
  for (in_base* i : o.consumers) {
    if (i->closed) {
      release(r);
    } else {
      i->queue.push_back(&r);
      check(*i->consumer);
    }
  }
}

void graph_core::end_output(out_base& o) {
  o.ended = true;
  for (in_base* i : o.consumers) check(*i->consumer);
}

regst_base* graph_core::take(in_base& i) {
  if (i.queue.empty()) return nullptr;
  regst_base* r = i.queue.front();
  i.queue.pop_front();
  return r;
}

void graph_core::release(regst_base& r) {
  if (--r.readers_left > 0) return;
  out_base& o = *r.owner;
  o.free_list.push_back(&r);
  --o.in_use;
  if (o.producer) check(*o.producer);
}

void graph_core::finish(actor_node& n) {
  if (n.state_ == node_state::finished) return;
  n.state_ = node_state::finished;
  --unfinished_;
  for (in_base* i : n.inputs) {
    i->closed = true;
    while (!i->queue.empty()) {
      regst_base* r = i->queue.front();
      i->queue.pop_front();
      release(*r);
    }
  }
  for (out_base* o : n.outputs) end_output(*o);
  if (over()) {
    done_cv.notify_all();
    work_cv.notify_all();
  }
}

}  // namespace flexpar::detail
