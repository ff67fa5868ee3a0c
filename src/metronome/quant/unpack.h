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

// Q4_K / Q5_K: the 6-bit scales and mins of the 8 sub-blocks as two 64-bit words, byte j of `sc`
// = sc[j] and of `mn` = mn[j]. Word arithmetic (SWAR) on the 12 packed bytes read as three
// little-endian words s0 = bytes 0-3, s1 = 4-7, s2 = 8-11 (quant/blocks.h): sc[0..3] = low 6 bits
// of s0, mn[0..3] of s1; sc[4..7] = low nibbles of s2 | bits 6-7 of s0 as bits 4-5, mn[4..7] =
// high nibbles of s2 | bits 6-7 of s1. A dozen integer operations a super-block instead of eight
// branches. The AVX-512 kernels run these same steps on the three words as vector lanes
// (kernels/internal/avx512_unpack.h, KScaleBytes: the scalar round trip cost half their time); the
// kernel tests hold the two together (every K-quant kernel against the scalar one, built on this).
struct KScaleWords {
  std::uint64_t sc;
  std::uint64_t mn;
};
inline KScaleWords UnpackKScaleWords(const std::uint8_t (&scales)[kKScaleBytes]) noexcept {
  const auto word = [&scales](int i) {
    return static_cast<std::uint32_t>(scales[4 * i]) |
           static_cast<std::uint32_t>(scales[4 * i + 1]) << 8 |
           static_cast<std::uint32_t>(scales[4 * i + 2]) << 16 |
           static_cast<std::uint32_t>(scales[4 * i + 3]) << 24;
  };
  constexpr std::uint32_t kLow6 = 0x3F3F3F3Fu;
  constexpr std::uint32_t kLow4 = 0x0F0F0F0Fu;
  constexpr std::uint32_t kBits45 = 0x30303030u;  // bits 6-7 of a byte shifted right by 2
  const std::uint32_t s0 = word(0);
  const std::uint32_t s1 = word(1);
  const std::uint32_t s2 = word(2);
  const std::uint32_t sc_hi = (s2 & kLow4) | ((s0 >> 2) & kBits45);
  const std::uint32_t mn_hi = ((s2 >> 4) & kLow4) | ((s1 >> 2) & kBits45);
  return {(s0 & kLow6) | static_cast<std::uint64_t>(sc_hi) << 32,
          (s1 & kLow6) | static_cast<std::uint64_t>(mn_hi) << 32};
}

// The same as bytes: sc[j], mn[j] of sub-block j (0..7).
inline void UnpackKScales(const std::uint8_t (&scales)[kKScaleBytes], std::uint8_t (&sc)[8],
                          std::uint8_t (&mn)[8]) noexcept {
  const KScaleWords w = UnpackKScaleWords(scales);
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<std::uint8_t>(w.sc >> (8 * j));
    mn[j] = static_cast<std::uint8_t>(w.mn >> (8 * j));
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
