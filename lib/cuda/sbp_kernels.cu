// lib/cuda/sbp_kernels.cu — flexpar/cuda/sbp.hpp's kernels: the box copy, and the ops that work
// along one tensor axis (softmax, layer_norm, reduce_sum) or element-wise (gelu), embedding's lookup,
// the convolutions' im2col and col2im, and the tiled transpose.
//
// The box is first folded: an axis the box spans whole in both tensors merges with the axis before
// it, so what is left is rows of `run` contiguous bytes under up to max_axes outer axes. No outer
// axis is one cudaMemcpyAsync; otherwise one kernel copies the box in chunks of the widest of 16, 8,
// 4 or 1 bytes that divides the run, the strides and both addresses, a thread per chunk (grid-stride),
// in place of the copy engines' 2-D copy on the narrow rows a split inner axis makes (doc/sbp.md, and
// flexpar_sbp_gpu_bench's pack table, which times the two side by side).
//
// embedding's lookup, im2col and col2im are an index each through for_each_index (launch.cuh), as
// lib/cuda/nn.cu's element-wise kernels are; transpose goes through shared memory in 32 x 32 tiles.
//
// The axis ops see the shard as [outer, rows, inner] (the axis in the middle) and give each of the
// outer x inner lines one thread, which walks its `rows` elements `inner` apart (neighbouring
// threads read neighbouring elements when inner > 1). They compute in double and round once, as the
// host ops do.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <flexpar/core/check_cuda.hpp>
#include <flexpar/core/error.hpp>
#include <flexpar/sbp/local_math.hpp>

#include "launch.cuh"

