// Integer (VNNI) kernels of quant_matmul_avx512.h. This file is compiled with AVX-512 flags
// (kernels/CMakeLists.txt) and only entered after CpuHasAvx512Vnni(): keep code that may run on
// any CPU out of it.
#include "metronome/kernels/quant_matmul_avx512.h"

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "metronome/base/check.h"
#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::kernels::avx512 {
namespace {

using quant::GgmlType;
using quant::kQk32;
using quant::kQkK;

constexpr int kRowTile = 8;     // activation rows sharing one unpacked weight block
constexpr int kWeightTile = 2;  // weight rows whose unpacked blocks stay in registers together
// Activation rows per pass over a call's weight rows: their prepared form (<= 32 * 192 bytes per
// 64 elements, 150 KB at k = 1536) stays in L2 while the weight rows (a few KB each) cycle
// through L1. Without it, m = 512 streamed all activations from L3 once per weight tile.
constexpr int kActRowBlock = 32;

inline float Half(std::uint16_t h) noexcept { return _cvtsh_ss(h); }

// Lanes 0-7 = a, lanes 8-15 = b: the per-lane scale of two 32-element blocks in one vector (the
// 16 int32 lanes of a vpdpbusd over 64 bytes are 8 per block).
inline __m512 Halves(float a, float b) noexcept {
  return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b));
}

