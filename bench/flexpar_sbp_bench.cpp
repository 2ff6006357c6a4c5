// flexpar_sbp_bench — boxing next to the bare collective it calls, measured in one run.
//
// For each boxing (P -> B, P -> S(0), P -> S(1), S(0) -> B, S(1) -> B, S(0) -> S(1)) and logical size, the time
// of to<To>(std::move(t)) next to its peers, all measured in the same run, interleaved (iteration i
// runs every variant once, starting at variant i mod V, so load from other processes and the cache
// state one variant leaves for the next fall on all of them alike), or with --block K in blocks (each
// variant K iterations in a row, the variants taking turns: each finds the cache as it left it, the
// steady state of a training loop that boxes one shape, while load from other processes still falls
// on all of them alike over the blocks):
//   - "bare": the flexpar collective doing the same data movement, on the communicator the boxing
//     calls it on (the mesh axis's group), on buffers the caller owns and reuses (the best case of a
//     hand-written program; 64-byte aligned flexpar::aligned_vector, as the tensors' shards), its
//     input written in the untimed preparation as from_full writes the boxing's (so both start from
//     data just written);
//   - "bare+alloc": the same collective with its output vector allocated fresh in the timed region
//     (what boxing cost before the tensors' buffer pool: a new tensor per call); for the in-place
//     P -> B, a buffer made fresh before the timing;
//   - "pass": a memcpy of the bytes the boxing copies beyond the collective, on warm buffers: for
//     S(1) -> B the placing of the received rows from the staging slots ((p-1)/p n bytes: my own rows
//     are copied once, as the bare allgather copies them), for S(0) -> S(1) the pack of the blocks
//     for the other ranks ((p-1)/p^2 n bytes; on one node the rounds pack them where the bare packs
//     its contiguous blocks, and copy my own block once where the bare copies it twice: so the pass
//     is an upper bound there), for P -> S(1) the pack a program calling the bare makes first (its
//     summand's strided rows into contiguous blocks: n bytes, as a warm memcpy, a lower bound on the
//     strided pack; the boxing packs them in its rounds instead); 0 where nothing is copied
//     (P -> S(0) leaves my block at the front of the buffer).
//   For P -> S(0) and P -> S(1) the bare is the out-of-place reduce_scatter_v into a reused buffer of my block (the
//   data movement of the boxing: my block, reduced, in a buffer of its own); a second table sets the
//   boxing next to the two in-place forms as well: my block left at its offset of the n-element
//   buffer, and at its front (the call the boxing makes, on the buffer of a tensor made like the
//   boxing's: same memory, same state, without the boxing). P -> S(1)'s group has that front call
//   too: the fastest form of the bare, the call P -> S(1) makes on strided rows made on contiguous
//   blocks (on the Intel host the out-of-place form took up to 2.6x of it at 1 MiB).
// After the timing of each size (first repeat), every boxing runs once more on values that differ by
// element and, under P(sum), by rank, and its result is compared with the logical tensor; the exit
// status is 1 when an element differs.
// Two controls sit beside P -> B, whose boxing makes exactly the bare's call (an in-place allreduce):
// the same call on the buffer of a tensor made by from_full ("on tensor": the boxing's memory, without
// the boxing), and the bare again on a second buffer of the caller's ("A/A": two runs of one call on
// two buffers, the resolution of a ratio on this machine).
// Boxing tensors come from the placement's buffer pool (the input is made by from_full in the
// untimed preparation, the result goes back to the pool untimed), as in a training step that boxes
// the same shapes again and again. Each sample is the slowest rank's time of that iteration; the
// tables print medians after `--warmup` untimed iterations, and the ratios boxing / bare,
// boxing / bare+alloc and boxing / (bare + pass). With --repeat R the tables are measured R times,
// every size in turn, and a last table gives each row's median ratio and range over the repeats (on
// a shared machine one run's medians of a few percent apart say little).
//
//   mpiexec -n 2 flexpar_sbp_bench [-b 1M] [-e 16M] [-f 4] [--iters 20] [--warmup 3] [--block 1] [--cols 256]
//                                  [--repeat 1]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <flexpar/core/check_mpi.hpp>
#include <flexpar/sbp/sbp.hpp>

