// The decode-path (m <= kGemvMaxRows) AVX-512 kernels of quant_gemv_avx512.h. Compiled with the
// AVX-512 flags of kernels/CMakeLists.txt and entered only after CpuHasAvx512Vnni().
//
// At m = 1..4 a product is a stream over W: the arithmetic per weight byte is small, so what
// decides the speed is how many cache lines are in flight. Each thread therefore walks
// up to kGemvWeightRows weight rows at once (separate streams for the line-fill buffers),
// prefetches kGemvPrefetchRowGroups groups of rows ahead (rows are contiguous, so that is the
// same stream, a few KB ahead), keeps one fp32 accumulator per (activation row, weight row) across
// the whole row and reduces it once at the end, and reads the per-block fp16 scales of a pair of
// blocks with two broadcasts from a table converted 16 blocks per vcvtph2ps.
#include "metronome/kernels/quant_gemv_avx512.h"

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::kernels::avx512 {
namespace {

using quant::GgmlType;
using quant::kQk32;

// Weight rows in flight per thread: 4 while the MT x NT accumulators, NT unpacked blocks and NT
// scales fit the 32 vector registers (MT <= 2), 2 for MT = 3, 4.
constexpr int kGemvWeightRows = 4;
template <int MT>
constexpr int kWeightRowsFor = MT <= 2 ? kGemvWeightRows : 2;
// Row groups prefetched ahead of the one being read (each group is kGemvWeightRows rows).
constexpr int kGemvPrefetchRowGroups = 2;
constexpr int kBlocksPerScaleVector = 16;  // fp16 scales widened per vcvtph2ps

// ---- activations: one row's pair of 32-element blocks as the kernel reads it: 64 int8 values,
// d_a per lane and ca = c d_a (block sum) / 8 per lane (8 int32 lanes of a vpdpbusd per block),
// so the 8 lanes of a block sum to c d_a sum: c = -offset for offset types, 1 for min types.
struct alignas(64) GemvActPair {
  std::int8_t qs[64];
  float da[16];
  float ca[16];
};

void PrepareActPairs(const RowsKernelArgs& a, int blocks, float c, GemvActPair* out) noexcept {
  const int pairs = (blocks + 1) / 2;
  for (int r = 0; r < a.m; ++r) {
    const auto* x = reinterpret_cast<const quant::ActQ8Block32*>(
        a.act + static_cast<std::size_t>(r) * a.act_row_bytes);
    for (int p = 0; p < pairs; ++p) {
      GemvActPair& dst = out[static_cast<std::ptrdiff_t>(r) * pairs + p];
      for (int h = 0; h < 2; ++h) {
        const int b = 2 * p + h;
        float d = 0.0f;
        float sum = 0.0f;
        if (b < blocks) {
          std::memcpy(dst.qs + 32 * h, x[b].qs, 32);
          d = x[b].d;
          sum = static_cast<float>(x[b].sum);
        } else {
          std::memset(dst.qs + 32 * h, 0, 32);  // odd block count: the second half contributes 0
        }
        _mm256_store_ps(dst.da + 8 * h, _mm256_set1_ps(d));
        _mm256_store_ps(dst.ca + 8 * h, _mm256_set1_ps(c * d * sum * 0.125f));
      }
    }
  }
}

// ---- weights: a pair of blocks as 64 unsigned bytes u = q + offset (or q, for min types).
inline __m512i Pair256(const std::int8_t* a, const std::int8_t* b) noexcept {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

// [lo(a), hi(a), lo(b), hi(b)]: element i < 16 of a block is the low nibble of qs[i], element
// i >= 16 the high nibble of qs[i - 16].
inline __m512i NibblePair(const std::uint8_t* a, const std::uint8_t* b) noexcept {
  const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i qb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  const __m256i ab = _mm256_inserti128_si256(_mm256_castsi128_si256(qa), qb, 1);
  // [qa, qa, qb, qb]; the odd 128-bit lanes take the high nibbles.
  __m512i v = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3),
                                       _mm512_castsi256_si512(ab));
  v = _mm512_mask_srli_epi16(v, 0xFF00FF00u, v, 4);
  return _mm512_and_si512(v, _mm512_set1_epi8(15));
}

inline __m512i AddHighBitPair(__m512i lo, const std::uint8_t* qha, const std::uint8_t* qhb) {
  std::uint32_t ha = 0;
  std::uint32_t hb = 0;
  std::memcpy(&ha, qha, 4);
  std::memcpy(&hb, qhb, 4);
  const std::uint64_t bits = static_cast<std::uint64_t>(ha) | static_cast<std::uint64_t>(hb) << 32;
  return _mm512_mask_add_epi8(lo, bits, lo, _mm512_set1_epi8(16));
}

struct GemvQ8_0 {
  using Block = quant::BlockQ8_0;
  static constexpr bool kMin = false;
  static constexpr float kOffset = 128.0f;
  static __m512i Unpack(const Block* a, const Block* b) noexcept {
    return _mm512_xor_si512(Pair256(a->qs, b->qs), _mm512_set1_epi8(-128));
  }
};
struct GemvQ4_0 {
  using Block = quant::BlockQ4_0;
  static constexpr bool kMin = false;
  static constexpr float kOffset = 8.0f;
  static __m512i Unpack(const Block* a, const Block* b) noexcept {
    return NibblePair(a->qs, b->qs);
  }
};
struct GemvQ4_1 {
  using Block = quant::BlockQ4_1;
  static constexpr bool kMin = true;
  static constexpr float kOffset = 0.0f;
  static __m512i Unpack(const Block* a, const Block* b) noexcept {
    return NibblePair(a->qs, b->qs);
  }
};
struct GemvQ5_0 {
  using Block = quant::BlockQ5_0;
  static constexpr bool kMin = false;
  static constexpr float kOffset = 16.0f;
  static __m512i Unpack(const Block* a, const Block* b) noexcept {
    return AddHighBitPair(NibblePair(a->qs, b->qs), a->qh, b->qh);
  }
};
struct GemvQ5_1 {
  using Block = quant::BlockQ5_1;
  static constexpr bool kMin = true;
  static constexpr float kOffset = 0.0f;
  static __m512i Unpack(const Block* a, const Block* b) noexcept {
    return AddHighBitPair(NibblePair(a->qs, b->qs), a->qh, b->qh);
  }
};

// The fp32 scales (and mins, for min types) of NT rows' blocks, converted 16 blocks at a time:
// d[j * stride + b], m[j * stride + b]; stride = blocks rounded up to a multiple of 16.
template <class W, int NT>
void ConvertScales(const typename W::Block* const* wrow, int blocks, int stride, float* d,
                   float* m) noexcept {
  alignas(32) std::uint16_t hd[kBlocksPerScaleVector];
  alignas(32) std::uint16_t hm[kBlocksPerScaleVector];
  for (int j = 0; j < NT; ++j) {
    for (int b0 = 0; b0 < blocks; b0 += kBlocksPerScaleVector) {
      const int n = blocks - b0 < kBlocksPerScaleVector ? blocks - b0 : kBlocksPerScaleVector;
      for (int l = 0; l < kBlocksPerScaleVector; ++l) {
        const typename W::Block& blk = wrow[j][b0 + (l < n ? l : 0)];
        hd[l] = blk.d;
        if constexpr (W::kMin) hm[l] = blk.m;
      }
      const auto at = static_cast<std::ptrdiff_t>(j) * stride + b0;
      _mm512_storeu_ps(d + at,
                       _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(hd))));
      if constexpr (W::kMin) {
        _mm512_storeu_ps(m + at,
                         _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(hm))));
      }
    }
  }
}

