// flexpar_actor_bench: what the actor runtime costs, next to its peers measured in the same run.
//
//   mpiexec.mpich -n 4 ./flexpar_actor_bench            (local hops on rank 0; cross-rank between
//                                                         ranks 0 and 1; the pipeline on all ranks)
//
//  1. Local hop: a chain source -> k relays -> sink on rank 0; time per message per hop (median of
//     --reps runs), for 1 and 2 pool threads and register counts 1 and 4. Peer: a plain function call
//     chain doing the same work (the floor), in the same process.
//  2. Cross-rank hop: source on rank 0 -> sink on rank 1, time per message in a stream (register
//     counts 1 and 4), next to the raw transport's one-way latency (ping-pong / 2) and its own
//     streaming time per message, over the same kind of transport.
//  3. Pipeline: p = size ranks; GPipe and 1F1B with one stage per rank (forward cost --stage-us,
//     backward 2x) and interleaved 1F1B with two stages per rank of half that cost each (the same
//     work), done with sleep (not spin) so that ranks oversubscribing the cores do not stretch each
//     other's stages; the bubble = 1 - sum(busy) / (p x step time), next to the theory
//     (p - 1) / (v m + p - 1); and each stage's measured stash peak next to its register count.
// Each run's result is checked after its timing (the chain's sum, the messages that crossed, the
// pipeline's losses and stash peaks); the exit status is 1 when one is wrong.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include <flexpar/actor/deterministic_scheduler.hpp>
#include <flexpar/actor/executor.hpp>
#include <flexpar/actor/pipeline.hpp>
#include <flexpar/comm/communicator.hpp>

