// flexpar/core/hash.hpp — FNV-1a, the hash ranks exchange to agree on a list (names, lengths) in one
// allreduce or allgather instead of sending the list: the relaxations' and ZeRO's registration checks.
// Not cryptographic, not for persisted data; every rank of one build computes the same value.
#pragma once

#include <cstdint>
#include <string_view>

namespace flexpar {

/// FNV-1a's 64-bit offset basis: the hash of no bytes.
inline constexpr std::uint64_t fnv1a_basis = 14695981039346656037ull;

/// FNV-1a, 64 bits, of `bytes`, continued from `h` (so that a list hashes item by item).
[[nodiscard]] constexpr std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h = fnv1a_basis) noexcept {
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace flexpar
