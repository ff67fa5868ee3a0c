#include "metronome/quant/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "metronome/base/half.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/ggml_type.h"
#include "metronome/quant/unpack.h"

namespace metronome::quant {
namespace {

constexpr std::uint16_t kF16One = 0x3C00;      // 1.0
constexpr std::uint16_t kF16Half = 0x3800;     // 0.5
constexpr std::uint16_t kF16Quarter = 0x3400;  // 0.25
constexpr std::uint16_t kF16MinusTwo = 0xC000;

std::vector<float> Decode(GgmlType type, const void* block, int n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  DequantizeRow(type, block, n, out.data());
  return out;
}

// ---- known byte patterns: the layouts of blocks.h pinned by hand-built blocks ----

TEST(CodecLayoutTest, Q8_0) {
  BlockQ8_0 b{};
  b.d = kF16Half;
  for (int i = 0; i < 32; ++i) b.qs[i] = static_cast<std::int8_t>(i - 16);
  const auto x = Decode(GgmlType::kQ8_0, &b, 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(x[i], 0.5f * static_cast<float>(i - 16)) << i;
}

TEST(CodecLayoutTest, Q4_0LowNibblesFirstHalfHighNibblesSecondHalf) {
  BlockQ4_0 b{};
  b.d = kF16Half;
  for (int l = 0; l < 16; ++l) b.qs[l] = static_cast<std::uint8_t>(l | (15 - l) << 4);
  const auto x = Decode(GgmlType::kQ4_0, &b, 32);
  for (int l = 0; l < 16; ++l) {
    EXPECT_EQ(x[l], 0.5f * static_cast<float>(l - 8)) << l;
    EXPECT_EQ(x[l + 16], 0.5f * static_cast<float>(15 - l - 8)) << l;
  }
}

TEST(CodecLayoutTest, Q4_1AddsTheMin) {
  BlockQ4_1 b{};
  b.d = kF16One;
  b.m = kF16MinusTwo;
  for (int l = 0; l < 16; ++l) b.qs[l] = static_cast<std::uint8_t>(l | (15 - l) << 4);
  const auto x = Decode(GgmlType::kQ4_1, &b, 32);
  for (int l = 0; l < 16; ++l) {
    EXPECT_EQ(x[l], static_cast<float>(l) - 2.0f) << l;
    EXPECT_EQ(x[l + 16], static_cast<float>(15 - l) - 2.0f) << l;
  }
}

TEST(CodecLayoutTest, Q5HighBitIsBitIOfQhLittleEndian) {
  BlockQ5_0 b0{};
  BlockQ5_1 b1{};
  b0.d = b1.d = kF16One;
  b1.m = kF16Half;
  // qh bytes 0x01 0x00 0x80 0x00: bits 0 and 23 set -> elements 0 and 23 get +16.
  const std::uint8_t qh[4] = {0x01, 0x00, 0x80, 0x00};
  std::memcpy(b0.qh, qh, 4);
  std::memcpy(b1.qh, qh, 4);
  for (int l = 0; l < 16; ++l) b0.qs[l] = b1.qs[l] = static_cast<std::uint8_t>(l | 3 << 4);
  const auto x0 = Decode(GgmlType::kQ5_0, &b0, 32);
  const auto x1 = Decode(GgmlType::kQ5_1, &b1, 32);
  for (int i = 0; i < 32; ++i) {
    const int nib = i < 16 ? i : 3;
    const int q = nib + ((i == 0 || i == 23) ? 16 : 0);
    EXPECT_EQ(x0[i], static_cast<float>(q - 16)) << i;
    EXPECT_EQ(x1[i], static_cast<float>(q) + 0.5f) << i;
  }
}

// scales bytes chosen so every packing path of the 6-bit scales/mins is exercised; the expected
// values are worked out by hand from ggml's get_scale_min_k4.
constexpr std::uint8_t kKScales[12] = {0x41, 0x02, 0x03, 0xC4, 0x05, 0x46,
                                       0x07, 0x08, 0x21, 0x43, 0x65, 0x87};
constexpr int kKSc[8] = {1, 2, 3, 4, 17, 3, 5, 55};
constexpr int kKMn[8] = {5, 6, 7, 8, 2, 20, 6, 8};

TEST(CodecLayoutTest, Q4_K) {
  BlockQ4_K b{};
  b.d = kF16One;
  b.dmin = kF16Half;
  std::memcpy(b.scales, kKScales, 12);
  for (int k = 0; k < 128; ++k) b.qs[k] = static_cast<std::uint8_t>(k);
  const auto x = Decode(GgmlType::kQ4_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 64;
    const int l = e % 32;
    // [64 g, 64 g + 32): low nibbles of qs[32 g + l]; the next 32: their high nibbles.
    const int q = (e % 64) < 32 ? (32 * g + l) & 15 : (32 * g + l) >> 4;
    const int j = e / 32;
    EXPECT_EQ(x[e], static_cast<float>(kKSc[j] * q) - 0.5f * static_cast<float>(kKMn[j])) << e;
  }
}

// The word-parallel scale decode against the per-sub-block formula of quant/blocks.h, on random
// packed bytes (every bit of the 12 set and clear), and PackKScales as its inverse.
TEST(CodecLayoutTest, KScalesWordDecodeMatchesTheLayoutFormula) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::uint8_t s[kKScaleBytes];
    for (auto& v : s) v = static_cast<std::uint8_t>(rng());
    std::uint8_t sc[8];
    std::uint8_t mn[8];
    UnpackKScales(s, sc, mn);
    for (int j = 0; j < 8; ++j) {
      const int want_sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
      const int want_mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      ASSERT_EQ(sc[j], want_sc) << "trial " << trial << " sub-block " << j;
      ASSERT_EQ(mn[j], want_mn) << "trial " << trial << " sub-block " << j;
    }
    std::uint8_t packed[kKScaleBytes];
    PackKScales(sc, mn, packed);
    ASSERT_EQ(std::memcmp(packed, s, kKScaleBytes), 0) << "trial " << trial;
  }
}

TEST(CodecLayoutTest, Q5_K) {
  BlockQ5_K b{};
  b.d = kF16One;
  b.dmin = kF16Half;
  std::memcpy(b.scales, kKScales, 12);
  for (int k = 0; k < 128; ++k) b.qs[k] = static_cast<std::uint8_t>(k);
  b.qh[3] = 0x01;  // bit 0 of qh[3]: element 3
  b.qh[5] = 0x80;  // bit 7 of qh[5]: element 64 * 3 + 32 + 5
  b.qh[9] = 0x04;  // bit 2 of qh[9]: element 64 + 9
  const auto x = Decode(GgmlType::kQ5_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 64;
    const int l = e % 32;
    int q = (e % 64) < 32 ? (32 * g + l) & 15 : (32 * g + l) >> 4;
    if (e == 3 || e == 229 || e == 73) q += 16;
    const int j = e / 32;
    EXPECT_EQ(x[e], static_cast<float>(kKSc[j] * q) - 0.5f * static_cast<float>(kKMn[j])) << e;
  }
}

TEST(CodecLayoutTest, Q6_K) {
  BlockQ6_K b{};
  b.d = kF16Quarter;
  for (int k = 0; k < 16; ++k) b.scales[k] = static_cast<std::int8_t>(k - 8);
  b.ql[0] = 0x21;        // element 0: low nibble 1; element 64: high nibble 2
  b.qh[0] = 0xE4;        // 0b11'10'01'00: elements 0, 32, 64, 96 get high bits 0, 1, 2, 3
  b.ql[64 + 5] = 0x0F;   // second half, element 128 + 5: low nibble 15
  b.qh[32 + 5] = 0x01;   // ... high bits 1
  b.ql[64 + 40] = 0xA0;  // second half, element 128 + 64 + 8 (ql[l + 32] high nibble = 96 + l)
  const auto x = Decode(GgmlType::kQ6_K, &b, 256);
  for (int e = 0; e < 256; ++e) {
    int q = 0;
    if (e == 0) q = 1;
    if (e == 32) q = 16;
    if (e == 64) q = 2 | 32;
    if (e == 96) q = 48;
    if (e == 133) q = 15 | 16;
    if (e == 128 + 96 + 8) q = 10;
    EXPECT_EQ(x[e], 0.25f * static_cast<float>(b.scales[e / 16]) * static_cast<float>(q - 32)) << e;
  }
}

TEST(CodecLayoutTest, HalfTypes) {
  const std::uint16_t f16[3] = {kF16One, kF16MinusTwo, 0x7BFF};  // 1, -2, 65504
  const std::uint16_t bf16[2] = {0x3F80, 0xC0A0};                // 1, -5
  const auto a = Decode(GgmlType::kF16, f16, 3);
  EXPECT_EQ(a, (std::vector<float>{1.0f, -2.0f, 65504.0f}));
  const auto b = Decode(GgmlType::kBF16, bf16, 2);
  EXPECT_EQ(b, (std::vector<float>{1.0f, -5.0f}));
}

// ---- round trips: quantise, dequantise, compare with a bound from the type's step ----

enum class Shape { kGaussian, kUniformPositive, kAllNegative, kOutlier, kZero, kTiny };

std::vector<float> MakeRow(Shape shape, int n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.0f, 3.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) {
    switch (shape) {
      case Shape::kGaussian:
      case Shape::kOutlier:
        v = gauss(rng) * 0.05f;
        break;
      case Shape::kUniformPositive:
        v = uni(rng) + 0.5f;
        break;
      case Shape::kAllNegative:
        v = -uni(rng) - 0.1f;
        break;
      case Shape::kZero:
        v = 0.0f;
        break;
      case Shape::kTiny:
        v = gauss(rng) * 1e-3f;
        break;
    }
  }
  if (shape == Shape::kOutlier) x[static_cast<std::size_t>(n / 3)] = 4.0f;
  return x;
}