namespace flexpar::cuda::detail {
namespace {

constexpr int max_axes = 8;

// The outer axes of a folded box: extents and the byte strides of each in source and destination.
struct box_rows {
  int axes = 0;
  std::size_t extent[max_axes]{};
  std::size_t src_stride[max_axes]{};
  std::size_t dst_stride[max_axes]{};
  std::size_t rows = 1;
  std::size_t run = 0;  // contiguous bytes of one row
};

// Chunk i of the box: row i / per_row (its outer indices give the two offsets), chunk i % per_row of
// the row. Index is 32-bit where the box allows it (the divisions are the kernel's only arithmetic).
template <class Chunk, class Index>
__global__ void copy_chunks_kernel(std::byte* dst, const std::byte* src, box_rows b, Index per_row, Index chunks) {
  for (Index i = blockIdx.x * static_cast<Index>(blockDim.x) + threadIdx.x; i < chunks;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    Index row = i / per_row;
    const Index c = i - row * per_row;
    std::size_t from = 0, to = 0;
    for (int a = b.axes - 1; a >= 0; --a) {
      const Index extent = static_cast<Index>(b.extent[a]);
      const Index k = a == 0 ? row : row % extent;
      row = a == 0 ? 0 : row / extent;
      from += k * b.src_stride[a];
      to += k * b.dst_stride[a];
    }
    reinterpret_cast<Chunk*>(dst + to)[c] = reinterpret_cast<const Chunk*>(src + from)[c];
  }
}

template <class Chunk>
void launch_copy_chunks(std::byte* dst, const std::byte* src, const box_rows& b, cudaStream_t s) {
  const std::size_t per_row = b.run / sizeof(Chunk), chunks = per_row * b.rows;
  const unsigned grid = grid_for(chunks, block_threads, 8);
  if (chunks < (std::size_t{1} << 31))  // i + the grid's stride stays below 2^32: no wrap-around
    copy_chunks_kernel<Chunk, unsigned>
        <<<grid, block_threads, 0, s>>>(dst, src, b, static_cast<unsigned>(per_row), static_cast<unsigned>(chunks));
  else
    copy_chunks_kernel<Chunk, std::size_t><<<grid, block_threads, 0, s>>>(dst, src, b, per_row, chunks);
  check_launch("flexpar::cuda::copy_box");
}

std::vector<std::size_t> strides_in_bytes(const std::vector<std::size_t>& shape, std::size_t element_bytes) {
  std::vector<std::size_t> st(shape.size());
  std::size_t s = element_bytes;
  for (std::size_t d = shape.size(); d-- > 0;) {
    st[d] = s;
    s *= shape[d];
  }
  return st;
}

enum class line_op : int { softmax = 0, layer_norm = 1 };

__global__ void along_axis_kernel(float* data, std::size_t outer, std::size_t rows, std::size_t inner, int op,
                                  double eps) {
  const std::size_t lines = outer * inner;
  for (std::size_t l = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; l < lines;
       l += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    float* x = data + (l / inner) * rows * inner + l % inner;
    if (op == static_cast<int>(line_op::softmax)) {
      double hi = -INFINITY, sum = 0;
      for (std::size_t r = 0; r < rows; ++r) hi = fmax(hi, static_cast<double>(x[r * inner]));
      for (std::size_t r = 0; r < rows; ++r) sum += exp(static_cast<double>(x[r * inner]) - hi);
      for (std::size_t r = 0; r < rows; ++r)
        x[r * inner] = static_cast<float>(exp(static_cast<double>(x[r * inner]) - hi) / sum);
    } else {
      double mean = 0, var = 0;
      for (std::size_t r = 0; r < rows; ++r) mean += static_cast<double>(x[r * inner]);
      mean /= static_cast<double>(rows);
      for (std::size_t r = 0; r < rows; ++r) {
        const double d = static_cast<double>(x[r * inner]) - mean;
        var += d * d;
      }
      const double scale = 1.0 / sqrt(var / static_cast<double>(rows) + eps);
      for (std::size_t r = 0; r < rows; ++r)
        x[r * inner] = static_cast<float>((static_cast<double>(x[r * inner]) - mean) * scale);
    }
  }
}

__global__ void sum_axis_kernel(const float* x, float* out, std::size_t outer, std::size_t rows, std::size_t inner) {
  const std::size_t lines = outer * inner;
  for (std::size_t l = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; l < lines;
       l += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float* line = x + (l / inner) * rows * inner + l % inner;
    float acc = 0;  // the host sums in accumulate_t<float> = float, in row order: the same order here
    for (std::size_t r = 0; r < rows; ++r) acc += line[r * inner];
    out[l] = acc;
  }
}

__global__ void gelu_kernel(float* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const double v = x[i];
    x[i] = static_cast<float>(0.5 * v * (1.0 + erf(v / sqrt(2.0))));
  }
}

// A 32 x 32 tile per block (32 x 8 threads), read by rows of `in` and written by rows of `out`
// through shared memory (a padded column: no bank conflicts); the blocks stride over the tiles.
constexpr int tile = 32;
template <class Word>
__global__ void transpose_kernel(const Word* in, Word* out, std::size_t rows, std::size_t cols) {
  __shared__ Word t[tile][tile + 1];
  const std::size_t tiles_x = (cols + tile - 1) / tile, tiles_y = (rows + tile - 1) / tile;
  for (std::size_t ty = blockIdx.y; ty < tiles_y; ty += gridDim.y)
    for (std::size_t tx = blockIdx.x; tx < tiles_x; tx += gridDim.x) {
      const std::size_t c = tx * tile + threadIdx.x;
      for (unsigned j = threadIdx.y; j < tile; j += blockDim.y) {
        const std::size_t r = ty * tile + j;
        if (r < rows && c < cols) t[j][threadIdx.x] = in[r * cols + c];
      }
      __syncthreads();
      const std::size_t oc = ty * tile + threadIdx.x;  // a row of in is a column of out
      for (unsigned j = threadIdx.y; j < tile; j += blockDim.y) {
        const std::size_t orow = tx * tile + j;
        if (orow < cols && oc < rows) out[orow * rows + oc] = t[threadIdx.x][j];
      }
      __syncthreads();
    }
}

template <class Word>
void launch_transpose(const void* in, void* out, std::size_t rows, std::size_t cols, cudaStream_t s) {
  const std::size_t tiles_x = (cols + tile - 1) / tile, tiles_y = (rows + tile - 1) / tile;
  const dim3 grid(static_cast<unsigned>(std::min<std::size_t>(tiles_x, 1024)),
                  static_cast<unsigned>(std::min<std::size_t>(tiles_y, 1024)));
  transpose_kernel<Word>
      <<<grid, dim3(tile, 8), 0, s>>>(static_cast<const Word*>(in), static_cast<Word*>(out), rows, cols);
  check_launch("flexpar::sbp::transpose (device)");
}

// f(Word{}) with Word the unsigned type of `element_bytes` bytes (1, 2, 4, 8): the ops that only move
// elements. @throws usage_error naming `op` for another size.
template <class F>
void by_element_bytes(std::size_t element_bytes, const char* op, F f) {
  switch (element_bytes) {
    case 1: return f(std::uint8_t{});
    case 2: return f(std::uint16_t{});
    case 4: return f(std::uint32_t{});
    case 8: return f(std::uint64_t{});
    default:
      throw error_on<usage_error>(no_rank, op, "elements of ", element_bytes,
                                  " bytes; it moves elements of 1, 2, 4 or 8 bytes");
  }
}

unsigned grid_of(std::size_t work) { return grid_for(work, block_threads, 4); }

}  // namespace

