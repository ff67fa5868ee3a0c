// Byte layouts of the quantised blocks this engine computes with, exactly as GGUF stores them
// (ggml's published block definitions, ggml-common.h). All scales `d`/`m`/`dmin` are IEEE f16 bit
// patterns (base/half.h) except Q8_K's fp32 `d`. Little-endian throughout. Element index i of a
// block is the i-th value of the row the block covers.
//
// 32-element blocks (kQk32):
//   Q8_0  x[i] = d * qs[i]                                         (qs int8)
//   Q4_0  x[i] = d * (nib(i) - 8)            nib(i) = qs[i] & 15 for i < 16, qs[i-16] >> 4 after
//   Q4_1  x[i] = d * nib(i) + m
//   Q5_0  x[i] = d * ((nib(i) | hb(i) << 4) - 16)   hb(i) = bit i of qh read as a uint32 (LE)
//   Q5_1  x[i] = d * (nib(i) | hb(i) << 4) + m
// 256-element super-blocks (kQkK), made of sub-blocks:
//   Q4_K  8 sub-blocks of 32 with a 6-bit scale sc[j] and 6-bit min mn[j] packed in scales[12]
//         (j < 4: sc = scales[j] & 63, mn = scales[j+4] & 63; j >= 4: sc = (scales[j+4] & 15) |
//         (scales[j-4] >> 6) << 4, mn = (scales[j+4] >> 4) | (scales[j] >> 6) << 4).
//         Elements [64 g, 64 g + 32) use sub-block 2g and the low nibbles of qs[32 g .. 32 g + 32);
//         [64 g + 32, 64 g + 64) use sub-block 2g+1 and the high nibbles of the same bytes.
//         x = d * sc * q - dmin * mn.
//   Q5_K  as Q4_K, plus a fifth bit: for element 64 g + l (l < 32) bit 2g of qh[l], for
//         64 g + 32 + l bit 2g+1 of qh[l]; q = nibble | bit << 4.
//   Q6_K  16 sub-blocks of 16 with int8 scales; per half h (128 elements: ql[64 h ..], qh[32 h ..],
//         scales[8 h ..]) and l < 32: q(l) = (ql[l] & 15) | (qh[l] & 3) << 4,
//         q(l+32) = (ql[l+32] & 15) | ((qh[l] >> 2) & 3) << 4, q(l+64) = (ql[l] >> 4) |
//         ((qh[l] >> 4) & 3) << 4, q(l+96) = (ql[l+32] >> 4) | ((qh[l] >> 6) & 3) << 4;
//         element e of the half uses scales[e / 16]; x = d * scale * (q - 32).
//   Q8_K  (activations only, never stored in files we load) x[i] = d * qs[i]; bsums[k] is the sum
//         of qs[16 k .. 16 k + 16), for the K-quants' min terms.
//
// Not a GGUF layout: ActQ8Block32, the activations the 32-element types' dot products consume
// (Q8_0-style with an fp32 scale, which the inner loop needs without a conversion, and the sum of
// the quants, which the offset of Q4_0/Q5_0 and the min of Q4_1/Q5_1 multiply).
#pragma once

#include <cstdint>

namespace metronome::quant {

inline constexpr int kQk32 = 32;  // elements per block of the 32-element types
inline constexpr int kQkK = 256;  // elements per K-quant super-block
inline constexpr int kKScaleBytes = 12;

struct BlockQ8_0 {
  std::uint16_t d;
  std::int8_t qs[kQk32];
};
struct BlockQ4_0 {
  std::uint16_t d;
  std::uint8_t qs[kQk32 / 2];
};
struct BlockQ4_1 {
  std::uint16_t d;
  std::uint16_t m;
  std::uint8_t qs[kQk32 / 2];
};
struct BlockQ5_0 {
  std::uint16_t d;
  std::uint8_t qh[4];
  std::uint8_t qs[kQk32 / 2];
};
struct BlockQ5_1 {
  std::uint16_t d;
  std::uint16_t m;
  std::uint8_t qh[4];
  std::uint8_t qs[kQk32 / 2];
};
struct BlockQ4_K {
  std::uint16_t d;
  std::uint16_t dmin;
  std::uint8_t scales[kKScaleBytes];
  std::uint8_t qs[kQkK / 2];
};
struct BlockQ5_K {
  std::uint16_t d;
  std::uint16_t dmin;
  std::uint8_t scales[kKScaleBytes];
  std::uint8_t qh[kQkK / 8];
  std::uint8_t qs[kQkK / 2];
};
struct BlockQ6_K {
  std::uint8_t ql[kQkK / 2];
  std::uint8_t qh[kQkK / 4];
  std::int8_t scales[kQkK / 16];
  std::uint16_t d;
};
struct BlockQ8_K {
  float d;
  std::int8_t qs[kQkK];
  std::int16_t bsums[kQkK / 16];
};

// x[i] = d * qs[i]; sum = sum of qs (ours: see above).
struct ActQ8Block32 {
  float d;
  std::int32_t sum;
  std::int8_t qs[kQk32];
};

}  // namespace metronome::quant
