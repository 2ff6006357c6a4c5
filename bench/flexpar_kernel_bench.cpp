// flexpar_kernel_bench: the CUDA kernels of flexpar/cuda/kernels.hpp next to a device-to-device
// cudaMemcpyAsync measured in the same run (doc/gpu.md, "Kernels").
//
// For each size: the median of --iterations timed runs (CUDA events around each run, after --warmup
// untimed ones) of the copy and of every kernel, as achieved bandwidth counting bytes read + written,
// and the ratio to the copy. Then the fused pack of --tensors small tensors (one launch) against one
// cudaMemcpyAsync per tensor, timed both by events and by the host's clock around submission + wait.
// After each size's timing every kernel runs once more on varied data against its host twin (exit
// status 1 when one differs). Without a CUDA device it says so and exits 77.
//
//   flexpar_kernel_bench --sizes 64M,256M --iterations 20
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <flexpar/collective/reduce_kernel.hpp>
#include <flexpar/compress/minmax_uint8.hpp>
#include <flexpar/compress/onebit.hpp>
#include <flexpar/cuda/kernels.hpp>

#include "bench_cli.hpp"

namespace fc = flexpar::cuda;
using namespace std::chrono_literals;

namespace {

struct timing {
  double median_ms = 0;       // events on the stream
  double host_median_ms = 0;  // the host's clock: submission and wait
};

timing measure(fc::stream& s, int warmup, int iterations, const std::function<void()>& run) {
  for (int i = 0; i < warmup; ++i) run();
  fc::synchronize(s, 120s, "warm-up");
  std::vector<double> device, host;
  fc::event start, stop;
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    start.record(s);
    run();
    stop.record(s);
    fc::wait(stop, 120s, "a timed run");
    const auto t1 = std::chrono::steady_clock::now();
    device.push_back(fc::event::elapsed_ms(start, stop));
    host.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(device.begin(), device.end());
  std::sort(host.begin(), host.end());
  return {device[device.size() / 2], host[host.size() / 2]};
}

/// Elements of `got` whose bytes differ from `want`'s.
template <class T>
std::size_t differing(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return std::max(got.size(), want.size());
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) wrong += std::memcmp(&got[i], &want[i], sizeof(T)) != 0;
  return wrong;
}

/// Small integers that differ by element (exact sums and maxima in every type used).
std::vector<float> varied(std::size_t n, int salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>((i * 7 + salt) % 23) - 11);
  return v;
}

