#include "metronome/quant/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "metronome/base/check.h"
#include "metronome/base/half.h"
#include "metronome/quant/unpack.h"

namespace metronome::quant {
namespace {

// ---- f16 scales rounded in a chosen direction, so that a block's range stays covered. ----

std::uint16_t F16NextUp(std::uint16_t h) {
  if (h == 0x8000u) return 0x0001u;
  return (h & 0x8000u) ? static_cast<std::uint16_t>(h - 1) : static_cast<std::uint16_t>(h + 1);
}
std::uint16_t F16NextDown(std::uint16_t h) {
  if (h == 0x0000u) return 0x8001u;
  return (h & 0x8000u) ? static_cast<std::uint16_t>(h + 1) : static_cast<std::uint16_t>(h - 1);
}
// The nearest f16 >= v (resp. <= v), for finite v within the f16 range.
std::uint16_t F16AtLeast(float v) {
  std::uint16_t h = FloatToF16(v);
  if (F16ToFloat(h) < v) h = F16NextUp(h);
  return h;
}
std::uint16_t F16AtMost(float v) {
  std::uint16_t h = FloatToF16(v);
  if (F16ToFloat(h) > v) h = F16NextDown(h);
  return h;
}

int RoundClamp(float v, int lo, int hi) {
  const auto r = static_cast<int>(std::nearbyint(v));
  return std::clamp(r, lo, hi);
}

// ---- 32-element types ----

// Symmetric types with a signed offset (Q4_0: 16 levels, offset 8; Q5_0: 32 levels, offset 16):
// the element of largest magnitude maps to the lowest level (d = extreme / -offset), as ggml does.
// Writes the scale and the offset quants q + offset in [0, 2 offset).
void QuantizeOffsetBlock(const float* x, int offset, std::uint16_t* d_out,
                         std::uint8_t (&q)[kQk32]) {
  float extreme = 0.0f;
  for (int i = 0; i < kQk32; ++i) {
    if (std::fabs(x[i]) > std::fabs(extreme)) extreme = x[i];
  }
  // |d| rounded up so that the extreme stays within the lowest level.
  const float magnitude = F16ToFloat(F16AtLeast(std::fabs(extreme) / static_cast<float>(offset)));
  const float d = extreme > 0.0f ? -magnitude : magnitude;
  *d_out = FloatToF16(d);
  const float inv = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < kQk32; ++i) {
    q[i] = static_cast<std::uint8_t>(RoundClamp(x[i] * inv, -offset, offset - 1) + offset);
  }
}

// Asymmetric types (Q4_1: 15 steps, Q5_1: 31): x = d q + m with m <= min(x), m + steps d >= max(x).
void QuantizeMinBlock(const float* x, int steps, std::uint16_t* d_out, std::uint16_t* m_out,
                      std::uint8_t (&q)[kQk32]) {
  const auto [lo_it, hi_it] = std::minmax_element(x, x + kQk32);
  const std::uint16_t m_h = F16AtMost(*lo_it);
  const float m = F16ToFloat(m_h);
  const std::uint16_t d_h = F16AtLeast((*hi_it - m) / static_cast<float>(steps));
  const float d = F16ToFloat(d_h);
  *d_out = d_h;
  *m_out = m_h;
  const float inv = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < kQk32; ++i)
    q[i] = static_cast<std::uint8_t>(RoundClamp((x[i] - m) * inv, 0, steps));
}

void PackNibbles(const std::uint8_t (&q)[kQk32], std::uint8_t (&qs)[kQk32 / 2]) {
  for (int l = 0; l < kQk32 / 2; ++l) {
    qs[l] = static_cast<std::uint8_t>((q[l] & 15) | (q[l + kQk32 / 2] & 15) << 4);
  }
}
void PackHighBits(const std::uint8_t (&q)[kQk32], std::uint8_t (&qh)[4]) {
  std::uint32_t h = 0;
  for (int i = 0; i < kQk32; ++i) h |= static_cast<std::uint32_t>((q[i] >> 4) & 1) << i;
  for (int k = 0; k < 4; ++k) qh[k] = static_cast<std::uint8_t>(h >> (8 * k));
}

