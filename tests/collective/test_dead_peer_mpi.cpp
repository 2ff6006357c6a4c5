// A rank of 3 (the last, or VICTIM) killed (SIGKILL) or stopped (SIGSTOP) while the others wait for
// it: every survivor must throw peer_failure naming that rank within 3 s, with FLEXPAR_TIMEOUT at
// 300 s; with `shrink`, the survivors then agree on who failed (with VICTIM 0, the agreement's first
// coordinator is the one that died), make a communicator of the two of them, rebuild what they used
// on it and go on. Run by tests/collective/dead_peer.sh (which launches so that the launcher leaves
// the survivors running), which checks what each survivor prints:
//
//   test_dead_peer_mpi OP [shrink|noshrink [VICTIM]]
//     OP: allreduce_small | allreduce_large | allgather   shared memory, liveness by the flag lines
//         ring                  the ring allreduce over the transport (FLEXPAR_TRANSPORT: mpi | ucx)
//         engine                a gradient_sync step over an engine (its negotiation and fusion thread)
//         relaxation            a decentralized (ring) relaxation's step, point to point
//         zero                  a ZeRO-3 step (zero::sharded_data_parallel): its boxings run on its
//                               communication thread, whose peer_failure reaches the caller's wait
//         stopped               the ring, the victim stopped rather than killed: only its heartbeats tell
//
// The victim dies after one operation that every rank finishes (and checks); each survivor then
// prints "survivor R: peer_failure after S s: TEXT", and with `shrink`
// "survivor R: shrunk to P ranks in S s, rebuilt in S s; OP on them: ok" (or FAILED: ...). It
// leaves with _exit (MPI cannot finalize without the dead rank), after a pause that lets the other
// survivor see the failure before this rank's own exit could be seen too; status 0 when TEXT names
// the victim and only the victim.
#include <mpi.h>

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/engine/engine.hpp>
#include <flexpar/engine/gradient_sync.hpp>
#include <flexpar/relax/decentralized.hpp>
#include <flexpar/relax/optimizer.hpp>
#include <flexpar/zero/sharded_data_parallel.hpp>

namespace {

using seconds = std::chrono::duration<double>;

/// What the survivors run: one operation of OP on `comm`, built on first use and rebuilt by reset().
/// Every rank's inputs differ (by rank and by element), and every element of the result is checked
/// against the serial computation of the same operation on all ranks' inputs: a wrong sum, average,
/// gather order or shard map after a shrink fails, not only a wrong last element.
class workload {
 public:
  workload(std::string op, std::size_t n) : op_(std::move(op)), data_(n), weights_(n), grads_(n) {}

  /// Builds what OP needs on `comm` (collective), from the initial weights (a restart: what was
  /// trained on the old communicator is dropped, as a resume from a checkpoint would).
  void build(flexpar::communicator& comm) {
    comm_ = &comm;
    reset();
    const int p = comm.size();
    // every replica starts from the same weights (decentralized's start() broadcasts rank 0's; ZeRO
    // keeps one model); the ranks' gradients then differ
    std::vector<float> initial(weights_.size());
    for (std::size_t i = 0; i < initial.size(); ++i) initial[i] = 1.0f + float(i % 8) * 0.5f;
    replicas_.assign(static_cast<std::size_t>(p), initial);
    weights_ = initial;
    if (op_ == "engine") {
      engine_ = std::make_unique<flexpar::engine>(comm);
      sync_ = std::make_unique<flexpar::gradient_sync>(
          *engine_, flexpar::gradient_sync_options{.reduction = flexpar::gradient_reduction::sum});
      sync_->register_parameter("w", std::span(weights_), std::span(data_));
    }
    if (op_ == "relaxation") {
      relax_ = std::make_unique<flexpar::relax::decentralized>(comm, flexpar::relax::peer_selection::ring);
      relax_->start(params());
    }
    if (op_ == "zero") {
      mesh_.emplace(comm, std::array<int, 1>{comm.size()});
      zero_.emplace(*mesh_,
                    flexpar::zero::options{.stage = 3, .bucket_bytes = data_.size() * sizeof(float), .average = false});
      zero_->add("w", weights_);
      zero_->start();
    }
  }
  /// Drops what was built (after a failure).
  void reset() {
    zero_.reset();
    mesh_.reset();
    sgd_ = flexpar::relax::sgd({.learning_rate = 0.5f});  // its state was sized for the old shards
    sync_.reset();
    engine_.reset();
    relax_.reset();
  }