namespace {

using flexpar::clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

/// Results found wrong on this rank (each measured run's result is checked after its timing); the
/// exit status is 1 when any rank found one.
int failures = 0;

/// A chain source -> `relays` relays -> sink of `messages` messages; seconds for the run.
template <std::size_t N>
double local_chain(flexpar::actor_executor& pool, int relays, std::int64_t messages) {
  using flexpar::fire_result;
  using flexpar::in;
  using flexpar::out;
  flexpar::actor_graph g;
  auto& src = g.add_actor<out<std::int64_t, N>>("source", [i = std::int64_t{0}, messages](std::int64_t& x) mutable {
    if (i == messages) return fire_result::done;
    x = i++;
    return fire_result::emit;
  });
  std::vector<flexpar::actor<in<std::int64_t>, out<std::int64_t, N>>*> chain;
  for (int r = 0; r < relays; ++r) {
    std::string label = "relay";
    label += std::to_string(r);
    chain.push_back(&g.add_actor<in<std::int64_t>, out<std::int64_t, N>>(
        label, [](const std::int64_t& x, std::int64_t& y) { y = x + 1; }));
  }
  std::int64_t sum = 0;
  auto& sink = g.add_actor<in<std::int64_t>>("sink", [&sum](const std::int64_t& x) { sum += x; });
  if (chain.empty()) {
    g.connect(src.template output<0>(), sink.template input<0>());
  } else {
    g.connect(src.template output<0>(), chain.front()->template input<0>());
    for (std::size_t r = 0; r + 1 < chain.size(); ++r)
      g.connect(chain[r]->template output<0>(), chain[r + 1]->template input<0>());
    g.connect(chain.back()->template output<0>(), sink.template input<0>());
  }
  const auto t0 = clock::now();
  pool.run(g, flexpar::deadline_after(std::chrono::seconds(120)));
  const double s = seconds_since(t0);
  const std::int64_t expected = messages * (messages - 1) / 2 + messages * relays;
  if (sum != expected) {
    std::fprintf(stderr, "local chain: wrong sum %lld (expected %lld)\n", static_cast<long long>(sum),
                 static_cast<long long>(expected));
    ++failures;
  }
  return s;
}

/// The floor: the same relays as plain calls.
double call_chain(int relays, std::int64_t messages) {
  volatile std::int64_t sum = 0;
  const auto t0 = clock::now();
  for (std::int64_t i = 0; i < messages; ++i) {
    std::int64_t x = i;
    for (int r = 0; r < relays; ++r) x = x + 1;
    sum = sum + x;
  }
  return seconds_since(t0);
}

/// Source on rank 0 -> sink on rank 1; seconds on rank 1 from the first to the last message.
template <std::size_t N>
double cross_rank_stream(flexpar::communicator& comm, std::int64_t messages, bool single_thread) {
  using flexpar::fire_result;
  using flexpar::in;
  using flexpar::out;
  flexpar::actor_graph g(comm);
  auto& src = g.add_actor<out<std::int64_t, N>>(0, "source", [i = std::int64_t{0}, messages](std::int64_t& x) mutable {
    if (i == messages) return fire_result::done;
    x = i++;
    return fire_result::emit;
  });
  std::int64_t count = 0, sum = 0;
  auto& sink = g.add_actor<in<std::int64_t>>(1, "sink", [&count, &sum](const std::int64_t& x) {
    ++count;
    sum += x;
  });
  g.connect(src.template output<0>(), sink.template input<0>());
  flexpar::actor_executor pool(1);
  MPI_Barrier(comm.mpi_comm());
  const auto t0 = clock::now();
  if (single_thread) {
    flexpar::deterministic_scheduler s(g);
    std::mt19937_64 rng(1);
    s.run_random(rng, flexpar::deadline_after(std::chrono::seconds(120)));
  } else {
    pool.run(g, flexpar::deadline_after(std::chrono::seconds(120)));
  }
  double s = seconds_since(t0);
  if (comm.rank() == 1 && (count != messages || sum != messages * (messages - 1) / 2)) {
    std::fprintf(stderr, "cross-rank stream: %lld messages summing to %lld arrived (expected %lld summing to %lld)\n",
                 static_cast<long long>(count), static_cast<long long>(sum), static_cast<long long>(messages),
                 static_cast<long long>(messages * (messages - 1) / 2));
    ++failures;
  }
  MPI_Bcast(&s, 1, MPI_DOUBLE, 1, comm.mpi_comm());
  return s;
}

/// Raw transport: one-way latency of 8 bytes (ping-pong / 2), seconds.
double raw_ping_pong(flexpar::transport& t, int rounds) {
  std::int64_t v = 0;
  const auto bytes = std::as_writable_bytes(std::span(&v, 1));
  const auto until = flexpar::deadline_after(std::chrono::seconds(60));
  const auto t0 = clock::now();
  for (int i = 0; i < rounds; ++i) {
    if (t.rank() == 0) {
      t.send(1, 5, bytes, until);
      t.recv(1, 6, bytes, until);
    } else {
      t.recv(0, 5, bytes, until);
      t.send(0, 6, bytes, until);
    }
  }
  return seconds_since(t0) / (2.0 * rounds);
}

/// Raw transport: rank 0 streams `messages` 8-byte messages (up to 4 outstanding), seconds per message.
double raw_stream(flexpar::transport& t, std::int64_t messages) {
  std::vector<std::int64_t> slots(4);
  std::vector<flexpar::request> reqs(4);
  const auto until = flexpar::deadline_after(std::chrono::seconds(60));
  const auto t0 = clock::now();
  for (std::int64_t i = 0; i < messages; ++i) {
    const std::size_t k = static_cast<std::size_t>(i % 4);
    reqs[k].wait(until);
    slots[k] = i;
    const auto bytes = std::as_writable_bytes(std::span(&slots[k], 1));
    reqs[k] = t.rank() == 0 ? t.isend(1, 7, bytes) : t.irecv(0, 7, bytes);
  }
  for (auto& r : reqs) r.wait(until);
  return seconds_since(t0) / static_cast<double>(messages);
}

/// A barrier whose waiters sleep (1 ms) between tests instead of spinning.
void sleeping_barrier(flexpar::communicator& comm) {
  MPI_Request r;
  MPI_Ibarrier(comm.mpi_comm(), &r);
  for (int done = 0;;) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"actor runtime: local and cross-rank hop overhead, pipeline bubble and activation peaks"};
  std::int64_t messages = 200000, cross_messages = 20000;
  int reps = 5, relays = 4, stage_us = 10000;
  std::string sections = "local,cross,pipeline";
  app.add_option("--messages", messages, "messages per local chain run");
  app.add_option("--cross-messages", cross_messages, "messages per cross-rank run");
  app.add_option("--reps", reps, "repetitions (medians are reported)");
  app.add_option("--relays", relays, "relay actors in the local chain");
  app.add_option("--stage-us", stage_us, "forward cost of a pipeline stage in microseconds (backward: 2x)");
  app.add_option("--sections", sections, "which parts to run: local, cross, pipeline (comma-separated)");
  CLI11_PARSE(app, argc, argv);

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    const int rank = comm.rank(), size = comm.size();