void QuantizeQ8_0(const float* x, BlockQ8_0* b) {
  float amax = 0.0f;
  for (int i = 0; i < kQk32; ++i) amax = std::max(amax, std::fabs(x[i]));
  b->d = F16AtLeast(amax / 127.0f);
  const float d = F16ToFloat(b->d);
  const float inv = d != 0.0f ? 1.0f / d : 0.0f;
  for (int i = 0; i < kQk32; ++i)
    b->qs[i] = static_cast<std::int8_t>(RoundClamp(x[i] * inv, -127, 127));
}
void QuantizeQ4_0(const float* x, BlockQ4_0* b) {
  std::uint8_t q[kQk32];
  QuantizeOffsetBlock(x, 8, &b->d, q);
  PackNibbles(q, b->qs);
}
void QuantizeQ5_0(const float* x, BlockQ5_0* b) {
  std::uint8_t q[kQk32];
  QuantizeOffsetBlock(x, 16, &b->d, q);
  PackNibbles(q, b->qs);
  PackHighBits(q, b->qh);
}
void QuantizeQ4_1(const float* x, BlockQ4_1* b) {
  std::uint8_t q[kQk32];
  QuantizeMinBlock(x, 15, &b->d, &b->m, q);
  PackNibbles(q, b->qs);
}
void QuantizeQ5_1(const float* x, BlockQ5_1* b) {
  std::uint8_t q[kQk32];
  QuantizeMinBlock(x, 31, &b->d, &b->m, q);
  PackNibbles(q, b->qs);
  PackHighBits(q, b->qh);
}

// ---- K-quants ----

// Q4_K (steps 15) / Q5_K (steps 31): 8 sub-blocks of 32, x = d sc[j] q - dmin mn[j].
// Writes d, dmin, the 6-bit scales and mins, and the quants q[256] in [0, steps].
void QuantizeKMinBlock(const float* x, int steps, std::uint16_t* d_out, std::uint16_t* dmin_out,
                       std::uint8_t (&scales)[kKScaleBytes], std::uint8_t (&q)[kQkK]) {
  constexpr int kSub = 8;
  constexpr int kLen = kQkK / kSub;
  float lo[kSub];
  float hi[kSub];
  float max_neg_lo = 0.0f;
  for (int j = 0; j < kSub; ++j) {
    const auto [a, b] = std::minmax_element(x + kLen * j, x + kLen * (j + 1));
    lo[j] = std::min(*a, 0.0f);  // the min term can only subtract
    hi[j] = *b;
    max_neg_lo = std::max(max_neg_lo, -lo[j]);
  }
  // Mins first, rounded up on the 6-bit grid so that every sub-block's low end is covered...
  const std::uint16_t dmin_h = F16AtLeast(max_neg_lo / 63.0f);
  const float dmin = F16ToFloat(dmin_h);
  std::uint8_t mn[kSub];
  float need[kSub];  // the step each sub-block needs to reach its top from its rounded min
  float max_need = 0.0f;
  for (int j = 0; j < kSub; ++j) {
    mn[j] = dmin > 0.0f ? static_cast<std::uint8_t>(
                              std::clamp(static_cast<int>(std::ceil(-lo[j] / dmin)), 0, 63))
                        : 0;
    need[j] = std::max(0.0f, (hi[j] + dmin * mn[j]) / static_cast<float>(steps));
    max_need = std::max(max_need, need[j]);
  }
  // ...then the scales, rounded up the same way.
  const std::uint16_t d_h = F16AtLeast(max_need / 63.0f);
  const float d = F16ToFloat(d_h);
  std::uint8_t sc[kSub];
  for (int j = 0; j < kSub; ++j) {
    const float* xs = x + kLen * j;
    const float m = dmin * mn[j];
    const int cover = d > 0.0f ? std::clamp(static_cast<int>(std::ceil(need[j] / d)), 0, 63) : 0;
    // A few smaller scales: finer steps that clip the extremes may still cost less squared error.
    int best = cover;
    float best_err = INFINITY;
    for (int s = cover; s >= std::max(1, cover - 3); --s) {
      const float step = d * static_cast<float>(s);
      float err = 0.0f;
      for (int l = 0; l < kLen; ++l) {
        const int v = RoundClamp((xs[l] + m) / step, 0, steps);
        const float e = step * static_cast<float>(v) - m - xs[l];
        err += e * e;
      }
      if (err < best_err) {
        best_err = err;
        best = s;
      }
    }
    sc[j] = static_cast<std::uint8_t>(best);
    const float step = d * static_cast<float>(best);
    const float inv = step > 0.0f ? 1.0f / step : 0.0f;
    for (int l = 0; l < kLen; ++l) {
      q[kLen * j + l] = static_cast<std::uint8_t>(RoundClamp((xs[l] + m) * inv, 0, steps));
    }
  }
  *d_out = d_h;
  *dmin_out = dmin_h;
  PackKScales(sc, mn, scales);
}

