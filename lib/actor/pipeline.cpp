// lib/actor/pipeline.cpp — pipeline parallelism as an actor graph per step
// (include/flexpar/actor/pipeline.hpp).
#include <flexpar/actor/deterministic_scheduler.hpp>
#include <flexpar/actor/executor.hpp>
#include <flexpar/actor/pipeline.hpp>
#include <flexpar/timeline.hpp>

#include <algorithm>
#include <chrono>
#include <iterator>

namespace flexpar {

namespace {
using tensor = std::vector<float>;
using stash_out = out<tensor, dynamic_registers>;

// Who goes first among a rank's ready actors: GPipe its forwards, 1F1B its backwards (they free the
// stash). Among actors of equal priority the graph fires the one ready first.
int priority_of(pipeline_schedule s, bool backward) { return (s == pipeline_schedule::gpipe) != backward ? 1 : 0; }
}  // namespace

std::string_view name_of(pipeline_schedule s) noexcept {
  switch (s) {
    case pipeline_schedule::gpipe: return "gpipe";
    case pipeline_schedule::one_f_one_b: return "1f1b";
  }
  return "?";
}

std::size_t stash_registers(pipeline_schedule s, int stages, int stage, int micro_batches, int stages_per_stream) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1 || stages_per_stream < 1) {
    const std::string op = std::string("stash_registers(").append(name_of(s)).append(")");
    throw error_on<usage_error>(no_rank, op, "stage ", stage, " of ", stages, " with ", micro_batches,
                                " micro-batch(es) and ", stages_per_stream, " stage(s) per stream",
                                "; needs 0 <= stage < stages, micro-batches >= 1 and stages per stream >= 1");
  }
  if (s == pipeline_schedule::gpipe) return static_cast<std::size_t>(micro_batches);
  const int interleaved = stages_per_stream > 1 ? 1 : 0;
  return static_cast<std::size_t>(std::min(stages - stage + interleaved, micro_batches));
}

double pipeline_bubble_theory(int ranks, int stages_per_rank, int micro_batches) noexcept {
  const double idle = ranks - 1;
  return idle / (static_cast<double>(stages_per_rank) * micro_batches + idle);
}

namespace {
// One stage's mesh, normalized: the ranks, the extents, the layouts.
struct mesh_of_stage {
  std::vector<int> ranks;
  std::vector<int> shape;
  sbp::nd_parallel input, output;
  int group = 0;  // the stream group: stages on the same ranks and stream take turns

  [[nodiscard]] std::vector<int> coords(std::size_t index) const { return sbp::mesh_coords(index, shape); }
  [[nodiscard]] sbp::box box(const sbp::shape_t& s, const sbp::nd_parallel& layout, std::size_t index) const {
    const auto c = coords(index);
    return sbp::shard_box(s, layout, shape, c);
  }
  // Holds data that no other rank of the mesh copies: coordinate 0 on every axis where `layout` is B.
  [[nodiscard]] bool owner(const sbp::nd_parallel& layout, std::size_t index) const {
    const auto c = coords(index);
    for (std::size_t d = 0; d < shape.size(); ++d)
      if (layout[d].is_broadcast() && c[d] != 0) return false;
    return true;
  }
};

// A piece of an activation (or gradient) moving from mesh index `src` of one stage to mesh index
// `dst` of its neighbour: `piece` in the boundary's logical coordinates.
struct transfer {
  std::size_t src, dst;
  sbp::box piece;
};

bool same_box(const sbp::box& a, const sbp::box& b) { return a.offset == b.offset && a.extent == b.extent; }

// dst[box at dst_offset] += src (a dense tensor of shape `extent`).
void add_box(const float* src, float* dst, const sbp::shape_t& dst_shape, const sbp::shape_t& dst_offset,
             const sbp::shape_t& extent) {
  if (sbp::elements_of(extent) == 0) return;
  const sbp::shape_t dst_strides = sbp::strides_of(dst_shape);
  const std::size_t rank = extent.size();
  std::vector<std::size_t> index(rank, 0);
  const std::size_t row = extent.back();
  for (std::size_t done = 0; done < sbp::elements_of(extent); done += row) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < rank; ++i) at += (dst_offset[i] + index[i]) * dst_strides[i];
    for (std::size_t k = 0; k < row; ++k) dst[at + k] += src[done + k];
    for (std::size_t i = rank - 1; i-- > 0;) {  // next row (the last axis is the row itself)
      if (++index[i] < extent[i]) break;
      index[i] = 0;
    }
  }
}
// A stage's tensor must have the elements of its box (the layouts and the activation shapes say);
// `rank` is the rank of the split or gather actor that checks it (where the check runs).
void check_size(int rank, const tensor& t, const sbp::box& b, const char* what) {
  if (t.size() == b.elements()) return;
  throw error_on<usage_error>(rank, "pipeline", "a tensor of ", t.size(), " element(s) reached the ", what,
                              " of a box of extents ", sbp::to_string(b.extent), " (", b.elements(),
                              " elements); the stage wrote a tensor that is not its box under its layout");
}

