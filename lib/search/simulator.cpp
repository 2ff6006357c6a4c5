// lib/search/simulator.cpp — the execution simulator: task skeleton, task costs from the SBP layer and the collectives'
// cost functions, FIFO-queue event simulation, and delta simulation (header: flexpar/search/simulator.hpp).
#include <flexpar/collective/allreduce_hierarchical.hpp>
#include <flexpar/collective/allreduce_ring.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/relax/bytegrad.hpp>
#include <flexpar/relax/decentralized.hpp>
#include <flexpar/relax/low_precision_decentralized.hpp>
#include <flexpar/relax/onebit_adam.hpp>
#include <flexpar/sbp/boxing.hpp>
#include <flexpar/search/simulator.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>

namespace flexpar::search {

using sbp::nd_parallel;
using sbp::parallel;
using sbp::shape_t;

std::string_view name_of(sync_policy p) noexcept {
  switch (p) {
    case sync_policy::exact: return "exact";
    case sync_policy::compressed: return "compressed";
    case sync_policy::relaxed: return "relaxed";
  }
  return "?";
}

sync_policy sync_policy_from(std::string_view name) {
  for (sync_policy p : {sync_policy::exact, sync_policy::compressed, sync_policy::relaxed})
    if (name == name_of(p)) return p;
  throw error_on<usage_error>(no_rank, "search::sync_policy_from", "no policy '", name,
                              "'; policies: exact compressed relaxed");
}

sync_policy policy_of(algorithm a) noexcept {
  switch (a) {
    case algorithm::bytegrad: return sync_policy::compressed;
    case algorithm::onebit_adam:
    case algorithm::decentralized:
    case algorithm::low_precision_decentralized:
    case algorithm::qadam:
    case algorithm::async_model_average:
    case algorithm::local_sgd: return sync_policy::relaxed;
    default: return sync_policy::exact;  // none, the collectives' algorithms, gradient_allreduce
  }
}

double sync_seconds(algorithm a, const sync_group& grp, double bytes, const cluster& c) {
  const int p = grp.ranks;
  if (p <= 1 || a == algorithm::none) return 0;
  const cost_params m = c.params(grp.nodes > 1);
  const compression_rates& z = c.compression;
  const double share = 1.0 + 1.0 / p;  // encode: every partition once, then my reduced one
  const double bucket = 4 * bytes;     // the relaxations fuse the tensors into one bucket and back (2 copies)
  switch (a) {
    case algorithm::none: return 0;
    case algorithm::ring: return allreduce_ring_cost(p, bytes).seconds(m);
    case algorithm::hierarchical:
      if (grp.nodes <= 1 || grp.per_node <= 1) return std::numeric_limits<double>::infinity();
      return allreduce_hierarchical_cost(grp.per_node, grp.nodes, bytes, m).seconds(m);
    case algorithm::bytegrad:  // alltoall + allgather of min-max uint8 partitions (compressed_average)
      return cost{2.0 * (p - 1), relax::bytegrad::wire_bytes(bytes, p), bytes + bucket}.seconds(m) +
             share * bytes / z.minmax_encode + 2 * bytes / z.minmax_decode;
    case algorithm::onebit_adam:  // the same pattern with the 1-bit codec, and its own Adam passes
      return cost{2.0 * (p - 1), relax::onebit_adam::wire_bytes(bytes, p), bytes + bucket}.seconds(m) +
             share * bytes / z.onebit_encode + 2 * bytes / z.onebit_decode + bytes / z.adam_update;
    case algorithm::decentralized:  // one exchange with one peer, then an average
      return cost{1.0, relax::decentralized::wire_bytes(bytes, p, relax::peer_selection::shift_one), bytes + bucket}
          .seconds(m);
    case algorithm::low_precision_decentralized: {  // encoded differences to q ring neighbours
      const double q = p == 2 ? 1.0 : 2.0;
      return cost{q, relax::low_precision_decentralized::wire_bytes(bytes, p), (2 * q + 2) * bytes + bucket}.seconds(
                 m) +
             bytes / z.minmax_encode + (q + 1) * bytes / z.minmax_decode;
    }
    default: return std::numeric_limits<double>::infinity();  // not one the simulator models
  }
}

namespace {

enum class task_kind : unsigned char {
  forward_boxing,
  forward,
  loss_boxing,
  backward,
  backward_boxing,
  allreduce,
  update
};

struct task {
  task_kind kind = task_kind::forward;
  std::size_t op = 0;     // the op (the consumer, for boxing tasks)
  std::size_t input = 0;  // boxing: which input of `op`
  std::vector<std::size_t> deps;
  double duration = 0;      // strategy dependent
  std::vector<int> queues;  // strategy dependent: compute queue d = d, link queue d = devices + d
};

struct entry {
  std::size_t task;
  double end;
};

/// Where an op's tensors live under a config: device set and mesh.
struct placed {
  int first = 0;
  std::vector<int> mesh;
  int devices = 1;
};

/// The SBP with every entry's dual (the layout of a gradient): S -> S, B -> P(sum), P -> B.
nd_parallel dual(nd_parallel s) {
  for (std::size_t d = 0; d < s.rank; ++d) {
    if (s[d].is_broadcast())
      s[d] = parallel::P();
    else if (s[d].is_partial())
      s[d] = parallel::B();
  }
  return s;
}

std::size_t overlap(const sbp::box& a, const sbp::box& b) {
  std::size_t n = 1;
  for (std::size_t k = 0; k < a.offset.size(); ++k) {
    const std::size_t lo = std::max(a.offset[k], b.offset[k]);
    const std::size_t hi = std::min(a.offset[k] + a.extent[k], b.offset[k] + b.extent[k]);
    if (hi <= lo) return 0;
    n *= hi - lo;
  }
  return n;
}

}  // namespace

struct simulator::impl {
  graph g;
  cluster cl;
  std::vector<task> tasks;
  std::vector<std::vector<std::size_t>> op_tasks;  // every task whose cost depends on op i's config
  std::vector<std::size_t> first_task;             // the first of them in program order
  strategy cfg;
  std::vector<sbp_signature> sig;
  std::vector<op_times> times;
  std::vector<double> end;
  std::vector<double> queue_free;
  std::vector<std::vector<entry>> history;
  std::vector<std::uint64_t> memory;  // parameter bytes per device (exact integers: delta == full)
  double step = 0;
  bool simulated = false;
  sync_policy policy = sync_policy::exact;
  std::optional<kernel_profile> profile;