void softmax_lines(float* data, std::size_t outer, std::size_t rows, std::size_t inner, cudaStream_t s) {
  if (outer * rows * inner == 0) return;
  along_axis_kernel<<<grid_of(outer * inner), block_threads, 0, s>>>(data, outer, rows, inner,
                                                                     static_cast<int>(line_op::softmax), 0.0);
  check_launch("flexpar::sbp::softmax (device)");
}

void layer_norm_lines(float* data, std::size_t outer, std::size_t rows, std::size_t inner, double eps, cudaStream_t s) {
  if (outer * rows * inner == 0) return;
  along_axis_kernel<<<grid_of(outer * inner), block_threads, 0, s>>>(data, outer, rows, inner,
                                                                     static_cast<int>(line_op::layer_norm), eps);
  check_launch("flexpar::sbp::layer_norm (device)");
}

void sum_lines(const float* x, float* out, std::size_t outer, std::size_t rows, std::size_t inner, cudaStream_t s) {
  if (outer * inner == 0) return;
  sum_axis_kernel<<<grid_of(outer * inner), block_threads, 0, s>>>(x, out, outer, rows, inner);
  check_launch("flexpar::sbp::reduce_sum (device)");
}

void gelu_in_place(float* x, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  gelu_kernel<<<grid_of(n), block_threads, 0, s>>>(x, n);
  check_launch("flexpar::sbp::gelu (device)");
}

void copy_box_bytes(std::size_t element_bytes, const void* src, const std::vector<std::size_t>& src_shape,
                    const std::vector<std::size_t>& src_at, void* dst, const std::vector<std::size_t>& dst_shape,
                    const std::vector<std::size_t>& dst_at, const std::vector<std::size_t>& extent, cudaStream_t s) {
  const std::size_t n = extent.size();
  if (src_shape.size() != n || dst_shape.size() != n || src_at.size() != n || dst_at.size() != n)
    throw error_on<usage_error>(no_rank, "flexpar::cuda::copy_box",
                                "the shapes, offsets and extent have different numbers of axes");
  std::size_t elements = 1;
  for (std::size_t d = 0; d < n; ++d) {
    if (src_at[d] + extent[d] > src_shape[d] || dst_at[d] + extent[d] > dst_shape[d])
      throw error_on<usage_error>(no_rank, "flexpar::cuda::copy_box",
                                  "the box leaves the source or destination tensor on axis ", d);
    elements *= extent[d];
  }
  if (elements == 0) return;
  const auto ss = strides_in_bytes(src_shape, element_bytes), ds = strides_in_bytes(dst_shape, element_bytes);
  const std::byte* from = static_cast<const std::byte*>(src);
  std::byte* to = static_cast<std::byte*>(dst);
  for (std::size_t d = 0; d < n; ++d) {
    from += src_at[d] * ss[d];
    to += dst_at[d] * ds[d];
  }
  // Fold: the innermost run grows over axes that are whole in both tensors (then the next axis out is
  // contiguous with it too); axes of extent 1 drop out.
  std::size_t run = element_bytes, d = n;
  while (d > 0) {
    const std::size_t a = d - 1;
    if (extent[a] == 1) {
      --d;
      continue;
    }
    if (ss[a] != run || ds[a] != run) break;  // not contiguous with the run so far
    run *= extent[a];
    --d;
    if (extent[a] != src_shape[a] || extent[a] != dst_shape[a]) break;  // a partial axis ends the run
  }
  box_rows b;
  b.run = run;
  for (std::size_t a = 0; a < d; ++a) {
    if (extent[a] == 1) continue;
    if (b.axes == max_axes) throw error_on<usage_error>(no_rank, "flexpar::cuda::copy_box", "more than 8 strided axes");
    b.extent[b.axes] = extent[a];
    b.src_stride[b.axes] = ss[a];
    b.dst_stride[b.axes] = ds[a];
    ++b.axes;
    b.rows *= extent[a];
  }
  if (b.axes == 0) {
    FLEXPAR_CHECK_CUDA(-1, cudaMemcpyAsync(to, from, run, cudaMemcpyDeviceToDevice, s));
    return;
  }
  // the widest chunk that divides the run, every stride and both addresses
  std::size_t common = b.run | reinterpret_cast<std::uintptr_t>(from) | reinterpret_cast<std::uintptr_t>(to);
  for (int a = 0; a < b.axes; ++a) common |= b.src_stride[a] | b.dst_stride[a];
  if (common % 16 == 0)
    launch_copy_chunks<uint4>(to, from, b, s);
  else if (common % 8 == 0)
    launch_copy_chunks<std::uint64_t>(to, from, b, s);
  else if (common % 4 == 0)
    launch_copy_chunks<std::uint32_t>(to, from, b, s);
  else
    launch_copy_chunks<std::uint8_t>(to, from, b, s);
}