// The ports of stage j on mesh index i, whichever actor types its position gives it.
struct ports {
  in<tensor>* activation = nullptr;  // F's input (j > 0)
  stash_out* x = nullptr;            // F's outputs
  stash_out* y = nullptr;
  in<tensor>* bx = nullptr;  // B's inputs
  in<tensor>* by = nullptr;
  in<tensor>* bg = nullptr;  // (not on the last stage)
  stash_out* gx = nullptr;   // B's output (j > 0)
  detail::actor_node* f = nullptr;
  detail::actor_node* b = nullptr;
};
// By stage, then by mesh index: every stage's ports on every rank (each rank builds the whole graph).
using port_table = std::vector<std::vector<ports>>;

// One boundary crossed in one direction (stage j -> j + 1 forward, j + 1 -> j backward): its pieces,
// the meshes and layouts on both sides, and which pieces each source sends and each destination takes.
struct crossing {
  int j;
  bool backward;
  std::vector<transfer> moves;
  const mesh_of_stage* from;
  const mesh_of_stage* to;
  const sbp::nd_parallel* from_layout;
  const sbp::nd_parallel* to_layout;
  const sbp::shape_t* shape;                           // null: the pipeline has no shapes
  std::vector<std::vector<std::size_t>> out_of, into;  // per source, per destination: indices into moves

  [[nodiscard]] sbp::box from_box(std::size_t i) const {
    return shape ? from->box(*shape, *from_layout, i) : sbp::box{};
  }
  [[nodiscard]] sbp::box to_box(std::size_t k) const { return shape ? to->box(*shape, *to_layout, k) : sbp::box{}; }
  // Source i's output that carries the crossing: the gradient of stage j + 1, or the activation of j.
  [[nodiscard]] stash_out& source_port(port_table& at, std::size_t i) const {
    ports& pt = at[static_cast<std::size_t>(backward ? j + 1 : j)][i];
    return backward ? *pt.gx : *pt.y;
  }
  // Destination k's input that takes it.
  [[nodiscard]] in<tensor>& target_port(port_table& at, std::size_t k) const {
    ports& pt = at[static_cast<std::size_t>(backward ? j : j + 1)][k];
    return backward ? *pt.bg : *pt.activation;
  }
};
}  // namespace

struct pipeline::state {
  communicator* comm;
  std::shared_ptr<transport> bus;
  std::vector<mesh_of_stage> meshes;
  std::vector<pipeline_stage> stages;
  std::vector<sbp::shape_t> shapes;
  std::vector<int> local;
  int micro_batches;
  pipeline_schedule schedule;
  std::vector<std::size_t> stash;
  std::size_t gradient_registers;
  std::vector<int> streams;
  std::function<void(int, tensor&)> input;
  std::function<float(int, const tensor&, tensor&)> loss;
  timeline* trace;
  actor_executor pool;
  bool broken = false;
  bool fixed = false;
  std::vector<std::vector<int>> order;  // by group: the firings, 2 j (forward of stage j) or 2 j + 1 (backward)

  explicit state(pipeline_builder& b)
      : comm(b.comm_),
        stages(b.stages_),
        shapes(b.shapes_),
        micro_batches(b.micro_batches_),
        schedule(b.schedule_),
        stash(b.stash_),
        gradient_registers(b.gradient_registers_),
        streams(b.streams_),
        input(b.input_),
        loss(b.loss_),
        trace(b.trace_),
        pool(std::max<std::size_t>(b.threads_, 1), false) {}

  [[nodiscard]] int count() const noexcept { return static_cast<int>(meshes.size()); }
  // This rank's index in stage j's mesh, or -1.
  [[nodiscard]] int index_in(int j) const {
    const auto& r = meshes[static_cast<std::size_t>(j)].ranks;
    const auto it = std::find(r.begin(), r.end(), comm->rank());
    return it == r.end() ? -1 : static_cast<int>(it - r.begin());
  }
  // The pieces crossing boundary j (stage j -> j + 1): forward (activation) or backward (gradient).
  [[nodiscard]] std::vector<transfer> transfers(int j, bool backward) const;
};

struct pipeline_step::state {
  explicit state(const pipeline::state& p) : graph(*p.comm, p.bus), pipe(&p) {}
  struct stage_record {
    int stage;
    stash_out* x = nullptr;  // the stash's input side: its peak is the activations held
    double busy = 0;
    std::string track;
  };
  actor_graph graph;
  const pipeline::state* pipe;
  std::vector<stage_record> local;  // in the order of pipe->local
  std::vector<float> losses;

  // make_step's parts, in the order it runs them (pipeline.cpp, after the pipeline's accessors).
  void add_records();
  [[nodiscard]] port_table add_stage_actors();
  void add_forward(ports& pt, int rank, const std::string& label, stage_record* rec, const pipeline_stage* sp,
                   bool first);
  void add_backward(ports& pt, int rank, std::string label, stage_record* rec, const pipeline_stage* sp, bool first,
                    bool last);
  void order_streams(const port_table& at);
  void connect_stashes(port_table& at);
  [[nodiscard]] crossing plan_crossing(int j, bool backward) const;
  [[nodiscard]] std::vector<stash_out*> add_splits(port_table& at, const crossing& c);
  void add_gathers(port_table& at, const crossing& c, const std::vector<stash_out*>& piece_port);

