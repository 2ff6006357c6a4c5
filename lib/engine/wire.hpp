// lib/engine/wire.hpp — the engine's message encoding: fixed-width little-endian fields and length-prefixed strings,
// appended to / read from a byte vector. Reading past the end is a protocol error (a bug or a
// peer running another flexpar version), reported as such.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <flexpar/core/error.hpp>

namespace flexpar::detail {

class wire_writer {
 public:
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put(T value) {
    const auto at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &value, sizeof(T));
  }
  void put(const std::string& s) {
    put(static_cast<std::uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), reinterpret_cast<const std::byte*>(s.data()),
                  reinterpret_cast<const std::byte*>(s.data()) + s.size());
  }
  [[nodiscard]] std::vector<std::byte>& bytes() noexcept { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

class wire_reader {
 public:
  explicit wire_reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  template <class T>
  requires std::is_trivially_copyable_v<T> T get() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  std::string get_string() {
    const auto n = get<std::uint32_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + at_), n);
    at_ += n;
    return s;
  }
  /// Throws unless every byte was read (a longer message than this version writes).
  void expect_end() const {
    if (at_ != bytes_.size())
      throw error_on<error>(no_rank, "engine protocol error", bytes_.size() - at_,
                            " unread bytes at the end of a message (do all ranks run the same flexpar?)");
  }

 private:
  void need(std::size_t n) const {
    if (at_ + n > bytes_.size())
      throw error_on<error>(no_rank, "engine protocol error", "a message of ", bytes_.size(),
                            " bytes ended early (do all ranks run the same flexpar?)");
  }
  std::span<const std::byte> bytes_;
  std::size_t at_ = 0;
};

}  // namespace flexpar::detail