inline __m512i LoadPair256(const std::int8_t* a, const std::int8_t* b) noexcept {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

// The 16 nibble bytes of two blocks as 64 bytes [lo(a), hi(a), lo(b), hi(b)]: element i of a
// 32-element block is the low nibble of qs[i] for i < 16 and the high nibble of qs[i - 16] after.
inline __m512i Nibbles2(const std::uint8_t* a, const std::uint8_t* b) noexcept {
  const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i qb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  __m512i v = _mm512_castsi128_si512(qa);
  v = _mm512_inserti32x4(v, qa, 1);
  v = _mm512_inserti32x4(v, qb, 2);
  v = _mm512_inserti32x4(v, qb, 3);
  v = _mm512_mask_srli_epi16(v, 0xFF00FF00u, v, 4);  // 16-bit words 8-15 and 24-31
  return _mm512_and_si512(v, _mm512_set1_epi8(15));
}

inline std::uint64_t HighBits2(const std::uint8_t* a, const std::uint8_t* b) noexcept {
  std::uint32_t ha = 0;
  std::uint32_t hb = 0;
  std::memcpy(&ha, a, 4);
  std::memcpy(&hb, b, 4);
  return static_cast<std::uint64_t>(ha) | static_cast<std::uint64_t>(hb) << 32;
}

// ---- 32-element weight types: unpack two blocks into 64 unsigned bytes, with per-lane scales.
// dw: d_w per lane; mw (types with a min, kMin): the min m per lane, the coefficient of the
// activation block sum. Offset types (kOffset) fold -offset into the activations' ActPair::ca.
struct UnpackedPair {
  __m512i u;
  __m512 dw;
  __m512 mw;
};

struct Q8_0W {
  using Block = quant::BlockQ8_0;
  static constexpr bool kMin = false;
  static constexpr float kOffset = 128.0f;
  static UnpackedPair Unpack(const Block* a, const Block* b) noexcept {
    const __m512i u = _mm512_xor_si512(LoadPair256(a->qs, b->qs), _mm512_set1_epi8(-128));
    return {u, Halves(Half(a->d), Half(b->d)), _mm512_setzero_ps()};
  }
};
struct Q4_0W {
  using Block = quant::BlockQ4_0;
  static constexpr bool kMin = false;
  static constexpr float kOffset = 8.0f;
  static UnpackedPair Unpack(const Block* a, const Block* b) noexcept {
    return {Nibbles2(a->qs, b->qs), Halves(Half(a->d), Half(b->d)), _mm512_setzero_ps()};
  }
};
struct Q4_1W {
  using Block = quant::BlockQ4_1;
  static constexpr bool kMin = true;
  static constexpr float kOffset = 0.0f;
  static UnpackedPair Unpack(const Block* a, const Block* b) noexcept {
    return {Nibbles2(a->qs, b->qs), Halves(Half(a->d), Half(b->d)), Halves(Half(a->m), Half(b->m))};
  }
};
struct Q5_0W {
  using Block = quant::BlockQ5_0;
  static constexpr bool kMin = false;
  static constexpr float kOffset = 16.0f;
  static UnpackedPair Unpack(const Block* a, const Block* b) noexcept {
    const __m512i lo = Nibbles2(a->qs, b->qs);
    const __m512i u = _mm512_mask_add_epi8(lo, HighBits2(a->qh, b->qh), lo, _mm512_set1_epi8(16));
    return {u, Halves(Half(a->d), Half(b->d)), _mm512_setzero_ps()};
  }
};
struct Q5_1W {
  using Block = quant::BlockQ5_1;
  static constexpr bool kMin = true;
  static constexpr float kOffset = 0.0f;
  static UnpackedPair Unpack(const Block* a, const Block* b) noexcept {
    const __m512i lo = Nibbles2(a->qs, b->qs);
    const __m512i u = _mm512_mask_add_epi8(lo, HighBits2(a->qh, b->qh), lo, _mm512_set1_epi8(16));
    return {u, Halves(Half(a->d), Half(b->d)), Halves(Half(a->m), Half(b->m))};
  }
};

// One activation row's pair of blocks, laid out for the kernel: the 64 int8 values, d_a per lane,
// and ca = c * d_a * (block sum) / 8 per lane, 8 lanes per block, so that the lanes of a block sum
// to c d_a sum: c = -offset for offset types (then d_w (d_a dot + ca) is the block's product), 1
// for min types (then d_w d_a dot + m ca).
struct alignas(64) ActPair {
  std::int8_t qs[64];
  float da[16];
  float ca[16];
};

// The activation rows (quant::ActQ8Block32, act_row_bytes apart) in ActPair form.
void PrepareQ8_0(const RowsKernelArgs& a, int blocks, float c, ActPair* out) noexcept {
  const int pairs = (blocks + 1) / 2;
  for (int r = 0; r < a.m; ++r) {
    const auto* x = reinterpret_cast<const quant::ActQ8Block32*>(
        a.act + static_cast<std::size_t>(r) * a.act_row_bytes);
    for (int p = 0; p < pairs; ++p) {
      ActPair& dst = out[static_cast<std::ptrdiff_t>(r) * pairs + p];
      for (int h = 0; h < 2; ++h) {
        const int b = 2 * p + h;
        float d = 0.0f;
        float sum = 0.0f;
        if (b < blocks) {
          std::memcpy(dst.qs + 32 * h, x[b].qs, 32);
          d = x[b].d;
          sum = static_cast<float>(x[b].sum);
        } else {
          std::memset(dst.qs + 32 * h, 0, 32);  // an odd block count: the second half is empty
        }
        _mm256_store_ps(dst.da + 8 * h, _mm256_set1_ps(d));
        _mm256_store_ps(dst.ca + 8 * h, _mm256_set1_ps(c * d * sum * 0.125f));
      }
    }
  }
}

// y[i * ldy + j] (+)= v for the tile's outputs.
inline void Put(float* y, bool accumulate, float v) noexcept { *y = accumulate ? *y + v : v; }

template <class W, int MT, int NT>
void Tile32(const ActPair* act, int pairs, int blocks, const typename W::Block* const* wrow,
            float* y, int ldy, bool accumulate) noexcept {
  __m512 acc[MT][NT];
#pragma GCC unroll 8
  for (auto& row : acc) {
#pragma GCC unroll 8
    for (auto& a : row) a = _mm512_setzero_ps();
  }
  for (int p = 0; p < pairs; ++p) {
    const int b0 = 2 * p;
    const int b1 = b0 + 1 < blocks ? b0 + 1 : b0;  // odd count: re-read b0; its activation is 0
    UnpackedPair w[NT];
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) w[j] = W::Unpack(wrow[j] + b0, wrow[j] + b1);
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const ActPair& a = act[static_cast<std::ptrdiff_t>(i) * pairs + p];
      const __m512i q = _mm512_load_si512(a.qs);
      const __m512 da = _mm512_load_ps(a.da);
      const __m512 ca = _mm512_load_ps(a.ca);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        const __m512 dot =
            _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w[j].u, q));
        if constexpr (W::kMin) {
          acc[i][j] = _mm512_fmadd_ps(w[j].dw, _mm512_mul_ps(da, dot), acc[i][j]);
          acc[i][j] = _mm512_fmadd_ps(w[j].mw, ca, acc[i][j]);
        } else {
          acc[i][j] = _mm512_fmadd_ps(w[j].dw, _mm512_fmadd_ps(da, dot, ca), acc[i][j]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      Put(y + static_cast<std::ptrdiff_t>(i) * ldy + j, accumulate,
          _mm512_reduce_add_ps(acc[i][j]));
    }
  }
}

