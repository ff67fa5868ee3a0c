// The integer quants and sub-block scales of each block type, unpacked from the bit layouts of
// quant/blocks.h: the one place those layouts are read. The dequantiser (quant/codec.cc) and the
// portable dot kernels (kernels/quant_matmul.cc) are both written on top of these, so a layout
// error shows in both and in the byte-pattern tests.
//
// Offsets are applied where ggml applies them: Q4_0/Q5_0/Q6_K quants come back signed (q - 8,
// q - 16, q - 32), Q4_1/Q5_1/Q4_K/Q5_K unsigned (their minimum is a separate term).
#pragma once

#include <cstdint>
#include <cstring>

#include "metronome/quant/blocks.h"

namespace metronome::quant {

// Q4_K / Q5_K: 6-bit scale sc[j] and min mn[j] of sub-block j (0..7) from the 12 packed bytes.
inline void UnpackKScales(const std::uint8_t (&scales)[kKScaleBytes], std::uint8_t (&sc)[8],
                          std::uint8_t (&mn)[8]) noexcept {
  for (int j = 0; j < 4; ++j) {
    sc[j] = scales[j] & 63;
    mn[j] = scales[j + 4] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    sc[j] = static_cast<std::uint8_t>((scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4));
    mn[j] = static_cast<std::uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// The inverse of UnpackKScales (sc, mn <= 63).
inline void PackKScales(const std::uint8_t (&sc)[8], const std::uint8_t (&mn)[8],
                        std::uint8_t (&scales)[kKScaleBytes]) noexcept {
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<std::uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    scales[j + 4] = static_cast<std::uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    scales[j + 8] = static_cast<std::uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

// 32-element blocks: q[i] for element i.
inline void UnpackQuants(const BlockQ8_0& b, std::int8_t (&q)[kQk32]) noexcept {
  std::memcpy(q, b.qs, kQk32);
}
inline void UnpackQuants(const BlockQ4_0& b, std::int8_t (&q)[kQk32]) noexcept {
  for (int l = 0; l < kQk32 / 2; ++l) {
    q[l] = static_cast<std::int8_t>((b.qs[l] & 15) - 8);
    q[l + kQk32 / 2] = static_cast<std::int8_t>((b.qs[l] >> 4) - 8);
  }
}
inline void UnpackQuants(const BlockQ4_1& b, std::int8_t (&q)[kQk32]) noexcept {
  for (int l = 0; l < kQk32 / 2; ++l) {
    q[l] = static_cast<std::int8_t>(b.qs[l] & 15);
    q[l + kQk32 / 2] = static_cast<std::int8_t>(b.qs[l] >> 4);
  }
}
// Q5: nibble | (bit i of qh as a little-endian uint32) << 4.
inline void UnpackQ5(const std::uint8_t (&qh)[4], const std::uint8_t (&qs)[kQk32 / 2], int offset,
                     std::int8_t (&q)[kQk32]) noexcept {
  const std::uint32_t h =
      static_cast<std::uint32_t>(qh[0]) | static_cast<std::uint32_t>(qh[1]) << 8 |
      static_cast<std::uint32_t>(qh[2]) << 16 | static_cast<std::uint32_t>(qh[3]) << 24;
  for (int l = 0; l < kQk32 / 2; ++l) {
    const int lo = (qs[l] & 15) | static_cast<int>(((h >> l) & 1u) << 4);
    const int hi = (qs[l] >> 4) | static_cast<int>(((h >> (l + 16)) & 1u) << 4);
    q[l] = static_cast<std::int8_t>(lo - offset);
    q[l + kQk32 / 2] = static_cast<std::int8_t>(hi - offset);
  }
}
inline void UnpackQuants(const BlockQ5_0& b, std::int8_t (&q)[kQk32]) noexcept {
  UnpackQ5(b.qh, b.qs, 16, q);
}
inline void UnpackQuants(const BlockQ5_1& b, std::int8_t (&q)[kQk32]) noexcept {
  UnpackQ5(b.qh, b.qs, 0, q);
}

// 256-element super-blocks: q[i] for element i.
inline void UnpackQuants(const BlockQ4_K& b, std::int8_t (&q)[kQkK]) noexcept {
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      q[64 * g + l] = static_cast<std::int8_t>(b.qs[32 * g + l] & 15);
      q[64 * g + 32 + l] = static_cast<std::int8_t>(b.qs[32 * g + l] >> 4);
    }
  }
}
inline void UnpackQuants(const BlockQ5_K& b, std::int8_t (&q)[kQkK]) noexcept {
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      const int lo_bit = (b.qh[l] >> (2 * g)) & 1;
      const int hi_bit = (b.qh[l] >> (2 * g + 1)) & 1;
      q[64 * g + l] = static_cast<std::int8_t>((b.qs[32 * g + l] & 15) | lo_bit << 4);
      q[64 * g + 32 + l] = static_cast<std::int8_t>((b.qs[32 * g + l] >> 4) | hi_bit << 4);
    }
  }
}
inline void UnpackQuants(const BlockQ6_K& b, std::int8_t (&q)[kQkK]) noexcept {
  for (int h = 0; h < 2; ++h) {
    const std::uint8_t* ql = b.ql + 64 * h;
    const std::uint8_t* qh = b.qh + 32 * h;
    std::int8_t* out = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      out[l] = static_cast<std::int8_t>(((ql[l] & 15) | ((qh[l] & 3) << 4)) - 32);
      out[l + 32] = static_cast<std::int8_t>(((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32);
      out[l + 64] = static_cast<std::int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      out[l + 96] = static_cast<std::int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

}  // namespace metronome::quant