    auto wanted = [&](const char* part) { return sections.find(part) != std::string::npos; };
    // 1. Local hops (rank 0 alone; the other ranks wait asleep).
    if (rank == 0 && wanted("local")) {
      std::printf("# local hop: source -> %d relays -> sink, %lld messages, median of %d; time per message per hop\n",
                  relays, static_cast<long long>(messages), reps);
      std::printf("| pool threads | register count | actor hop (us) | plain call hop (us) |\n|---|---|---|---|\n");
      const double hops = static_cast<double>(messages) * (relays + 1);
      for (std::size_t threads : {1u, 2u}) {
        flexpar::actor_executor pool(threads);
        for (int count : {1, 4}) {
          std::vector<double> a, c;
          for (int r = 0; r < reps; ++r) {
            a.push_back((count == 1 ? local_chain<1>(pool, relays, messages) : local_chain<4>(pool, relays, messages)) /
                        hops);
            c.push_back(call_chain(relays, messages) / hops);
          }
          std::printf("| %zu | %d | %.3f | %.5f |\n", threads, count, median(a) * 1e6, median(c) * 1e6);
        }
      }
      std::fflush(stdout);
    }

    sleeping_barrier(comm);
    // 2. Cross-rank hops between ranks 0 and 1, over the transport comm was built with; the other
    //    ranks wait asleep (a spinning waiter would steal the cores of the two measured ranks).
    if (size >= 2 && wanted("cross")) {
      auto pair = comm.split(rank < 2 ? 0 : -1, rank);
      std::vector<double> ping, stream, actor1, actor4, single1, single4;
      for (int r = 0; r < reps; ++r) {
        if (pair) {
          ping.push_back(raw_ping_pong(pair->transport(), 2000));
          stream.push_back(raw_stream(pair->transport(), cross_messages));
          const double n = static_cast<double>(cross_messages);
          actor1.push_back(cross_rank_stream<1>(*pair, cross_messages, false) / n);
          actor4.push_back(cross_rank_stream<4>(*pair, cross_messages, false) / n);
          single1.push_back(cross_rank_stream<1>(*pair, cross_messages, true) / n);
          single4.push_back(cross_rank_stream<4>(*pair, cross_messages, true) / n);
        }
      }
      if (rank == 0) {
        const double lat = median(ping);
        std::printf("\n# cross-rank hop: rank 0 -> rank 1 over %s, 8-byte payloads, %lld messages, median of %d\n",
                    std::string(flexpar::name_of(comm.settings().transport)).c_str(),
                    static_cast<long long>(cross_messages), reps);
        std::printf("| what | time per message (us) | / raw one-way latency |\n|---|---|---|\n");
        std::printf("| raw transport one-way latency (ping-pong / 2) | %.2f | 1.00 |\n", lat * 1e6);
        std::printf("| raw transport stream (4 in flight) | %.2f | %.2f |\n", median(stream) * 1e6,
                    median(stream) / lat);
        std::printf("| actor edge, register count 1 | %.2f | %.2f |\n", median(actor1) * 1e6, median(actor1) / lat);
        std::printf("| actor edge, register count 4 | %.2f | %.2f |\n", median(actor4) * 1e6, median(actor4) / lat);
        std::printf("| actor edge, count 1, single thread (deterministic_scheduler) | %.2f | %.2f |\n",
                    median(single1) * 1e6, median(single1) / lat);
        std::printf("| actor edge, count 4, single thread (deterministic_scheduler) | %.2f | %.2f |\n",
                    median(single4) * 1e6, median(single4) / lat);
        std::fflush(stdout);
      }
    }

