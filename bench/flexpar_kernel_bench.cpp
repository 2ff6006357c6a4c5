// flexpar_kernel_bench: the CUDA kernels of flexpar/cuda/kernels.hpp next to a device-to-device
// cudaMemcpyAsync measured in the same run (doc/gpu.md, "Kernels").
//
// For each size: the median of --iterations timed runs (CUDA events around each run, after --warmup
// untimed ones) of the copy and of every kernel, as achieved bandwidth counting bytes read + written,
// and the ratio to the copy. Then the fused pack of --tensors small tensors (one launch) against one
// cudaMemcpyAsync per tensor, timed both by events and by the host's clock around submission + wait.
// Without a CUDA device it says so and exits 77.
//
//   flexpar_kernel_bench --sizes 64M,256M --iterations 20
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

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
  return 0;
}