#include "bench_cli.hpp"
#include "bench_timing.hpp"

namespace {

using namespace flexpar::sbp;

/// One thing to time: `prepare` and `finish` run untimed around the timed `run`.
struct variant {
  std::function<void()> prepare, run, finish;
};

/// How the variants of a group take turns: `block` 1 interleaves them (iteration i runs every variant
/// once, rotated), after `warmup` untimed iterations of the group; `block` K > 1 runs each variant K
/// timed iterations in a row, after `warmup` untimed ones of its own, the variants taking turns block
/// by block (rotated), so that each iteration finds the cache as the same variant left it: the
/// steady state of a loop that boxes one shape, where the interleaved order measures every variant
/// after another one's traffic.
struct schedule {
  int warmup = 3, iters = 20, block = 1;
};

/// Times `v` once (prepare, barrier, run, finish): the slowest rank's microseconds.
double time_once(const variant& v) {
  v.prepare();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  v.run();
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  v.finish();
  double slowest = 0;
  MPI_Allreduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

/// Runs the variants as `s` says; returns the median over timed iterations of the slowest rank's
/// time, per variant (microseconds).
std::vector<double> measure(const schedule& s, const std::vector<variant>& variants) {
  std::vector<std::vector<double>> samples(variants.size());
  const std::size_t count = variants.size();
  if (s.block <= 1) {
    for (int i = 0; i < s.warmup + s.iters; ++i)
      for (std::size_t j = 0; j < count; ++j) {
        // rotated: iteration i starts at variant i mod V, so that each variant follows every other one
        // alike (the cache and pool state a variant leaves behind falls on all of them)
        const std::size_t v = (j + static_cast<std::size_t>(i)) % count;
        const double us = time_once(variants[v]);
        if (i >= s.warmup) samples[v].push_back(us);
      }
  } else {
    for (int done = 0, turn = 0; done < s.iters; done += s.block, ++turn)
      for (std::size_t j = 0; j < count; ++j) {
        const std::size_t v = (j + static_cast<std::size_t>(turn)) % count;
        for (int i = 0; i < s.warmup; ++i) (void)time_once(variants[v]);
        for (int i = 0; i < std::min(s.block, s.iters - done); ++i) samples[v].push_back(time_once(variants[v]));
      }
  }
  std::vector<double> medians;
  for (auto& x : samples) medians.push_back(flexpar::bench::median_in_place(x));
  return medians;
}

void nothing() {}

struct row {
  std::string boxing;
  std::size_t bytes;
  double boxed_us, bare_us, bare_alloc_us, pass_us;
};

/// P -> S(0) next to the three forms of the bare reduce-scatter (microseconds).
struct forms {
  std::size_t bytes;
  double boxed_us, out_of_place_us, my_block_us, front_us;
  double strided_boxed_us = 0, strided_front_us = 0;  ///< P -> S(1), and the front form in its group
};

/// P -> B next to its controls (microseconds): the bare allreduce on a from_full tensor's buffer, and
/// on a second buffer of the caller's.
struct controls {
  std::size_t bytes;
  double boxed_us, bare_us, on_tensor_us, second_us;
};

/// to<To>(std::move(t)) of a tensor made by from_full (untimed), the result freed into the pool (untimed).
template <class From, class To>
variant boxing_of(const placement<1>& mesh, const shape_t& shape, const flexpar::aligned_vector<float>& full) {
  auto t = std::make_shared<std::optional<global_tensor<float, From>>>();
  auto r = std::make_shared<std::optional<global_tensor<float, To>>>();
  return {[t, &mesh, shape, &full] { t->emplace(global_tensor<float, From>::from_full(mesh, shape, full)); },
          [t, r] { r->emplace(to<To>(std::move(**t))); },
          [t, r] {
            t->reset();
            r->reset();
          }};
}

/// call(buffer): the collective a boxing makes, on the buffer of a P(sum) tensor made by from_full
/// like the boxing's (untimed), so the same memory in the same state, without the boxing.
template <class Call>
variant call_on_tensor(const placement<1>& mesh, const shape_t& shape, const flexpar::aligned_vector<float>& full,
                       Call call) {
  auto t = std::make_shared<std::optional<global_tensor<float, partial_sum>>>();
  return {[t, &mesh, shape, &full] { t->emplace(global_tensor<float, partial_sum>::from_full(mesh, shape, full)); },
          [t, call] { call((*t)->to_local()); }, [t] { t->reset(); }};
}

/// One more call of to<To>, untimed, on a tensor whose values differ by element and, under P(sum), by
/// rank (rank r < p - 1 holds a small summand of its own, the last one the logical tensor minus them:
/// sums of small integers, exact): the elements of its result, gathered by to_full (no boxing), that
/// differ from the logical tensor, over every rank.
template <class From, class To>
long long wrong_boxing(const placement<1>& mesh, const shape_t& shape) {
  const int p = mesh.parent().size(), me = mesh.parent().rank();
  std::vector<float> logical(elements_of(shape)), mine(logical.size());
  for (std::size_t i = 0; i < logical.size(); ++i) logical[i] = static_cast<float>(static_cast<int>(i % 17) - 8);
  auto summand = [](int r, std::size_t i) {
    return static_cast<float>(static_cast<int>((i + 3 * static_cast<std::size_t>(r)) % 5) - 2);
  };
  for (std::size_t i = 0; i < mine.size(); ++i) {
    mine[i] = logical[i];
    if (me < p - 1) {
      mine[i] = summand(me, i);
    } else {
      for (int r = 0; r < p - 1; ++r) mine[i] -= summand(r, i);
    }
  }
  auto t = std::is_same_v<From, partial_sum> ? global_tensor<float, From>::from_local(mesh, shape, mine)
                                             : global_tensor<float, From>::from_full(mesh, shape, logical);
  const std::vector<float> got = to<To>(std::move(t)).to_full();
  long long wrong = got.size() == logical.size() ? 0 : static_cast<long long>(logical.size());
  if (wrong == 0)
    for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != logical[i];
  FLEXPAR_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
  return wrong;
}

/// A warm memcpy of `n` floats (the extra pass some boxings make), as a variant.
variant memcpy_pass(flexpar::aligned_vector<float>& from, flexpar::aligned_vector<float>& to, std::size_t n) {
  return {nothing, [&from, &to, n] { std::memcpy(to.data(), from.data(), n * sizeof(float)); }, nothing};
}

/// Over --repeat runs of the whole table (every size in turn, so that a slow spell of the machine
/// falls on all rows alike): per row, the median and the range of boxing / bare, and the medians of
/// boxing / bare+alloc and boxing / (bare + pass); then P -> S(0) against front, and P -> B's controls.
void print_over_repeats(const std::vector<std::vector<row>>& repeats,
                        const std::vector<std::vector<forms>>& form_repeats,
                        const std::vector<std::vector<controls>>& control_repeats) {
  std::printf("# over %zu repeats: per row the median and range of the repeats' ratios\n", repeats.size());
  std::printf("%-15s %9s %8s %15s %8s %10s\n", "boxing", "bytes", "/bare", "/bare range", "/+alloc", "/bare+pass");
  for (std::size_t i = 0; i < repeats.front().size(); ++i) {
    std::vector<double> bare, alloc, pass;
    for (const std::vector<row>& rows : repeats) {
      const row& r = rows[i];
      bare.push_back(r.boxed_us / r.bare_us);
      alloc.push_back(r.boxed_us / r.bare_alloc_us);
      pass.push_back(r.boxed_us / (r.bare_us + r.pass_us));
    }
    const double mid = flexpar::bench::median_in_place(bare);  // sorts: front() and back() are the range
    std::printf("%-15s %9zu %7.2fx %7.2f-%5.2fx %7.2fx %9.2fx\n", repeats.front()[i].boxing.c_str(),
                repeats.front()[i].bytes, mid, bare.front(), bare.back(), flexpar::bench::median_in_place(alloc),
                flexpar::bench::median_in_place(pass));
  }
  std::printf(
      "# P(sum) -> S(0) against the in-place call it makes (front), and P(sum) -> S(1) against the same call "
      "(its bare on contiguous blocks), over the repeats\n");
  std::printf("%9s %8s %15s %10s %17s\n", "bytes", "/front", "/front range", "S(1)/front", "S(1)/front range");
  for (std::size_t i = 0; i < form_repeats.front().size(); ++i) {
    std::vector<double> front, strided;
    for (const std::vector<forms>& f : form_repeats) {
      front.push_back(f[i].boxed_us / f[i].front_us);
      strided.push_back(f[i].strided_boxed_us / f[i].strided_front_us);
    }
    // each median_in_place sorts its vector: front() and back() are then the range
    const double mid = flexpar::bench::median_in_place(front), mid_strided = flexpar::bench::median_in_place(strided);
    std::printf("%9zu %7.2fx %7.2f-%5.2fx %9.2fx %9.2f-%5.2fx\n", form_repeats.front()[i].bytes, mid, front.front(),
                front.back(), mid_strided, strided.front(), strided.back());
  }
  std::printf("# P(sum) -> B against its call on a tensor's buffer, and the A/A control, over the repeats\n");
  std::printf("%9s %11s %17s %8s %15s\n", "bytes", "/on-tensor", "/on-tensor range", "A/A", "A/A range");
  for (std::size_t i = 0; i < control_repeats.front().size(); ++i) {
    std::vector<double> on_tensor, second;
    for (const std::vector<controls>& c : control_repeats) {
      on_tensor.push_back(c[i].boxed_us / c[i].on_tensor_us);
      second.push_back(c[i].second_us / c[i].bare_us);
    }
    // each median_in_place sorts its vector: front() and back() are then the range
    const double mid_on_tensor = flexpar::bench::median_in_place(on_tensor);
    const double mid_second = flexpar::bench::median_in_place(second);
    std::printf("%9zu %10.2fx %9.2f-%5.2fx %7.2fx %7.2f-%5.2fx\n", control_repeats.front()[i].bytes, mid_on_tensor,
                on_tensor.front(), on_tensor.back(), mid_second, second.front(), second.back());
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CLI::App app{"flexpar_sbp_bench: boxing next to the bare collective it calls"};
  std::string begin = "1M", end = "16M";
  int factor = 4, repeat = 1;
  schedule plan;
  std::size_t cols = 256;
  app.add_option("-b,--minbytes", begin, "smallest logical tensor (bytes, K/M/G)");
  app.add_option("-e,--maxbytes", end, "largest logical tensor");
  app.add_option("-f,--stepfactor", factor, "size multiplier between rows");
  app.add_option("--iters", plan.iters, "measured iterations per row")->check(CLI::PositiveNumber);
  app.add_option("--warmup", plan.warmup, "untimed iterations before them (before each block with --block)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--block", plan.block,
                 "timed iterations each variant runs in a row, the variants taking turns block by block (steady "
                 "state); 1 (the default) interleaves them iteration by iteration")
      ->check(CLI::PositiveNumber);
  app.add_option("--repeat", repeat,
                 "measure every row this many times, all sizes in turn; then print the ratios' medians and "
                 "ranges over the repeats")
      ->check(CLI::PositiveNumber);
  app.add_option("--cols", cols, "columns of the [n, cols] tensors (S(1)'s runs: cols / p elements)")
      ->check(CLI::PositiveNumber);
  if (const auto done = flexpar::bench::parse_or_finalize(app, argc, argv, rank)) return *done;
  int status = 0;
  {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    placement<1> mesh(comm, {comm.size()}, {}, std::make_shared<buffer_pool>(std::size_t{1} << 30));
    // the bare collectives run on the communicator the boxing calls them on: the mesh axis's group
    flexpar::communicator& axis = mesh.axis(0);
    const int p = comm.size();
    const auto up = static_cast<std::size_t>(p);
    std::vector<std::vector<row>> repeats;  // every repeat's rows, in one order
    std::vector<std::vector<forms>> form_repeats;
    std::vector<std::vector<controls>> control_repeats;
    long long wrong = 0;  // elements of the verified boxings' results that differ, over ranks and sizes
    for (int rep = 0; rep < repeat; ++rep) {
      std::vector<row> rows;
      std::vector<forms> reduce_scatter_forms;
      std::vector<controls> allreduce_controls;
      for (std::size_t bytes = flexpar::bench::parse_size(begin); bytes <= flexpar::bench::parse_size(end);
           bytes *= static_cast<std::size_t>(factor)) {
        const std::size_t n = bytes / sizeof(float) / cols / up * up;
        const shape_t shape{n, cols};
        const std::size_t count = n * cols, block = count / up;
        const flexpar::aligned_vector<float> full(count, 1.0f), shard(block, 1.0f);
        // my shard as the bare allgather's and alltoall's input, written before each call as from_full
        // writes the boxing's (so both start from a shard just written)
        flexpar::aligned_vector<float> mine(block);
        const auto write_mine = [&] { std::copy(shard.begin(), shard.end(), mine.begin()); };
        flexpar::aligned_vector<float> buffer(count), out(count), fresh, scratch_a(count, 1.0f), scratch_b(count, 1.0f);
        const std::vector<std::size_t> even(up, block);

        {  // P -> B: allreduce, in place; with the controls (on a tensor's buffer, and A/A on a second one)
          flexpar::aligned_vector<float> second(count);
          const auto m = measure(
              plan,
              {boxing_of<partial_sum, broadcast>(mesh, shape, full),
               {[&] { std::copy(full.begin(), full.end(), buffer.begin()); },
                [&] { flexpar::allreduce(axis, std::span(buffer), flexpar::reduce_op::sum); }, nothing},
               {[&] { fresh = flexpar::aligned_vector<float>(full); },
                [&] { flexpar::allreduce(axis, std::span(fresh), flexpar::reduce_op::sum); }, [&] { fresh = {}; }},
               call_on_tensor(mesh, shape, full,  // the call P -> B makes: an in-place allreduce
                              [&](std::span<float> b) { flexpar::allreduce(axis, b, flexpar::reduce_op::sum); }),
               {[&] { std::copy(full.begin(), full.end(), second.begin()); },
                [&] { flexpar::allreduce(axis, std::span(second), flexpar::reduce_op::sum); }, nothing}});
          rows.push_back({"P(sum) -> B", bytes, m[0], m[1], m[2], 0});
          allreduce_controls.push_back({bytes, m[0], m[1], m[3], m[4]});
        }
        // P -> S(i): the bare is the out-of-place reduce_scatter_v of my block into a buffer of its own
        // (reused, and fresh per call), the summand written in the preparation as from_full writes it
        const auto write_full = [&] { std::copy(full.begin(), full.end(), buffer.begin()); };
        auto bare_reduce_scatter = [&] {
          return std::vector<variant>{
              {write_full,
               [&] {
                 flexpar::reduce_scatter_v(axis, std::span<const float>(buffer), std::span(out).first(block),
                                           std::span<const std::size_t>(even), flexpar::reduce_op::sum);
               },
               nothing},
              {write_full,
               [&] {
                 fresh = flexpar::aligned_vector<float>(block);
                 flexpar::reduce_scatter_v(axis, std::span<const float>(buffer), std::span(fresh),
                                           std::span<const std::size_t>(even), flexpar::reduce_op::sum);
               },
               [&] { fresh = {}; }}};
        };
        {  // P -> S(0): the boxing leaves my block at the front of the tensor's buffer, which is then cut
          // down to it (nothing moves beyond the collective); next to the in-place forms as well
          auto in_place = [&](flexpar::result_at where) {
            return variant{write_full,
                           [&, where] {
                             flexpar::reduce_scatter_v(axis, std::span(buffer), std::span<const std::size_t>(even),
                                                       flexpar::reduce_op::sum, where);
                           },
                           nothing};
          };
          std::vector<variant> v{boxing_of<partial_sum, split<0>>(mesh, shape, full)};
          for (variant& b : bare_reduce_scatter()) v.push_back(std::move(b));
          v.push_back(in_place(flexpar::result_at::my_block));
          v.push_back(call_on_tensor(mesh, shape, full, [&](std::span<float> b) {  // the call P -> S(0) makes
            flexpar::reduce_scatter_v(axis, b, std::span<const std::size_t>(even), flexpar::reduce_op::sum,
                                      flexpar::result_at::front);
          }));
          const auto m = measure(plan, v);
          rows.push_back({"P(sum) -> S(0)", bytes, m[0], m[1], m[2], 0});  // no pass: nothing moves
          reduce_scatter_forms.push_back({bytes, m[0], m[1], m[3], m[4]});
        }
        {  // P -> S(1): the rows of my columns are strided in every summand; the rounds pack them (the
          // pass: the pack of the whole summand into contiguous blocks that the bare would need first)
          std::vector<variant> v{boxing_of<partial_sum, split<1>>(mesh, shape, full)};
          for (variant& b : bare_reduce_scatter()) v.push_back(std::move(b));
          v.push_back(memcpy_pass(scratch_a, scratch_b, count));
          // the call P -> S(0) makes, on a summand whose blocks are contiguous: the fastest form of
          // the bare, which P -> S(1) makes on strided rows
          v.push_back(call_on_tensor(mesh, shape, full, [&](std::span<float> b) {
            flexpar::reduce_scatter_v(axis, b, std::span<const std::size_t>(even), flexpar::reduce_op::sum,
                                      flexpar::result_at::front);
          }));
          const auto m = measure(plan, v);
          rows.push_back({"P(sum) -> S(1)", bytes, m[0], m[1], m[2], m[3]});
          reduce_scatter_forms.back().strided_boxed_us = m[0];
          reduce_scatter_forms.back().strided_front_us = m[4];
        }
        // S(0) -> B and S(1) -> B: allgather (the second also places the received rows: (p-1)/p n bytes).
        // Each in its own interleaved group next to the bare allgather: measured in one group, the first
        // boxing inherited the pool and cache state the second left behind.
        auto bare_allgather = [&] {
          return std::vector<variant>{
              {write_mine, [&] { flexpar::allgather(axis, std::span<const float>(mine), std::span(out)); }, nothing},
              {write_mine,
               [&] {
                 fresh = flexpar::aligned_vector<float>(count);
                 flexpar::allgather(axis, std::span<const float>(mine), std::span(fresh));
               },
               [&] { fresh = {}; }}};
        };
        {
          std::vector<variant> v{boxing_of<split<0>, broadcast>(mesh, shape, full)};
          for (variant& b : bare_allgather()) v.push_back(std::move(b));
          const auto m = measure(plan, v);
          rows.push_back({"S(0) -> B", bytes, m[0], m[1], m[2], 0});
        }
        {
          std::vector<variant> v{boxing_of<split<1>, broadcast>(mesh, shape, full)};
          for (variant& b : bare_allgather()) v.push_back(std::move(b));
          v.push_back(memcpy_pass(scratch_a, scratch_b, count - block));
          const auto m = measure(plan, v);
          rows.push_back({"S(1) -> B", bytes, m[0], m[1], m[2], m[3]});
        }
        {  // S(0) -> S(1): alltoall; the blocks for the other ranks are packed by columns first
          // ((p-1)/p of my shard: the bare alltoall copies my own block too, the boxing copies it once)
          flexpar::aligned_vector<float> got(block);
          const auto m = measure(
              plan,
              {boxing_of<split<0>, split<1>>(mesh, shape, full),
               {write_mine, [&] { flexpar::alltoall(axis, std::span<const float>(mine), std::span(got)); }, nothing},
               {write_mine,
                [&] {
                  fresh = flexpar::aligned_vector<float>(block);
                  flexpar::alltoall(axis, std::span<const float>(mine), std::span(fresh));
                },
                [&] { fresh = {}; }},
               memcpy_pass(scratch_a, scratch_b, block - block / up)});
          rows.push_back({"S(0) -> S(1)", bytes, m[0], m[1], m[2], m[3]});
        }
        if (rep == 0) {  // every boxing timed above, once more on values that show a wrong result
          wrong += wrong_boxing<partial_sum, broadcast>(mesh, shape);
          wrong += wrong_boxing<partial_sum, split<0>>(mesh, shape);
          wrong += wrong_boxing<partial_sum, split<1>>(mesh, shape);
          wrong += wrong_boxing<split<0>, broadcast>(mesh, shape);
          wrong += wrong_boxing<split<1>, broadcast>(mesh, shape);
          wrong += wrong_boxing<split<0>, split<1>>(mesh, shape);
        }
      }
      if (rank == 0) {
        std::printf(
            "# flexpar_sbp_bench: %d ranks, f32 tensors [n, %zu], %s, median of %d after %d warm-up%s, "
            "slowest rank per iteration; repeat %d of %d\n",
            p, cols, plan.block > 1 ? ("in blocks of " + std::to_string(plan.block)).c_str() : "interleaved",
            plan.iters, plan.warmup, plan.block > 1 ? " per block" : "", rep + 1, repeat);
        std::printf("%-15s %9s %10s %9s %10s %8s %8s %8s %9s\n", "boxing", "bytes", "boxing(us)", "bare(us)",
                    "+alloc(us)", "pass(us)", "/bare", "/+alloc", "/bare+pass");
        for (const row& r : rows)
          std::printf("%-15s %9zu %10.1f %9.1f %10.1f %8.1f %7.2fx %7.2fx %8.2fx\n", r.boxing.c_str(), r.bytes,
                      r.boxed_us, r.bare_us, r.bare_alloc_us, r.pass_us, r.boxed_us / r.bare_us,
                      r.boxed_us / r.bare_alloc_us, r.boxed_us / (r.bare_us + r.pass_us));
        std::printf(
            "# P(sum) -> S(0) and the forms of the bare reduce_scatter_v: out of place (the bare above), in "
            "place with my block left at its offset, in place with it at the front of a from_full tensor's buffer (the "
            "call the boxing makes, on the memory it makes it on)\n");
        std::printf("%9s %10s %12s %12s %10s %9s %9s %9s %12s %12s\n", "bytes", "boxing(us)", "out-of-pl(us)",
                    "my_block(us)", "front(us)", "/out-pl", "/my_blk", "/front", "S(1)/front", "(in its group)");
        for (const forms& f : reduce_scatter_forms)
          std::printf("%9zu %10.1f %12.1f %12.1f %10.1f %8.2fx %8.2fx %8.2fx %11.2fx %10.1fus\n", f.bytes, f.boxed_us,
                      f.out_of_place_us, f.my_block_us, f.front_us, f.boxed_us / f.out_of_place_us,
                      f.boxed_us / f.my_block_us, f.boxed_us / f.front_us, f.strided_boxed_us / f.strided_front_us,
                      f.strided_front_us);
        std::printf(
            "# controls: P(sum) -> B's call (in-place allreduce) on a from_full tensor's buffer (on-tensor), and the "
            "bare again on a second buffer of the caller's (A/A: the resolution of a ratio here)\n");
        std::printf("%9s %10s %9s %13s %10s %11s %9s\n", "bytes", "boxing(us)", "bare(us)", "on-tensor(us)",
                    "second(us)", "/on-tensor", "A/A");
        for (const controls& c : allreduce_controls)
          std::printf("%9zu %10.1f %9.1f %13.1f %10.1f %10.2fx %8.2fx\n", c.bytes, c.boxed_us, c.bare_us,
                      c.on_tensor_us, c.second_us, c.boxed_us / c.on_tensor_us, c.second_us / c.bare_us);
        // what the boxing tensors' pool did over the whole run (untimed preparation included): a
        // reused buffer grown past its size is zeroed by std::vector, which `filled` counts
        const buffer_pool::statistics pool = mesh.pool().stats();
        std::printf("# pool (rank 0): %zu hits, %zu misses, %zu elements filled, %zu returned, %zu dropped\n",
                    pool.hits, pool.misses, pool.filled, pool.returned, pool.dropped);
      }
      repeats.push_back(std::move(rows));
      form_repeats.push_back(std::move(reduce_scatter_forms));
      control_repeats.push_back(std::move(allreduce_controls));
    }
    if (rank == 0 && repeat > 1) print_over_repeats(repeats, form_repeats, control_repeats);
    if (rank == 0) std::printf("# verified: one more call of every boxing per size, %lld wrong\n", wrong);
    status = wrong == 0 ? 0 : 1;
  }
  MPI_Finalize();
  return status;
}
