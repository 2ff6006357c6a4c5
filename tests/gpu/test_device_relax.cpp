// flexpar/cuda/relax.hpp under mpiexec (processes sharing the GPU: the ipc path and staged
// point-to-point; a GPU each: NCCL): each device relaxation against its host form (flexpar/relax/)
// on the same ranks, the same weights and gradients, SGD with momentum and weight decay for several
// steps: weights and gradients bit-identical after every step, and the same traffic.
//   - Dyadic settings (gradients k/8, weights k/4, learning rate 1/8, momentum 1/2, decay 0 or 1/4):
//     the allreduce-based averages (gradient_allreduce, local_sgd, decentralized all) sum exactly
//     until a division by 3 rounds: bit-identical on 1 and 2 ranks, and on 3 ranks within float
//     rounding (1e-5 relative) once weights that were divided by 3 are summed in each path's order.
//   - Any settings (0.05, 0.9, 1e-3): bytegrad (same codes, same decode-and-sum order, same division),
//     decentralized shift_one / ring (mine + the peers' in the same order, then one division),
//     low_precision_decentralized (the same differences, codes and replica sums), and
//     qadam (its own Adam, adam.cu's operations in the host loop's order; warm-up on sums of k/8).
//   - onebit_adam: within float rounding (1e-4 relative): cuda::onebit sums its scale in another order.
// Also: a parameter list that differs between ranks is one usage_error on every rank; an unknown
// algorithm is named with the known ones (every host algorithm has a device form); async_model_average
// keeps the host form's rules (pause in a common round, one average after finish()).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <flexpar/collective.hpp>
#include <flexpar/comm/communicator.hpp>
#include <flexpar/cuda/relax.hpp>
#include <flexpar/relax/registry.hpp>

#include "gpu/device_io.hpp"
#include "relax/relax_scenarios.hpp"  // eventually, gather_all

namespace fc = flexpar::cuda;
namespace fr = flexpar::relax;
using flexpar::testing_support::download;
using flexpar::testing_support::eventually;
using flexpar::testing_support::gather_all;
using flexpar::testing_support::upload;

namespace {

fc::device_communicator make_gpu(flexpar::communicator& comm) {
  const int devices = fc::device_count();  // at least one: the gpu tests' main skips without
  fc::device_options options;
  options.use_nccl = devices >= comm.topology().local_size();
  const int device = comm.topology().local_rank() % devices;
  FLEXPAR_CHECK_CUDA(comm.rank(), cudaSetDevice(device));
  return fc::device_communicator(comm, device, options);
}

// A gradient value: a multiple of 1/8 in [-2, 2], different per rank, step, tensor and element.
float gradient_value(int rank, int step, std::size_t tensor, std::size_t i) {
  return static_cast<float>(
             static_cast<int>(
                 (i * 7 + tensor * 5 + static_cast<std::size_t>(rank) * 11 + static_cast<std::size_t>(step) * 3) % 33) -
             16) /
         8.0f;
}
float weight_value(int rank, std::size_t tensor, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 3 + tensor + static_cast<std::size_t>(rank) * 13) % 17) - 8) / 4.0f;
}

// Within float rounding of sums taken in another order (1e-4 relative, 1e-6 absolute).
bool close(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > 1e-4f * std::max(std::abs(a[i]), std::abs(b[i])) + 1e-6f) return false;
  return true;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
std::size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return a.size() == b.size() ? a.size() : std::min(a.size(), b.size());
}

// The same model on the host and on the device.
struct twin_model {
  std::vector<std::string> names;
  std::vector<std::vector<float>> w, g;          // host
  std::vector<fc::device_buffer<float>> dw, dg;  // device
  std::vector<fr::parameter> host;
  std::vector<fc::parameter> device;

