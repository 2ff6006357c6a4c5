// samples/megatron_block.cpp — a Megatron-style MLP block with SBP global tensors.
//
//   mpiexec -n 2 build/samples/megatron_block            # model parallel over every rank (1-D mesh)
//   mpiexec -n 4 build/samples/megatron_block --mesh 2x2 # data x model parallel on a 2 x 2 mesh
//   mpiexec -n 2 build/samples/megatron_block --gpu      # the 1-D block in device memory (CUDA builds)
//
// y = relu(x W1) W2 with W1 split by columns and W2 by rows: the column-parallel matmul needs no
// communication, the row-parallel one leaves partial sums, and one allreduce (P -> B) ends the
// block, as in Megatron-LM. The types say so: every intermediate SBP below is deduced, and a wrong
// combination would not compile. The result is checked against the same block computed serially.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <flexpar/core/uncaught.hpp>
#include <flexpar/sbp/sbp.hpp>
#if FLEXPAR_HAVE_CUDA
#include <flexpar/cuda/sbp.hpp>
#endif

namespace {

struct sizes {
  std::size_t batch = 8, hidden = 16, ffn = 64;
};

std::vector<float> matrix(std::size_t rows, std::size_t cols, int salt) {
  std::vector<float> m(rows * cols);
  for (std::size_t i = 0; i < m.size(); ++i)
    m[i] = static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(salt)) % 9) - 4);
  return m;
}

std::vector<float> serial_block(const sizes& s, const std::vector<float>& x, const std::vector<float>& w1,
                                const std::vector<float>& w2) {
  std::vector<float> h(s.batch * s.ffn, 0.0f), y(s.batch * s.hidden, 0.0f);
  for (std::size_t i = 0; i < s.batch; ++i)
    for (std::size_t k = 0; k < s.hidden; ++k)
      for (std::size_t j = 0; j < s.ffn; ++j) h[i * s.ffn + j] += x[i * s.hidden + k] * w1[k * s.ffn + j];
  for (float& v : h) v = v > 0 ? v : 0;
  for (std::size_t i = 0; i < s.batch; ++i)
    for (std::size_t k = 0; k < s.ffn; ++k)
      for (std::size_t j = 0; j < s.hidden; ++j) y[i * s.hidden + j] += h[i * s.ffn + k] * w2[k * s.hidden + j];
  return y;
}

double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  return worst;
}

using namespace flexpar::sbp;

// [snippet:megatron_1d]
// Model parallel over a 1-D mesh: W1 by columns, W2 by rows, one allreduce per block.
std::vector<float> block_1d(flexpar::communicator& comm, const sizes& s, const std::vector<float>& x,
                            const std::vector<float>& w1, const std::vector<float>& w2) {
  placement<1> mesh(comm, {comm.size()});
  auto X = global_tensor<float, broadcast>::from_full(mesh, {s.batch, s.hidden}, x);
  auto W1 = global_tensor<float, split<1>>::from_full(mesh, {s.hidden, s.ffn}, w1);  // column parallel
  auto W2 = global_tensor<float, split<0>>::from_full(mesh, {s.ffn, s.hidden}, w2);  // row parallel

  auto H = relu(matmul(X, W1));    // (B, S(1)) -> S(1); relu keeps S(1)
  auto partial_y = matmul(H, W2);  // (S(1), S(0)) -> P(sum)
  static_assert(std::is_same_v<decltype(partial_y), global_tensor<float, partial_sum>>);
  const auto cost = boxing_cost<partial_sum, broadcast>(partial_y.shape(), mesh);
  auto Y = to<broadcast>(std::move(partial_y));  // the block's one allreduce
  if (comm.rank() == 0)
    std::printf("1-D mesh of %d: H is %s, x W1 W2 is %s, one allreduce of %.0f bytes on the wire per rank\n",
                comm.size(), to_string<decltype(H)::sbp_type>().c_str(), to_string<partial_sum>().c_str(),
                cost.wire_bytes);
  return {Y.to_local().begin(), Y.to_local().end()};
}
// [/snippet:megatron_1d]