// Calls f.template operator()<R>() for R = rem, 1 <= rem < kRowTile (the last, partial row tile).
template <int R = kRowTile - 1, class F>
void ForRemainder(int rem, F&& f) noexcept {
  if constexpr (R > 0) {
    if (rem == R) {
      f.template operator()<R>();
    } else {
      ForRemainder<R - 1>(rem, f);
    }
  }
}

std::vector<ActPair>& ActScratch() {
  thread_local std::vector<ActPair> scratch;
  return scratch;
}

template <class W, int NT>
void RowTiles32(const ActPair* act, int m, int pairs, int blocks,
                const typename W::Block* const* wrow, float* y, int ldy, bool accumulate) noexcept {
  int r = 0;
  for (; r + kRowTile <= m; r += kRowTile) {
    Tile32<W, kRowTile, NT>(act + static_cast<std::ptrdiff_t>(r) * pairs, pairs, blocks, wrow,
                            y + static_cast<std::ptrdiff_t>(r) * ldy, ldy, accumulate);
  }
  const ActPair* a = act + static_cast<std::ptrdiff_t>(r) * pairs;
  float* yr = y + static_cast<std::ptrdiff_t>(r) * ldy;
  ForRemainder(m - r,
               [&]<int R>() { Tile32<W, R, NT>(a, pairs, blocks, wrow, yr, ldy, accumulate); });
}

template <class W>
void Rows32(const RowsKernelArgs& a, int row_begin, int row_end) {
  using Block = typename W::Block;
  const quant::WeightMatrix& w = *a.w;
  const int blocks = w.cols / kQk32;
  const int pairs = (blocks + 1) / 2;
  std::vector<ActPair>& act = ActScratch();
  const auto need = static_cast<std::size_t>(a.m) * static_cast<std::size_t>(pairs);
  if (act.size() < need) act.resize(need);
  PrepareQ8_0(a, blocks, W::kMin ? 1.0f : -W::kOffset, act.data());
  const auto row = [&w](int j) { return reinterpret_cast<const Block*>(w.Row(j)); };
  for (int r0 = 0; r0 < a.m; r0 += kActRowBlock) {
    const int m = a.m - r0 < kActRowBlock ? a.m - r0 : kActRowBlock;
    const ActPair* x = act.data() + static_cast<std::ptrdiff_t>(r0) * pairs;
    float* y = a.y + static_cast<std::ptrdiff_t>(r0) * a.ldy;
    int j = row_begin;
    for (; j + kWeightTile <= row_end; j += kWeightTile) {
      const Block* rows[kWeightTile] = {row(j), row(j + 1)};
      RowTiles32<W, kWeightTile>(x, m, pairs, blocks, rows, y + j, a.ldy, a.accumulate);
    }
    if (j < row_end) {
      const Block* rows[1] = {row(j)};
      RowTiles32<W, 1>(x, m, pairs, blocks, rows, y + j, a.ldy, a.accumulate);
    }
  }
}

// ---- K-quants: a 256-element super-block unpacked into four 64-byte chunks of unsigned values
// (chunk c = elements [64 c, 64 c + 64)), the fp32 scale of each int32 lane of a chunk's
// vpdpbusd (lane l covers elements 64 c + 4 l .. + 3), and the coefficient of each of Q8_K's 16
// bsums (elements [16 g, 16 g + 16)), all with the super-block's d / dmin folded in.
struct alignas(64) UnpackedSuper {
  std::uint8_t u[4][64];
  float ws[4][16];
  float wm[16];
};

// Q4_K/Q5_K's 6-bit scale and min of sub-block j (quant/blocks.h).
inline void ScaleMinK4(const std::uint8_t* s, int j, int* sc, int* mn) noexcept {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Scales of the 8 sub-blocks of 32 (lane l of chunk c is in sub-block 2 c + l / 8) and mins per
// bsum group g (sub-block g / 2).
inline void ScalesK4(const std::uint8_t* scales, float d, float dmin, UnpackedSuper* out) noexcept {
  float sc[8];
  float mn[8];
  for (int j = 0; j < 8; ++j) {
    int s = 0;
    int mi = 0;
    ScaleMinK4(scales, j, &s, &mi);
    sc[j] = d * static_cast<float>(s);
    mn[j] = -dmin * static_cast<float>(mi);
  }
#pragma GCC unroll 8
  for (int c = 0; c < 4; ++c) _mm512_store_ps(out->ws[c], Halves(sc[2 * c], sc[2 * c + 1]));
  const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  _mm512_store_ps(out->wm, _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(mn))));
}