  impl(graph gr, cluster c) : g(std::move(gr)), cl(c) {
    cl.validate();
    build_skeleton();
    queue_free.assign(2 * static_cast<std::size_t>(cl.devices()), 0.0);
    history.assign(queue_free.size(), {});
  }

  std::size_t add_task(task t) {
    tasks.push_back(std::move(t));
    return tasks.size() - 1;
  }

  void build_skeleton() {
    const std::size_t n = g.ops.size();
    std::vector<std::size_t> fwd(n), bwd(n), loss(n, 0);
    std::vector<std::vector<std::size_t>> fwd_edge(n), bwd_edge(n);
    op_tasks.assign(n, {});
    first_task.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {  // 1. forward phase
      std::vector<std::size_t> edges;
      for (std::size_t k = 0; k < g.ops[i].inputs.size(); ++k)
        edges.push_back(add_task({task_kind::forward_boxing, i, k, {fwd[g.ops[i].inputs[k]]}, 0, {}}));
      fwd[i] = add_task({task_kind::forward, i, 0, edges, 0, {}});
      first_task[i] = edges.empty() ? fwd[i] : edges.front();
      fwd_edge[i] = std::move(edges);
      if (g.consumers(i).empty()) loss[i] = add_task({task_kind::loss_boxing, i, 0, {fwd[i]}, 0, {}});
    }
    for (std::size_t i = n; i-- > 0;) {  // 2. backward phase (consumers first)
      std::vector<std::size_t> deps{fwd[i]};
      if (g.consumers(i).empty()) deps.push_back(loss[i]);
      for (std::size_t c : g.consumers(i))
        for (std::size_t k = 0; k < g.ops[c].inputs.size(); ++k)
          if (g.ops[c].inputs[k] == i) deps.push_back(bwd_edge[c][k]);
      bwd[i] = add_task({task_kind::backward, i, 0, deps, 0, {}});
      for (std::size_t k = 0; k < g.ops[i].inputs.size(); ++k)
        bwd_edge[i].push_back(add_task({task_kind::backward_boxing, i, k, {bwd[i]}, 0, {}}));
    }
    std::vector<std::size_t> reduce(n, 0);
    for (std::size_t i = n; i-- > 0;)
      if (g.ops[i].param_bytes > 0) reduce[i] = add_task({task_kind::allreduce, i, 0, {bwd[i]}, 0, {}});
    std::vector<std::size_t> update(n, 0);
    for (std::size_t i = 0; i < n; ++i)  // 3. update phase
      if (g.ops[i].param_bytes > 0) update[i] = add_task({task_kind::update, i, 0, {reduce[i]}, 0, {}});
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<std::size_t>& mine = op_tasks[i];
      mine.insert(mine.end(), fwd_edge[i].begin(), fwd_edge[i].end());
      mine.push_back(fwd[i]);
      if (g.consumers(i).empty()) mine.push_back(loss[i]);
      mine.push_back(bwd[i]);
      mine.insert(mine.end(), bwd_edge[i].begin(), bwd_edge[i].end());
      if (g.ops[i].param_bytes > 0) {
        mine.push_back(reduce[i]);
        mine.push_back(update[i]);
      }
      for (std::size_t c : g.consumers(i))
        for (std::size_t k = 0; k < g.ops[c].inputs.size(); ++k)
          if (g.ops[c].inputs[k] == i) {
            mine.push_back(fwd_edge[c][k]);
            mine.push_back(bwd_edge[c][k]);
          }
    }
  }

