// flexpar/cuda/engine.hpp: the engine's device backend on its own, with 2 and 3 thread ranks on one
// GPU (the ipc and staged paths), every collective the engine runs against a serial oracle on small
// integers: a fused allreduce of uneven tensors (with a rank that has joined and contributes the
// identity), one tensor in and out of place, broadcast (a joined rank receives into scratch),
// allgather with even and uneven counts, reduce_scatter with even and uneven blocks, alltoall. The
// inputs are uploaded on the caller's stream and read back on it after order_after(), with no host
// wait in between: the markers alone order the work.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include <flexpar/comm/run_in_process.hpp>
#include <flexpar/cuda/engine.hpp>
#include <flexpar/engine/engine.hpp>

#include "gpu/device_io.hpp"
#include "support/test_config.hpp"

namespace fc = flexpar::cuda;
using flexpar::collective_kind;
using flexpar::device_item;
using flexpar::dtype;
using flexpar::reduce_op;
using flexpar::testing_support::download;
using namespace std::chrono_literals;

namespace {

float value(int rank, std::size_t tensor, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 3 + tensor * 5 + static_cast<std::size_t>(rank) * 7) % 17) - 8);
}

std::vector<float> tensor_of(int rank, std::size_t tensor, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value(rank, tensor, i);
  return v;
}

fc::device_options shared_gpu() {
  fc::device_options o;
  o.use_nccl = false;
  return o;
}

/// Uploads on `s` without waiting (the marker orders the backend after it).
fc::device_buffer<float> upload_async(const std::vector<float>& h, cudaStream_t s) {
  fc::device_buffer<float> d(h.size());
  fc::copy_async(d.span(), std::span<const float>(h), s);
  return d;
}

std::byte* bytes(const fc::device_buffer<float>& b) { return reinterpret_cast<std::byte*>(b.data()); }

}  // namespace

TEST(EngineBackend, FusedAllreduceWithAJoinedRankMatchesTheSerialSum) {
  for (int world : {2, 3}) {
    const std::vector<std::size_t> sizes{1, 1000, 7, 40001, 0};
    flexpar::run_in_process(
        world,
        [&](flexpar::communicator& comm) {
          fc::device_communicator gpu(comm, 0, shared_gpu());
          fc::engine_backend backend(gpu);
          fc::stream s;
          const bool joined = comm.rank() == world - 1;  // contributes the identity to every tensor
          std::vector<fc::device_buffer<float>> in, out;
          std::vector<device_item> items;
          for (std::size_t t = 0; t < sizes.size(); ++t) {
            in.push_back(upload_async(tensor_of(comm.rank(), t, sizes[t]), s));
            out.emplace_back(sizes[t]);
            if (joined)
              items.push_back({nullptr, nullptr, sizes[t], nullptr});
            else
              items.push_back({bytes(in[t]), bytes(out[t]), sizes[t], backend.capture(s)});
          }
          std::string path;
          const std::vector<std::uint64_t> counts(static_cast<std::size_t>(world), 0);
          const auto end = backend.run(collective_kind::allreduce, dtype::f32, reduce_op::sum, -1, items, counts, path);
          backend.order_after(end, s);
          if (joined) return;
          for (std::size_t t = 0; t < sizes.size(); ++t) {
            const auto got = download(fc::device_span<const float>(out[t].span()), s);
            for (std::size_t i = 0; i < sizes[t]; ++i) {
              float want = 0;
              for (int r = 0; r + 1 < world; ++r) want += value(r, t, i);
              ASSERT_EQ(got[i], want) << "world " << world << " tensor " << t << " i " << i << " path " << path;
            }
          }
          EXPECT_TRUE(backend.done(end));
          const flexpar::device_phases ph = backend.phases(end);
          EXPECT_GE(ph.copy_in, 0.0f);
          EXPECT_GE(ph.collective, 0.0f);
          EXPECT_GE(ph.copy_out, 0.0f);
        },
        flexpar::testing_support::with_timeout(60s));
  }
}