// Lanes 0-7 = p[0], lanes 8-15 = p[1]: the per-lane scale of a pair of blocks.
inline __m512 PairScale(const float* p) noexcept {
  return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(p[0]), _mm512_set1_ps(p[1]));
}

// y[i, j] (+)= row i of the activations . weight row j, for MT activation rows and NT weight rows.
template <class W, int MT, int NT>
void Group32(const GemvActPair* act, int pairs, int blocks, const typename W::Block* const* wrow,
             std::size_t row_bytes, const float* d, const float* mn, int stride, float* y, int ldy,
             bool accumulate) noexcept {
  __m512 acc[MT][NT];
#pragma GCC unroll 8
  for (auto& row : acc) {
#pragma GCC unroll 8
    for (auto& v : row) v = _mm512_setzero_ps();
  }
  const std::size_t ahead = row_bytes * static_cast<std::size_t>(NT * kGemvPrefetchRowGroups);
  for (int p = 0; p < pairs; ++p) {
    const int b0 = 2 * p;
    const int b1 = b0 + 1 < blocks ? b0 + 1 : b0;  // odd count: re-read b0; its activation is 0
    __m512i u[NT];
    __m512 dw[NT];
    [[maybe_unused]] __m512 mw[NT];
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      const char* at = reinterpret_cast<const char*>(wrow[j] + b0);
      // A pair of blocks is at most 68 bytes: one prefetch per pair reaches every line ahead.
      _mm_prefetch(at + ahead, _MM_HINT_T0);
      u[j] = W::Unpack(wrow[j] + b0, wrow[j] + b1);
      dw[j] = PairScale(d + static_cast<std::ptrdiff_t>(j) * stride + b0);
      if constexpr (W::kMin) mw[j] = PairScale(mn + static_cast<std::ptrdiff_t>(j) * stride + b0);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const GemvActPair& a = act[static_cast<std::ptrdiff_t>(i) * pairs + p];
      const __m512i q = _mm512_load_si512(a.qs);
      const __m512 da = _mm512_load_ps(a.da);
      const __m512 ca = _mm512_load_ps(a.ca);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u[j], q));
        if constexpr (W::kMin) {
          acc[i][j] = _mm512_fmadd_ps(dw[j], _mm512_mul_ps(da, dot), acc[i][j]);
          acc[i][j] = _mm512_fmadd_ps(mw[j], ca, acc[i][j]);
        } else {
          acc[i][j] = _mm512_fmadd_ps(dw[j], _mm512_fmadd_ps(da, dot, ca), acc[i][j]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      float& out = y[static_cast<std::ptrdiff_t>(i) * ldy + j];
      const float v = _mm512_reduce_add_ps(acc[i][j]);
      out = accumulate ? out + v : v;
    }
  }
}