// qs[32 c .. 32 c + 32): low nibbles are elements [64 c, 64 c + 32), high nibbles the next 32.
inline __m512i NibblesK(const std::uint8_t* qs32) noexcept {
  __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs32)));
  v = _mm512_mask_srli_epi16(v, 0xFFFF0000u, v, 4);
  return _mm512_and_si512(v, _mm512_set1_epi8(15));
}

struct Q4_KW {
  using Block = quant::BlockQ4_K;
  static void Unpack(const Block& b, UnpackedSuper* out) noexcept {
#pragma GCC unroll 8
    for (int c = 0; c < 4; ++c) _mm512_store_si512(out->u[c], NibblesK(b.qs + 32 * c));
    ScalesK4(b.scales, Half(b.d), Half(b.dmin), out);
  }
};

struct Q5_KW {
  using Block = quant::BlockQ5_K;
  static void Unpack(const Block& b, UnpackedSuper* out) noexcept {
    const __m512i qh =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh)));
#pragma GCC unroll 8
    for (int c = 0; c < 4; ++c) {
      // Element 64 c + l takes bit 2 c of qh[l]; element 64 c + 32 + l bit 2 c + 1.
      const __m512i bit = _mm512_mask_blend_epi8(0xFFFFFFFF00000000ull,
                                                 _mm512_set1_epi8(static_cast<char>(1 << (2 * c))),
                                                 _mm512_set1_epi8(static_cast<char>(2 << (2 * c))));
      const __mmask64 high = _mm512_test_epi8_mask(qh, bit);
      const __m512i lo = NibblesK(b.qs + 32 * c);
      _mm512_store_si512(out->u[c], _mm512_mask_add_epi8(lo, high, lo, _mm512_set1_epi8(16)));
    }
    ScalesK4(b.scales, Half(b.d), Half(b.dmin), out);
  }
};

struct Q6_KW {
  using Block = quant::BlockQ6_K;
  static void Unpack(const Block& b, UnpackedSuper* out) noexcept {
    const __m512i low4 = _mm512_set1_epi8(15);
    const __m512i low2 = _mm512_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      // Half h: elements [128 h, 128 h + 128) from ql[64 h ..], qh[32 h ..] (quant/blocks.h).
      const __m512i ql = _mm512_loadu_si512(b.ql + 64 * h);
      __m512i qh = _mm512_broadcast_i64x4(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h)));
      qh = _mm512_mask_srli_epi16(qh, 0xFFFF0000u, qh, 2);  // bytes 32-63 take bits 2-3
      const __m512i hi0 = _mm512_slli_epi16(_mm512_and_si512(qh, low2), 4);
      const __m512i hi1 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 4), low2), 4);
      _mm512_store_si512(out->u[2 * h], _mm512_or_si512(_mm512_and_si512(ql, low4), hi0));
      _mm512_store_si512(out->u[2 * h + 1],
                         _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), hi1));
    }
    const __m512 s = _mm512_mul_ps(_mm512_set1_ps(Half(b.d)),
                                   _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                       reinterpret_cast<const __m128i*>(b.scales)))));
#pragma GCC unroll 8
    for (int c = 0; c < 4; ++c) {
      const __m512i idx = _mm512_add_epi32(
          _mm512_set1_epi32(4 * c),
          _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            2));
      _mm512_store_ps(out->ws[c], _mm512_permutexvar_ps(idx, s));
    }
    _mm512_store_ps(out->wm, _mm512_mul_ps(s, _mm512_set1_ps(-32.0f)));
  }
};

