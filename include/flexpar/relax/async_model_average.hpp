// flexpar/relax/async_model_average.hpp — async_model_average: a background thread averages the weights of every rank
// every `period_ms`, while the training thread keeps stepping on its own (BAGUA's asynchronous model average).
//
// Threads and communicators: start() splits the communicator (collective) into a private one that
// only the background thread uses (a communicator serves one thread at a time), so the training
// thread may keep using `comm` for its own collectives. Over MPI this needs MPI_THREAD_MULTIPLE
// (checked at construction: usage_error otherwise). The weights are guarded by one mutex that
// step() holds while it applies the optimizer and the thread holds while it reads or writes them.
//
// One round of the background thread, M = model bytes (f32), p ranks:
//   step 1: wait `period_ms` (or a request: abort, finish)
//   step 2: allreduce(max) of this rank's {pause wanted, stop wanted}        16 bytes, so that every
//           rank's thread takes the same decision in the same round
//   step 3: under the lock, copy the weights into a snapshot s                local
//   step 4: a = allreduce(avg) of s (without the lock: training goes on)     2 (p - 1) / p * M sent
//   step 5: under the lock, x += a - s (the local steps taken during step 4 are kept)
// Bytes on the wire per rank: 2 (p - 1) / p * M per round, i.e. per second 1000 / period_ms rounds
// (fewer when the allreduce takes longer than the period), independent of the step rate.
//
// abort() and resume() are collective (every rank calls them, in the same order): abort() returns
// once this rank's thread has paused (all threads pause in the same round); resume() lets them go on.
// finish() (collective) stops the thread in a common round, then averages once more synchronously,
// so every rank ends with the same weights: the average of the weights at that moment. The
// destructor without finish() stops the thread locally (a rank that leaves early): the other ranks'
// rounds then end with timeout_error at their deadline, which their next step()/finish() rethrows.
// Results depend on timing: the tests check the rules (identical average after finish, pause,
// deadlines), not a serial trajectory. Use it when ranks run at different speeds or the network is
// slow and bursty: no rank ever waits for another in step().
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/relax/flat_model.hpp>
#include <flexpar/relax/relaxation.hpp>

namespace flexpar::relax {

namespace detail {

/// async_model_average's background thread and its control (file header), written once for every
/// memory. The Model (host_async_model below; cuda::detail::device_async_model on the GPU) provides:
///   communicator& comm();                        the relaxation's communicator
///   void start(algo, params);                    collective: check the list, rank 0's weights, the
///                                                private communicator and what the thread averages with
///   communicator& links();                       that private communicator
///   void check(op, params);                      the list keeps its lengths
///   void apply(params, opt);                     the optimizer step (called under the weights' lock)
///   void snapshot();                             step 3, under the lock: s = the weights
///   void average();                              step 4, without the lock: a = allreduce(avg) of s
///   void apply_delta();                          step 5, under the lock: x += a - s
///   std::uint64_t final_average(params);         finish(): weights = allreduce(avg) of the weights; bytes
///   std::size_t size() const;                    elements of the model
/// The buffers the thread reads are the ones given to start(): check_same() refuses others.
template <class Model>
class async_average {
 public:
  /// @throws usage_error if period_ms < 1, or if the Model's communicator runs over MPI and MPI was
  ///         initialized with a thread level below MPI_THREAD_MULTIPLE.
  async_average(Model& m, int period_ms) : m_(m), period_(period_ms) {
    communicator& comm = m.comm();
    const std::string at = where(comm.rank(), "async_model_average", "make");
    if (period_ms < 1) throw usage_error(at + "period of " + std::to_string(period_ms) + " ms; it must be at least 1");
    if (comm.mpi_comm() != MPI_COMM_NULL) {
      int initialized = 0, provided = MPI_THREAD_SINGLE;
      MPI_Initialized(&initialized);
      if (initialized) MPI_Query_thread(&provided);
      if (provided < MPI_THREAD_MULTIPLE)
        throw usage_error(at +
                          "its background thread calls MPI while the training thread does; initialize MPI with "
                          "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) (this MPI provides level " +
                          std::to_string(provided) + ")");
    }
  }
  async_average(const async_average&) = delete;
  async_average& operator=(const async_average&) = delete;
  ~async_average() { stop_locally(); }