  twin_model(const std::vector<std::size_t>& sizes, int rank, cudaStream_t s) {
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      names.push_back("layer" + std::to_string(t));
      w.emplace_back(sizes[t]);
      g.emplace_back(sizes[t], 0.0f);
      for (std::size_t i = 0; i < sizes[t]; ++i) w[t][i] = weight_value(rank, t, i);
      dw.push_back(upload(w[t], s));
      dg.push_back(upload(g[t], s));
    }
    for (std::size_t t = 0; t < sizes.size(); ++t) {
      host.push_back({names[t], w[t], g[t]});
      device.push_back({names[t], dw[t].span(), dg[t].span()});
    }
  }
  void set_gradients(int rank, int step, cudaStream_t s) {
    for (std::size_t t = 0; t < g.size(); ++t) {
      for (std::size_t i = 0; i < g[t].size(); ++i) g[t][i] = gradient_value(rank, step, t, i);
      fc::copy_async(dg[t].span(), std::span<const float>(g[t]), s);
    }
  }
};

}  // namespace

namespace {
enum class match : std::uint8_t {
  bits,             // bit-identical on any input
  bits_when_exact,  // bit-identical while sums are exact (dyadic settings; 1 or 2 ranks), else within rounding
  rounding,         // within float rounding (onebit_adam: the 1-bit scale is summed in another order)
};
struct relax_case {
  std::string name;
  fr::options options;
  match how;
};
fr::options adam_settings(std::size_t chunk, std::size_t onebit_chunk) {
  fr::options o;
  o.warmup_steps = 2;  // steps 1-2 exact Adam, 3-5 compressed momentum
  o.adam = {.learning_rate = 0.01f, .weight_decay = 0.01f};
  o.chunk = chunk;
  o.onebit_chunk = onebit_chunk;
  return o;
}
}  // namespace

