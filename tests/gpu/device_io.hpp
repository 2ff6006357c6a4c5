// What the gpu tests share: test data between host vectors and device buffers, on a stream (the
// vector forms of cuda::to_device / to_host).
#pragma once

#include <chrono>
#include <span>
#include <vector>

#include <flexpar/cuda/runtime.hpp>

namespace flexpar::testing_support {

/// A device copy of `host`, enqueued on `s` (the buffer is ready once `s` reaches this point).
template <class T>
cuda::device_buffer<T> upload(const std::vector<T>& host, cudaStream_t s) {
  return cuda::to_device(std::span<const T>(host), s);
}

/// The elements of `d` once the work before on `s` is done (waits, 60 s at most).
template <class T>
std::vector<T> download(cuda::device_span<const T> d, cudaStream_t s) {
  return cuda::to_host(d, s, std::chrono::seconds(60), "download");
}

}  // namespace flexpar::testing_support