void PackKNibbles(const std::uint8_t (&q)[kQkK], std::uint8_t (&qs)[kQkK / 2]) {
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * g + l] =
          static_cast<std::uint8_t>((q[64 * g + l] & 15) | (q[64 * g + 32 + l] & 15) << 4);
    }
  }
}

void QuantizeQ4_K(const float* x, BlockQ4_K* b) {
  std::uint8_t q[kQkK];
  QuantizeKMinBlock(x, 15, &b->d, &b->dmin, b->scales, q);
  PackKNibbles(q, b->qs);
}
void QuantizeQ5_K(const float* x, BlockQ5_K* b) {
  std::uint8_t q[kQkK];
  QuantizeKMinBlock(x, 31, &b->d, &b->dmin, b->scales, q);
  PackKNibbles(q, b->qs);
  std::memset(b->qh, 0, sizeof(b->qh));
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      b->qh[l] = static_cast<std::uint8_t>(b->qh[l] | ((q[64 * g + l] >> 4) & 1) << (2 * g) |
                                           ((q[64 * g + 32 + l] >> 4) & 1) << (2 * g + 1));
    }
  }
}

// Q6_K: 16 sub-blocks of 16, x = d sc[k] (q - 32); sc[k] rounded up so that +-31 steps cover
// the sub-block's max |x|.
void QuantizeQ6_K(const float* x, BlockQ6_K* b) {
  constexpr int kSub = 16;
  constexpr int kLen = kQkK / kSub;
  float need[kSub];
  float max_need = 0.0f;
  for (int k = 0; k < kSub; ++k) {
    float amax = 0.0f;
    for (int l = 0; l < kLen; ++l) amax = std::max(amax, std::fabs(x[kLen * k + l]));
    need[k] = amax / 31.0f;
    max_need = std::max(max_need, need[k]);
  }
  b->d = F16AtLeast(max_need / 127.0f);
  const float d = F16ToFloat(b->d);
  std::uint8_t q[kQkK];  // q + 32 in [0, 63]
  for (int k = 0; k < kSub; ++k) {
    const int s = d > 0.0f ? std::clamp(static_cast<int>(std::ceil(need[k] / d)), 0, 127) : 0;
    b->scales[k] = static_cast<std::int8_t>(s);
    const float step = d * static_cast<float>(s);
    const float inv = step > 0.0f ? 1.0f / step : 0.0f;
    for (int l = 0; l < kLen; ++l) {
      q[kLen * k + l] = static_cast<std::uint8_t>(RoundClamp(x[kLen * k + l] * inv, -32, 31) + 32);
    }
  }
  for (int h = 0; h < 2; ++h) {
    std::uint8_t* ql = b->ql + 64 * h;
    std::uint8_t* qh = b->qh + 32 * h;
    const std::uint8_t* qq = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[l] = static_cast<std::uint8_t>((qq[l] & 15) | (qq[l + 64] & 15) << 4);
      ql[l + 32] = static_cast<std::uint8_t>((qq[l + 32] & 15) | (qq[l + 96] & 15) << 4);
      qh[l] = static_cast<std::uint8_t>((qq[l] >> 4) | (qq[l + 32] >> 4) << 2 |
                                        (qq[l + 64] >> 4) << 4 | (qq[l + 96] >> 4) << 6);
    }
  }
}

// ---- dequantisation (ggml's products, in ggml's order) ----