TEST(DeviceRelax, EachMatchesItsHostFormBitForBit) {
  flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  fc::device_communicator gpu = make_gpu(comm);
  fc::stream s;
  const int me = comm.rank();
  const std::vector<relax_case> cases{
      {"gradient_allreduce", {}, match::bits},  // sums of the raw gradients k/8: exact in any order
      {"bytegrad", {}, match::bits},
      {"bytegrad", {.chunk = 7}, match::bits},
      {"local_sgd", {.interval = 2}, match::bits_when_exact},
      {"decentralized", {.interval = 1, .peers = "all"}, match::bits_when_exact},
      {"decentralized", {.interval = 1, .peers = "shift_one"}, match::bits},
      {"decentralized", {.interval = 2, .peers = "ring"}, match::bits},
      {"low_precision_decentralized", {.interval = 1, .chunk = 7}, match::bits},
      {"low_precision_decentralized", {.interval = 2}, match::bits},
      {"qadam", adam_settings(5, 2048), match::bits},  // its optimizer is its own: the SGD settings do not matter
      {"onebit_adam", adam_settings(512, 64), match::rounding},
  };
  const std::vector<std::vector<std::size_t>> models{{1000, 37, 5003}, {1}, {2, 0, 3}, {70001}};
  const std::vector<fr::sgd_options> dyadic{{.learning_rate = 0.125f, .momentum = 0.5f, .weight_decay = 0.0f},
                                            {.learning_rate = 0.125f, .momentum = 0.5f, .weight_decay = 0.25f}};
  const fr::sgd_options any{.learning_rate = 0.05f, .momentum = 0.9f, .weight_decay = 1e-3f};
  for (const relax_case& c : cases)
    for (const auto& sizes : models) {
      std::vector<fr::sgd_options> settings = dyadic;
      if (c.how != match::bits_when_exact) settings.push_back(any);
      for (const fr::sgd_options& o : settings) {
        const std::string what = c.name + " (" + c.options.peers + ", interval " + std::to_string(c.options.interval) +
                                 ", chunk " + std::to_string(c.options.chunk) + "), " + std::to_string(sizes.size()) +
                                 " tensors of " + std::to_string(sizes.front()) + "..., lr " +
                                 std::to_string(o.learning_rate) + " decay " + std::to_string(o.weight_decay);
        twin_model m(sizes, me, s);
        fr::sgd host_opt(o);
        fc::sgd device_opt(o);
        auto host_algo = fr::make(c.name, comm, c.options);
        auto device_algo = fc::make_relaxation(c.name, gpu, c.options);
        EXPECT_EQ(device_algo->name(), host_algo->name());
        host_algo->start(m.host);
        device_algo->start(m.device, s);
        const bool exact = c.how == match::bits || (c.how == match::bits_when_exact && comm.size() <= 2);
        auto compare = [&](const char* when) {
          for (std::size_t t = 0; t < sizes.size(); ++t) {
            const auto w = download(fc::device_span<const float>(m.dw[t].span()), s);
            const auto g = download(fc::device_span<const float>(m.dg[t].span()), s);
            ASSERT_TRUE(exact ? same_bits(g, m.g[t]) : close(g, m.g[t]))
                << what << ": rank " << me << " " << when << " tensor " << t << " gradient differs first at "
                << first_difference(g, m.g[t]);
            ASSERT_TRUE(exact ? same_bits(w, m.w[t]) : close(w, m.w[t]))
                << what << ": rank " << me << " " << when << " tensor " << t << " weights differ first at "
                << first_difference(w, m.w[t]);
          }
        };
        compare("after start");
        for (int step = 0; step < 5; ++step) {
          m.set_gradients(me, step, s);
          host_algo->step(m.host, host_opt);
          device_algo->step(m.device, device_opt, s);
          compare(("step " + std::to_string(step)).c_str());
          if (HasFatalFailure()) return;
        }
        host_algo->finish(m.host);
        device_algo->finish(m.device, s);
        compare("after finish");
        if (HasFatalFailure()) return;
        const fr::traffic ht = host_algo->traffic_so_far(), dt = device_algo->traffic_so_far();
        EXPECT_EQ(dt.steps, ht.steps) << what;
        EXPECT_EQ(dt.exchanges, ht.exchanges) << what;
        const bool compressed = c.name == "bytegrad" || c.name == "qadam" || c.name == "onebit_adam";
        if (!compressed) {
          EXPECT_EQ(dt.bytes_sent, ht.bytes_sent) << what;
        } else {
          // the compressed average's step 5 pads every partition to the widest encoding; partitions differ
          // by at most one element, i.e. one byte and one chunk header (8 bytes min-max, 4 bytes 1-bit):
          // at most 9 (p - 1) bytes more per step
          EXPECT_GE(dt.bytes_sent, ht.bytes_sent) << what;
          EXPECT_LE(dt.bytes_sent, ht.bytes_sent + 9u * dt.steps * static_cast<std::uint64_t>(comm.size() - 1)) << what;
        }
      }
    }
}

TEST(DeviceRelax, AParameterListThatDiffersIsOneErrorOnEveryRank) {
  flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  if (comm.size() < 2) GTEST_SKIP() << "needs two ranks";
  fc::device_communicator gpu = make_gpu(comm);
  fc::stream s;
  twin_model m({10, comm.rank() == 1 ? std::size_t{11} : std::size_t{10}}, comm.rank(), s);
  fc::bytegrad algo(gpu);
  try {
    algo.start(m.device, s);
    FAIL() << "rank " << comm.rank() << ": start() accepted lists that differ";
  } catch (const flexpar::usage_error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("relax::bytegrad start"), std::string::npos) << text;
    EXPECT_NE(text.find("parameter 1"), std::string::npos) << text;
    EXPECT_NE(text.find("rank 1"), std::string::npos) << text;
  }
}

