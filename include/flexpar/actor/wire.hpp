// flexpar/actor/wire.hpp — how a payload type crosses ranks: the bytes to send and where to receive them.
//
// Specialize `flexpar::wire<T>` for a payload that is neither trivially copyable nor a
// `std::vector` of a trivially copyable type.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <flexpar/core/error.hpp>

namespace flexpar {

/// The bytes of a trivially copyable payload: the object itself.
template <class T>
struct wire {
  static_assert(std::is_trivially_copyable_v<T>,
                "flexpar::wire<T>: a payload that crosses ranks must be trivially copyable or a std::vector of a "
                "trivially copyable type; specialize flexpar::wire<T> to send another type");
  /// The bytes to send for `value`.
  static std::span<const std::byte> bytes(const T& value) noexcept { return std::as_bytes(std::span(&value, 1)); }
  /// Room for a received message of `size` bytes inside `value`.
  /// @throws usage_error if `size` is not sizeof(T) (both ranks must agree on T).
  static std::span<std::byte> prepare(T& value, std::size_t size) {
    if (size != sizeof(T)) {
      throw error_on<usage_error>(no_rank, "flexpar::wire", "received ", size, " bytes for a payload of ", sizeof(T),
                                  " bytes; the two ranks of a cross-rank edge disagree on its type");
    }
    return std::as_writable_bytes(std::span(&value, 1));
  }
};

/// The bytes of a vector of trivially copyable elements: its elements (resized on receipt).
template <class U, class A>
struct wire<std::vector<U, A>> {
  static_assert(
      std::is_trivially_copyable_v<U>,
      "flexpar::wire<std::vector<U>>: the elements of a vector that crosses ranks must be trivially copyable");
  /// The bytes to send for `value`.
  static std::span<const std::byte> bytes(const std::vector<U, A>& value) noexcept {
    return std::as_bytes(std::span(value.data(), value.size()));
  }
  /// Resizes `value` to hold `size` bytes and returns them.
  /// @throws usage_error if `size` is not a multiple of sizeof(U).
  static std::span<std::byte> prepare(std::vector<U, A>& value, std::size_t size) {
    if (size % sizeof(U) != 0) {
      throw error_on<usage_error>(no_rank, "flexpar::wire", "received ", size, " bytes for a vector of ", sizeof(U),
                                  "-byte elements; the two ranks of a cross-rank edge disagree on its type");
    }
    value.resize(size / sizeof(U));
    return std::as_writable_bytes(std::span(value.data(), value.size()));
  }
};

}  // namespace flexpar
