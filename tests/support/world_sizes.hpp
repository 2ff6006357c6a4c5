// World sizes and message sizes the tests sweep (STYLE: "Testing multi-rank code").
#pragma once

#include <array>
#include <cstddef>

namespace flexpar::testing_support {

/// In-process world sizes: powers of two and not, odd ones, one.
inline constexpr std::array<int, 7> inproc_world_sizes{1, 2, 3, 4, 5, 7, 8};

/// Message sizes of the transport tests: empty, one byte, odd, one page minus one, just past 1 MiB, 64 MiB.
inline constexpr std::array<std::size_t, 5> p2p_message_sizes{0, 1, 4095, (1u << 20) + 3, std::size_t{64} << 20};

}  // namespace flexpar::testing_support