constexpr Shape kShapes[] = {Shape::kGaussian,    Shape::kUniformPositive,
                             Shape::kAllNegative, Shape::kOutlier,
                             Shape::kZero,        Shape::kTiny};

std::vector<std::byte> Encode(GgmlType type, const std::vector<float>& x) {
  const auto bytes = TensorBytes(type, x.size());
  EXPECT_TRUE(bytes.has_value());
  std::vector<std::byte> out(bytes.value_or(0));
  QuantizeRow(type, x.data(), static_cast<std::int64_t>(x.size()), out.data());
  return out;
}

// Relative slack for f16 scale rounding (one f16 ulp is 2^-10 relative) and fp32 arithmetic.
constexpr float kScaleSlack = 1.0f + 1.0f / 256.0f;

float MaxAbs(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

TEST(CodecRoundTripTest, Q8_0WithinHalfAStep) {
  for (const Shape shape : kShapes) {
    const auto x = MakeRow(shape, 32 * 7, 11);
    const auto y = Decode(GgmlType::kQ8_0, Encode(GgmlType::kQ8_0, x).data(), 32 * 7);
    for (int b = 0; b < 7; ++b) {
      const float step = MaxAbs(x.data() + 32 * b, 32) / 127.0f;
      for (int l = 0; l < 32; ++l) {
        const int i = 32 * b + l;
        ASSERT_LE(std::fabs(y[i] - x[i]), 0.5f * step * kScaleSlack + 1e-9f) << i;
      }
    }
  }
}

// Q4_0 / Q5_0: the extreme maps to the lowest level exactly; the opposite end may clip by one step.
void CheckOffsetType(GgmlType type, int offset) {
  for (const Shape shape : kShapes) {
    const auto x = MakeRow(shape, 32 * 9, 12);
    const auto y = Decode(type, Encode(type, x).data(), 32 * 9);
    for (int b = 0; b < 9; ++b) {
      const float step = MaxAbs(x.data() + 32 * b, 32) / static_cast<float>(offset);
      double sq = 0.0;
      for (int l = 0; l < 32; ++l) {
        const int i = 32 * b + l;
        ASSERT_LE(std::fabs(y[i] - x[i]), step * kScaleSlack + 1e-9f) << Name(type) << " " << i;
        sq += static_cast<double>(y[i] - x[i]) * (y[i] - x[i]);
      }
      EXPECT_LE(std::sqrt(sq / 32), 0.5 * step * kScaleSlack + 1e-9) << Name(type) << " " << b;
    }
  }
}
TEST(CodecRoundTripTest, Q4_0) { CheckOffsetType(GgmlType::kQ4_0, 8); }
TEST(CodecRoundTripTest, Q5_0) { CheckOffsetType(GgmlType::kQ5_0, 16); }

// Q4_1 / Q5_1: [min, max] over `steps` steps, within half a step.
void CheckMinType(GgmlType type, int steps) {
  for (const Shape shape : kShapes) {
    const auto x = MakeRow(shape, 32 * 9, 13);
    const auto y = Decode(type, Encode(type, x).data(), 32 * 9);
    for (int b = 0; b < 9; ++b) {
      const auto [lo, hi] = std::minmax_element(x.begin() + 32 * b, x.begin() + 32 * (b + 1));
      // The min is rounded down to f16 (at most 2^-10 relative), which widens the range.
      const float range = (*hi - *lo) + std::fabs(*lo) / 1024.0f;
      const float step = range / static_cast<float>(steps);
      for (int l = 0; l < 32; ++l) {
        const int i = 32 * b + l;
        ASSERT_LE(std::fabs(y[i] - x[i]), 0.5f * step * kScaleSlack + 1e-9f)
            << Name(type) << " " << i;
      }
    }
  }
}
TEST(CodecRoundTripTest, Q4_1) { CheckMinType(GgmlType::kQ4_1, 15); }
TEST(CodecRoundTripTest, Q5_1) { CheckMinType(GgmlType::kQ5_1, 31); }

// Q4_K / Q5_K: per sub-block of 32 the RMS error is at most half the step that covers the
// sub-block's range [min(x, 0), max(x)] on the 6-bit grids (the search only keeps a scale with a
// smaller squared error than that one), d and dmin being the block's decoded super-scales.
void CheckKMinType(GgmlType type, int steps) {
  for (const Shape shape : kShapes) {
    constexpr int kBlocks = 3;
    const auto x = MakeRow(shape, 256 * kBlocks, 14);
    const auto enc = Encode(type, x);
    const auto y = Decode(type, enc.data(), 256 * kBlocks);
    const std::size_t block_bytes = Traits(type).block_bytes;
    for (int b = 0; b < kBlocks; ++b) {
      std::uint16_t dh = 0;
      std::uint16_t dminh = 0;
      std::memcpy(&dh, enc.data() + block_bytes * b, 2);
      std::memcpy(&dminh, enc.data() + block_bytes * b + 2, 2);
      const float d = F16ToFloat(dh);
      const float dmin = F16ToFloat(dminh);
      for (int j = 0; j < 8; ++j) {
        const int base = 256 * b + 32 * j;
        const auto [lo, hi] = std::minmax_element(x.begin() + base, x.begin() + base + 32);
        const float range = *hi - std::min(*lo, 0.0f);
        const float cover_step = (range + dmin) / static_cast<float>(steps) + d;
        double sq = 0.0;
        for (int l = 0; l < 32; ++l)
          sq += std::pow(static_cast<double>(y[base + l] - x[base + l]), 2);
        EXPECT_LE(std::sqrt(sq / 32), 0.5 * cover_step * 1.0001 + 1e-9)
            << Name(type) << " block " << b << " sub " << j;
      }
      // The super-scales are as small as the 6-bit grid allows (within one f16 ulp).
      float max_lo = 0.0f;
      for (int e = 0; e < 256; ++e) max_lo = std::max(max_lo, -x[256 * b + e]);
      EXPECT_LE(dmin, max_lo / 63.0f * kScaleSlack + 1e-12f) << Name(type);
    }
  }
}
TEST(CodecRoundTripTest, Q4_K) { CheckKMinType(GgmlType::kQ4_K, 15); }
TEST(CodecRoundTripTest, Q5_K) { CheckKMinType(GgmlType::kQ5_K, 31); }

TEST(CodecRoundTripTest, Q6_KWithinHalfTheCoveringStep) {
  for (const Shape shape : kShapes) {
    const auto x = MakeRow(shape, 256 * 3, 15);
    const auto enc = Encode(GgmlType::kQ6_K, x);
    const auto y = Decode(GgmlType::kQ6_K, enc.data(), 256 * 3);
    for (int b = 0; b < 3; ++b) {
      std::uint16_t dh = 0;
      std::memcpy(&dh, enc.data() + 210 * b + 208, 2);
      const float d = F16ToFloat(dh);
      for (int k = 0; k < 16; ++k) {
        const int base = 256 * b + 16 * k;
        const float step = MaxAbs(x.data() + base, 16) / 31.0f + d;
        for (int l = 0; l < 16; ++l) {
          ASSERT_LE(std::fabs(y[base + l] - x[base + l]), 0.5f * step * 1.0001f + 1e-9f)
              << base + l;
        }
      }
    }
  }
}

TEST(CodecRoundTripTest, HalfTypesRoundToNearest) {
  const auto x = MakeRow(Shape::kGaussian, 100, 16);
  const auto f16 = Decode(GgmlType::kF16, Encode(GgmlType::kF16, x).data(), 100);
  const auto bf16 = Decode(GgmlType::kBF16, Encode(GgmlType::kBF16, x).data(), 100);
  const auto f32 = Decode(GgmlType::kF32, Encode(GgmlType::kF32, x).data(), 100);
  for (int i = 0; i < 100; ++i) {
    EXPECT_LE(std::fabs(f16[i] - x[i]), std::fabs(x[i]) / 2048.0f + 3e-8f) << i;  // incl. subnormal
    EXPECT_LE(std::fabs(bf16[i] - x[i]), std::fabs(x[i]) / 256.0f) << i;
    EXPECT_EQ(f32[i], x[i]);
  }
}

// Random lengths for every computable type: the encoding has exactly TensorBytes bytes and decodes
// to finite values near the input (a coarse bound; the per-type tests above hold the tight ones).
TEST(CodecRoundTripTest, RandomShapesEveryComputableType) {
  std::mt19937 rng(17);
  for (std::uint32_t id = 0; id < 40; ++id) {
    const auto t = FindGgmlType(id);
    if (!t || !t->computable) continue;
    for (int trial = 0; trial < 5; ++trial) {
      const int blocks = 1 + static_cast<int>(rng() % 6);
      const int n = blocks * static_cast<int>(std::max<std::uint32_t>(t->block_elems, 32));
      const auto x = MakeRow(Shape::kGaussian, n, rng());
      const auto enc = Encode(t->type, x);
      ASSERT_EQ(enc.size(), *TensorBytes(t->type, static_cast<std::uint64_t>(n)));
      const auto y = Decode(t->type, enc.data(), n);
      const float amax = MaxAbs(x.data(), n);
      for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << t->name;
        ASSERT_LE(std::fabs(y[i] - x[i]), amax / 4.0f) << t->name << " " << i;
      }
    }
  }
}