TEST(EngineBackend, EveryCollectiveOfOneTensorMatchesTheSerialOracle) {
  for (int world : {2, 3}) {
    flexpar::run_in_process(
        world,
        [&](flexpar::communicator& comm) {
          const auto p = static_cast<std::size_t>(world), me = static_cast<std::size_t>(comm.rank());
          fc::device_communicator gpu(comm, 0, shared_gpu());
          fc::engine_backend backend(gpu);
          fc::stream s;
          std::string path;
          auto run = [&](collective_kind kind, reduce_op op, int root, device_item item,
                         const std::vector<std::uint64_t>& counts) {
            const auto end = backend.run(kind, dtype::f32, op, root, std::span(&item, 1), counts, path);
            backend.order_after(end, s);
          };
          // allreduce (avg), out of place and in place
          {
            const std::size_t n = 3001;
            std::vector<float> mine(n);
            for (std::size_t i = 0; i < n; ++i) mine[i] = value(comm.rank(), 0, i) * static_cast<float>(world);
            auto in = upload_async(mine, s);
            fc::device_buffer<float> out(n);
            run(collective_kind::allreduce, reduce_op::avg, -1, {bytes(in), bytes(out), n, backend.capture(s)}, {});
            auto got = download(fc::device_span<const float>(out.span()), s);
            for (std::size_t i = 0; i < n; ++i) {
              float want = 0;
              for (int r = 0; r < world; ++r) want += value(r, 0, i);
              ASSERT_EQ(got[i], want) << "allreduce avg world " << world;
            }
            run(collective_kind::allreduce, reduce_op::max, -1, {bytes(in), bytes(in), n, backend.capture(s)}, {});
            got = download(fc::device_span<const float>(in.span()), s);
            for (std::size_t i = 0; i < n; ++i) {
              float want = -1e9f;
              for (int r = 0; r < world; ++r) want = std::max(want, value(r, 0, i) * static_cast<float>(world));
              ASSERT_EQ(got[i], want) << "allreduce max in place world " << world;
            }
          }
          // broadcast from rank 0; the last rank has joined (no buffer: scratch)
          {
            const std::size_t n = 777;
            auto data = upload_async(tensor_of(comm.rank(), 1, n), s);
            const bool joined = comm.rank() == world - 1;
            run(collective_kind::broadcast, reduce_op::sum, 0,
                joined ? device_item{nullptr, nullptr, n, nullptr}
                       : device_item{bytes(data), bytes(data), n, backend.capture(s)},
                {});
            if (!joined) {
              ASSERT_EQ(download(fc::device_span<const float>(data.span()), s), tensor_of(0, 1, n)) << "broadcast";
            }
          }
          // allgather, even and uneven counts
          for (bool even : {true, false}) {
            std::vector<std::uint64_t> counts(p);
            for (std::size_t q = 0; q < p; ++q) counts[q] = even ? 500 : 100 + 37 * q;
            const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
            auto in = upload_async(tensor_of(comm.rank(), 2, counts[me]), s);
            fc::device_buffer<float> out(total);
            run(collective_kind::allgather, reduce_op::sum, -1, {bytes(in), bytes(out), counts[me], backend.capture(s)},
                counts);
            const auto got = download(fc::device_span<const float>(out.span()), s);
            std::vector<float> want;
            for (std::size_t q = 0; q < p; ++q) {
              const auto b = tensor_of(static_cast<int>(q), 2, counts[q]);
              want.insert(want.end(), b.begin(), b.end());
            }
            ASSERT_EQ(got, want) << (even ? "even" : "uneven") << " allgather world " << world;
          }
          // reduce_scatter, blocks even and uneven (the first count % p one longer)
          for (std::size_t count : {p * 400, p * 400 + p - 1}) {
            const std::size_t base = count / p, extra = count % p;
            const std::size_t mine_count = base + (me < extra ? 1 : 0), at = me * base + std::min(me, extra);
            auto in = upload_async(tensor_of(comm.rank(), 3, count), s);
            fc::device_buffer<float> out(mine_count);
            run(collective_kind::reduce_scatter, reduce_op::sum, -1, {bytes(in), bytes(out), count, backend.capture(s)},
                {});
            const auto got = download(fc::device_span<const float>(out.span()), s);
            for (std::size_t i = 0; i < mine_count; ++i) {
              float want = 0;
              for (int r = 0; r < world; ++r) want += value(r, 3, at + i);
              ASSERT_EQ(got[i], want) << "reduce_scatter count " << count << " world " << world;
            }
          }
          // alltoall
          {
            const std::size_t block = 333, count = block * p;
            auto in = upload_async(tensor_of(comm.rank(), 4, count), s);
            fc::device_buffer<float> out(count);
            run(collective_kind::alltoall, reduce_op::sum, -1, {bytes(in), bytes(out), count, backend.capture(s)}, {});
            const auto got = download(fc::device_span<const float>(out.span()), s);
            for (std::size_t q = 0; q < p; ++q)
              for (std::size_t i = 0; i < block; ++i)
                ASSERT_EQ(got[q * block + i], value(static_cast<int>(q), 4, me * block + i)) << "alltoall";
          }
        },
        flexpar::testing_support::with_timeout(60s));
  }
}