  stage_record* record_of(int j) {
    for (auto& r : local)
      if (r.stage == j) return &r;
    return nullptr;
  }
  // Runs `body` as firing `kind``mb` of stage `r`: its busy time and its span on the timeline.
  template <class F>
  void timed(stage_record& r, const char* kind, int mb, F&& body) {
    const auto b = clock::now();
    body();
    const auto e = clock::now();
    r.busy += std::chrono::duration<double>(e - b).count();
    if (pipe->trace) {
      std::string name = kind;
      name += std::to_string(mb);
      pipe->trace->span(r.track, name, b, e, {{"micro_batch", std::to_string(mb)}});
    }
  }
};

pipeline_step::pipeline_step(std::unique_ptr<state> s) : s_(std::move(s)) {}
pipeline_step::pipeline_step(pipeline_step&&) noexcept = default;
pipeline_step& pipeline_step::operator=(pipeline_step&&) noexcept = default;
pipeline_step::~pipeline_step() = default;
actor_graph& pipeline_step::graph() noexcept { return s_->graph; }

pipeline_step_stats pipeline_step::stats() const {
  pipeline_step_stats out;
  for (const auto& r : s_->local) {
    out.stages.push_back({r.stage, r.x->register_count(), r.x->peak_registers_in_use(), r.busy});
    out.busy_seconds += r.busy;
  }
  out.losses = s_->losses;
  return out;
}

pipeline pipeline_builder::build() { return pipeline(*this); }

std::vector<transfer> pipeline::state::transfers(int j, bool backward) const {
  const mesh_of_stage& a = meshes[static_cast<std::size_t>(j)];      // gives the activation
  const mesh_of_stage& c = meshes[static_cast<std::size_t>(j + 1)];  // takes it
  std::vector<transfer> out;
  if (shapes.empty()) {  // two one-rank stages: the whole tensor, whatever its shape
    out.push_back({0, 0, {}});
    return out;
  }
  const sbp::shape_t& shape = shapes[static_cast<std::size_t>(j)];
  // Forward: each owner of a piece of stage j's output sends it to every rank of stage j + 1 whose
  // input box meets it. Backward: every rank of stage j + 1 sends its gradient's part to every rank
  // of stage j whose output box meets it (replicas of a broadcast input send partial sums).
  const mesh_of_stage& from = backward ? c : a;
  const mesh_of_stage& to = backward ? a : c;
  const sbp::nd_parallel& from_layout = backward ? c.input : a.output;
  const sbp::nd_parallel& to_layout = backward ? a.output : c.input;
  std::vector<bool> fed(to.ranks.size(), false);
  for (std::size_t i = 0; i < from.ranks.size(); ++i) {
    if (!backward && !from.owner(from_layout, i)) continue;
    const sbp::box fb = from.box(shape, from_layout, i);
    for (std::size_t k = 0; k < to.ranks.size(); ++k) {
      const sbp::box piece = sbp::intersect(fb, to.box(shape, to_layout, k));
      if (piece.elements() == 0) continue;
      out.push_back({i, k, piece});
      fed[k] = true;
    }
  }
  // A rank with an empty box still takes one (empty) message per micro-batch: it drives its actors.
  for (std::size_t k = 0; k < to.ranks.size(); ++k) {
    if (fed[k]) continue;
    std::size_t i = 0;
    while (!backward && !from.owner(from_layout, i)) ++i;
    sbp::box piece = to.box(shape, to_layout, k);
    out.push_back({i, k, piece});
  }
  // A gradient with an empty box still goes somewhere (an empty piece): every output has a consumer.
  for (std::size_t i = 0; backward && i < from.ranks.size(); ++i) {
    const bool sends = std::any_of(out.begin(), out.end(), [&](const transfer& t) { return t.src == i; });
    if (!sends) out.push_back({i, 0, from.box(shape, from_layout, i)});
  }
  std::sort(out.begin(), out.end(),
            [](const transfer& x, const transfer& y) { return x.src != y.src ? x.src < y.src : x.dst < y.dst; });
  return out;
}