// One index per output element (c of row i); a row of no columns (a rank's empty share of D) still
// has one, which checks the id.
template <class Word>
void embedding_words(const Word* w, const std::int64_t* ids, Word* out, std::size_t n, std::size_t cols,
                     std::int64_t lo, std::int64_t rows, std::int64_t vocab, unsigned long long* first_bad,
                     cudaStream_t s) {
  const std::size_t width = std::max<std::size_t>(cols, 1);
  for_each_index(
      n * width,
      [=] __device__(std::size_t e) {
        const std::size_t i = e / width, c = e - i * width;
        const std::int64_t id = ids[i];
        const bool bad = id < 0 || id >= vocab;
        if (bad && c == 0) atomicMin(first_bad, static_cast<unsigned long long>(i));
        if (c >= cols) return;
        // another rank's row (or a bad id): zero; the P(sum) layouts add the ranks' lookups
        out[i * cols + c] =
            !bad && id >= lo && id < lo + rows ? w[static_cast<std::size_t>(id - lo) * cols + c] : Word{};
      },
      s, "flexpar::sbp::embedding (device)");
}

void embedding_rows(std::size_t element_bytes, const void* w, const std::int64_t* ids, void* out, std::size_t n,
                    std::size_t cols, std::int64_t lo, std::int64_t rows, std::int64_t vocab,
                    unsigned long long* first_bad, cudaStream_t s) {
  FLEXPAR_CHECK_CUDA(-1, cudaMemsetAsync(first_bad, 0xff, sizeof(unsigned long long), s));
  by_element_bytes(element_bytes, "flexpar::sbp::embedding (device)", [&](auto word) {
    using Word = decltype(word);
    embedding_words<Word>(static_cast<const Word*>(w), ids, static_cast<Word*>(out), n, cols, lo, rows, vocab,
                          first_bad, s);
  });
}

void im2col(const sbp::local::conv2d_geometry& g, const float* x, float* col, cudaStream_t s) {
  // one index per element of col [C R S, P Q]: row (c, r, s), column (p, q)
  const std::size_t c_ = g.in_channels, h_ = g.height, w_ = g.width, r_ = g.kernel_h, s_ = g.kernel_w;
  const std::size_t ph = g.pad_h, pw = g.pad_w, q_ = g.out_width(), pq = g.out_height() * q_;
  for_each_index(
      c_ * r_ * s_ * pq,
      [=] __device__(std::size_t e) {
        const std::size_t row = e / pq, at = e - row * pq;
        const std::size_t c = row / (r_ * s_), r = row / s_ % r_, s = row % s_;
        const std::size_t h = at / q_ + r, w = at % q_ + s;  // in the padded input
        col[e] = h >= ph && h < h_ + ph && w >= pw && w < w_ + pw ? x[(c * h_ + h - ph) * w_ + w - pw] : 0.0f;
      },
      s, "flexpar::sbp::conv2d (device): im2col");
}

void col2im(const sbp::local::conv2d_geometry& g, const float* dcol, float* dx, cudaStream_t s) {
  // one index per element of dx [C, H, W], gathering its (r, s) taps in order
  const std::size_t h_ = g.height, w_ = g.width, r_ = g.kernel_h, s_ = g.kernel_w;
  const std::size_t ph = g.pad_h, pw = g.pad_w, p_ = g.out_height(), q_ = g.out_width();
  for_each_index(
      g.in_channels * h_ * w_,
      [=] __device__(std::size_t e) {
        const std::size_t c = e / (h_ * w_), h = e / w_ % h_, w = e % w_;
        float acc = 0.0f;
        for (std::size_t r = 0; r < r_; ++r)
          for (std::size_t s = 0; s < s_; ++s) {
            // the output position (p, q) whose window puts tap (r, s) on (h, w)
            if (h + ph < r || w + pw < s) continue;
            const std::size_t p = h + ph - r, q = w + pw - s;
            if (p < p_ && q < q_) acc += dcol[((c * r_ + r) * s_ + s) * p_ * q_ + p * q_ + q];
          }
        dx[e] = acc;
      },
      s, "flexpar::sbp::conv2d_grad_input (device): col2im");
}

void transpose_2d(std::size_t element_bytes, const void* in, void* out, std::size_t rows, std::size_t cols,
                  cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  by_element_bytes(element_bytes, "flexpar::sbp::transpose (device)",
                   [&](auto word) { launch_transpose<decltype(word)>(in, out, rows, cols, s); });
}

}  // namespace flexpar::cuda::detail