// ---- activations ----

TEST(CodecActivationTest, Q8Block32ScaleQuantsAndSums) {
  const auto x = MakeRow(Shape::kOutlier, 32 * 5, 18);
  std::vector<ActQ8Block32> a(5);
  QuantizeActivationsQ8(x.data(), 32 * 5, a.data());
  for (int b = 0; b < 5; ++b) {
    const float amax = MaxAbs(x.data() + 32 * b, 32);
    EXPECT_FLOAT_EQ(a[b].d, amax / 127.0f);
    int sum = 0;
    for (int l = 0; l < 32; ++l) {
      sum += a[b].qs[l];
      EXPECT_LE(std::fabs(a[b].d * a[b].qs[l] - x[32 * b + l]), 0.5f * a[b].d * 1.0001f);
    }
    EXPECT_EQ(a[b].sum, sum);
  }
}

TEST(CodecActivationTest, Q8_KScaleQuantsAndBsums) {
  const auto x = MakeRow(Shape::kGaussian, 512, 19);
  std::vector<BlockQ8_K> a(2);
  QuantizeActivationsQ8_K(x.data(), 512, a.data());
  for (int b = 0; b < 2; ++b) {
    EXPECT_FLOAT_EQ(a[b].d, MaxAbs(x.data() + 256 * b, 256) / 127.0f);
    for (int k = 0; k < 16; ++k) {
      int s = 0;
      for (int l = 0; l < 16; ++l) {
        s += a[b].qs[16 * k + l];
        EXPECT_LE(std::fabs(a[b].d * a[b].qs[16 * k + l] - x[256 * b + 16 * k + l]),
                  0.5f * a[b].d * 1.0001f);
      }
      EXPECT_EQ(a[b].bsums[k], s);
    }
  }
}

TEST(CodecActivationTest, ZeroRowGivesZeroScale) {
  std::vector<float> x(256, 0.0f);
  BlockQ8_K k{};
  ActQ8Block32 a{};
  QuantizeActivationsQ8_K(x.data(), 256, &k);
  QuantizeActivationsQ8(x.data(), 32, &a);
  EXPECT_EQ(k.d, 0.0f);
  EXPECT_EQ(a.d, 0.0f);
  EXPECT_EQ(a.sum, 0);
}

}  // namespace
}  // namespace metronome::quant
