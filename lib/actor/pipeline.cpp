// lib/actor/pipeline.cpp — pipeline parallelism: schedules and the per-stage step loop
// (include/flexpar/actor/pipeline.hpp).
#include <flexpar/actor/pipeline.hpp>
#include <flexpar/timeline.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

namespace flexpar {

std::string_view name_of(pipeline_schedule s) noexcept {
  switch (s) {
    case pipeline_schedule::gpipe: return "gpipe";
    case pipeline_schedule::one_f_one_b: return "1f1b";
  }
  return "?";
}

std::vector<pipeline_op> schedule_ops(pipeline_schedule s, int stages, int stage, int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1) {
    std::string text = "schedule_ops(";
    text += name_of(s);
    text += "): stage ";
    text += std::to_string(stage);
    text += " of ";
    text += std::to_string(stages);
    text += " with ";
    text += std::to_string(micro_batches);
    text += " micro-batch(es); needs 0 <= stage < stages and micro-batches >= 1";
    throw usage_error(text);
  }
  using k = pipeline_op::kind;
  std::vector<pipeline_op> ops;
  ops.reserve(2 * static_cast<std::size_t>(micro_batches));
  if (s == pipeline_schedule::gpipe) {
    for (int i = 0; i < micro_batches; ++i) ops.push_back({k::forward, i});
    for (int i = 0; i < micro_batches; ++i) ops.push_back({k::backward, i});
    return ops;
  }
  // 1F1B: warm-up forwards fill the pipe below us; then each forward is followed by the oldest backward.
  const int warmup = std::min(stages - stage - 1, micro_batches);
  for (int i = 0; i < warmup; ++i) ops.push_back({k::forward, i});
  for (int i = 0; i < micro_batches - warmup; ++i) {
    ops.push_back({k::forward, warmup + i});
    ops.push_back({k::backward, i});
  }
  for (int i = micro_batches - warmup; i < micro_batches; ++i) ops.push_back({k::backward, i});
  return ops;
}

pipeline pipeline_builder::build() { return pipeline(*this); }

pipeline::pipeline(pipeline_builder& b)
    : ranks_(b.ranks_),
      micro_batches_(b.micro_batches_),
      schedule_(b.schedule_),
      input_(b.input_),
      loss_(b.loss_),
      trace_(b.trace_) {
  communicator& comm = *b.comm_;
  auto fail = [&](const std::string& why) { throw error_on<usage_error>(comm.rank(), "pipeline_builder::build", why); };
  if (ranks_.empty()) fail("no stage");
  if (micro_batches_ < 1) fail("micro-batches must be >= 1");
  std::set<int> seen;
  for (std::size_t s = 0; s < ranks_.size(); ++s) {
    const int r = ranks_[s];
    std::string where = "stage ";
    where += std::to_string(s);
    where += " ('";
    where += b.stages_[s].label;
    where += "') on rank ";
    where += std::to_string(r);
    if (r < 0 || r >= comm.size()) {
      where += ", outside the communicator of ";
      where += std::to_string(comm.size());
      where += " rank(s)";
      fail(where);
    }
    if (!seen.insert(r).second) {
      where += ": that rank already holds a stage (one stage per rank)";
      fail(where);
    }
    if (r == comm.rank()) {
      stage_ = static_cast<int>(s);
      mine_ = b.stages_[s];
    }
  }
  if (stage_ == 0 && !input_) fail("stage 0 needs the input function (pipeline_builder::input)");
  if (stage_ == stages() - 1 && !loss_) fail("the last stage needs the loss function (pipeline_builder::loss)");
  if (stage_ >= 0 && (!mine_.forward || !mine_.backward)) fail("a stage needs a forward and a backward function");
  transport_ = comm.transport().split(0, comm.rank());
  if (4 * static_cast<tag_t>(micro_batches_) >= transport_->max_tag()) fail("too many micro-batches for the tag range");
}

