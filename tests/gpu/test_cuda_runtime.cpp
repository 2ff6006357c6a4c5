// flexpar/cuda/runtime.hpp on a device: buffers, copies between the kinds, memory_kind_of, and the
// deadline of a GPU wait.
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include <flexpar/cuda/runtime.hpp>

namespace fc = flexpar::cuda;
using namespace std::chrono_literals;

TEST(CudaRuntime, HostDeviceRoundTripThroughPinnedAndPageable) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    std::vector<int> host(n);
    std::iota(host.begin(), host.end(), 7);
    fc::device_buffer<int> a(n), b(n);
    fc::pinned_buffer<int> back(n);
    fc::stream s;
    fc::copy_async(a.span(), std::span<const int>(host), s);
    fc::copy_async(b.span(), fc::device_span<const int>(a.span()), s);
    fc::copy_async(back.span(), b.span(), s);
    fc::synchronize(s, 30s, "round trip");
    EXPECT_TRUE(std::equal(host.begin(), host.end(), back.data())) << "n = " << n;
  }
}

TEST(CudaRuntime, MemoryKindOfTellsDeviceFromHost) {
  fc::device_buffer<float> d(16);
  fc::pinned_buffer<float> p(16);
  std::vector<float> h(16);
  EXPECT_EQ(fc::memory_kind_of(d.data()), flexpar::memory_kind::cuda);
  EXPECT_EQ(fc::memory_kind_of(p.data()), flexpar::memory_kind::host);
  EXPECT_EQ(fc::memory_kind_of(h.data()), flexpar::memory_kind::host);
  EXPECT_EQ(fc::memory_kind_of(nullptr), flexpar::memory_kind::host);
}

TEST(CudaRuntime, CopyOfMismatchedSizesIsAUsageError) {
  fc::device_buffer<float> d(4);
  std::vector<float> h(5);
  fc::stream s;
  try {
    fc::copy_async(d.span(), std::span<const float>(h), s);
    FAIL() << "no error";
  } catch (const flexpar::usage_error& e) {
    EXPECT_NE(std::string(e.what()).find("holds 4 elements, the source 5"), std::string::npos) << e.what();
  }
}

TEST(CudaRuntime, WaitPastItsDeadlineThrowsTimeoutNamingTheWork) {
  fc::stream s;
  // A host function on the stream holds it for 400 ms: the wait below must give up at 50 ms.
  auto hold = [](void*) { std::this_thread::sleep_for(400ms); };
  ASSERT_EQ(cudaLaunchHostFunc(s, hold, nullptr), cudaSuccess);
  fc::event e(false);
  e.record(s);
  try {
    fc::wait(e, 50ms, "the held stream", 3);
    FAIL() << "no timeout";
  } catch (const flexpar::timeout_error& err) {
    EXPECT_NE(std::string(err.what()).find("[rank 3] the held stream: the GPU work did not finish within 50 ms"),
              std::string::npos)
        << err.what();
  }
  fc::synchronize(s, 30s, "drain");
  EXPECT_TRUE(e.done());
}

TEST(CudaRuntime, EventsTimeDeviceWork) {
  fc::device_buffer<std::byte> a(64 << 20), b(64 << 20);
  fc::stream s;
  fc::event start, stop;
  start.record(s);
  fc::copy_async(b.span(), fc::device_span<const std::byte>(a.span()), s);
  stop.record(s);
  fc::wait(stop, 30s, "copy");
  EXPECT_GT(fc::event::elapsed_ms(start, stop), 0.0f);
}