// [snippet:megatron_2d]
// Data x model parallel on a 2 x 2 mesh: the batch is split over mesh axis 0, the weights over axis 1.
std::vector<float> block_2d(flexpar::communicator& comm, const sizes& s, const std::vector<float>& x,
                            const std::vector<float>& w1, const std::vector<float>& w2) {
  placement<2> mesh(comm, {2, comm.size() / 2});  // (data, model)
  auto X = global_tensor<float, sbp<split<0>, broadcast>>::from_full(mesh, {s.batch, s.hidden}, x);
  auto W1 = global_tensor<float, sbp<broadcast, split<1>>>::from_full(mesh, {s.hidden, s.ffn}, w1);
  auto W2 = global_tensor<float, sbp<broadcast, split<0>>>::from_full(mesh, {s.ffn, s.hidden}, w2);

  auto H = relu(matmul(X, W1));    // (S(0), S(1))
  auto partial_y = matmul(H, W2);  // (S(0), P(sum)): partial sums within each model group
  static_assert(std::is_same_v<decltype(partial_y)::sbp_type, sbp<split<0>, partial_sum>>);
  auto Y = to<sbp<split<0>, broadcast>>(std::move(partial_y));  // allreduce over the model axis only
  if (comm.rank() == 0)
    std::printf("2 x %d mesh: H is %s, x W1 W2 is %s, boxed to %s by one allreduce per model group\n", comm.size() / 2,
                to_string<decltype(H)::sbp_type>().c_str(), to_string<sbp<split<0>, partial_sum>>().c_str(),
                to_string<decltype(Y)::sbp_type>().c_str());
  return Y.to_full();
}
// [/snippet:megatron_2d]

#if FLEXPAR_HAVE_CUDA
// [snippet:megatron_gpu]
// The 1-D block with its shards in device memory: the same types and signatures; cuBLAS for the
// matmuls, the relu kernel, and the device allreduce (CUDA IPC among the ranks of one node, NCCL
// between GPUs) for the boxing, all on the placement's stream.
std::vector<float> block_gpu(flexpar::communicator& comm, const sizes& s, const std::vector<float>& x,
                             const std::vector<float>& w1, const std::vector<float>& w2) {
  using device = flexpar::memory::cuda;
  placement<1> mesh(comm, {comm.size()});
  flexpar::cuda::device_placement gpu(mesh, comm.topology().local_rank() % flexpar::cuda::device_count());
  auto X = global_tensor<float, broadcast, device>::from_full(gpu, {s.batch, s.hidden}, x);
  auto W1 = global_tensor<float, split<1>, device>::from_full(gpu, {s.hidden, s.ffn}, w1);
  auto W2 = global_tensor<float, split<0>, device>::from_full(gpu, {s.ffn, s.hidden}, w2);

  auto H = relu(matmul(X, W1));    // (B, S(1)) -> S(1), cuBLAS then the relu kernel
  auto partial_y = matmul(H, W2);  // (S(1), S(0)) -> P(sum), in device memory
  static_assert(std::is_same_v<decltype(partial_y), global_tensor<float, partial_sum, device>>);
  auto Y = to<broadcast>(std::move(partial_y));  // the device allreduce
  // NCCL where every rank has a GPU of its own (one process per GPU), CUDA IPC where they share one
  const auto path = gpu.axis(0).choose("allreduce", Y.to_local().size() * sizeof(float)).path;
  if (comm.rank() == 0)
    std::printf("1-D mesh of %d on GPU %d: H is %s, one device allreduce (%s path)\n", comm.size(), gpu.device(),
                to_string<decltype(H)::sbp_type>().c_str(), std::string(flexpar::cuda::name_of(path)).c_str());
  return Y.download();  // my shard (B: the whole y) copied to the host
}
// [/snippet:megatron_gpu]
#endif

}  // namespace

int main(int argc, char** argv) {
  std::set_terminate(flexpar::report_uncaught_and_abort);  // a rank's uncaught error: one whole line
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
  int status = 0;
  {
    flexpar::communicator comm = flexpar::communicator::from_mpi(MPI_COMM_WORLD);
    const bool mesh_2d = argc > 2 && std::string(argv[1]) == "--mesh" && std::string(argv[2]) == "2x2";
    const bool on_gpu = argc > 1 && std::string(argv[1]) == "--gpu";
#if FLEXPAR_HAVE_CUDA
    const bool have_gpu = flexpar::cuda::device_present();
#else
    const bool have_gpu = false;
#endif
    const sizes s;
    const auto x = matrix(s.batch, s.hidden, 1), w1 = matrix(s.hidden, s.ffn, 2), w2 = matrix(s.ffn, s.hidden, 3);
    if (mesh_2d && comm.size() % 2 != 0) {
      if (comm.rank() == 0) std::fprintf(stderr, "--mesh 2x2 needs an even number of ranks\n");
      status = 2;
    } else if (on_gpu && !have_gpu) {
      if (comm.rank() == 0) std::fprintf(stderr, "--gpu needs a CUDA build of flexpar and a CUDA device\n");
      status = 77;  // ctest's skip code
    } else {
      std::vector<float> y;
#if FLEXPAR_HAVE_CUDA
      if (on_gpu) y = block_gpu(comm, s, x, w1, w2);
#endif
      if (!on_gpu) y = mesh_2d ? block_2d(comm, s, x, w1, w2) : block_1d(comm, s, x, w1, w2);
      const double diff = max_difference(y, serial_block(s, x, w1, w2));
      std::printf("rank %d: max |y - serial y| = %g\n", comm.rank(), diff);
      status = diff == 0.0 ? 0 : 1;
    }
  }
  MPI_Finalize();
  return status;
}