/// Each kernel timed above, once more (untimed) on `n` varied floats, against its host twin
/// (kernels.hpp's table: bit for bit, the same bytes; 1-bit: the same signs and residuals, the scale
/// within 1e-5 as it is summed in another order; the packs: the same bytes as the pieces). Prints
/// what differs; returns the number of kernels whose result was wrong.
int verify_kernels(std::size_t n, std::size_t minmax_chunk, std::size_t onebit_chunk, fc::stream& s) {
  int wrong = 0;
  auto back = [&s](auto d) { return fc::to_host(d, s, 120s, "flexpar_kernel_bench: a verified result"); };
  auto expect = [&](const char* kernel, std::size_t bad) {
    if (bad == 0) return;
    std::fprintf(stderr, "flexpar_kernel_bench: %s on %zu floats: %zu elements differ from the host\n", kernel, n, bad);
    ++wrong;
  };
  const std::vector<float> a = varied(n, 1), b = varied(n, 5);
  const auto da = fc::to_device(std::span(std::as_const(a)), s), db = fc::to_device(std::span(std::as_const(b)), s);
  const auto ca = fc::device_span<const float>(da.span()), cb = fc::device_span<const float>(db.span());
  {  // reduce_into f32 sum, 2 and 3 operands
    auto dst = fc::to_device(std::span(std::as_const(b)), s);
    fc::reduce_into(dst.span(), ca, flexpar::reduce_op::sum, s);
    std::vector<float> want = b;
    flexpar::reduce_into(std::span<float>(want), std::span<const float>(a), flexpar::reduce_op::sum);
    expect("reduce_into f32 sum (2 op)", differing(back(fc::device_span<const float>(dst.span())), want));
    fc::device_buffer<float> out(n);
    fc::reduce_into(out.span(), ca, cb, flexpar::reduce_op::sum, s);
    expect("reduce_into f32 sum (3 op)", differing(back(fc::device_span<const float>(out.span())), want));
  }
  {  // bf16 sum and i8 max over the same bytes, in place
    auto typed = [&](auto zero, const char* name, flexpar::reduce_op op) {
      using T = decltype(zero);
      std::vector<T> x(n * sizeof(float) / sizeof(T)), y(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = T(static_cast<float>(static_cast<int>(i % 9) - 4));
        y[i] = T(static_cast<float>(static_cast<int>((i * 5) % 7) - 3));
      }
      const auto dx = fc::to_device(std::span(std::as_const(x)), s);
      auto dy = fc::to_device(std::span(std::as_const(y)), s);
      fc::reduce_into(dy.span(), fc::device_span<const T>(dx.span()), op, s);
      flexpar::reduce_into(std::span<T>(y), std::span<const T>(x), op);
      expect(name, differing(back(fc::device_span<const T>(dy.span())), y));
    };
    typed(flexpar::bfloat16{}, "reduce_into bf16 sum (2 op)", flexpar::reduce_op::sum);
    typed(std::int8_t{}, "reduce_into i8 max (2 op)", flexpar::reduce_op::max);
  }
  {  // scale_for_average
    auto d = fc::to_device(std::span(std::as_const(b)), s);
    fc::scale_for_average(d.span(), 3, s);
    std::vector<float> want = b;
    flexpar::scale_for_average(std::span<float>(want), 3);
    expect("scale_for_average f32", differing(back(fc::device_span<const float>(d.span())), want));
  }
  {  // min-max uint8: the encoding's bytes, then decode and decode_add of them
    const flexpar::compress::minmax_uint8 host{minmax_chunk};
    fc::minmax_uint8 q(minmax_chunk);
    std::vector<std::byte> want(host.encoded_size(n));
    host.encode(a, want);
    fc::device_buffer<std::byte> wire(want.size());
    q.encode(ca, wire.span(), s);
    q.check(s, 60s);
    const std::vector<std::byte> got = back(fc::device_span<const std::byte>(wire.span()));
    expect("minmax_uint8 encode", differing(got, want));
    std::vector<float> decoded(n), acc = b;
    host.decode(want, decoded);
    const auto dwire = fc::to_device(std::span(std::as_const(want)), s);
    fc::device_buffer<float> out(n);
    q.decode(fc::device_span<const std::byte>(dwire.span()), out.span(), s);
    expect("minmax_uint8 decode", differing(back(fc::device_span<const float>(out.span())), decoded));
    auto dacc = fc::to_device(std::span(std::as_const(b)), s);
    q.decode_add(fc::device_span<const std::byte>(dwire.span()), dacc.span(), s);
    flexpar::reduce_into(std::span<float>(acc), std::span<const float>(decoded), flexpar::reduce_op::sum);
    expect("minmax_uint8 decode_add", differing(back(fc::device_span<const float>(dacc.span())), acc));
  }
  {  // 1-bit from a zero residual: signs of x, scale = mean |x| per chunk, residual x -+ scale; decode
    fc::onebit ob(n, onebit_chunk);
    const flexpar::compress::onebit host_sizes(0, onebit_chunk);
    fc::device_buffer<std::byte> bits(ob.encoded_size(n));
    ob.encode(ca, bits.span(), s);
    ob.check(s, 60s);
    const std::vector<std::byte> got = back(fc::device_span<const std::byte>(bits.span()));
    const std::vector<float> residual = back(ob.residual());
    std::size_t bad = 0;
    for (std::size_t begin = 0, c = 0; begin < n; begin += onebit_chunk, ++c) {
      const std::size_t off = c * (4 + (onebit_chunk + 7) / 8), m = std::min(onebit_chunk, n - begin);
      float scale = 0;
      std::memcpy(&scale, got.data() + off, sizeof scale);
      double total = 0;
      for (std::size_t i = 0; i < m; ++i) total += std::abs(a[begin + i]);
      if (std::abs(scale - total / static_cast<double>(m)) > 1e-5 * total / static_cast<double>(m)) ++bad;
      for (std::size_t i = 0; i < m; ++i) {
        const bool negative = (static_cast<unsigned>(got[off + 4 + i / 8]) >> (i % 8)) & 1u;
        const float kept = a[begin + i] - (a[begin + i] < 0 ? -scale : scale);
        bad += negative != (a[begin + i] < 0) || std::memcmp(&residual[begin + i], &kept, sizeof kept) != 0;
      }
    }
    expect("onebit encode", bad);
    std::vector<float> decoded(n);
    host_sizes.decode(got, decoded);
    fc::device_buffer<float> out(n);
    ob.decode(fc::device_span<const std::byte>(bits.span()), out.span(), s);
    expect("onebit decode", differing(back(fc::device_span<const float>(out.span())), decoded));
  }
  {  // fusion pack of 64 pieces of a: the bytes of a, in order
    fc::fusion_packer packer;
    std::vector<fc::device_span<const std::byte>> pieces;
    const std::size_t bytes = n * sizeof(float), piece = bytes / 64;
    for (std::size_t k = 0; k < 64; ++k)
      pieces.emplace_back(reinterpret_cast<const std::byte*>(da.data()) + k * piece, piece);
    fc::device_buffer<std::byte> packed(64 * piece);
    packer.pack(pieces, packed.span(), s);
    std::vector<std::byte> want(64 * piece);
    std::memcpy(want.data(), a.data(), want.size());
    expect("fusion pack (64 tensors)", differing(back(fc::device_span<const std::byte>(packed.span())), want));
  }
  return wrong;
}