  /// One operation; true when every element of its result is the exact one expected on comm's ranks
  /// (inputs are small multiples of 1/4: every sum here is exact in f32).
  bool run() {
    const int p = comm_->size(), me = comm_->rank();
    const std::size_t n = data_.size();
    auto mine = [](int r, std::size_t i) { return float(r + 1) + float(i % 5); };  // rank r's summand i
    auto gradient = [](int r, std::size_t i) { return float(r + 1) * float(i % 4 + 1) * 0.25f; };
    if (op_ == "allgather") {
      const std::size_t block = n / static_cast<std::size_t>(p);  // n = 3 * 1024: p equal blocks for p <= 3
      auto value = [&](std::size_t i) { return float(i / block + 1) * 1000.0f + float(i % block % 97); };
      for (std::size_t i = 0; i < n; ++i) data_[i] = i / block == static_cast<std::size_t>(me) ? value(i) : -1.0f;
      flexpar::allgather(*comm_, std::span(data_), flexpar::algorithm::shared_memory);
      std::vector<float> want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = value(i);
      return same(data_, want, "gathered blocks");
    }
    if (op_ == "relaxation") {  // an SGD step on every replica, then ring averaging (decentralized.hpp)
      for (std::size_t i = 0; i < n; ++i) grads_[i] = gradient(me, i);
      relax_->step(params(), sgd_);
      for (int r = 0; r < p; ++r)
        for (std::size_t i = 0; i < n; ++i) replicas_[static_cast<std::size_t>(r)][i] -= 0.5f * gradient(r, i);
      auto next = replicas_;
      for (int r = 0; r < p; ++r)
        for (std::size_t i = 0; i < n; ++i) {
          const auto& x = replicas_;
          const auto at = [&](int k) { return x[static_cast<std::size_t>((k + p) % p)][i]; };
          next[static_cast<std::size_t>(r)][i] = p == 2  ? (at(r) + at(r - 1)) / 2.0f
                                                 : p > 2 ? ((at(r) + at(r - 1)) + at(r + 1)) / 3.0f
                                                         : at(r);
        }
      replicas_ = std::move(next);
      return same(weights_, replicas_[static_cast<std::size_t>(me)], "weights");
    }
    if (op_ == "zero") {  // the gathered weights, then a step with every rank's gradients summed
      std::vector<float>& w = replicas_[0];
      {
        auto full = zero_->gather("w");
        if (!same(full.values(), w, "gathered weights")) return false;
      }
      const std::span<float> g = zero_->gradient("w");
      for (std::size_t i = 0; i < n; ++i) g[i] = gradient(me, i);
      zero_->gradient_ready("w");
      if (!zero_->step(sgd_)) return false;
      for (std::size_t i = 0; i < n; ++i) {
        float sum = 0;
        for (int r = 0; r < p; ++r) sum += gradient(r, i);
        w[i] -= 0.5f * sum;
      }
      auto after = zero_->gather("w");
      return same(after.values(), w, "weights after the step");
    }
    for (std::size_t i = 0; i < n; ++i) data_[i] = mine(me, i);
    bool ok = true;
    if (op_ == "engine") {
      sync_->on_gradient_ready("w");
      ok = sync_->synchronize();
    } else {
      const auto algo =
          op_ == "ring" || op_ == "stopped" ? flexpar::algorithm::ring : flexpar::algorithm::shared_memory;
      flexpar::allreduce(*comm_, std::span(data_), flexpar::reduce_op::sum, algo);
    }
    std::vector<float> want(n);
    for (std::size_t i = 0; i < n; ++i)
      for (int r = 0; r < p; ++r) want[i] += mine(r, i);
    return ok && same(data_, want, "sums");
  }

 private:
  /// True when `got` is `want`; else prints the first element that differs.
  bool same(std::span<const float> got, std::span<const float> want, const char* what) const {
    for (std::size_t i = 0; i < want.size(); ++i)
      if (i >= got.size() || got[i] != want[i]) {
        std::printf("rank %d: %s: %s [%zu] is %g, expected %g\n", comm_->rank(), op_.c_str(), what, i,
                    i < got.size() ? double(got[i]) : -1.0, double(want[i]));
        return false;
      }
    return got.size() == want.size();
  }
  std::vector<flexpar::relax::parameter> params() { return {{"w", std::span(weights_), std::span(grads_)}}; }