  placed where(std::size_t i) const { return {cfg[i].first_device, sig[i].mesh, cfg[i].devices()}; }

  bool axis_crosses_nodes(const placed& p, std::size_t d) const {
    int stride = 1;
    for (std::size_t e = d + 1; e < p.mesh.size(); ++e) stride *= p.mesh[e];
    for (int x = 0; x < p.devices; ++x) {
      const int c = (x / stride) % p.mesh[d];
      if (cl.node_of(p.first + x) != cl.node_of(p.first + x - c * stride)) return true;
    }
    return false;
  }

  /// Seconds of the SBP route from -> to on one placement (each step priced on its axis's link).
  double route_seconds(const shape_t& shape, const nd_parallel& from, const nd_parallel& to, const placed& p) const {
    const sbp::route r = sbp::plan(from, to, sbp::extents_of(p.mesh));
    double t = 0;
    const std::vector<int> origin(p.mesh.size(), 0);
    for (std::size_t k = 0; k < r.count; ++k) {
      const sbp::route_step& s = r.steps[k];
      const sbp::box held = sbp::shard_box(shape, r.before[k], p.mesh, origin, s.axis);
      const cost c =
          sbp::axis_step_cost(s.from, s.to, p.mesh[s.axis], static_cast<double>(held.elements() * g.element_bytes));
      t += c.seconds(cl.params(axis_crosses_nodes(p, s.axis)));
    }
    return t;
  }

  /// The queues a transfer touching device d holds: its link queue, and its compute queue too when the
  /// cluster does not overlap communication with computation.
  void comm_queues(int d, std::vector<int>& q) const {
    for (int id : {cl.devices() + d, d})
      if ((id != d || !cl.overlap) && std::find(q.begin(), q.end(), id) == q.end()) q.push_back(id);
  }
  void link_queues(const placed& p, std::vector<int>& q) const {
    for (int x = 0; x < p.devices; ++x) comm_queues(p.first + x, q);
  }
  void compute_queues(const placed& p, std::vector<int>& q) const {
    for (int x = 0; x < p.devices; ++x) q.push_back(p.first + x);
  }