namespace {
// The unit-time machine's order of one step: runs the stage-level graph (F_j, B_j per stage, the
// step's counts and priorities, stage j on stream meshes[j].group) with run_rounds and records, per
// group, the firings in the order they happened (2 j: forward of stage j, 2 j + 1: its backward).
std::vector<std::vector<int>> unit_time_order(const std::vector<mesh_of_stage>& meshes,
                                              const std::vector<std::size_t>& stash, std::size_t gradient_registers,
                                              pipeline_schedule schedule, int m, int groups) {
  std::vector<std::vector<int>> order(static_cast<std::size_t>(groups));
  actor_graph g;
  const int count = static_cast<int>(meshes.size());
  std::vector<dynamic_actor<tensor>*> f(static_cast<std::size_t>(count)), b(static_cast<std::size_t>(count));
  for (int j = 0; j < count; ++j) {
    const int group = meshes[static_cast<std::size_t>(j)].group;
    auto& seq = order[static_cast<std::size_t>(group)];
    const bool first = j == 0, last = j == count - 1;
    f[static_cast<std::size_t>(j)] = &g.add_dynamic_actor<tensor>(
        0, "F" + std::to_string(j), first ? 0 : 1, 2,
        [&seq, j, first, m, i = 0](std::span<const tensor* const>, std::span<tensor* const>) mutable {
          seq.push_back(2 * j);
          return first && ++i == m ? fire_result::last : fire_result::emit;
        });
    b[static_cast<std::size_t>(j)] =
        &g.add_dynamic_actor<tensor>(0, "B" + std::to_string(j), last ? 2 : 3, first ? 0 : 1,
                                     [&seq, j](std::span<const tensor* const>, std::span<tensor* const>) {
                                       seq.push_back(2 * j + 1);
                                       return fire_result::emit;
                                     });
    for (auto* a : {f[static_cast<std::size_t>(j)], b[static_cast<std::size_t>(j)]}) a->set_stream(group);
    f[static_cast<std::size_t>(j)]->set_priority(priority_of(schedule, false));
    b[static_cast<std::size_t>(j)]->set_priority(priority_of(schedule, true));
    for (int o = 0; o < 2; ++o)
      f[static_cast<std::size_t>(j)]->output(o).set_register_count(stash[static_cast<std::size_t>(j)]);
    if (!first) b[static_cast<std::size_t>(j)]->output(0).set_register_count(gradient_registers);
  }
  for (int j = 0; j < count; ++j) {
    auto& fj = *f[static_cast<std::size_t>(j)];
    auto& bj = *b[static_cast<std::size_t>(j)];
    g.connect(fj.output(0), bj.input(0));
    g.connect(fj.output(1), bj.input(1));
    if (j + 1 < count) {
      g.connect(fj.output(1), f[static_cast<std::size_t>(j + 1)]->input(0));
      g.connect(b[static_cast<std::size_t>(j + 1)]->output(0), bj.input(2));
    }
  }
  deterministic_scheduler d(g);
  d.run_rounds(deadline_after(std::chrono::seconds(60)));
  return order;
}
}  // namespace