template <typename Block>
void DequantizeSymmetric32(const Block* blocks, std::int64_t n, float* out) {
  for (std::int64_t i = 0; i < n / kQk32; ++i) {
    std::int8_t q[kQk32];
    UnpackQuants(blocks[i], q);
    const float d = F16ToFloat(blocks[i].d);
    for (int l = 0; l < kQk32; ++l) out[kQk32 * i + l] = static_cast<float>(q[l]) * d;
  }
}
template <typename Block>
void DequantizeMin32(const Block* blocks, std::int64_t n, float* out) {
  for (std::int64_t i = 0; i < n / kQk32; ++i) {
    std::int8_t q[kQk32];
    UnpackQuants(blocks[i], q);
    const float d = F16ToFloat(blocks[i].d);
    const float m = F16ToFloat(blocks[i].m);
    for (int l = 0; l < kQk32; ++l) out[kQk32 * i + l] = static_cast<float>(q[l]) * d + m;
  }
}
template <typename Block>
void DequantizeKMin(const Block* blocks, std::int64_t n, float* out) {
  for (std::int64_t i = 0; i < n / kQkK; ++i) {
    std::int8_t q[kQkK];
    std::uint8_t sc[8];
    std::uint8_t mn[8];
    UnpackQuants(blocks[i], q);
    UnpackKScales(blocks[i].scales, sc, mn);
    const float d = F16ToFloat(blocks[i].d);
    const float dmin = F16ToFloat(blocks[i].dmin);
    for (int j = 0; j < 8; ++j) {
      const float d1 = d * static_cast<float>(sc[j]);
      const float m1 = dmin * static_cast<float>(mn[j]);
      for (int l = 0; l < 32; ++l) {
        out[kQkK * i + 32 * j + l] = d1 * static_cast<float>(q[32 * j + l]) - m1;
      }
    }
  }
}
void DequantizeQ6_K(const BlockQ6_K* blocks, std::int64_t n, float* out) {
  for (std::int64_t i = 0; i < n / kQkK; ++i) {
    std::int8_t q[kQkK];
    UnpackQuants(blocks[i], q);
    const float d = F16ToFloat(blocks[i].d);
    for (int k = 0; k < kQkK / 16; ++k) {
      const float scale = d * static_cast<float>(blocks[i].scales[k]);  // ggml's (d * sc) * q
      for (int l = 0; l < 16; ++l) {
        out[kQkK * i + 16 * k + l] = scale * static_cast<float>(q[16 * k + l]);
      }
    }
  }
}

// ---- the unquantised types: fp32 copied, f16 / bf16 converted element by element ----

void CopyF32(const float* from, std::int64_t n, float* to) {
  std::memcpy(to, from, static_cast<std::size_t>(n) * sizeof(float));
}
template <auto kConvert, typename From, typename To>
void ConvertEach(const From* from, std::int64_t n, To* to) {
  for (std::int64_t i = 0; i < n; ++i) to[i] = kConvert(from[i]);
}

// A row of n elements (a whole number of blocks) quantised one block at a time.
template <typename Block, int kBlockElems, void (*kQuantizeBlock)(const float*, Block*)>
void QuantizeBlocks(const float* x, std::int64_t n, Block* blocks) {
  for (std::int64_t i = 0; i < n / kBlockElems; ++i)
    kQuantizeBlock(x + i * kBlockElems, blocks + i);
}

// One computable type's row codec: `Stored` is what a row is made of (fp32, f16/bf16 bits or
// blocks); both functions take the row's element count.
template <GgmlType kCodecType, typename StoredUnit,
          void (*kDequantize)(const StoredUnit*, std::int64_t, float*),
          void (*kQuantize)(const float*, std::int64_t, StoredUnit*)>
struct RowCodec {
  static constexpr GgmlType kType = kCodecType;
  using Stored = StoredUnit;
  static constexpr auto Dequantize = kDequantize;
  static constexpr auto Quantize = kQuantize;
};