  /// A tensor of `shape` as `from` on `src` becomes `to` on `dst`: its duration and link queues.
  void transfer(task& t, const shape_t& shape, const nd_parallel& from, const placed& src, const nd_parallel& to,
                const placed& dst) const {
    t.queues.clear();
    t.duration = 0;
    if (src.first == dst.first && src.mesh == dst.mesh) {  // one placement: an SBP boxing route
      if (from == to) return;
      t.duration = route_seconds(shape, from, to, src);
      link_queues(src, t.queues);
      return;
    }
    // A placement change (doc/sbp.md): partial entries -> B on the source mesh, then every destination
    // receives the part of its box it does not hold from the source shards that hold it.
    nd_parallel whole = from;
    for (std::size_t d = 0; d < whole.rank; ++d)
      if (whole[d].is_partial()) whole[d] = parallel::B();
    double reduce = whole == from ? 0.0 : route_seconds(shape, from, whole, src);
    nd_parallel need = to;
    for (std::size_t d = 0; d < need.rank; ++d)
      if (need[d].is_partial()) need[d] = parallel::B();  // a partial target: every rank takes it whole
    std::vector<sbp::box> shards;  // one per distinct source shard (coordinate 0 on broadcast axes)
    std::vector<int> holder;
    std::vector<sbp::box> own(static_cast<std::size_t>(src.devices));
    for (int x = 0; x < src.devices; ++x) {
      const std::vector<int> c = sbp::mesh_coords(static_cast<std::size_t>(x), src.mesh);
      own[static_cast<std::size_t>(x)] = sbp::shard_box(shape, whole, src.mesh, c);
      bool canonical = true;
      for (std::size_t d = 0; d < whole.rank; ++d)
        if (!whole[d].is_split() && c[d] != 0) canonical = false;
      if (canonical) {
        shards.push_back(own[static_cast<std::size_t>(x)]);
        holder.push_back(src.first + x);
      }
    }
    double slowest = 0;
    for (int y = 0; y < dst.devices; ++y) {
      const int device = dst.first + y;
      const sbp::box want =
          sbp::shard_box(shape, need, dst.mesh, sbp::mesh_coords(static_cast<std::size_t>(y), dst.mesh));
      std::size_t local = 0;
      const bool holds = device >= src.first && device < src.first + src.devices;
      if (holds) local = overlap(want, own[static_cast<std::size_t>(device - src.first)]);
      const std::size_t missing = want.elements() - local;
      if (missing == 0) continue;
      double messages = 0;
      bool remote_node = false;
      for (std::size_t s = 0; s < shards.size(); ++s) {
        if (holder[s] == device) continue;
        if (overlap(want, shards[s]) == 0) continue;
        messages += 1;
        if (cl.node_of(holder[s]) != cl.node_of(device)) remote_node = true;
      }
      const cost_params m = cl.params(remote_node);
      slowest = std::max(slowest, messages * m.alpha + static_cast<double>(missing * g.element_bytes) * m.beta);
    }
    t.duration = reduce + slowest;
    if (t.duration > 0) {
      link_queues(src, t.queues);
      for (int y = 0; y < dst.devices; ++y) comm_queues(dst.first + y, t.queues);
    }
  }

  static double split_degree(const nd_parallel& s, const std::vector<int>& mesh) {
    double k = 1;
    for (std::size_t d = 0; d < s.rank; ++d)
      if (s[d].is_split()) k *= mesh[d];
    return k;
  }

  double input_bytes(std::size_t i) const {
    double b = 0;
    for (std::size_t in : g.ops[i].inputs) b += g.output_bytes(in);
    if (g.ops[i].inputs.empty())
      b = static_cast<double>(g.ops[i].batch * g.ops[i].in_channels * g.ops[i].spatial * g.element_bytes);
    return b;
  }

  double weight_share(std::size_t i) const { return g.ops[i].param_bytes / split_degree(sig[i].weight, sig[i].mesh); }

  double compute_seconds(std::size_t i, double factor) const {
    const op& o = g.ops[i];
    if (profile) {  // measured kernels: the slowest device has the first (largest) balanced shard
      const double measured = profile->seconds(o, cfg[i], factor > 1);
      if (measured >= 0) return cl.kernel_latency + measured;
    }
    const sbp_signature& s = sig[i];
    const double n = cfg[i].devices();
    const double bytes = input_bytes(i) / split_degree(s.input, s.mesh) +
                         g.output_bytes(i) / split_degree(s.output, s.mesh) + weight_share(i);
    return cl.kernel_latency + factor * std::max(o.forward_flops / n / cl.flops, bytes / cl.memory_bandwidth);
  }