TEST(DeviceRelax, AnUnknownAlgorithmIsNamedWithTheKnownOnes) {
  flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  fc::device_communicator gpu = make_gpu(comm);
  try {
    (void)fc::make_relaxation("no_such_algorithm", gpu);
    FAIL() << "make_relaxation accepted an unknown algorithm";
  } catch (const flexpar::usage_error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("no_such_algorithm"), std::string::npos) << text;
    for (std::string_view known : fr::algorithm_names())  // every host algorithm has its device form
      EXPECT_NE(text.find(known), std::string::npos) << text;
  }
  for (std::string_view known : fr::algorithm_names()) {
    fr::options o;
    o.warmup_steps = 1;
    EXPECT_EQ(fc::make_relaxation(known, gpu, o)->name(), known);
  }
}

// async_model_average on the device, the host test's rules (relax_scenarios.hpp): rounds run in the
// background while the training thread steps; abort() pauses every rank in the same round and the
// rounds stop; resume() restarts them; after finish() every rank holds the same weights, bit for bit,
// the average of the weights at the moment finish() was called (within 1e-5).
TEST(DeviceRelax, AsyncModelAverageKeepsTheHostFormsRules) {
  flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
  fc::device_communicator gpu = make_gpu(comm);
  fc::stream s;
  const int me = comm.rank();
  twin_model m({1000, 37, 5003}, me, s);
  fc::sgd opt({.learning_rate = 0.05f, .momentum = 0.9f});
  fc::async_model_average algo(gpu, 1);
  EXPECT_THROW(algo.abort(), flexpar::usage_error) << "not started";
  algo.start(m.device, s);
  for (int step = 0; step < 5; ++step) {
    m.set_gradients(me, step, s);
    algo.step(m.device, opt, s);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(eventually([&] { return algo.rounds() >= 3; })) << "[rank " << me << "] no background rounds";
  EXPECT_THROW(algo.resume(), flexpar::usage_error) << "resume() before abort()";
  for (int pause = 0; pause < 2; ++pause) {
    algo.abort();
    const auto paused_at = static_cast<std::int64_t>(algo.rounds());
    std::vector<std::int64_t> everyone(static_cast<std::size_t>(comm.size()));
    flexpar::allgather(comm, std::span<const std::int64_t>(&paused_at, 1), std::span<std::int64_t>(everyone));
    for (std::int64_t r : everyone) EXPECT_EQ(r, paused_at) << "[rank " << me << "] ranks paused in different rounds";
    m.set_gradients(me, 5 + pause, s);
    algo.step(m.device, opt, s);  // local steps go on while paused
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(static_cast<std::int64_t>(algo.rounds()), paused_at) << "averaging went on after abort()";
    if (pause == 1) break;  // finish() from the paused state
    algo.resume();
    EXPECT_TRUE(eventually([&] { return static_cast<std::int64_t>(algo.rounds()) > paused_at; }))
        << "[rank " << me << "] no rounds after resume()";
  }
  auto weights = [&] {
    std::vector<float> flat;
    for (auto& b : m.dw) {
      const auto w = download(fc::device_span<const float>(b.span()), s);
      flat.insert(flat.end(), w.begin(), w.end());
    }
    return flat;
  };
  const std::vector<float> before = weights();
  const std::vector<float> all = gather_all(comm, before);
  algo.finish(m.device, s);
  const std::vector<float> after = weights();
  const std::size_t n = before.size();
  const std::vector<float> finals = gather_all(comm, after);
  for (std::size_t i = 0; i < n; ++i) {
    double mean = 0;
    for (int r = 0; r < comm.size(); ++r) mean += all[static_cast<std::size_t>(r) * n + i];
    mean /= comm.size();
    ASSERT_NEAR(after[i], mean, 1e-5 * std::max(1.0, std::abs(mean))) << "[rank " << me << "] element " << i;
    for (int r = 0; r < comm.size(); ++r)
      ASSERT_EQ(std::memcmp(&finals[static_cast<std::size_t>(r) * n + i], &after[i], sizeof(float)), 0)
          << "[rank " << me << "] rank " << r << " ends with another weight at " << i;
  }
  EXPECT_EQ(algo.traffic_so_far().steps, 7u);
}
