// One rank's local memory traffic in a 2-rank shared-memory reduce-scatter, without the other rank:
// the lower bound on what P -> S(1) can reach next to the bare reduce-scatter it is measured against
// (doc/sbp.md, "Why P -> S(1) stays behind front"; flexpar_sbp_bench measures the real collectives).
//
// The summand is an f32 tensor [n, 256] of `bytes` in one 64-byte aligned buffer; the rank is rank 1,
// whose block is not the first. Rounds of 256 KiB of result (the shared-memory rounds' chunk), each:
//   fill:  copy the peer's part of the round into a send slot (in cache),
//   drain: my part (op) a received slot (in cache, the peer's contribution) -> the result.
// The variants differ only in where the parts lie and where the result goes:
//   front            contiguous blocks (P -> S(0)); the result overwrites the peer's block at the
//                    front, on the lines the fill has just read (the in-place call P -> S(1) makes,
//                    on contiguous blocks: its `front` bare);
//   out_of_place     contiguous blocks; the result goes to a buffer of its own (the out-of-place bare);
//   strided          the parts are the halves of every row (P -> S(1), as built): the fill packs the
//                    peer's runs into the send slot and reads one byte of each line of mine, the drain
//                    reduces my runs where they lie into the front of the buffer, run by run;
//   strided_packed   the same, the fill copying my runs into a section of their own, which the drain
//                    reads (P -> S(1) until 2026-11-25);
//   strided_unread   the same as strided without the reads of my lines in the fill (P -> S(1) on a
//                    summand taken to be in cache).
// bytes_per_second counts the summand's bytes.
//
// zero_copy: both ranks, as two threads (BENCHMARK ... ->Threads(2)), each summand readable by both (a
// node-shared arena for the tensors, which flexpar does not have: the design with no fill at all).
// Every call each rank reduces its block from the two summands straight into its own result, then
// the two meet at a barrier (the end hand-off after which a summand may change): no round buffer,
// no copy, no flag. The contiguous variant reads the blocks of P -> S(0), the strided one the halves
// of every row of P -> S(1); their ratio is what the S(1) layout itself costs on the machine, with
// nothing of the collective around it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstddef>
#include <memory>
#include <span>

#include <flexpar/collective/reduce_kernel.hpp>
#include <flexpar/core/aligned_vector.hpp>
#include <flexpar/core/streaming_copy.hpp>  // copy_run, the packs' inline run copy
#include <flexpar/sbp/boxing.hpp>           // detail::read_lines