  std::string op_;
  flexpar::communicator* comm_ = nullptr;
  std::vector<float> data_, weights_, grads_;
  std::vector<std::vector<float>> replicas_;  // the expected weights of every rank (ZeRO: [0], one model)
  std::unique_ptr<flexpar::engine> engine_;
  std::unique_ptr<flexpar::gradient_sync> sync_;
  std::unique_ptr<flexpar::relax::decentralized> relax_;
  std::optional<flexpar::sbp::placement<1>> mesh_;
  std::optional<flexpar::zero::sharded_data_parallel<1>> zero_;
  flexpar::relax::sgd sgd_{{.learning_rate = 0.5f}};
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const std::string op = argc > 1 ? argv[1] : "allreduce_small";
  const bool shrink = argc > 2 && std::string(argv[2]) == "shrink";
  const int victim_arg = argc > 3 ? std::atoi(argv[3]) : -1;
  const std::vector<std::string> ops{"allreduce_small", "allreduce_large", "allgather", "ring",
                                     "engine",          "relaxation",      "stopped",   "zero"};
  if (std::find(ops.begin(), ops.end(), op) == ops.end()) {
    std::fprintf(stderr, "test_dead_peer_mpi: unknown operation '%s'\n", op.c_str());
    return 2;
  }
  auto comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD, flexpar::config::from_environment(),
                                              flexpar::thread_need::multiple);
  const int rank = comm.rank(), size = comm.size(), victim = victim_arg >= 0 ? victim_arg : size - 1;
  std::vector<long long> pids(static_cast<std::size_t>(size));
  const long long my_pid = ::getpid();
  MPI_Allgather(&my_pid, 1, MPI_LONG_LONG, pids.data(), 1, MPI_LONG_LONG, MPI_COMM_WORLD);
  workload work(op, op == "allreduce_large" ? std::size_t{3} << 20 : std::size_t{3} * 1024);
  work.build(comm);
  if (!work.run()) {  // every rank: the channels, the segment, one round
    std::printf("rank %d: the first %s gave a wrong result\n", rank, op.c_str());
    return 1;
  }
  std::fflush(stdout);
  if (rank == victim && op == "stopped") {
    // A stopped rank ends only when someone kills it: survivor 0 does once it has reported; this
    // child does after 20 s if no survivor got that far (it dies with its parent otherwise).
    if (::fork() == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() == static_cast<pid_t>(my_pid)) {
        ::sleep(20);
        ::kill(static_cast<pid_t>(my_pid), SIGKILL);
      }
      ::_exit(0);
    }
    ::raise(SIGSTOP);
  }
  if (rank == victim) ::raise(SIGKILL);
  auto start = std::chrono::steady_clock::now();
  int status = 1;
  try {
    work.run();
    std::printf("survivor %d: FAILED: %s returned although rank %d failed\n", rank, op.c_str(), victim);
  } catch (const flexpar::peer_failure& e) {
    const double s = seconds(std::chrono::steady_clock::now() - start).count();
    const std::string text = e.what();
    // The victim, and no other rank, is named failed.
    const bool names_it = text.find("rank " + std::to_string(victim) + " failed") != std::string::npos ||
                          text.find("rank " + std::to_string(victim) + " publishing") != std::string::npos;
    bool names_other = false;
    for (int r = 0; r < size; ++r)
      if (r != victim && text.find("rank " + std::to_string(r) + " failed") != std::string::npos) names_other = true;
    std::printf("survivor %d: peer_failure after %.3f s: %s\n", rank, s, text.c_str());
    status = names_it && !names_other ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("survivor %d: FAILED: not a peer_failure: %s\n", rank, e.what());
  }
  std::fflush(stdout);
  if (shrink && status == 0) {
    try {
      start = std::chrono::steady_clock::now();
      work.reset();  // what was built on the old communicator goes first: engine, gradient_sync, relaxation
      flexpar::communicator survivors = comm.shrink();  // collective over the survivors: agree, then a new group
      const double shrunk = seconds(std::chrono::steady_clock::now() - start).count();
      const auto rebuilding = std::chrono::steady_clock::now();
      work.build(survivors);  // the same objects on the survivors: a new engine + gradient_sync, or relaxation
      const double rebuilt = seconds(std::chrono::steady_clock::now() - rebuilding).count();
      const bool ok = survivors.size() == size - 1 && work.run() && work.run();
      std::printf("survivor %d: shrunk to %d ranks in %.3f s, rebuilt in %.3f s; %s on them: %s\n", rank,
                  survivors.size(), shrunk, rebuilt, op.c_str(), ok ? "ok" : "FAILED: wrong result");
      status = ok ? 0 : 1;
      work.reset();
    } catch (const std::exception& e) {
      std::printf("survivor %d: FAILED: shrink: %s\n", rank, e.what());
      status = 1;
    }
    std::fflush(stdout);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the other survivor reports first
  if (op == "stopped" && rank == 0) ::kill(static_cast<pid_t>(pids[static_cast<std::size_t>(victim)]), SIGKILL);
  ::_exit(status);
}
