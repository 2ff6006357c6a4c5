// Seeded random test data (STYLE §10: a seeded RNG object, no std::rand).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace flexpar::testing_support {

/// `n` floats drawn from N(0, scale²) by a generator seeded with `seed`: the same values on every run.
inline std::vector<float> normal_floats(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace flexpar::testing_support