namespace {

using flexpar::reduce_op;

constexpr std::size_t cols = 256, half = cols / 2;
constexpr std::size_t round_elements = 256 * 1024 / sizeof(float);  // result elements per round

enum class layout { front, out_of_place, strided, strided_packed, strided_unread };

struct rank_buffers {
  explicit rank_buffers(std::size_t n)
      : summand(n, 1.0f),
        result(n / 2, 0.0f),
        send(round_elements),
        mine(round_elements),
        received(round_elements, 0.0f) {}
  flexpar::aligned_vector<float> summand, result, send, mine, received;
};

void copy_floats(float* to, const float* from, std::size_t n) {
  flexpar::copy_run(reinterpret_cast<std::byte*>(to), reinterpret_cast<const std::byte*>(from),
                            n * sizeof(float));
}

void one_call(rank_buffers& b, layout how) {
  const std::size_t n = b.summand.size(), rows = n / cols, rows_per_round = round_elements / half;
  float* const data = b.summand.data();
  const std::span<const float> received(b.received.data(), round_elements);
  for (std::size_t first = 0, k = 0; first < rows; first += rows_per_round, ++k) {
    const std::size_t m = std::min(rows_per_round, rows - first) * half;  // result elements this round
    float* const out = (how == layout::out_of_place ? b.result.data() : data) + k * round_elements;
    if (how == layout::front || how == layout::out_of_place) {
      copy_floats(b.send.data(), data + k * round_elements, m);  // fill: the peer's block, front half
      flexpar::reduce_into(std::span<float>(out, m), std::span<const float>(data + n / 2 + k * round_elements, m),
                           received.first(m), reduce_op::sum);
      continue;
    }
    for (std::size_t r = first; r < first + m / half; ++r) {  // fill: the peer's run, then mine
      copy_floats(b.send.data() + (r - first) * half, data + r * cols, half);
      if (how == layout::strided_packed)
        copy_floats(b.mine.data() + (r - first) * half, data + r * cols + half, half);
      else if (how == layout::strided)
        flexpar::sbp::detail::read_lines(data + r * cols + half, half);
    }
    if (how == layout::strided_packed) {
      flexpar::reduce_into(std::span<float>(out, m), std::span<const float>(b.mine.data(), m), received.first(m),
                           reduce_op::sum);
      continue;
    }
    flexpar::detail::visit_op(reduce_op::sum, [&](auto f) {   // drain: my runs where they lie, forward,
      for (std::size_t r = first; r < first + m / half; ++r)  // as the boxing's (one dispatch a round)
        flexpar::detail::reduce_elements_forward(out + (r - first) * half, data + r * cols + half,
                                                 received.data() + (r - first) * half, half, f);
    });
  }
}

void rank_traffic(benchmark::State& state, layout how) {
  rank_buffers b(static_cast<std::size_t>(state.range(0)) / sizeof(float));
  for (auto _ : state) {
    one_call(b, how);
    benchmark::DoNotOptimize(b.summand.data());
    benchmark::DoNotOptimize(b.result.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

/// The two ranks' summands [n, 256] (rank q's: its contributions q + 1, small integers, exact in
/// f32), their results and the barrier of the end hand-off: made by thread 0 before the timed loop
/// (Google Benchmark starts the threads' loops together) and dropped by it after.
struct node_summands {
  explicit node_summands(std::size_t n)
      : summand{flexpar::aligned_vector<float>(n, 1.0f), flexpar::aligned_vector<float>(n, 2.0f)},
        result{flexpar::aligned_vector<float>(n / 2), flexpar::aligned_vector<float>(n / 2)} {}
  flexpar::aligned_vector<float> summand[2], result[2];
  std::barrier<> handoff{2};
};

std::unique_ptr<node_summands> node;  // the benchmark's own, between thread 0's setup and teardown

/// Rank r's block of the zero-copy reduce-scatter: contiguous (block r of both summands) or strided
/// (half r of every row of both), written to r's own result.
void zero_copy_block(node_summands& s, int r, bool strided) {
  const std::size_t n = s.summand[0].size(), rows = n / cols;
  const float* a = s.summand[r].data();
  const float* b = s.summand[1 - r].data();
  float* out = s.result[r].data();
  const auto ur = static_cast<std::size_t>(r);
  flexpar::detail::visit_op(reduce_op::sum, [&](auto f) {
    if (!strided) {
      flexpar::detail::reduce_elements(out, a + ur * (n / 2), b + ur * (n / 2), n / 2, f);
      return;
    }
    for (std::size_t o = 0; o < rows; ++o)
      flexpar::detail::reduce_elements(out + o * half, a + o * cols + ur * half, b + o * cols + ur * half, half, f);
  });
}

void zero_copy(benchmark::State& state, bool strided) {
  const auto n = static_cast<std::size_t>(state.range(0)) / sizeof(float);
  const int r = state.thread_index();
  if (r == 0) node = std::make_unique<node_summands>(n);
  for (auto _ : state) {
    // untimed: my summand written afresh by me (a boxing's summand is the last op's output, dirty in
    // its owner's cache), then the start hand-off
    flexpar::aligned_vector<float>& mine = node->summand[r];
    std::fill(mine.begin(), mine.end(), static_cast<float>(r + 1));
    node->handoff.arrive_and_wait();
    const auto start = std::chrono::steady_clock::now();
    zero_copy_block(*node, r, strided);
    node->handoff.arrive_and_wait();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
  if (r == 0) {
    // the check: every element of both results is 1 + 2 (the bench measures a reduce-scatter, not a copy)
    for (const auto& result : node->result)
      if (std::any_of(result.begin(), result.end(), [](float x) { return x != 3.0f; }))
        state.SkipWithError("wrong sum");
    node.reset();
  }
}

}  // namespace

BENCHMARK_CAPTURE(zero_copy, contiguous, false)
    ->Arg(1 << 20)
    ->Arg(16 << 20)
    ->Arg(64 << 20)
    ->Threads(2)
    ->UseManualTime();
BENCHMARK_CAPTURE(zero_copy, strided, true)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20)->Threads(2)->UseManualTime();
BENCHMARK_CAPTURE(rank_traffic, front, layout::front)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20);
BENCHMARK_CAPTURE(rank_traffic, out_of_place, layout::out_of_place)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20);
BENCHMARK_CAPTURE(rank_traffic, strided, layout::strided)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20);
BENCHMARK_CAPTURE(rank_traffic, strided_packed, layout::strided_packed)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20);
BENCHMARK_CAPTURE(rank_traffic, strided_unread, layout::strided_unread)->Arg(1 << 20)->Arg(16 << 20)->Arg(64 << 20);

BENCHMARK_MAIN();