pipeline::pipeline(pipeline_builder& b) : s_(std::make_unique<state>(b)) {
  state& p = *s_;
  communicator& comm = *p.comm;
  auto fail = [&](const std::string& why) { throw error_on<usage_error>(comm.rank(), "pipeline_builder::build", why); };
  const int count = static_cast<int>(b.meshes_.size());
  if (count == 0) fail("no stage");
  if (p.micro_batches < 1) fail("micro-batches must be >= 1");
  if (p.gradient_registers < 1) fail("gradient registers must be >= 1");
  auto sized = [&](std::size_t have, const char* what) {
    if (have == 0 || have == static_cast<std::size_t>(count)) return;
    std::string text = what;
    text += " has ";
    text += std::to_string(have);
    text += " entry(ies) for ";
    text += std::to_string(count);
    text += " stage(s)";
    fail(text);
  };
  sized(p.stash.size(), "stash_registers");
  sized(p.streams.size(), "streams");
  if (p.streams.empty()) p.streams.assign(static_cast<std::size_t>(count), 0);

  bool several = false;  // some stage spans several ranks
  for (int j = 0; j < count; ++j) {
    const stage_mesh& given = b.meshes_[static_cast<std::size_t>(j)];
    const auto& st = p.stages[static_cast<std::size_t>(j)];
    std::string where = "stage ";
    where += std::to_string(j);
    where += " ('";
    where += st.label;
    where += "')";
    mesh_of_stage mesh{given.ranks, given.shape, given.input, given.output};
    if (mesh.shape.empty()) mesh.shape.push_back(static_cast<int>(mesh.ranks.size()));
    std::size_t cells = 1;
    for (int e : mesh.shape) cells *= e > 0 ? static_cast<std::size_t>(e) : 0;
    if (mesh.ranks.empty() || cells != mesh.ranks.size() || mesh.shape.size() > sbp::max_mesh_rank) {
      fail(where + ": a mesh of " + std::to_string(mesh.ranks.size()) + " rank(s) with extents whose product is " +
           std::to_string(cells) + " (1 to 4 axes, each >= 1)");
    }
    for (std::size_t i = 0; i < mesh.ranks.size(); ++i) {
      const int r = mesh.ranks[i];
      if (r < 0 || r >= comm.size()) {
        fail(where + " on rank " + std::to_string(r) + ", outside the communicator of " + std::to_string(comm.size()) +
             " rank(s)");
      }
      if (std::count(mesh.ranks.begin(), mesh.ranks.end(), r) > 1)
        fail(where + ": rank " + std::to_string(r) + " is in its mesh twice");
    }
    if (mesh.ranks.size() == 1) {  // a one-rank mesh: its layouts say nothing; keep them B on its one axis
      mesh.shape = {1};
      mesh.input = mesh.output = sbp::nd_parallel{};
    } else {
      several = true;
      for (const sbp::nd_parallel* layout : {&mesh.input, &mesh.output}) {
        if (layout->rank != mesh.shape.size() || layout->any_partial()) {
          fail(where + ": layout " + sbp::to_string(*layout) + " on a mesh of " + std::to_string(mesh.shape.size()) +
               " axis(es); it needs one entry per mesh axis, each split or broadcast (reduce a partial result inside "
               "the stage)");
        }
      }
    }
    for (int k = 0; k < j; ++k) {  // equal or disjoint: a rank belongs to one device group per stream
      const auto& other = p.meshes[static_cast<std::size_t>(k)].ranks;
      std::vector<int> x = other, y = mesh.ranks;
      std::sort(x.begin(), x.end());
      std::sort(y.begin(), y.end());
      std::vector<int> both;
      std::set_intersection(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(both));
      if (!both.empty() && x != y) {
        fail(where + "'s mesh shares rank " + std::to_string(both.front()) + " with stage " + std::to_string(k) +
             "'s without being the same ranks; meshes of stages are equal or disjoint");
      }
    }
    if (p.streams[static_cast<std::size_t>(j)] < 0) fail(where + ": a stream is a number >= 0");
    p.meshes.push_back(std::move(mesh));
  }
  // Groups: stages on the same ranks and the same stream take turns (one device).
  {
    std::vector<std::pair<std::vector<int>, int>> keys;
    for (int j = 0; j < count; ++j) {
      auto ranks = p.meshes[static_cast<std::size_t>(j)].ranks;
      std::sort(ranks.begin(), ranks.end());
      std::pair<std::vector<int>, int> key{std::move(ranks), p.streams[static_cast<std::size_t>(j)]};
      auto it = std::find(keys.begin(), keys.end(), key);
      if (it == keys.end()) it = keys.insert(keys.end(), std::move(key));
      p.meshes[static_cast<std::size_t>(j)].group = static_cast<int>(it - keys.begin());
    }
  }
  if (several && p.shapes.size() != static_cast<std::size_t>(count - 1)) {
    fail("a stage spans several ranks: activation_shapes needs the shape of each of the " + std::to_string(count - 1) +
         " activation(s) between stages (it has " + std::to_string(p.shapes.size()) + ")");
  }
  if (!several) p.shapes.clear();
  for (std::size_t j = 0; j < p.shapes.size(); ++j) {
    for (const auto* layout : {&p.meshes[j].output, &p.meshes[j + 1].input}) {
      for (std::size_t d = 0; d < layout->rank; ++d) {
        if ((*layout)[d].is_split() && static_cast<std::size_t>((*layout)[d].axis) >= p.shapes[j].size()) {
          fail("activation " + std::to_string(j) + " of shape " + sbp::to_string(p.shapes[j]) + " cannot be " +
               sbp::to_string(*layout) + ": no such tensor axis");
        }
      }
    }
  }
  if (p.stash.empty()) {
    for (int j = 0; j < count; ++j) {
      int sharing = 0;  // stages that take turns on stage j's device
      for (int k = 0; k < count; ++k)
        sharing += p.meshes[static_cast<std::size_t>(k)].group == p.meshes[static_cast<std::size_t>(j)].group ? 1 : 0;
      p.stash.push_back(stash_registers(p.schedule, count, j, p.micro_batches, sharing));
    }
  }
  for (int j = 0; j < count; ++j) {
    std::string where = "stage " + std::to_string(j) + " ('" + p.stages[static_cast<std::size_t>(j)].label + "')";
    if (p.stash[static_cast<std::size_t>(j)] < 1) fail(where + ": a stash of 0 registers holds no micro-batch");
    if (p.index_in(j) >= 0) {
      const auto& st = p.stages[static_cast<std::size_t>(j)];
      if (!st.forward || !st.backward) fail(where + ": a stage needs a forward and a backward function");
      p.local.push_back(j);
    }
  }
  if (p.index_in(0) >= 0 && !p.input) fail("stage 0 needs the input function (pipeline_builder::input)");
  if (p.index_in(count - 1) >= 0 && !p.loss) fail("the last stage needs the loss function (pipeline_builder::loss)");
  p.fixed = b.fixed_order_ < 0 ? several : b.fixed_order_ == 1;
  if (p.fixed) {
    int groups = 0;
    for (const auto& mesh : p.meshes) groups = std::max(groups, mesh.group + 1);
    p.order = unit_time_order(p.meshes, p.stash, p.gradient_registers, p.schedule, p.micro_batches, groups);
  }
  p.bus = comm.transport().split(0, comm.rank());
}

pipeline::pipeline(pipeline&&) noexcept = default;
pipeline& pipeline::operator=(pipeline&&) noexcept = default;
pipeline::~pipeline() = default;