  /// The weight-gradient synchronization of op i: over the weight's replicas, per group the cheapest
  /// algorithm the policy allows (the network decides); the slowest group is the task's duration.
  void allreduce_cost(std::size_t i, task& t) {
    static constexpr algorithm choices[] = {algorithm::ring,          algorithm::hierarchical,
                                            algorithm::bytegrad,      algorithm::onebit_adam,
                                            algorithm::decentralized, algorithm::low_precision_decentralized};
    const sbp_signature& s = sig[i];
    const placed p = where(i);
    t.queues.clear();
    t.duration = 0;
    times[i].algorithm = algorithm::none;
    int replicas = 1;
    for (std::size_t d = 0; d < s.weight.rank; ++d)
      if (!s.weight[d].is_split()) replicas *= s.mesh[d];
    if (replicas == 1) return;
    const double bytes = weight_share(i);
    std::map<std::vector<int>, std::map<int, int>> groups;  // split coordinates -> node -> devices
    for (int x = 0; x < p.devices; ++x) {
      std::vector<int> c = sbp::mesh_coords(static_cast<std::size_t>(x), p.mesh);
      for (std::size_t d = 0; d < s.weight.rank; ++d)
        if (!s.weight[d].is_split()) c[d] = -1;
      ++groups[c][cl.node_of(p.first + x)];
    }
    algorithm slowest = algorithm::ring;
    for (const auto& [key, nodes] : groups) {
      sync_group grp{replicas, static_cast<int>(nodes.size()), nodes.begin()->second};
      for (const auto& [node, count] : nodes)
        if (count != grp.per_node) grp.per_node = 0;
      double best = std::numeric_limits<double>::infinity();
      algorithm pick = algorithm::ring;
      for (algorithm a : choices) {  // ties keep the earlier (the exact ones come first)
        if (policy_of(a) > policy) continue;
        const double seconds = sync_seconds(a, grp, bytes, cl);
        if (seconds < best) {
          best = seconds;
          pick = a;
        }
      }
      if (best >= t.duration) {
        t.duration = best;
        slowest = pick;
      }
    }
    times[i].algorithm = slowest;
    times[i].gradient_allreduce = t.duration;
    link_queues(p, t.queues);
  }

  void cost_task(std::size_t id) {
    task& t = tasks[id];
    const std::size_t i = t.op;
    switch (t.kind) {
      case task_kind::forward:
      case task_kind::backward:
      case task_kind::update: {
        t.queues.clear();
        compute_queues(where(i), t.queues);
        if (t.kind == task_kind::update) {
          const double measured = profile ? profile->update_seconds(g.ops[i], cfg[i]) : -1.0;
          t.duration = cl.kernel_latency + (measured >= 0 ? measured : 4.0 * weight_share(i) / cl.memory_bandwidth);
          times[i].update = t.duration;
        } else {
          t.duration = compute_seconds(i, t.kind == task_kind::forward ? 1.0 : 2.0);
          (t.kind == task_kind::forward ? times[i].forward : times[i].backward) = t.duration;
        }
        break;
      }
      case task_kind::allreduce: allreduce_cost(i, t); break;
      case task_kind::loss_boxing: {  // the loss needs the model's output whole: P(sum) -> S(0) and back
        const op& o = g.ops[i];
        const shape_t shape{o.batch, o.out_channels, o.spatial};
        nd_parallel whole = sig[i].output;
        for (std::size_t d = 0; d < whole.rank; ++d)
          if (whole[d].is_partial()) whole[d] = parallel::S(0);
        t.queues.clear();
        t.duration = 0;
        if (whole == sig[i].output) break;
        const placed p = where(i);
        t.duration =
            route_seconds(shape, sig[i].output, whole, p) + route_seconds(shape, whole, dual(sig[i].output), p);
        link_queues(p, t.queues);
        break;
      }
      case task_kind::forward_boxing:
      case task_kind::backward_boxing: {
        const std::size_t u = g.ops[i].inputs[t.input];
        const op& producer = g.ops[u];
        const shape_t shape{producer.batch, producer.out_channels, producer.spatial};
        if (t.kind == task_kind::forward_boxing)
          transfer(t, shape, sig[u].output, where(u), sig[i].input, where(i));
        else
          transfer(t, shape, dual(sig[i].input), where(i), dual(sig[u].output), where(u));
        break;
      }
    }
  }

  void add_memory(std::size_t i, bool add) {
    if (g.ops[i].param_bytes <= 0) return;
    // weights, gradients and two optimizer states, rounded up to whole bytes per device
    const auto share = static_cast<std::uint64_t>(4.0 * weight_share(i) + 0.999);
    for (int x = 0; x < cfg[i].devices(); ++x) {
      std::uint64_t& m = memory[static_cast<std::size_t>(cfg[i].first_device + x)];
      m = add ? m + share : m - share;
    }
  }

  void input_boxing_time(std::size_t i) {
    times[i].input_boxing = 0;
    times[i].backward_boxing = 0;
    for (std::size_t id : op_tasks[i]) {
      const task& t = tasks[id];
      if (t.op != i) continue;
      if (t.kind == task_kind::forward_boxing) times[i].input_boxing += t.duration;
      if (t.kind == task_kind::backward_boxing || t.kind == task_kind::loss_boxing)
        times[i].backward_boxing += t.duration;
    }
  }