  /// Collective: rank 0's weights everywhere, the private communicator, then the thread starts. The
  /// buffers in `params` are read by the thread until finish(): they must stay valid.
  template <class Params>
  void start(Params params) {
    if (thread_.joinable())
      throw usage_error(where(m_.comm().rank(), "async_model_average", "start") +
                        "already started; call finish() first");
    m_.start("async_model_average", params);
    weights_of_.clear();
    for (const auto& p : params) weights_of_.push_back(p.weight.data());
    // Builds the collective channel of the private communicator now, on every rank: its lazy
    // construction would otherwise happen in the thread's first round, under the transport's
    // bootstrap deadline.
    flexpar::barrier(m_.links());
    {
      std::lock_guard lk(control_);
      want_pause_ = want_stop_ = quit_ = paused_ = ended_ = aborted_ = false;
      error_ = nullptr;
    }
    thread_ = std::thread([this] { run(); });
    // Still running at MPI_Finalize: stop the thread there, before the private communicator closes.
    at_finalize_ = flexpar::detail::finalize_hook(m_.links().at_finalize(), [this] { stop_locally(); });
  }
  /// The optimizer step, under the weights' lock; rethrows an error of the background thread.
  template <class Params, class Opt>
  void step(Params params, Opt& opt) {
    check_same(params, "step");
    rethrow_background_error();
    std::lock_guard lk(weights_);
    m_.apply(params, opt);
    steps_.fetch_add(1, std::memory_order_relaxed);
  }
  /// Collective: stops the thread in a common round, then one synchronous average of the weights.
  template <class Params>
  void finish(Params params) {
    check_same(params, "finish");
    if (!thread_.joinable() && !started_once())
      throw usage_error(where(m_.comm().rank(), "async_model_average", "finish") + "not started");
    {
      std::lock_guard lk(control_);
      want_stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    rethrow_background_error();
    if (m_.comm().size() > 1) bytes_.fetch_add(m_.final_average(params), std::memory_order_relaxed);
  }
  /// Collective: pauses the background averaging on every rank; returns once this rank's thread has
  /// paused. @throws timeout_error past the communicator's deadline; the thread's error if it failed.
  void abort() {
    std::unique_lock lk(control_);
    if (!thread_.joinable()) throw usage_error(where(m_.comm().rank(), "async_model_average", "abort") + "not started");
    want_pause_ = aborted_ = true;
    wake_.notify_all();
    if (!changed_.wait_until(lk, m_.comm().default_deadline(), [&] { return paused_ || ended_; }))
      throw timeout_error(where(m_.comm().rank(), "async_model_average", "abort") +
                          "the background thread did not pause before the deadline");
    lk.unlock();
    rethrow_background_error();
  }
  /// Collective: resumes the background averaging after abort(); returns once this rank's thread
  /// has left its pause (its next round waits for every rank's resume()).
  void resume() {
    std::unique_lock lk(control_);
    if (!aborted_)
      throw usage_error(where(m_.comm().rank(), "async_model_average", "resume") + "abort() was not called");
    want_pause_ = aborted_ = false;
    // Wait for the thread to leave this pause: a count, not paused_, which another rank's abort()
    // may set again before this thread wakes up.
    const std::uint64_t before = unpaused_;
    wake_.notify_all();
    if (!changed_.wait_until(lk, m_.comm().default_deadline(),
                             [&] { return !paused_ || unpaused_ != before || ended_; }))
      throw timeout_error(where(m_.comm().rank(), "async_model_average", "resume") +
                          "the background thread did not resume before the deadline");
  }
  /// Background averages completed so far on this rank.
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rounds_.load(std::memory_order_relaxed); }
  [[nodiscard]] traffic so_far() const noexcept {
    traffic t;
    t.bytes_sent = bytes_.load(std::memory_order_relaxed);
    t.steps = steps_.load(std::memory_order_relaxed);
    t.exchanges = rounds();
    return t;
  }
  /// Bytes one rank sends per averaging round for a model of `model_bytes` on `p` ranks.
  static constexpr double wire_bytes_per_round(double model_bytes, int p) noexcept {
    return p <= 1 ? 0.0 : 2.0 * (p - 1) / p * model_bytes + 16.0;
  }
  /// Stops the background thread without communicating (a rank that leaves early).
  void stop_locally() noexcept {
    {
      std::lock_guard lk(control_);
      quit_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  [[nodiscard]] bool started_once() const noexcept { return !weights_of_.empty(); }
  template <class Params>
  void check_same(Params params, std::string_view op) const {
    m_.check(op, params);
    for (std::size_t i = 0; i < params.size(); ++i)
      if (i >= weights_of_.size() || params[i].weight.data() != weights_of_[i]) {
        std::string text = where(m_.comm().rank(), "async_model_average", op);
        text.append("parameter ")
            .append(std::to_string(i))
            .append(" (\"")
            .append(params[i].name)
            .append("\") is not the buffer given to start(); the background thread averages those");
        throw usage_error(text);
      }
  }
  void rethrow_background_error() {
    std::exception_ptr e;
    {
      std::lock_guard lk(control_);
      e = error_;
    }
    if (e) std::rethrow_exception(e);
  }
  // The background thread (file header: one round).
  void run() {
    try {
      auto next = clock::now() + period_;
      for (;;) {
        std::int64_t flags[2] = {0, 0};
        {
          std::unique_lock lk(control_);
          if (paused_)
            wake_.wait(lk, [&] { return quit_ || want_stop_ || !want_pause_; });
          else
            wake_.wait_until(lk, next, [&] { return quit_ || want_stop_ || want_pause_; });
          if (quit_) break;
          if (paused_) {
            paused_ = false;
            ++unpaused_;
            changed_.notify_all();
          }
          flags[0] = want_pause_ ? 1 : 0;
          flags[1] = want_stop_ ? 1 : 0;
        }
        // step 2: the same decision on every rank.
        flexpar::allreduce(m_.links(), std::span<std::int64_t>(flags), reduce_op::max);
        if (flags[1] != 0) break;
        if (flags[0] != 0) {
          std::lock_guard lk(control_);
          want_pause_ = paused_ = true;  // paused by some rank's abort(): wait for my resume()
          changed_.notify_all();
          continue;
        }
        {  // step 3
          std::lock_guard lk(weights_);
          m_.snapshot();
        }
        m_.average();  // step 4
        {              // step 5
          std::lock_guard lk(weights_);
          m_.apply_delta();
        }
        bytes_.fetch_add(
            static_cast<std::uint64_t>(wire_bytes_per_round(static_cast<double>(m_.size()) * 4.0, m_.links().size())),
            std::memory_order_relaxed);
        rounds_.fetch_add(1, std::memory_order_relaxed);
        next = clock::now() + period_;
      }
    } catch (...) {
      std::lock_guard lk(control_);
      error_ = std::current_exception();
    }
    std::lock_guard lk(control_);
    ended_ = true;
    changed_.notify_all();
  }

  using clock = std::chrono::steady_clock;
  Model& m_;
  std::chrono::milliseconds period_;
  std::vector<const float*> weights_of_;  // the buffers given to start()
  std::mutex weights_;                    // the weights (the Model's, under step() and steps 3 and 5)
  std::mutex control_;                    // the flags below
  std::condition_variable wake_, changed_;
  bool want_pause_ = false, want_stop_ = false, quit_ = false, paused_ = false, ended_ = false;
  bool aborted_ = false;        // abort() called on this rank, resume() not yet
  std::uint64_t unpaused_ = 0;  // times the thread has left a pause
  std::exception_ptr error_;
  std::atomic<std::uint64_t> rounds_{0}, bytes_{0}, steps_{0};
  std::thread thread_;                          // joined before the members it uses go away
  flexpar::detail::finalize_hook at_finalize_;  // last: unregistered first
};

/// async_average's Model for host parameters.
class host_async_model {
 public:
  explicit host_async_model(communicator& comm) : comm_(comm) {}
  [[nodiscard]] communicator& comm() noexcept { return comm_; }
  [[nodiscard]] communicator& links() noexcept { return *links_; }
  [[nodiscard]] std::size_t size() const noexcept { return model_.size(); }
  void start(std::string_view algo, std::span<const parameter> params) {
    model_.bind(comm_, algo, params);
    model_.broadcast_weights(comm_, params);
    params_.assign(params.begin(), params.end());
    links_ = comm_.split(0, comm_.rank());
    snapshot_.assign(model_.size(), 0.0f);
    average_.assign(model_.size(), 0.0f);
  }
  void check(std::string_view op, std::span<const parameter> params) const { model_.check(comm_.rank(), op, params); }
  static void apply(std::span<const parameter> params, optimizer& opt) {
    for (std::size_t i = 0; i < params.size(); ++i) opt.apply(i, params[i].weight, params[i].gradient);
  }
  void snapshot() { model_.gather_weights(params_, snapshot_); }
  void average() {
    average_ = snapshot_;
    flexpar::allreduce(*links_, std::span<float>(average_), reduce_op::avg);
  }
  void apply_delta() {
    for (std::size_t k = 0; k < params_.size(); ++k) {
      const std::size_t at = model_.offset(k);
      std::span<float> w = params_[k].weight;
      for (std::size_t i = 0; i < w.size(); ++i) w[i] += average_[at + i] - snapshot_[at + i];
    }
  }
  std::uint64_t final_average(std::span<const parameter> params) {
    std::vector<float> flat(model_.size());
    model_.gather_weights(params, flat);
    flexpar::allreduce(*links_, std::span<float>(flat), reduce_op::avg);
    model_.scatter_weights(flat, params);
    return ring_allreduce_bytes(flat.size(), comm_.size());
  }

 private:
  communicator& comm_;
  flat_model model_;
  std::vector<parameter> params_;
  std::optional<communicator> links_;  // the background thread's (and finish()'s after it)
  std::vector<float> snapshot_, average_;
};

}  // namespace detail

/// Background weight averaging every `period_ms` (file header).
class async_model_average final : public relaxation {
 public:
  /// Over `comm` (kept by reference; it must outlive this object).
  /// @throws usage_error if period_ms < 1, or if `comm` runs over MPI and MPI was initialized with a
  ///         thread level below MPI_THREAD_MULTIPLE.
  async_model_average(communicator& comm, int period_ms) : model_(comm), rule_(model_, period_ms) {}
  /// Bytes one rank sends per averaging round for a model of `model_bytes` on `p` ranks.
  static constexpr double wire_bytes_per_round(double model_bytes, int p) noexcept {
    return detail::async_average<detail::host_async_model>::wire_bytes_per_round(model_bytes, p);
  }
  [[nodiscard]] std::string_view name() const noexcept override { return "async_model_average"; }
  /// Collective: rank 0's weights everywhere, the private communicator, then the thread starts. The
  /// spans in `params` are read by the thread until finish(): they must stay valid.
  void start(std::span<const parameter> params) override { rule_.start(params); }
  /// The optimizer step, under the weights' lock; rethrows an error of the background thread.
  /// @throws usage_error if `params` are not the spans given to start().
  void step(std::span<const parameter> params, optimizer& opt) override { rule_.step(params, opt); }
  /// Collective: stops the thread in a common round, then one synchronous average of the weights.
  /// @throws the background thread's error (e.g. timeout_error when a rank left early).
  void finish(std::span<const parameter> params) override { rule_.finish(params); }
  /// Collective: pauses the background averaging on every rank (file header).
  void abort() { rule_.abort(); }
  /// Collective: resumes the background averaging after abort() (file header).
  /// @throws usage_error if this rank did not call abort() since its last resume().
  void resume() { rule_.resume(); }
  /// Background averages completed so far on this rank.
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rule_.rounds(); }
  [[nodiscard]] traffic traffic_so_far() const noexcept override { return rule_.so_far(); }

 private:
  detail::host_async_model model_;
  detail::async_average<detail::host_async_model> rule_;  // after model_: its thread uses model_
};

}  // namespace flexpar::relax