template <class W, int MT, int NT>
void TileK(const std::byte* act, std::size_t act_row_bytes, int supers,
           const typename W::Block* const* wrow, float* y, int ldy, bool accumulate) noexcept {
  __m512 acc[MT][NT];
#pragma GCC unroll 8
  for (auto& row : acc) {
#pragma GCC unroll 8
    for (auto& a : row) a = _mm512_setzero_ps();
  }
  UnpackedSuper w[NT];
  for (int s = 0; s < supers; ++s) {
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) W::Unpack(wrow[j][s], &w[j]);
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const quant::BlockQ8_K& a = reinterpret_cast<const quant::BlockQ8_K*>(
          act + static_cast<std::size_t>(i) * act_row_bytes)[s];
      __m512 t[NT];
      const __m512 bsums = _mm512_cvtepi32_ps(
          _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsums))));
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) t[j] = _mm512_mul_ps(_mm512_load_ps(w[j].wm), bsums);
#pragma GCC unroll 8
      for (int c = 0; c < 4; ++c) {
        const __m512i q = _mm512_loadu_si512(a.qs + 64 * c);
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) {
          const __m512i dot =
              _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_load_si512(w[j].u[c]), q);
          t[j] = _mm512_fmadd_ps(_mm512_load_ps(w[j].ws[c]), _mm512_cvtepi32_ps(dot), t[j]);
        }
      }
      const __m512 da = _mm512_set1_ps(a.d);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_fmadd_ps(t[j], da, acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      Put(y + static_cast<std::ptrdiff_t>(i) * ldy + j, accumulate,
          _mm512_reduce_add_ps(acc[i][j]));
    }
  }
}

template <class W, int NT>
void RowTilesK(const RowsKernelArgs& a, int supers, const typename W::Block* const* wrow,
               int j) noexcept {
  int r = 0;
  const auto at = [&a](int row) { return a.act + static_cast<std::size_t>(row) * a.act_row_bytes; };
  const auto yat = [&a, j](int row) { return a.y + static_cast<std::ptrdiff_t>(row) * a.ldy + j; };
  for (; r + kRowTile <= a.m; r += kRowTile) {
    TileK<W, kRowTile, NT>(at(r), a.act_row_bytes, supers, wrow, yat(r), a.ldy, a.accumulate);
  }
  ForRemainder(a.m - r, [&]<int R>() {
    TileK<W, R, NT>(at(r), a.act_row_bytes, supers, wrow, yat(r), a.ldy, a.accumulate);
  });
}

template <class W>
void RowsK(const RowsKernelArgs& all, int row_begin, int row_end) {
  using Block = typename W::Block;
  const quant::WeightMatrix& w = *all.w;
  const int supers = w.cols / kQkK;
  const auto row = [&w](int j) { return reinterpret_cast<const Block*>(w.Row(j)); };
  for (int r0 = 0; r0 < all.m; r0 += kActRowBlock) {
    RowsKernelArgs a = all;  // rows [r0, r0 + kActRowBlock) of the activations and of y
    a.m = all.m - r0 < kActRowBlock ? all.m - r0 : kActRowBlock;
    a.act = all.act + static_cast<std::size_t>(r0) * all.act_row_bytes;
    a.y = all.y + static_cast<std::ptrdiff_t>(r0) * all.ldy;
    int j = row_begin;
    for (; j + kWeightTile <= row_end; j += kWeightTile) {
      const Block* rows[kWeightTile] = {row(j), row(j + 1)};
      RowTilesK<W, kWeightTile>(a, supers, rows, j);
    }
    if (j < row_end) {
      const Block* rows[1] = {row(j)};
      RowTilesK<W, 1>(a, supers, rows, j);
    }
  }
}

// ---- Dequantisation to fp32 from the same unpacked form (prefill: a tile of W for sgemm).
// Element e of a 64-byte chunk sits in int32 lane e / 4; each 16-element quarter of a chunk has a
// single scale in every type (blocks of 32, K-quant groups of 16 or 32).
// The 16 unsigned bytes of 128-bit lane t of u, times scale plus offset, to out[0, 16).
inline void StoreQuarter(__m512i u, int t, float scale, float offset, float* out) noexcept {
  const __m512i lane = _mm512_add_epi32(
      _mm512_set1_epi32(4 * t), _mm512_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3));
  const __m128i q = _mm512_castsi512_si128(_mm512_permutexvar_epi32(lane, u));
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q));
  _mm512_storeu_ps(out, _mm512_fmadd_ps(f, _mm512_set1_ps(scale), _mm512_set1_ps(offset)));
}