void pipeline::receive(int peer, tag_t tag, std::vector<float>& into, deadline until, std::string_view what,
                       int micro_batch) {
  try {
    std::uint64_t size = 0;
    transport_->recv(peer, tag, std::as_writable_bytes(std::span(&size, 1)), until);
    into.resize(size);
    transport_->recv(peer, tag + 1, std::as_writable_bytes(std::span(into.data(), into.size())), until);
  } catch (const timeout_error& e) {
    std::string text = "pipeline stage ";
    text += std::to_string(stage_);
    text += " ('";
    text += mine_.label;
    text += "'): waiting for the ";
    text += what;
    text += " of micro-batch ";
    text += std::to_string(micro_batch);
    text += " from rank ";
    text += std::to_string(peer);
    text += ": ";
    text += e.what();
    throw timeout_error(text);
  }
}

void pipeline::send(int peer, tag_t tag, const std::vector<float>& data) {
  auto o = std::make_unique<outgoing>();
  o->size = data.size();
  o->data = data;
  o->size_sent = transport_->isend(peer, tag, std::as_bytes(std::span(&o->size, 1)));
  o->data_sent = transport_->isend(peer, tag + 1, std::as_bytes(std::span(o->data.data(), o->data.size())));
  sends_.push_back(std::move(o));
}

pipeline_step_stats pipeline::run_step(deadline until) {
  pipeline_step_stats stats;
  stats.stage = stage_;
  if (stage_ < 0) return stats;
  const auto step_begin = clock::now();
  const int p = stages();
  const bool first = stage_ == 0, last = stage_ == p - 1;
  stats.losses.assign(last ? static_cast<std::size_t>(micro_batches_) : 0, 0.0f);
  std::string track = "stage ";
  track += std::to_string(stage_);
  track += ": ";
  track += mine_.label;

  struct stashed {
    std::vector<float> input, output;
  };
  std::map<int, stashed> stash;  // the activations in flight: the memory the schedule bounds
  std::vector<float> grad_out, grad_in;
  auto timed = [&](const char* kind, int mb, auto&& body) {
    const auto b = clock::now();
    body();
    const auto e = clock::now();
    stats.busy_seconds += std::chrono::duration<double>(e - b).count();
    if (trace_) {
      std::string name = kind;
      name += std::to_string(mb);
      trace_->span(track, name, b, e, {{"micro_batch", std::to_string(mb)}});
    }
  };

  for (const pipeline_op& op : schedule_ops(schedule_, p, stage_, micro_batches_)) {
    const int mb = op.micro_batch;
    const tag_t forward_tag = 4 * static_cast<tag_t>(mb), backward_tag = forward_tag + 2;
    if (op.what == pipeline_op::kind::forward) {
      stashed s;
      if (first)
        input_(mb, s.input);
      else
        receive(ranks_[static_cast<std::size_t>(stage_ - 1)], forward_tag, s.input, until, "activation", mb);
      timed("F", mb, [&] { mine_.forward(mb, s.input, s.output); });
      if (!last) send(ranks_[static_cast<std::size_t>(stage_ + 1)], forward_tag, s.output);
      stash.emplace(mb, std::move(s));
      stats.peak_activations = std::max(stats.peak_activations, stash.size());
    } else {
      auto it = stash.find(mb);
      if (last)
        timed("L", mb, [&] { stats.losses[static_cast<std::size_t>(mb)] = loss_(mb, it->second.output, grad_out); });
      else
        receive(ranks_[static_cast<std::size_t>(stage_ + 1)], backward_tag, grad_out, until, "gradient", mb);
      timed("B", mb, [&] { mine_.backward(mb, it->second.input, it->second.output, grad_out, grad_in); });
      if (!first) send(ranks_[static_cast<std::size_t>(stage_ - 1)], backward_tag, grad_in);
      stash.erase(it);
    }
    // Forget the sends already delivered (the rest complete at the end of the step).
    std::erase_if(sends_, [](auto& o) { return o->size_sent.test() && o->data_sent.test(); });
  }
  for (auto& o : sends_) {
    o->size_sent.wait(until);
    o->data_sent.wait(until);
  }
  sends_.clear();
  stats.step_seconds = std::chrono::duration<double>(clock::now() - step_begin).count();
  return stats;
}

}  // namespace flexpar
