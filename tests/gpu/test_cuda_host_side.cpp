// The host side of flexpar::cuda, which runs with or without a GPU (label unit: it runs in CI):
// device queries that answer instead of failing, a clear CUDA error where a device is needed and
// absent, and the device span's type rules.
#include <gtest/gtest.h>

#include <ranges>
#include <type_traits>

#include <flexpar/cuda/runtime.hpp>

namespace fc = flexpar::cuda;

// A device span is not a host range: no begin/end, no operator[] (host code cannot read it).
static_assert(!std::ranges::range<fc::device_span<float>>);
static_assert(std::is_convertible_v<fc::device_span<float>, fc::device_span<const float>>);
static_assert(!std::is_convertible_v<fc::device_span<const float>, fc::device_span<float>>);
static_assert(!std::is_convertible_v<fc::device_span<float>, std::span<float>>);
static_assert(std::is_same_v<fc::device_span<float>::memory_type, flexpar::memory::cuda>);
static_assert(flexpar::memory_tag<flexpar::memory::host> && flexpar::memory_tag<flexpar::memory::cuda>);
static_assert(flexpar::built_with_cuda);

TEST(CudaHostSide, DeviceQueriesAnswerWithoutThrowing) {
  const int n = fc::device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(fc::device_present(), n > 0);
  int local = 0;
  EXPECT_EQ(fc::memory_kind_of(&local), flexpar::memory_kind::host);
  EXPECT_EQ(fc::memory_kind_of(nullptr), flexpar::memory_kind::host);
  EXPECT_EQ(flexpar::name_of(flexpar::memory_kind::cuda), "cuda");
}

TEST(CudaHostSide, WithoutADeviceAllocationIsACudaTransportError) {
  if (fc::device_present()) GTEST_SKIP() << "a device is present: the no-device path is not reachable";
  try {
    fc::device_buffer<float> b(16);
    FAIL() << "cudaMalloc succeeded without a device";
  } catch (const flexpar::transport_error& e) {
    EXPECT_EQ(e.library(), "CUDA");
    EXPECT_NE(std::string(e.what()).find("cudaMalloc"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fc::stream{}, flexpar::transport_error);
  // An empty buffer allocates nothing, so it needs no device.
  fc::device_buffer<float> empty(0);
  EXPECT_EQ(empty.span().size(), 0u);
}

TEST(CudaHostSide, SpansSliceWithoutTouchingMemory) {
  float* fake = reinterpret_cast<float*>(std::uintptr_t{4096});  // never dereferenced
  const fc::device_span<float> s(fake, 100);
  EXPECT_EQ(s.subspan(10, 5).data(), fake + 10);
  EXPECT_EQ(s.subspan(10, 5).size(), 5u);
  EXPECT_EQ(s.first(7).size_bytes(), 28u);
  EXPECT_EQ(s.as_bytes().size(), 400u);
  const fc::device_span<const float> c = s;
  EXPECT_EQ(c.data(), fake);
}
