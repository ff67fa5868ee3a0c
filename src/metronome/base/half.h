// 16-bit floating-point storage formats and their exact conversions to and from fp32: IEEE
// binary16 ("f16", GGUF's F16 and the scales of most quantised blocks) and bfloat16 ("bf16", the
// upper half of an fp32). The only place these bit patterns are spelled out.
//
// Rounding: fp32 -> 16 bit is round-to-nearest-even; NaN stays a (quiet) NaN; f16 overflows to
// infinity. 16 bit -> fp32 is exact.
#pragma once

#include <bit>
#include <cstdint>

namespace metronome {

[[nodiscard]] float F16ToFloat(std::uint16_t h) noexcept;
[[nodiscard]] std::uint16_t FloatToF16(float f) noexcept;

[[nodiscard]] inline float Bf16ToFloat(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

[[nodiscard]] inline std::uint16_t FloatToBf16(float f) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // keep NaN a (quiet) NaN
  }
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

}  // namespace metronome
