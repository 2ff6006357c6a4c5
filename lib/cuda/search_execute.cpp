// lib/cuda/search_execute.cpp — flexpar/cuda/search.hpp: the executor of flexpar/search/executor.hpp on
// device shards.
#include <flexpar/core/error.hpp>
#include <flexpar/cuda/nn.hpp>
#include <flexpar/cuda/sbp_dynamic.hpp>
#include <flexpar/cuda/search.hpp>
#include <flexpar/search/executor.hpp>

#include <string>

namespace flexpar::cuda {
namespace {

using sbp::shape_t;
using search::executor::op_step;

/// The executor's local steps on device shards, on the placement's stream: cuBLAS for the transposed
/// products, the kernels of flexpar/cuda/nn.hpp for the rest, every block from the placement's pool.
struct device_backend {
  using tensor = sbp::dynamic_tensor<float, 1, memory::cuda>;
  const device_placement<1>& gpu;

  [[nodiscard]] tensor from_full(const shape_t& shape, const sbp::nd_parallel& s, std::span<const float> data) const {
    return tensor::from_full(gpu, shape, s, data);
  }
  /// a^T b or a b^T on the shards, cuBLAS transposing in place (no copies).
  [[nodiscard]] tensor product(const tensor& a, bool transpose_a, const tensor& b, bool transpose_b,
                               const char* what) const {
    const search::executor::transposed_product p = search::executor::plan_product(
        a.layout(), a.shape(), a.my_box(), transpose_a, b.layout(), b.shape(), b.my_box(), transpose_b, what);
    if (!gpu.contains_me()) return tensor::adopt(gpu, {p.m, p.n}, p.out, {});
    device_shard<float> c = tensor::acquire(gpu, p.rows * p.cols);  // beta = 0 writes every element
    if (c.count > 0) {
      if (p.inner == 0)
        fill(c.span(), 0.0f, gpu.stream());  // an empty sum
      else
        gpu.linear_algebra().gemm(transpose_a ? transpose::yes : transpose::no,
                                  transpose_b ? transpose::yes : transpose::no, p.rows, p.cols, p.inner, 1.0f,
                                  a.to_local(), b.to_local(), 0.0f, c.span(), gpu.stream());
    }
    return tensor::adopt(gpu, {p.m, p.n}, p.out, std::move(c));
  }
  [[nodiscard]] tensor relu(const tensor& x) const {
    tensor y = x.clone();
    cuda::relu(y.to_local(), gpu.stream());
    return y;
  }
  /// dy (in y's layout) where the output y is positive, else 0.
  [[nodiscard]] tensor relu_backward(const tensor& dy, const tensor& y) const {
    device_shard<float> dx = tensor::acquire(gpu, dy.to_local().size());
    cuda::relu_backward(dy.to_local(), y.to_local(), dx.span(), gpu.stream());
    return tensor::adopt(gpu, dy.shape(), dy.layout(), std::move(dx));
  }
  /// The pooling of my shard of x (whole planes: S(0), S(1) or B).
  [[nodiscard]] static pool_geometry geometry(const tensor& x, const op_step& st) {
    const sbp::box b = x.my_box();
    return {b.extent[0] * b.extent[1], b.extent[2], b.extent[3], st.window, st.stride};
  }
  [[nodiscard]] tensor max_pool(const tensor& x, const op_step& st) const {
    const pool_geometry g = geometry(x, st);
    device_shard<float> y = tensor::acquire(gpu, gpu.contains_me() ? g.planes * g.out_height() * g.out_width() : 0);
    if (gpu.contains_me()) cuda::max_pool(g, x.to_local(), y.span(), gpu.stream());
    return tensor::adopt(gpu, st.out, x.layout(), std::move(y));
  }
  [[nodiscard]] tensor max_pool_backward(const tensor& x, const tensor& dy, const op_step& st) const {
    device_shard<float> dx = tensor::acquire(gpu, x.to_local().size());
    if (gpu.contains_me())
      cuda::max_pool_backward(geometry(x, st), x.to_local(), dy.to_local(), dx.span(), gpu.stream());
    return tensor::adopt(gpu, x.shape(), x.layout(), std::move(dx));
  }
  /// w - lr dw (sgd_momentum with momentum 0: each product and difference rounded as the host's loop).
  [[nodiscard]] tensor sgd(const tensor& w, const tensor& dw, float lr) const {
    tensor updated = w.clone();
    sgd_momentum(updated.to_local(), {}, dw.to_local(), lr, 0.0f, 1.0f, gpu.stream());
    return updated;
  }
  void settle() const { gpu.synchronize("search::execute_steps (device)"); }
};

}  // namespace

search::execution_result execute_steps(const device_placement<1>& gpu, const search::graph& g,
                                       const search::strategy& s, std::span<const float> input,
                                       std::vector<std::vector<float>> weights, float lr, std::size_t steps) {
  communicator& comm = gpu.parent();
  if (!gpu.contains_me() || gpu.shape()[0] != comm.size())
    throw error_on<usage_error>(comm.rank(), "cuda::execute_steps", "the device placement ", gpu.describe(),
                                " is not the 1-D mesh of all ", comm.size(), " ranks of its communicator");
  const std::vector<op_step> plan = search::executor::plan_steps(g, s, comm.size());
  device_guard on(gpu.device());
  return search::executor::run_steps(device_backend{gpu}, comm, g, s, plan, input, weights, lr, steps);
}

}  // namespace flexpar::cuda