template <class W>
void Dequantize32(const void* w, int rows, int k, float* out) noexcept {
  using Block = typename W::Block;
  const int blocks = k / kQk32;
  const auto* wb = static_cast<const Block*>(w);
  for (int r = 0; r < rows; ++r) {
    const Block* row = wb + static_cast<std::ptrdiff_t>(r) * blocks;
    float* o = out + static_cast<std::ptrdiff_t>(r) * k;
    for (int b = 0; b < blocks; b += 2) {
      const int b1 = b + 1 < blocks ? b + 1 : b;
      const UnpackedPair p = W::Unpack(row + b, row + b1);
      alignas(64) float dw[16];
      alignas(64) float mw[16];
      _mm512_store_ps(dw, p.dw);
      _mm512_store_ps(mw, p.mw);
      const int quarters = b + 1 < blocks ? 4 : 2;
      for (int t = 0; t < quarters; ++t) {
        StoreQuarter(p.u, t, dw[4 * t], W::kMin ? mw[4 * t] : -W::kOffset * dw[4 * t],
                     o + 32 * b + 16 * t);
      }
    }
  }
}

template <class W>
void DequantizeK(const void* w, int rows, int k, float* out) noexcept {
  using Block = typename W::Block;
  const int supers = k / kQkK;
  const auto* wb = static_cast<const Block*>(w);
  UnpackedSuper s;
  for (int r = 0; r < rows; ++r) {
    for (int sb = 0; sb < supers; ++sb) {
      W::Unpack(wb[static_cast<std::ptrdiff_t>(r) * supers + sb], &s);
      float* o = out + static_cast<std::ptrdiff_t>(r) * k + static_cast<std::ptrdiff_t>(sb) * kQkK;
#pragma GCC unroll 8
      for (int c = 0; c < 4; ++c) {
        const __m512i u = _mm512_load_si512(s.u[c]);
#pragma GCC unroll 8
        for (int t = 0; t < 4; ++t) {
          StoreQuarter(u, t, s.ws[c][4 * t], s.wm[4 * c + t], o + 64 * c + 16 * t);
        }
      }
    }
  }
}

}  // namespace

QuantKernel Kernel(GgmlType type, bool bf16) noexcept {
  constexpr std::string_view kVnni = "avx512-vnni";
  switch (type) {
    case GgmlType::kQ8_0:
      return {Rows32<Q8_0W>, kVnni};
    case GgmlType::kQ4_0:
      return {Rows32<Q4_0W>, kVnni};
    case GgmlType::kQ4_1:
      return {Rows32<Q4_1W>, kVnni};
    case GgmlType::kQ5_0:
      return {Rows32<Q5_0W>, kVnni};
    case GgmlType::kQ5_1:
      return {Rows32<Q5_1W>, kVnni};
    case GgmlType::kQ4_K:
      return {RowsK<Q4_KW>, kVnni};
    case GgmlType::kQ5_K:
      return {RowsK<Q5_KW>, kVnni};
    case GgmlType::kQ6_K:
      return {RowsK<Q6_KW>, kVnni};
    case GgmlType::kF16:
      return {F16Rows, "avx512-f16c"};
    case GgmlType::kBF16:
      if (bf16) return {Bf16Rows, "avx512-bf16"};
      return {};
    default:
      return {};
  }
}

}  // namespace metronome::kernels::avx512

namespace metronome::kernels::avx512 {

void DequantizeRows(GgmlType type, const void* w, int rows, int k, float* out) noexcept {
  switch (type) {
    case GgmlType::kQ8_0:
      Dequantize32<Q8_0W>(w, rows, k, out);
      break;
    case GgmlType::kQ4_0:
      Dequantize32<Q4_0W>(w, rows, k, out);
      break;
    case GgmlType::kQ4_1:
      Dequantize32<Q4_1W>(w, rows, k, out);
      break;
    case GgmlType::kQ5_0:
      Dequantize32<Q5_0W>(w, rows, k, out);
      break;
    case GgmlType::kQ5_1:
      Dequantize32<Q5_1W>(w, rows, k, out);
      break;
    case GgmlType::kQ4_K:
      DequantizeK<Q4_KW>(w, rows, k, out);
      break;
    case GgmlType::kQ5_K:
      DequantizeK<Q5_KW>(w, rows, k, out);
      break;
    case GgmlType::kQ6_K:
      DequantizeK<Q6_KW>(w, rows, k, out);
      break;
    default:
      break;
  }
}

}  // namespace metronome::kernels::avx512
