// What the gpu tests share: test data between host vectors and device buffers, on a stream.
#pragma once

#include <chrono>
#include <span>
#include <vector>

#include <flexpar/cuda/runtime.hpp>

namespace flexpar::testing_support {

/// A device copy of `host`, enqueued on `s` (the buffer is ready once `s` reaches this point).
template <class T>
cuda::device_buffer<T> upload(const std::vector<T>& host, cudaStream_t s) {
  cuda::device_buffer<T> d(host.size());
  cuda::copy_async(d.span(), std::span<const T>(host), s);
  return d;
}

/// The elements of `d` once the work before on `s` is done (waits, 60 s at most).
template <class T>
std::vector<T> download(cuda::device_span<const T> d, cudaStream_t s) {
  std::vector<T> host(d.size());
  cuda::copy_async(std::span<T>(host), d, s);
  cuda::synchronize(s, std::chrono::seconds(60), "download");
  return host;
}

}  // namespace flexpar::testing_support