int pipeline::stage() const noexcept { return s_->local.empty() ? -1 : s_->local.front(); }
const std::vector<int>& pipeline::local_stages() const noexcept { return s_->local; }
int pipeline::stages() const noexcept { return s_->count(); }
int pipeline::micro_batches() const noexcept { return s_->micro_batches; }
pipeline_schedule pipeline::schedule() const noexcept { return s_->schedule; }
const std::vector<std::size_t>& pipeline::stash() const noexcept { return s_->stash; }

// ---- make_step's parts, in the order it runs them -------------------------------------------------
// Every rank builds the whole graph, in the same order: cross-rank edges are numbered by it.

// Step 1: a record per local stage (its timeline track, its busy time), and a loss slot per
// micro-batch on the last stage's ranks.
void pipeline_step::state::add_records() {
  const pipeline::state& p = *pipe;
  const int count = p.count();
  losses.assign(p.index_in(count - 1) >= 0 ? static_cast<std::size_t>(p.micro_batches) : 0, 0.0f);
  for (int j : p.local) {
    std::string track = "stage ";
    track += std::to_string(j);
    track += ": ";
    track += p.stages[static_cast<std::size_t>(j)].label;
    local.push_back({j, nullptr, 0.0, std::move(track)});
  }
}

// Step 2: each stage's forward (F) and backward (B) actor on each rank of its mesh, on the stage
// group's stream, with the schedule's priorities; returns their ports.
port_table pipeline_step::state::add_stage_actors() {
  const pipeline::state& p = *pipe;
  const int count = p.count();
  const int me = p.comm->rank();
  port_table at(static_cast<std::size_t>(count));
  for (int j = 0; j < count; ++j) {
    const mesh_of_stage& mesh = p.meshes[static_cast<std::size_t>(j)];
    const pipeline_stage& stage = p.stages[static_cast<std::size_t>(j)];
    const bool first = j == 0, last = j == count - 1;
    const std::size_t k = p.stash[static_cast<std::size_t>(j)];
    at[static_cast<std::size_t>(j)].resize(mesh.ranks.size());
    for (std::size_t i = 0; i < mesh.ranks.size(); ++i) {
      const int rank = mesh.ranks[i];
      ports& pt = at[static_cast<std::size_t>(j)][i];
      stage_record* rec = rank == me ? record_of(j) : nullptr;
      const pipeline_stage* sp = &stage;
      std::string label = stage.label;
      if (mesh.ranks.size() > 1) label += "@" + std::to_string(rank);

      add_forward(pt, rank, label, rec, sp, first);
      pt.x->set_register_count(k);
      pt.y->set_register_count(k);
      add_backward(pt, rank, label + ".backward", rec, sp, first, last);
      if (pt.gx) pt.gx->set_register_count(p.gradient_registers);
      if (rec) rec->x = pt.x;
      // One stream per device group; its actors fire in the unit-time machine's order if fixed.
      pt.f->set_stream(mesh.group);
      pt.b->set_stream(mesh.group);
      pt.f->set_priority(priority_of(p.schedule, false));
      pt.b->set_priority(priority_of(p.schedule, true));
    }
  }
  return at;
}

// F of one stage on one rank: the first stage's takes its micro-batch from the input function, the
// others' from the activation port; each stashes its input and output (x, y) for B.
void pipeline_step::state::add_forward(ports& pt, int rank, const std::string& label, stage_record* rec,
                                       const pipeline_stage* sp, bool first) {
  actor_graph& g = graph;
  state* st = this;
  const int m = pipe->micro_batches;
  if (first) {
    auto& a = g.add_actor<stash_out, stash_out>(rank, label + ".forward",
                                                [st, rec, sp, m, i = 0](tensor& x, tensor& y) mutable {
                                                  st->pipe->input(i, x);
                                                  st->timed(*rec, "F", i, [&] { sp->forward(i, x, y); });
                                                  return ++i == m ? fire_result::last : fire_result::emit;
                                                });
    pt.x = &a.output<0>();
    pt.y = &a.output<1>();
    pt.f = &a;
  } else {
    auto& a = g.add_actor<in<tensor>, stash_out, stash_out>(
        rank, label + ".forward", [st, rec, sp, i = 0](const tensor& in, tensor& x, tensor& y) mutable {
          x = in;
          st->timed(*rec, "F", i, [&] { sp->forward(i, x, y); });
          ++i;
        });
    pt.activation = &a.input<0>();
    pt.x = &a.output<0>();
    pt.y = &a.output<1>();
    pt.f = &a;
  }
}

