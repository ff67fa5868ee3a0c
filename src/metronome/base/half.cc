#include "metronome/base/half.h"

namespace metronome {

// Bit-exact binary16 decode: subnormals renormalised, inf/NaN kept (with payload).
float F16ToFloat(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits = 0;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      // Subnormal half: renormalise so the implicit bit is explicit, adjusting the exponent.
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / NaN (payload kept)
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

// Round-to-nearest-even, overflow to infinity, NaN stays NaN.
std::uint16_t FloatToF16(float f) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {
    return static_cast<std::uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477ff000u) {  // >= 65520: rounds past the largest half (65504)
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  const std::uint32_t e = absx >> 23;
  if (e < 113) {               // below 2^-14: a half subnormal (units of 2^-24) or zero
    if (e < 102) return sign;  // below 2^-25: rounds to zero
    const std::uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // 14..24
    std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u) != 0)) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  const std::uint32_t m = absx & 0x7fffffu;
  std::uint32_t q = ((e - 127 + 15) << 10) | (m >> 13);
  const std::uint32_t rem = m & 0x1fffu;
  // A carry out of the mantissa correctly bumps the exponent.
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u) != 0)) ++q;
  return static_cast<std::uint16_t>(sign | q);
}

}  // namespace metronome