// The one map from a computable type to its codec (DequantizeRow and QuantizeRow both read it).
template <typename... Codec>
struct RowCodecs {
  // Calls fn(C{}) for the codec C of `type`; false if `type` has none.
  template <typename Fn>
  static bool With(GgmlType type, Fn&& fn) {
    return ((type == Codec::kType && (fn(Codec{}), true)) || ...);
  }
};
using Codecs = RowCodecs<
    RowCodec<GgmlType::kF32, float, CopyF32, CopyF32>,
    RowCodec<GgmlType::kF16, std::uint16_t, ConvertEach<F16ToFloat>, ConvertEach<FloatToF16>>,
    RowCodec<GgmlType::kBF16, std::uint16_t, ConvertEach<Bf16ToFloat>, ConvertEach<FloatToBf16>>,
    RowCodec<GgmlType::kQ8_0, BlockQ8_0, DequantizeSymmetric32,
             QuantizeBlocks<BlockQ8_0, kQk32, QuantizeQ8_0>>,
    RowCodec<GgmlType::kQ4_0, BlockQ4_0, DequantizeSymmetric32,
             QuantizeBlocks<BlockQ4_0, kQk32, QuantizeQ4_0>>,
    RowCodec<GgmlType::kQ5_0, BlockQ5_0, DequantizeSymmetric32,
             QuantizeBlocks<BlockQ5_0, kQk32, QuantizeQ5_0>>,
    RowCodec<GgmlType::kQ4_1, BlockQ4_1, DequantizeMin32,
             QuantizeBlocks<BlockQ4_1, kQk32, QuantizeQ4_1>>,
    RowCodec<GgmlType::kQ5_1, BlockQ5_1, DequantizeMin32,
             QuantizeBlocks<BlockQ5_1, kQk32, QuantizeQ5_1>>,
    RowCodec<GgmlType::kQ4_K, BlockQ4_K, DequantizeKMin,
             QuantizeBlocks<BlockQ4_K, kQkK, QuantizeQ4_K>>,
    RowCodec<GgmlType::kQ5_K, BlockQ5_K, DequantizeKMin,
             QuantizeBlocks<BlockQ5_K, kQkK, QuantizeQ5_K>>,
    RowCodec<GgmlType::kQ6_K, BlockQ6_K, DequantizeQ6_K,
             QuantizeBlocks<BlockQ6_K, kQkK, QuantizeQ6_K>>>;

}  // namespace

void DequantizeRow(GgmlType type, const void* blocks, std::int64_t n, float* out) noexcept {
  MTR_DCHECK(Traits(type).computable && n % Traits(type).block_elems == 0,
             "DequantizeRow: type not computable or n not a whole number of blocks");
  const bool computable = Codecs::With(type, [&]<typename C>(C /*codec*/) {
    C::Dequantize(static_cast<const typename C::Stored*>(blocks), n, out);
  });
  MTR_CHECK(computable, "DequantizeRow: type is not computable");
}

void QuantizeRow(GgmlType type, const float* x, std::int64_t n, void* out) noexcept {
  MTR_DCHECK(Traits(type).computable && n % Traits(type).block_elems == 0,
             "QuantizeRow: type not computable or n not a whole number of blocks");
  const bool computable = Codecs::With(type, [&]<typename C>(C /*codec*/) {
    C::Quantize(x, n, static_cast<typename C::Stored*>(out));
  });
  MTR_CHECK(computable, "QuantizeRow: type is not computable");
}

namespace {
// max|x| / 127 in fp32; writes the quants of `len` elements and returns the scale.
float QuantizeSymmetric127(const float* x, int len, std::int8_t* qs) {
  float amax = 0.0f;
  for (int i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int i = 0; i < len; ++i) qs[i] = static_cast<std::int8_t>(RoundClamp(x[i] * inv, -127, 127));
  return d;
}
}  // namespace

void QuantizeActivationsQ8(const float* x, std::int64_t n, ActQ8Block32* out) noexcept {
  MTR_DCHECK(n % kQk32 == 0, "QuantizeActivationsQ8: n not a multiple of 32");
  for (std::int64_t i = 0; i < n / kQk32; ++i) {
    ActQ8Block32& b = out[i];
    b.d = QuantizeSymmetric127(x + kQk32 * i, kQk32, b.qs);
    b.sum = 0;
    for (int l = 0; l < kQk32; ++l) b.sum += b.qs[l];
  }
}

void QuantizeActivationsQ8_K(const float* x, std::int64_t n, BlockQ8_K* out) noexcept {
  MTR_DCHECK(n % kQkK == 0, "QuantizeActivationsQ8_K: n not a multiple of 256");
  for (std::int64_t i = 0; i < n / kQkK; ++i) {
    BlockQ8_K& b = out[i];
    b.d = QuantizeSymmetric127(x + kQkK * i, kQkK, b.qs);
    for (int k = 0; k < kQkK / 16; ++k) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += b.qs[16 * k + l];
      b.bsums[k] = static_cast<std::int16_t>(s);
    }
  }
}

}  // namespace metronome::quant