  void schedule_from(std::size_t k) {
    for (std::size_t q = 0; q < history.size(); ++q) {
      std::vector<entry>& h = history[q];
      while (!h.empty() && h.back().task >= k) h.pop_back();
      queue_free[q] = h.empty() ? 0.0 : h.back().end;
    }
    for (std::size_t id = k; id < tasks.size(); ++id) {
      const task& t = tasks[id];
      double start = 0;
      for (std::size_t d : t.deps) start = std::max(start, end[d]);
      for (int q : t.queues) start = std::max(start, queue_free[static_cast<std::size_t>(q)]);
      const double e = start + t.duration;
      end[id] = e;
      for (int q : t.queues) {
        queue_free[static_cast<std::size_t>(q)] = e;
        history[static_cast<std::size_t>(q)].push_back({id, e});
      }
    }
    double last = 0;
    for (double e : end) last = std::max(last, e);
    step = last;
    for (std::uint64_t m : memory)
      if (m > cl.memory_bytes) step = std::numeric_limits<double>::infinity();
  }

  void check(std::size_t i, const soap_config& c) const {
    if (!valid(g.ops[i], c, cl))
      throw error_on<usage_error>(no_rank, "search::simulator", "op ", i, " '", g.ops[i].name, "': config ",
                                  to_string(c), " is not valid for a ", name_of(g.ops[i].kind), " op on ", cl.devices(),
                                  " devices");
  }

  double simulate(const strategy& s) {
    if (s.size() != g.ops.size())
      throw error_on<usage_error>(no_rank, "search::simulator::simulate", "the strategy has ", s.size(),
                                  " configs, the graph '", g.name, "' has ", g.ops.size(), " ops");
    for (std::size_t i = 0; i < s.size(); ++i) check(i, s[i]);
    cfg = s;
    sig.clear();
    for (std::size_t i = 0; i < s.size(); ++i) sig.push_back(signature_of(g.ops[i], s[i]));
    times.assign(s.size(), {});
    for (std::size_t id = 0; id < tasks.size(); ++id) cost_task(id);
    for (std::size_t i = 0; i < s.size(); ++i) input_boxing_time(i);
    memory.assign(static_cast<std::size_t>(cl.devices()), 0);
    for (std::size_t i = 0; i < s.size(); ++i) add_memory(i, true);
    end.assign(tasks.size(), 0.0);
    for (auto& h : history) h.clear();
    schedule_from(0);
    simulated = true;
    return step;
  }

  double change(std::size_t i, const soap_config& c) {
    if (!simulated) throw error_on<usage_error>(no_rank, "search::simulator::change", "call simulate() first");
    if (i >= g.ops.size())
      throw error_on<usage_error>(no_rank, "search::simulator::change", "op ", i, " of a graph of ", g.ops.size());
    check(i, c);
    add_memory(i, false);
    cfg[i] = c;
    sig[i] = signature_of(g.ops[i], c);
    add_memory(i, true);
    times[i] = {};
    for (std::size_t id : op_tasks[i]) cost_task(id);
    input_boxing_time(i);
    for (std::size_t cns : g.consumers(i)) input_boxing_time(cns);
    schedule_from(first_task[i]);
    return step;
  }
};

simulator::simulator(graph g, cluster c) : impl_(std::make_unique<impl>(std::move(g), c)) {}
simulator::simulator(graph g, cluster c, kernel_profile profile) : impl_(std::make_unique<impl>(std::move(g), c)) {
  impl_->profile = std::move(profile);
}
simulator::~simulator() = default;
simulator::simulator(simulator&&) noexcept = default;
simulator& simulator::operator=(simulator&&) noexcept = default;
double simulator::simulate(const strategy& s) { return impl_->simulate(s); }
double simulator::change(std::size_t i, const soap_config& c) { return impl_->change(i, c); }
double simulator::step_time() const noexcept { return impl_->step; }
const strategy& simulator::current() const noexcept { return impl_->cfg; }
op_times simulator::times_of(std::size_t i) const { return impl_->times.at(i); }
void simulator::set_policy(sync_policy p) noexcept {
  impl_->policy = p;
  impl_->simulated = false;
}
sync_policy simulator::policy() const noexcept { return impl_->policy; }
const graph& simulator::model() const noexcept { return impl_->g; }
const cluster& simulator::machine() const noexcept { return impl_->cl; }
std::size_t simulator::task_count() const noexcept { return impl_->tasks.size(); }

}  // namespace flexpar::search