void row(const char* kernel, std::size_t bytes, double moved, double ms, double copy_gbps) {
  const double gbps = moved / (ms * 1e-3) / 1e9;
  std::printf("| %-28s | %8.1f MiB | %9.3f | %8.1f | %6.2f |\n", kernel, static_cast<double>(bytes) / (1 << 20), ms,
              gbps, gbps / copy_gbps);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flexpar CUDA kernels next to cudaMemcpyAsync (device to device)"};
  std::vector<std::string> sizes = {"64M", "256M"};
  int iterations = 20, warmup = 3;
  std::size_t tensors = 1024;
  std::string tensor_size = "4K";
  std::size_t minmax_chunk = 512, onebit_chunk = 2048;
  app.add_option("--sizes", sizes, "bytes of f32 data per kernel (K, M, G suffixes)")->delimiter(',');
  app.add_option("--iterations", iterations, "timed runs per row (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed runs before the timed ones")->check(CLI::NonNegativeNumber);
  app.add_option("--tensors", tensors, "tensors in the fused-pack comparison")->check(CLI::PositiveNumber);
  app.add_option("--tensor-size", tensor_size, "bytes per tensor in the fused-pack comparison");
  app.add_option("--minmax-chunk", minmax_chunk, "elements per min-max chunk")->check(CLI::PositiveNumber);
  app.add_option("--onebit-chunk", onebit_chunk, "elements per 1-bit chunk")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  if (!fc::device_present()) {
    std::printf("flexpar_kernel_bench: no CUDA device is present; nothing measured (exit 77)\n");
    return 77;
  }
  cudaDeviceProp props{};
  FLEXPAR_CHECK_CUDA(-1, cudaGetDeviceProperties(&props, fc::current_device()));
  std::printf("device: %s, %d SMs; median of %d runs after %d warm-up runs\n\n", props.name, props.multiProcessorCount,
              iterations, warmup);

  fc::stream s;
  int failures = 0;  // kernels whose verified call was wrong
  std::printf("| kernel                       |     size     | median ms |     GB/s | vs copy |\n");
  std::printf("|------------------------------|--------------|-----------|----------|---------|\n");
  for (const std::string& text : sizes) {
    const std::size_t bytes = flexpar::bench::parse_size(text) / 16 * 16;
    const std::size_t n = bytes / sizeof(float);
    fc::device_buffer<float> a(n), b(n), c(n);
    FLEXPAR_CHECK_CUDA(-1, cudaMemsetAsync(a.data(), 0, bytes, s));
    FLEXPAR_CHECK_CUDA(-1, cudaMemsetAsync(b.data(), 0, bytes, s));
    const double b2 = 2.0 * static_cast<double>(bytes), b3 = 3.0 * static_cast<double>(bytes);

    const timing copy = measure(s, warmup, iterations, [&] {
      FLEXPAR_CHECK_CUDA(-1, cudaMemcpyAsync(c.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s));
    });
    const double copy_gbps = b2 / (copy.median_ms * 1e-3) / 1e9;
    row("cudaMemcpyAsync D2D", bytes, b2, copy.median_ms, copy_gbps);

    const auto ca = fc::device_span<const float>(a.span());
    row("reduce_into f32 sum (2 op)", bytes, b3,
        measure(s, warmup, iterations, [&] { fc::reduce_into(b.span(), ca, flexpar::reduce_op::sum, s); }).median_ms,
        copy_gbps);
    row("reduce_into f32 sum (3 op)", bytes, b3,
        measure(
            s, warmup, iterations,
            [&] { fc::reduce_into(c.span(), ca, fc::device_span<const float>(b.span()), flexpar::reduce_op::sum, s); })
            .median_ms,
        copy_gbps);
    // the same bytes as other element types: dst (op)= src, in place
    const auto typed_reduce = [&](auto zero, const char* name, flexpar::reduce_op op) {
      using T = decltype(zero);
      const fc::device_span<T> x(reinterpret_cast<T*>(a.data()), bytes / sizeof(T)),
          y(reinterpret_cast<T*>(b.data()), bytes / sizeof(T));
      row(name, bytes, b3,
          measure(s, warmup, iterations, [&] { fc::reduce_into(y, fc::device_span<const T>(x), op, s); }).median_ms,
          copy_gbps);
    };
    typed_reduce(flexpar::bfloat16{}, "reduce_into bf16 sum (2 op)", flexpar::reduce_op::sum);
    typed_reduce(std::int8_t{}, "reduce_into i8 max (2 op)", flexpar::reduce_op::max);
    row("scale_for_average f32", bytes, b2,
        measure(s, warmup, iterations, [&] { fc::scale_for_average(b.span(), 3, s); }).median_ms, copy_gbps);

    fc::minmax_uint8 q(minmax_chunk);
    const std::size_t wire_bytes = q.encoded_size(n);
    fc::device_buffer<std::byte> wire(wire_bytes);
    const double enc_moved = static_cast<double>(bytes + wire_bytes);
    row("minmax_uint8 encode", bytes, enc_moved,
        measure(s, warmup, iterations, [&] { q.encode(ca, wire.span(), s); }).median_ms, copy_gbps);
    q.check(s, 60s);
    const auto cw = fc::device_span<const std::byte>(wire.span());
    row("minmax_uint8 decode", bytes, enc_moved,
        measure(s, warmup, iterations, [&] { q.decode(cw, c.span(), s); }).median_ms, copy_gbps);
    row("minmax_uint8 decode_add", bytes, enc_moved + static_cast<double>(bytes),
        measure(s, warmup, iterations, [&] { q.decode_add(cw, c.span(), s); }).median_ms, copy_gbps);

    fc::onebit ob(n, onebit_chunk);
    const std::size_t bits_bytes = ob.encoded_size(n);
    fc::device_buffer<std::byte> bits(bits_bytes);
    row("onebit encode", bytes, b3 + static_cast<double>(bits_bytes),
        measure(s, warmup, iterations, [&] { ob.encode(ca, bits.span(), s); }).median_ms, copy_gbps);
    ob.check(s, 60s);
    row("onebit decode", bytes, static_cast<double>(bytes + bits_bytes),
        measure(s, warmup, iterations, [&] { ob.decode(fc::device_span<const std::byte>(bits.span()), c.span(), s); })
            .median_ms,
        copy_gbps);

    fc::fusion_packer packer;
    std::vector<fc::device_span<const std::byte>> pieces;
    const std::size_t piece = bytes / 64;
    for (std::size_t k = 0; k < 64; ++k)
      pieces.emplace_back(reinterpret_cast<const std::byte*>(a.data()) + k * piece, piece);
    const auto out = fc::device_span<std::byte>(reinterpret_cast<std::byte*>(c.data()), bytes);
    row("fusion pack (64 tensors)", bytes, b2,
        measure(s, warmup, iterations, [&] { packer.pack(pieces, out, s); }).median_ms, copy_gbps);
    // every kernel of the rows above once more, untimed, against the host (at most 16 Mi floats: the
    // host copies of a 256 MiB row would need a GiB of memory and nothing more is checked by them)
    failures += verify_kernels(std::min<std::size_t>(n, std::size_t{1} << 24), minmax_chunk, onebit_chunk, s);
  }

  // Many small tensors: one fused launch against a cudaMemcpyAsync per tensor.
  const std::size_t each = flexpar::bench::parse_size(tensor_size);
  fc::device_buffer<std::byte> source(tensors * each), buffer(tensors * each);
  std::vector<fc::device_span<const std::byte>> small;
  for (std::size_t k = 0; k < tensors; ++k) small.emplace_back(source.data() + k * each, each);
  fc::fusion_packer packer;
  const timing fused = measure(s, warmup, iterations, [&] { packer.pack(small, buffer.span(), s); });
  const timing separate = measure(s, warmup, iterations, [&] {
    for (std::size_t k = 0; k < tensors; ++k)
      FLEXPAR_CHECK_CUDA(-1,
                         cudaMemcpyAsync(buffer.data() + k * each, small[k].data(), each, cudaMemcpyDeviceToDevice, s));
  });
  std::printf("\n%zu tensors of %zu bytes into one fusion buffer:\n\n", tensors, each);
  std::printf("| method                         | median ms (events) | median ms (host) |\n");
  std::printf("|--------------------------------|--------------------|------------------|\n");
  std::printf("| fusion_packer::pack (1 launch) | %18.4f | %16.4f |\n", fused.median_ms, fused.host_median_ms);
  std::printf("| %4zu x cudaMemcpyAsync         | %18.4f | %16.4f |\n", tensors, separate.median_ms,
              separate.host_median_ms);
  std::printf("\nfused pack speed-up: %.1fx (events), %.1fx (host clock)\n", separate.median_ms / fused.median_ms,
              separate.host_median_ms / fused.host_median_ms);
  {  // the many-tensor pack once more, untimed: the buffer holds the source's bytes
    auto back = [&s](auto d) { return fc::to_host(d, s, 120s, "flexpar_kernel_bench: a verified result"); };
    const std::vector<std::byte> want = back(fc::device_span<const std::byte>(source.span()));
    packer.pack(small, buffer.span(), s);
    if (differing(back(fc::device_span<const std::byte>(buffer.span())), want) != 0) {
      std::fprintf(stderr, "flexpar_kernel_bench: the fused pack of %zu tensors differs from its source\n", tensors);
      ++failures;
    }
  }
  std::printf("\n# verified: every kernel's result once more against the host, %d wrong\n", failures);
  return failures == 0 ? 0 : 1;
}
