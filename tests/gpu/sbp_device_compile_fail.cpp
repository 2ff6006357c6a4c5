// Programs on device tensors that must not compile (tests/sbp/expect_compile_error.cmake checks the
// text of each error); case 0, the control, is the same code brought into one memory and compiles.
#include <flexpar/cuda/sbp.hpp>

using namespace flexpar::sbp;
namespace fc = flexpar::cuda;

void program(const placement<1>& mesh, const fc::device_placement<1>& gpu) {
  auto rows = global_tensor<float, split<0>>::from_full(mesh, {4, 4}, std::vector<float>(16));
  auto whole = global_tensor<float, broadcast, flexpar::memory::cuda>::from_full(gpu, {4, 4}, std::vector<float>(16));
#if FLEXPAR_CASE == 0
  auto ok1 = matmul(to_device(rows, gpu), whole);                                // (S(0), B) -> S(0) on the GPU
  auto ok2 = add(to_host(whole), to_host(to<broadcast>(to_device(rows, gpu))));  // both on the host
  auto ok3 = relu(to<split<1>>(whole));
  auto ids = global_tensor<std::int64_t, split<0>>::from_full(mesh, {3}, std::vector<std::int64_t>(3));
  auto ok4 = embedding(whole, to_device(ids, gpu));  // (B, S(0)) -> S(0) on the GPU
  auto image =
      global_tensor<float, split<0>, flexpar::memory::cuda>::from_full(gpu, {2, 1, 4, 4}, std::vector<float>(32));
  auto kernel =
      global_tensor<float, broadcast, flexpar::memory::cuda>::from_full(gpu, {1, 1, 3, 3}, std::vector<float>(9));
  auto ok5 = conv2d(image, kernel, 1);  // (S(0), B) -> S(0) on the GPU
  (void)ok1, (void)ok2, (void)ok3, (void)ok4, (void)ok5;
#elif FLEXPAR_CASE == 1  // a host and a device operand
  auto bad = matmul(rows, whole);
  (void)bad;
#elif FLEXPAR_CASE == 2  // a device and a host operand
  auto bad = add(whole, to<broadcast>(rows));
  (void)bad;
#elif FLEXPAR_CASE == 3  // cuBLAS is called in f32 or bf16
  auto d = global_tensor<double, broadcast, flexpar::memory::cuda>::from_full(gpu, {2, 2}, std::vector<double>(4));
  auto bad = matmul(d, d);
  (void)bad;
#elif FLEXPAR_CASE == 4  // a device weight and host ids
  auto ids = global_tensor<std::int64_t, split<0>>::from_full(mesh, {3}, std::vector<std::int64_t>(3));
  auto bad = embedding(whole, ids);
  (void)bad;
#elif FLEXPAR_CASE == 5  // a device convolution in f64
  auto x =
      global_tensor<double, split<0>, flexpar::memory::cuda>::from_full(gpu, {2, 1, 4, 4}, std::vector<double>(32));
  auto k =
      global_tensor<double, broadcast, flexpar::memory::cuda>::from_full(gpu, {1, 1, 3, 3}, std::vector<double>(9));
  auto bad = conv2d(x, k, 1);
  (void)bad;
#endif
}