    sleeping_barrier(comm);
    // 3. Pipeline bubble and activation peaks: GPipe and 1F1B with one stage per rank, interleaved
    // 1F1B with two per rank (stage j on rank j mod p, each half the work: the same model).
    const int p = size;
    struct variant {
      const char* name;
      flexpar::pipeline_schedule schedule;
      int per_rank;
    };
    for (const variant& v : {variant{"gpipe", flexpar::pipeline_schedule::gpipe, 1},
                             variant{"1f1b", flexpar::pipeline_schedule::one_f_one_b, 1},
                             variant{"interleaved 1f1b", flexpar::pipeline_schedule::one_f_one_b, 2}}) {
      if (!wanted("pipeline")) break;
      const int stages = p * v.per_rank;
      const int forward_us = stage_us / v.per_rank;
      if (rank == 0) {
        std::printf(
            "\n# pipeline %s: %d stage(s) on %d rank(s) (%d per rank), forward %d us, backward %d us per stage "
            "(sleep), median of %d\n",
            v.name, stages, p, v.per_rank, forward_us, 2 * forward_us, reps);
        std::printf(
            "| m | bubble measured | bubble theory (p-1)/(v m+p-1) | measured / theory | step ms | peak / stash "
            "registers per stage |\n");
        std::printf("|---|---|---|---|---|---|\n");
      }
      for (int m : {4, 8, 16}) {
        flexpar::pipeline_builder b(comm);
        for (int s = 0; s < stages; ++s) {
          std::string label = "stage";
          label += std::to_string(s);
          b.stage(s % p, {label,
                          [forward_us](int, const std::vector<float>& x, std::vector<float>& y) {
                            std::this_thread::sleep_for(std::chrono::microseconds(forward_us));
                            y = x;
                          },
                          [forward_us](int, const std::vector<float>&, const std::vector<float>&,
                                       const std::vector<float>& gy, std::vector<float>& gx) {
                            std::this_thread::sleep_for(std::chrono::microseconds(2 * forward_us));
                            gx = gy;
                          }});
        }
        b.micro_batches(m).schedule(v.schedule);
        b.input([](int mb, std::vector<float>& x) { x.assign(16, static_cast<float>(mb + 1)); });
        b.loss([](int, const std::vector<float>& y, std::vector<float>& g) {  // sum(y): 16 (mb + 1) through identities
          g.assign(y.size(), 1.0f);
          float sum = 0.0f;
          for (float x : y) sum += x;
          return sum;
        });
        flexpar::pipeline pipe = b.build();
        std::vector<double> bubbles, steps;
        std::vector<unsigned long> peak(static_cast<std::size_t>(v.per_rank), 0),
            peaks(static_cast<std::size_t>(stages));
        for (int r = 0; r < reps; ++r) {
          MPI_Barrier(comm.mpi_comm());
          const auto stats = pipe.run_step(comm.default_deadline());
          double busy = stats.busy_seconds, busy_sum = 0, step_max = 0;
          MPI_Reduce(&busy, &busy_sum, 1, MPI_DOUBLE, MPI_SUM, 0, comm.mpi_comm());
          MPI_Reduce(&stats.step_seconds, &step_max, 1, MPI_DOUBLE, MPI_MAX, 0, comm.mpi_comm());
          bubbles.push_back(1.0 - busy_sum / (p * step_max));
          steps.push_back(step_max);
          // the step's result, after its timing: every micro-batch's loss on the last stage's rank, and
          // every stage's stash peak within its register count
          const bool last_here = (stages - 1) % p == rank;
          bool right = stats.losses.size() == (last_here ? static_cast<std::size_t>(m) : 0u) &&
                       stats.stages.size() == static_cast<std::size_t>(v.per_rank);
          for (std::size_t mb = 0; right && mb < stats.losses.size(); ++mb)
            right = stats.losses[mb] == 16.0f * static_cast<float>(mb + 1);
          for (std::size_t k = 0; right && k < stats.stages.size(); ++k) {
            right = stats.stages[k].peak_activations >= 1 &&
                    stats.stages[k].peak_activations <= stats.stages[k].stash_registers;
            peak[k] = std::max<unsigned long>(peak[k], stats.stages[k].peak_activations);
          }
          if (!right) {
            std::fprintf(stderr, "pipeline %s m = %d, rank %d: %zu losses, a stash peak outside [1, count]\n", v.name,
                         m, rank, stats.losses.size());
            ++failures;
          }
        }
        // peaks[j] for stage j: rank r's k-th stage is r + k p
        std::vector<unsigned long> gathered(static_cast<std::size_t>(stages));
        MPI_Gather(peak.data(), v.per_rank, MPI_UNSIGNED_LONG, gathered.data(), v.per_rank, MPI_UNSIGNED_LONG, 0,
                   comm.mpi_comm());
        if (rank == 0) {
          for (int r = 0; r < p; ++r)
            for (int k = 0; k < v.per_rank; ++k)
              peaks[static_cast<std::size_t>(r + k * p)] = gathered[static_cast<std::size_t>(r * v.per_rank + k)];
          const double theory = flexpar::pipeline_bubble_theory(p, v.per_rank, m);
          std::string peak_text;
          for (int s = 0; s < stages; ++s) {
            if (s) peak_text += " ";
            peak_text += std::to_string(peaks[static_cast<std::size_t>(s)]);
            peak_text += "/";
            peak_text += std::to_string(pipe.stash()[static_cast<std::size_t>(s)]);
          }
          std::printf("| %d | %.3f | %.3f | %.2f | %.1f | %s |\n", m, median(bubbles), theory,
                      theory > 0 ? median(bubbles) / theory : 0.0, median(steps) * 1e3, peak_text.c_str());
          std::fflush(stdout);
        }
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, comm.mpi_comm());
    if (rank == 0) std::printf("\n# verified: every run's result after its timing, %d wrong\n", failures);
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