// B of one stage on one rank: its ports by position (the last stage's takes its gradient from the
// loss function; the first stage's sends none back).
void pipeline_step::state::add_backward(ports& pt, int rank, std::string label, stage_record* rec,
                                        const pipeline_stage* sp, bool first, bool last) {
  actor_graph& g = graph;
  state* st = this;
  auto backward = [st, rec, sp, last, i = 0, g_loss = tensor{}, g_scratch = tensor{}](
                      const tensor& x, const tensor& y, const tensor* gy, tensor* gx) mutable {
    if (last) {
      st->timed(*rec, "L", i, [&] { st->losses[static_cast<std::size_t>(i)] = st->pipe->loss(i, y, g_loss); });
      gy = &g_loss;
    }
    st->timed(*rec, "B", i, [&] { sp->backward(i, x, y, *gy, gx ? *gx : g_scratch); });
    ++i;
  };
  if (last && first) {
    auto& a = g.add_actor<in<tensor>, in<tensor>>(
        rank, label, [backward](const tensor& x, const tensor& y) mutable { backward(x, y, nullptr, nullptr); });
    pt.bx = &a.input<0>();
    pt.by = &a.input<1>();
    pt.b = &a;
  } else if (last) {
    auto& a = g.add_actor<in<tensor>, in<tensor>, stash_out>(
        rank, label,
        [backward](const tensor& x, const tensor& y, tensor& gx) mutable { backward(x, y, nullptr, &gx); });
    pt.bx = &a.input<0>();
    pt.by = &a.input<1>();
    pt.gx = &a.output<0>();
    pt.b = &a;
  } else if (first) {
    auto& a = g.add_actor<in<tensor>, in<tensor>, in<tensor>>(
        rank, label,
        [backward](const tensor& x, const tensor& y, const tensor& gy) mutable { backward(x, y, &gy, nullptr); });
    pt.bx = &a.input<0>();
    pt.by = &a.input<1>();
    pt.bg = &a.input<2>();
    pt.b = &a;
  } else {
    auto& a = g.add_actor<in<tensor>, in<tensor>, in<tensor>, stash_out>(
        rank, label, [backward](const tensor& x, const tensor& y, const tensor& gy, tensor& gx) mutable {
          backward(x, y, &gy, &gx);
        });
    pt.bx = &a.input<0>();
    pt.by = &a.input<1>();
    pt.bg = &a.input<2>();
    pt.gx = &a.output<0>();
    pt.b = &a;
  }
}

// Step 3 (a fixed order only): each local group's actors fire in the recorded order.
void pipeline_step::state::order_streams(const port_table& at) {
  const pipeline::state& p = *pipe;
  std::vector<int> groups;
  for (int j : p.local) {
    const int group = p.meshes[static_cast<std::size_t>(j)].group;
    if (std::find(groups.begin(), groups.end(), group) != groups.end()) continue;
    groups.push_back(group);
    std::vector<detail::actor_node*> order;
    for (int firing : p.order[static_cast<std::size_t>(group)]) {
      const int j2 = firing / 2;
      const ports& pt = at[static_cast<std::size_t>(j2)][static_cast<std::size_t>(p.index_in(j2))];
      order.push_back(firing % 2 == 0 ? pt.f : pt.b);
    }
    graph.set_stream_order(group, std::move(order));
  }
}

// Step 4: each stage's stash, F's (x, y) into B.
void pipeline_step::state::connect_stashes(port_table& at) {
  for (auto& stage : at) {
    for (ports& pt : stage) {
      graph.connect(*pt.x, *pt.bx);
      graph.connect(*pt.y, *pt.by);
    }
  }
}

// Step 5, for each boundary and direction: its pieces, sources and destinations (plan_crossing), the
// sources' split actors (add_splits), the destinations' gather actors and the edges (add_gathers).
crossing pipeline_step::state::plan_crossing(int j, bool backward) const {
  const pipeline::state& p = *pipe;
  const mesh_of_stage& a = p.meshes[static_cast<std::size_t>(j)];
  const mesh_of_stage& c = p.meshes[static_cast<std::size_t>(j + 1)];
  crossing x{j,
             backward,
             p.transfers(j, backward),
             backward ? &c : &a,
             backward ? &a : &c,
             backward ? &c.input : &a.output,
             backward ? &a.output : &c.input,
             p.shapes.empty() ? nullptr : &p.shapes[static_cast<std::size_t>(j)],
             {},
             {}};
  // Per source: its pieces; per destination: the pieces it takes (both in `moves` order).
  x.out_of.resize(x.from->ranks.size());
  x.into.resize(x.to->ranks.size());
  for (std::size_t t = 0; t < x.moves.size(); ++t) {
    x.out_of[x.moves[t].src].push_back(t);
    x.into[x.moves[t].dst].push_back(t);
  }
  return x;
}