struct GemvScratch {
  std::vector<GemvActPair> act;
  std::vector<float> d;
  std::vector<float> m;
};

GemvScratch& Scratch() {
  thread_local GemvScratch s;
  return s;
}

template <class W, int MT>
void Rows32ForM(const RowsKernelArgs& a, int row_begin, int row_end, const GemvActPair* act,
                int pairs, int blocks, GemvScratch& s) noexcept {
  using Block = typename W::Block;
  const quant::WeightMatrix& w = *a.w;
  const int stride =
      (blocks + kBlocksPerScaleVector - 1) / kBlocksPerScaleVector * kBlocksPerScaleVector;
  const auto row = [&w](int j) { return reinterpret_cast<const Block*>(w.Row(j)); };
  constexpr int kNt = kWeightRowsFor<MT>;
  int j = row_begin;
  for (; j + kNt <= row_end; j += kNt) {
    const Block* rows[kNt];
    for (int t = 0; t < kNt; ++t) rows[t] = row(j + t);
    ConvertScales<W, kNt>(rows, blocks, stride, s.d.data(), s.m.data());
    Group32<W, MT, kNt>(act, pairs, blocks, rows, w.row_bytes, s.d.data(), s.m.data(), stride,
                        a.y + j, a.ldy, a.accumulate);
  }
  for (; j < row_end; ++j) {
    const Block* rows[1] = {row(j)};
    ConvertScales<W, 1>(rows, blocks, stride, s.d.data(), s.m.data());
    Group32<W, MT, 1>(act, pairs, blocks, rows, w.row_bytes, s.d.data(), s.m.data(), stride,
                      a.y + j, a.ldy, a.accumulate);
  }
}

template <class W>
void GemvRows32(const RowsKernelArgs& a, int row_begin, int row_end) {
  const int blocks = a.w->cols / kQk32;
  const int pairs = (blocks + 1) / 2;
  GemvScratch& s = Scratch();
  const auto need_act = static_cast<std::size_t>(a.m) * static_cast<std::size_t>(pairs);
  if (s.act.size() < need_act) s.act.resize(need_act);
  const auto need_scales = static_cast<std::size_t>(kGemvWeightRows) *
                           static_cast<std::size_t>(blocks + kBlocksPerScaleVector - 1) /
                           kBlocksPerScaleVector * kBlocksPerScaleVector;
  if (s.d.size() < need_scales) {
    s.d.resize(need_scales);
    s.m.resize(need_scales);
  }
  PrepareActPairs(a, blocks, W::kMin ? 1.0f : -W::kOffset, s.act.data());
  const GemvActPair* act = s.act.data();
  switch (a.m) {
    case 1:
      Rows32ForM<W, 1>(a, row_begin, row_end, act, pairs, blocks, s);
      break;
    case 2:
      Rows32ForM<W, 2>(a, row_begin, row_end, act, pairs, blocks, s);
      break;
    case 3:
      Rows32ForM<W, 3>(a, row_begin, row_end, act, pairs, blocks, s);
      break;
    default:  // 4: the caller guarantees m <= kGemvMaxRows
      Rows32ForM<W, 4>(a, row_begin, row_end, act, pairs, blocks, s);
      break;
  }
}

}  // namespace

RowsKernel GemvKernel(GgmlType type) noexcept {
  switch (type) {
    case GgmlType::kQ8_0:
      return GemvRows32<GemvQ8_0>;
    case GgmlType::kQ4_0:
      return GemvRows32<GemvQ4_0>;
    case GgmlType::kQ4_1:
      return GemvRows32<GemvQ4_1>;
    case GgmlType::kQ5_0:
      return GemvRows32<GemvQ5_0>;
    case GgmlType::kQ5_1:
      return GemvRows32<GemvQ5_1>;
    default:
      return nullptr;
  }
}

}  // namespace metronome::kernels::avx512