// A source whose one piece is its whole box sends its output as it is; else a split actor on its rank
// cuts the pieces. Returns the port each piece leaves from.
std::vector<stash_out*> pipeline_step::state::add_splits(port_table& at, const crossing& c) {
  const auto& moves = c.moves;
  const mesh_of_stage& from = *c.from;
  std::vector<stash_out*> piece_port(moves.size(), nullptr);
  for (std::size_t i = 0; i < from.ranks.size(); ++i) {
    const auto& ts = c.out_of[i];
    if (ts.empty()) continue;
    const sbp::box whole = c.from_box(i);
    if (ts.size() == 1 && (!c.shape || same_box(moves[ts[0]].piece, whole))) {
      piece_port[ts[0]] = &c.source_port(at, i);
      continue;
    }
    std::vector<sbp::box> pieces;
    for (std::size_t t : ts) pieces.push_back(moves[t].piece);
    std::string label = (c.backward ? "split gradient " : "split activation ") + std::to_string(c.j) + "@" +
                        std::to_string(from.ranks[i]);
    auto& split = graph.add_dynamic_actor<tensor>(
        from.ranks[i], label, 1, ts.size(),
        [rank = from.ranks[i], whole, pieces](std::span<const tensor* const> in, std::span<tensor* const> out) {
          const tensor& src = *in[0];
          check_size(rank, src, whole, "split");
          for (std::size_t t = 0; t < out.size(); ++t) {
            out[t]->resize(pieces[t].elements());
            sbp::copy_box(std::span<const float>(src), whole.extent, sbp::relative(pieces[t].offset, whole.offset),
                          std::span<float>(*out[t]), pieces[t].extent, sbp::shape_t(whole.extent.size(), 0),
                          pieces[t].extent);
          }
          return fire_result::emit;
        });
    for (std::size_t u = 0; u < ts.size(); ++u) {
      split.output(u).set_register_count(2);
      piece_port[ts[u]] = &split.output(u);
    }
    graph.connect(c.source_port(at, i), split.input(0));
  }
  return piece_port;
}

// A destination whose one piece is its whole box takes it as it is; else a gather actor on its rank
// places the pieces (forward) or adds them, in source order (backward: partial sums).
void pipeline_step::state::add_gathers(port_table& at, const crossing& c, const std::vector<stash_out*>& piece_port) {
  const bool backward = c.backward;
  const auto& moves = c.moves;
  const mesh_of_stage& to = *c.to;
  for (std::size_t k = 0; k < to.ranks.size(); ++k) {
    const auto& ts = c.into[k];
    const sbp::box whole = c.to_box(k);
    if (ts.size() == 1 && (!c.shape || same_box(moves[ts[0]].piece, whole))) {
      graph.connect(*piece_port[ts[0]], c.target_port(at, k));
      continue;
    }
    std::vector<sbp::box> pieces;
    for (std::size_t t : ts) pieces.push_back(moves[t].piece);
    std::string label =
        (backward ? "sum gradient " : "gather activation ") + std::to_string(c.j) + "@" + std::to_string(to.ranks[k]);
    auto& gather = graph.add_dynamic_actor<tensor>(
        to.ranks[k], label, ts.size(), 1,
        [rank = to.ranks[k], whole, pieces, backward](std::span<const tensor* const> in, std::span<tensor* const> out) {
          tensor& dst = *out[0];
          dst.assign(whole.elements(), 0.0f);
          for (std::size_t u = 0; u < in.size(); ++u) {
            check_size(rank, *in[u], pieces[u], backward ? "sum" : "gather");
            if (backward)
              add_box(in[u]->data(), dst.data(), whole.extent, sbp::relative(pieces[u].offset, whole.offset),
                      pieces[u].extent);
            else
              sbp::copy_box(std::span<const float>(*in[u]), pieces[u].extent, sbp::shape_t(whole.extent.size(), 0),
                            std::span<float>(dst), whole.extent, sbp::relative(pieces[u].offset, whole.offset),
                            pieces[u].extent);
          }
          return fire_result::emit;
        });
    gather.output(0).set_register_count(backward ? pipe->gradient_registers : 2);
    for (std::size_t u = 0; u < ts.size(); ++u) graph.connect(*piece_port[ts[u]], gather.input(u));
    graph.connect(gather.output(0), c.target_port(at, k));
  }
}

// The step's graph, built in named steps (above): records, actors, their order (if fixed), the
// stashes' edges, then each boundary's pieces forward and backward.
pipeline_step pipeline::make_step() {
  if (s_->broken) {
    throw error_on<usage_error>(s_->comm->rank(), "pipeline",
                                "an earlier step failed; its edges may hold half-delivered messages, so this "
                                "pipeline runs no more steps (build a new one)");
  }
  auto step = std::make_unique<pipeline_step::state>(*s_);
  pipeline_step::state& st = *step;
  st.add_records();                         // step 1
  port_table at = st.add_stage_actors();    // step 2
  if (s_->fixed) st.order_streams(at);      // step 3
  st.connect_stashes(at);                   // step 4
  for (int j = 0; j + 1 < stages(); ++j) {  // step 5
    for (bool backward : {false, true}) {
      const crossing c = st.plan_crossing(j, backward);
      const std::vector<stash_out*> piece_port = st.add_splits(at, c);
      st.add_gathers(at, c, piece_port);
    }
  }
  return pipeline_step(std::move(step));
}

pipeline_step_stats pipeline::run_step(deadline until) {
  if (s_->local.empty() && !s_->broken) return {};
  const auto begin = clock::now();
  pipeline_step step = make_step();
  try {
    s_->pool.run(step.graph(), until);
  } catch (...) {
    s_->broken = true;
    throw;
  }
  pipeline_step_stats stats = step.stats();
  stats.step_seconds = std::chrono::duration<double>(clock::now() - begin).count();
  return stats;
}

}  // namespace flexpar
