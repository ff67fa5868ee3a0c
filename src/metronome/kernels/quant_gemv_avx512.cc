// The decode-path (m <= kGemvMaxRows) AVX-512 kernels of quant_gemv_avx512.h. Compiled with the
// AVX-512 flags of kernels/CMakeLists.txt and entered only after CpuHasAvx512Vnni().
//
// At m = 1..4 a product is a stream over W: the arithmetic per weight byte is small, so what
// decides the speed is how well the stream is fed. Each thread walks one weight row at a time
// (Q8_0, F16, BF16: one sequential stream) or up to kGemvWeightRows at once (the types whose
// decode is heavier: independent chains), prefetches a few KB ahead (PrefetchAheadBytes), keeps one
// fp32 accumulator per (activation row, weight row) across the whole row and reduces it once at the
// end. 32-element types: four consecutive blocks are unpacked at once (GroupQuad: one nibble unpack
// for 128 weights of the 4/5-bit types) from two 64-byte loads, their quants, fp16 scales (and
// mins, Q5 high bits) picked out by 16-bit permutes (internal/avx512_unpack.h, ConsecutiveRun); a
// row's last, partial quad takes its scales from a gather of 16 blocks. K-quants: each super-block
// unpacked once into registers, 4 vpdpbusd and integer sub-block scales per activation row. F16:
// vcvtph2ps + fp32 FMA; BF16: vdpbf16ps.
#include "metronome/kernels/quant_gemv_avx512.h"

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "metronome/kernels/internal/avx512_unpack.h"
#include "metronome/kernels/internal/for_count.h"
#include "metronome/kernels/internal/stream_prefetch.h"
#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::kernels::avx512 {
namespace {

using quant::GgmlType;
using quant::kQk32;

// Weight rows in flight per thread. The types whose decode costs many instructions per byte (the
// 4/5-bit nibbles, the K-quants): 4 while the MT x NT accumulators, NT unpacked blocks and NT
// scales fit the 32 vector registers (MT <= 2), 2 for MT = 3, 4; the rows' independent chains
// keep the core busy. Q8_0, F16 and BF16 (a few instructions per byte) stream one row at a time:
// one sequential stream is what the hardware prefetcher follows best, and four rows interleaved
// a row apart streamed markedly slower; the nibble types, bound by their decode, are slower one
// row at a time (bench/quant_benchmark BM_DecodeKernel, m = 1).
constexpr int kGemvWeightRows = 4;
template <class W, int MT>
constexpr int kWeightRowsFor = std::is_same_v<W, Q8_0W> ? 1 : (MT <= 2 ? kGemvWeightRows : 2);
// Software prefetch distance: two groups of rows ahead of the group being read (rows are
// contiguous, so that is the same stream a few KB on); one row at a time, 8 KB ahead: a row is too
// short a lead for a lone stream, and longer leads gained nothing (BM_DecodeKernel).
constexpr int kGemvPrefetchRowGroups = 2;
constexpr std::size_t kOneRowPrefetchBytes = 8192;
template <int NT>
constexpr std::size_t PrefetchAheadBytes(std::size_t row_bytes) noexcept {
  return NT == 1 ? kOneRowPrefetchBytes
                 : row_bytes * static_cast<std::size_t>(NT * kGemvPrefetchRowGroups);
}
constexpr int kBlocksPerScaleVector = 16;  // fp16 scales widened per vcvtph2ps

// The (activation row, weight row) accumulators of a group: zeroed, and reduced once each into
// y[i * ldy + j] (+)=.
template <int MT, int NT>
inline void ZeroAccumulators(__m512 (&acc)[MT][NT]) noexcept {
#pragma GCC unroll 8
  for (auto& row : acc) {
#pragma GCC unroll 8
    for (auto& v : row) v = _mm512_setzero_ps();
  }
}
template <int MT, int NT>
inline void StoreSums(const __m512 (&acc)[MT][NT], float* y, int ldy, bool accumulate) noexcept {
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

// Weight rows [row_begin, row_end) in groups of kNt (then the tail one at a time):
// group.template operator()<NT>(rows, j) with rows[t] = row(j + t).
template <int kNt, class Row, class Group>
void ForRowGroups(int row_begin, int row_end, Row&& row, Group&& group) noexcept {
  using Ptr = decltype(row(0));
  int j = row_begin;
  for (; j + kNt <= row_end; j += kNt) {
    Ptr rows[kNt];
    for (int t = 0; t < kNt; ++t) rows[t] = row(j + t);
    group.template operator()<kNt>(rows, j);
  }
  for (; j < row_end; ++j) {
    Ptr rows[1] = {row(j)};
    group.template operator()<1>(rows, j);
  }
}

// The fp16 scale d (low half) and, for the min types, m (high half) of 16 consecutive blocks
// from `first` on (lanes past `valid` are 0): one vpgatherdd over the blocks' first 4 bytes
// (every block type here starts with d, the _1 types with d then m). A scalar pass through a
// table instead (a store per block, a vector reload) stalls on store forwarding once per 16
// blocks, a large share of the Q8_0 kernel's cycles under perf.
template <class W>
inline __m512i GatherScales(const typename W::Block* first, int valid) noexcept {
  const __m512i offsets =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(sizeof(typename W::Block))));
  const auto mask =
      static_cast<__mmask16>(valid >= kBlocksPerScaleVector ? 0xFFFFu : (1u << valid) - 1u);
  return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), mask, offsets, first, 1);
}

// ---- 32-element types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), four blocks a step: the weights
// of a quad unpacked once into lo / hi (internal/avx512_unpack.h, UnpackQuad), two vpdpbusd per
// activation row into one int32 vector that starts from the offset term, one conversion and one
// FMA by d_w d_a per lane. Offset types: sum (u - o) a = sum u a - o sum a, and -o sum a of block
// t starts lane 4 t of the dot (exact, in integers). Min types: the m_w d_a sum a terms are one FMA
// per quad of the quad's mins against the activations' d sum (lane 4 t), or, in a group with a
// partial quad, one FMA of the 16 gathered mins against the group's sums (block lanes).
constexpr int kQuadBlocks = 4;

struct alignas(64) GemvActQuad {
  std::int8_t lo[64];  // elements 0-15 of block t at 16 t
  std::int8_t hi[64];  // elements 16-31 of block t at 16 t
  std::int32_t c[16];  // lane 4 t: -offset * (sum of block t); the other lanes 0
  float da[16];        // d of block t in lanes 4 t .. 4 t + 3
  float sa[16];        // min types: d * (sum of block t) in lane 4 t; the other lanes 0
};
struct alignas(64) GemvActSums {  // min types, per 16 blocks: d * sum of block l in lane l
  float s[kBlocksPerScaleVector];
};

// Row r's quads at quads[r * nquads], its sums (min types) at sums[r * groups]; blocks past the
// row's end are zero (a quad or group that covers them adds nothing).
template <class W>
void PrepareActQuads(const RowsKernelArgs& a, int blocks, GemvActQuad* quads,
                     GemvActSums* sums) noexcept {
  const int nquads = (blocks + kQuadBlocks - 1) / kQuadBlocks;
  const int groups = (blocks + kBlocksPerScaleVector - 1) / kBlocksPerScaleVector;
  const auto offset = static_cast<std::int32_t>(W::kOffset);
  for (int r = 0; r < a.m; ++r) {
    const auto* x = reinterpret_cast<const quant::ActQ8Block32*>(
        a.act + static_cast<std::size_t>(r) * a.act_row_bytes);
    for (int q = 0; q < nquads; ++q) {
      GemvActQuad& dst = quads[static_cast<std::ptrdiff_t>(r) * nquads + q];
      std::memset(&dst, 0, sizeof dst);
      for (int t = 0; t < kQuadBlocks && kQuadBlocks * q + t < blocks; ++t) {
        const quant::ActQ8Block32& xb = x[kQuadBlocks * q + t];
        std::memcpy(dst.lo + 16 * t, xb.qs, 16);
        std::memcpy(dst.hi + 16 * t, xb.qs + 16, 16);
        dst.c[4 * t] = -offset * xb.sum;
        for (int l = 0; l < 4; ++l) dst.da[4 * t + l] = xb.d;
        if constexpr (W::kMin) dst.sa[4 * t] = xb.d * static_cast<float>(xb.sum);
      }
    }
    if constexpr (W::kMin) {
      for (int g = 0; g < groups; ++g) {
        GemvActSums& dst = sums[static_cast<std::ptrdiff_t>(r) * groups + g];
        for (int l = 0; l < kBlocksPerScaleVector; ++l) {
          const int b = kBlocksPerScaleVector * g + l;
          dst.s[l] = b < blocks ? x[b].d * static_cast<float>(x[b].sum) : 0.0f;
        }
      }
    }
  }
}

template <class W, int MT, int NT>
void GroupQuad(const GemvActQuad* act, const GemvActSums* sums, int blocks,
               const typename W::Block* const* wrow, std::size_t row_bytes, float* y, int ldy,
               bool accumulate) noexcept {
  using Block = typename W::Block;
  const int nquads = (blocks + kQuadBlocks - 1) / kQuadBlocks;
  const int groups = (blocks + kBlocksPerScaleVector - 1) / kBlocksPerScaleVector;
  __m512 acc[MT][NT];
  ZeroAccumulators(acc);
  const std::size_t ahead = PrefetchAheadBytes<NT>(row_bytes);
  // Lane l of a quad's dot is in block l / 4 (vpermps indices, + 4 per quad).
  const __m512i quad_lanes = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  constexpr int kQuadsPerScaleVector = kBlocksPerScaleVector / kQuadBlocks;
  // Types whose consecutive quads carry their own scales and mins (ConsecutiveQuadScales /
  // ConsecutiveQuadMins: permutes of the lines the unpack loads) gather only for a group with a
  // partial quad: a 16-lane gather costs about as much as the rest of four quads (BM_GemvResident,
  // m = 1). A gathered group adds
  // its mins once for its 16 blocks, the others per quad.
  constexpr bool kQuadScales = requires(const Block* first) { W::ConsecutiveQuadScales(first); }
  &&(!W::kMin || requires(const Block* first) { W::ConsecutiveQuadMins(first); });
  for (int g = 0; g < groups; ++g) {
    const int first_block = kBlocksPerScaleVector * g;
    const bool gather = !kQuadScales || (g == groups - 1 && blocks % kQuadBlocks != 0);
    __m512 dv[NT];
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      dv[j] = _mm512_setzero_ps();
      if (!gather) continue;
      const __m512i h = GatherScales<W>(wrow[j] + first_block, blocks - first_block);
      dv[j] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
      if constexpr (W::kMin) {
        const __m512 mv = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
          const GemvActSums& s = sums[static_cast<std::ptrdiff_t>(i) * groups + g];
          acc[i][j] = _mm512_fmadd_ps(mv, _mm512_load_ps(s.s), acc[i][j]);
        }
      }
    }
    const int q_begin = kQuadsPerScaleVector * g;
    const int q_end =
        nquads - q_begin < kQuadsPerScaleVector ? nquads : q_begin + kQuadsPerScaleVector;
    for (int q = q_begin; q < q_end; ++q) {
      const int b0 = kQuadBlocks * q;
      const __m512i lanes =
          _mm512_add_epi32(quad_lanes, _mm512_set1_epi32(kQuadBlocks * (q - q_begin)));
      // The quad's blocks, the last one repeated past the row's end (same for every row).
      int block[kQuadBlocks];
#pragma GCC unroll 4
      for (int t = 0; t < kQuadBlocks; ++t) block[t] = b0 + t < blocks ? b0 + t : blocks - 1;
      const bool consecutive = b0 + kQuadBlocks <= blocks;
      UnpackedQuad u[NT];
      __m512 dw[NT];
      __m512 mw[NT];  // min types, a group not gathered: m of block t in lanes 4 t ..
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        const Block* b[kQuadBlocks];
#pragma GCC unroll 4
        for (int t = 0; t < kQuadBlocks; ++t) b[t] = wrow[j] + block[t];
        // One prefetch per line of a quad's bytes (Q8_0: 136, the others at most 88).
        internal::PrefetchStreamLines<kQuadBlocks * sizeof(Block)>(
            reinterpret_cast<const char*>(b[0]) + ahead);
        if constexpr (requires { W::UnpackConsecutiveQuad(b[0]); }) {
          u[j] = consecutive ? W::UnpackConsecutiveQuad(b[0]) : W::UnpackQuad(b);
        } else {
          u[j] = W::UnpackQuad(b);
        }
        if constexpr (kQuadScales) {
          dw[j] =
              consecutive ? W::ConsecutiveQuadScales(b[0]) : _mm512_permutexvar_ps(lanes, dv[j]);
          if constexpr (W::kMin)
            mw[j] = gather ? _mm512_setzero_ps() : W::ConsecutiveQuadMins(b[0]);
        } else {
          dw[j] = _mm512_permutexvar_ps(lanes, dv[j]);
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const GemvActQuad& a = act[static_cast<std::ptrdiff_t>(i) * nquads + q];
        const __m512i lo = _mm512_load_si512(a.lo);
        const __m512i hi = _mm512_load_si512(a.hi);
        const __m512i c = _mm512_load_si512(a.c);
        const __m512 da = _mm512_load_ps(a.da);
#pragma GCC unroll 8
        for (int j = 0; j < NT; ++j) {
          const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(c, u[j].lo, lo), u[j].hi, hi);
          acc[i][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw[j], da), _mm512_cvtepi32_ps(dot), acc[i][j]);
          if constexpr (kQuadScales && W::kMin) {
            if (!gather) acc[i][j] = _mm512_fmadd_ps(mw[j], _mm512_load_ps(a.sa), acc[i][j]);
          }
        }
      }
    }
  }
  StoreSums(acc, y, ldy, accumulate);
}

template <class W>
void GemvRowsQuad(const RowsKernelArgs& a, int row_begin, int row_end) {
  if (row_begin >= row_end) return;
  const int blocks = a.w->cols / kQk32;
  const int nquads = (blocks + kQuadBlocks - 1) / kQuadBlocks;
  const int groups = (blocks + kBlocksPerScaleVector - 1) / kBlocksPerScaleVector;
  thread_local std::vector<GemvActQuad> quads;
  thread_local std::vector<GemvActSums> sums;
  const auto rows = static_cast<std::size_t>(a.m);
  if (quads.size() < rows * static_cast<std::size_t>(nquads)) quads.resize(rows * nquads);
  if (W::kMin && sums.size() < rows * static_cast<std::size_t>(groups)) sums.resize(rows * groups);
  PrepareActQuads<W>(a, blocks, quads.data(), sums.data());
  const quant::WeightMatrix& w = *a.w;
  const auto row = [&w](int j) { return reinterpret_cast<const typename W::Block*>(w.Row(j)); };
  ForCount<kGemvMaxRows>(a.m, [&]<int MT>() {
    ForRowGroups<kWeightRowsFor<W, MT>>(
        row_begin, row_end, row,
        [&]<int NT>(const typename W::Block* const* rows_in_flight, int j) {
          GroupQuad<W, MT, NT>(quads.data(), sums.data(), blocks, rows_in_flight, w.row_bytes,
                               a.y + j, a.ldy, a.accumulate);
        });
  });
}

// ---- K-quants (Q4_K, Q5_K, Q6_K) on BlockQ8_K activations: each weight super-block unpacked
// once per call into registers (SuperRegs: four 64-byte chunks, the integer sub-block scale of
// every int32 lane, d, the coefficient of every bsum with the offset / min folded in), then per
// activation row: 4 vpdpbusd, each scaled in int32 (vpmulld) and summed, one conversion, d_w and
// the bsum term, one FMA by d_a into the (activation row, weight row) accumulator. Exact integer
// dots, as the rows kernel. Registers, not a store and reload of UnpackedSuper, and integer
// lane scales, not fp32 ones: each alternative was slower or level (BM_GemvResident, m = 1).
struct GemvActK {  // one activation row's super-block: the 16 bsums as fp32
  alignas(64) float bsum[16];
};

void PrepareActK(const RowsKernelArgs& a, int supers, GemvActK* out) noexcept {
  for (int r = 0; r < a.m; ++r) {
    const auto* x = reinterpret_cast<const quant::BlockQ8_K*>(a.act + static_cast<std::size_t>(r) *
                                                                          a.act_row_bytes);
    for (int sb = 0; sb < supers; ++sb) {
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[sb].bsums));
      _mm512_store_ps(out[static_cast<std::ptrdiff_t>(r) * supers + sb].bsum,
                      _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(bs)));
    }
  }
}

template <class W, int MT, int NT>
void GroupK(const RowsKernelArgs& a, const GemvActK* bsum, int supers,
            const typename W::Block* const* wrow, float* y) noexcept {
  using Block = typename W::Block;
  __m512 acc[MT][NT];
  ZeroAccumulators(acc);
  const quant::BlockQ8_K* x[MT];
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
    x[i] = reinterpret_cast<const quant::BlockQ8_K*>(a.act +
                                                     static_cast<std::size_t>(i) * a.act_row_bytes);
  }
  const std::size_t ahead = PrefetchAheadBytes<NT>(a.w->row_bytes);
  for (int sb = 0; sb < supers; ++sb) {
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      internal::PrefetchStreamLines<sizeof(Block)>(reinterpret_cast<const char*>(wrow[j] + sb) +
                                                   ahead);
      // One weight super-block in registers at a time (NT of them would not fit beside the
      // accumulators); its activation chunks are L1 loads.
      SuperRegs w;
      W::UnpackRegs(wrow[j][sb], &w);
      const __m512 dw = _mm512_set1_ps(w.d);
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const quant::BlockQ8_K& xa = x[i][sb];
        // sum over the chunks of scale x dot, exact in int32; d_w once, in fp32.
        __m512i dot = _mm512_mullo_epi32(
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.u[0], _mm512_loadu_si512(xa.qs)),
            w.scale[0]);
#pragma GCC unroll 4
        for (int c = 1; c < 4; ++c) {
          dot = _mm512_add_epi32(
              dot, _mm512_mullo_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w.u[c],
                                                          _mm512_loadu_si512(xa.qs + 64 * c)),
                                      w.scale[c]));
        }
        const __m512 bs = _mm512_load_ps(bsum[static_cast<std::ptrdiff_t>(i) * supers + sb].bsum);
        const __m512 t = _mm512_fmadd_ps(dw, _mm512_cvtepi32_ps(dot), _mm512_mul_ps(w.wm, bs));
        acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(xa.d), t, acc[i][j]);
      }
    }
  }
  StoreSums(acc, y, a.ldy, a.accumulate);
}

template <class W>
void GemvRowsK(const RowsKernelArgs& a, int row_begin, int row_end) {
  if (row_begin >= row_end) return;
  const int supers = a.w->cols / quant::kQkK;
  thread_local std::vector<GemvActK> bsum;
  const auto need = static_cast<std::size_t>(a.m) * static_cast<std::size_t>(supers);
  if (bsum.size() < need) bsum.resize(need);
  PrepareActK(a, supers, bsum.data());
  const quant::WeightMatrix& w = *a.w;
  const auto row = [&w](int j) { return reinterpret_cast<const typename W::Block*>(w.Row(j)); };
  ForCount<kGemvMaxRows>(a.m, [&]<int MT>() {
    ForRowGroups<kWeightRowsFor<W, MT>>(row_begin, row_end, row,
                                        [&]<int NT>(const typename W::Block* const* rows, int j) {
                                          GroupK<W, MT, NT>(a, bsum.data(), supers, rows, a.y + j);
                                        });
  });
}

// ---- F16 / BF16: fp32 accumulators per (activation row, weight row), 32 elements a step.
// F16: the weights widened with vcvtph2ps and multiplied by the fp32 activations with FMA (the
// products are exact in fp32, as in F16Rows). BF16: vdpbf16ps on activations rounded to bf16
// once per call (nearest even, as Bf16Rows), two products per lane.
constexpr int kHalfStep = 32;  // 16-bit weights per step: 64 bytes, one cache line per row

inline __mmask32 HalfMask(int left) noexcept {
  if (left >= kHalfStep) return ~__mmask32{0};
  return left > 0 ? (__mmask32{1} << left) - 1u : __mmask32{0};
}

struct GemvF16 {
  // The fp32 activations as they are (act = x, ActivationFormat::kF32).
  using Act = float;
  static constexpr int kActPerStep = kHalfStep;
  // y_ij += w_j[s..s+32) . x_i[s..s+32), `mask` = the valid elements (k's tail). The two halves
  // go to two accumulators: one chain of two dependent FMAs per step leaves the FMA latency
  // exposed at one weight row in flight (BM_GemvResident, m = 1).
  static void Step(__m512& acc_lo, __m512& acc_hi, const std::uint16_t* w, const float* x,
                   __mmask32 mask) noexcept {
    const auto lo_mask = static_cast<__mmask16>(mask);
    const auto hi_mask = static_cast<__mmask16>(mask >> 16);
    const __m512 w_lo = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lo_mask, w));
    const __m512 w_hi = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(hi_mask, w + 16));
    acc_lo = _mm512_fmadd_ps(w_lo, _mm512_maskz_loadu_ps(lo_mask, x), acc_lo);
    acc_hi = _mm512_fmadd_ps(w_hi, _mm512_maskz_loadu_ps(hi_mask, x + 16), acc_hi);
  }
};

struct GemvBf16 {
  // Activations rounded to bf16, each row padded with zeros to whole steps (PrepareBf16Act).
  using Act = std::uint16_t;
  static constexpr int kActPerStep = kHalfStep;
  // One vdpbf16ps a step, into the first accumulator (the second is left as it is).
  static void Step(__m512& acc, __m512& /*unused*/, const std::uint16_t* w, const std::uint16_t* x,
                   __mmask32 mask) noexcept {
    const __m512i wv = _mm512_maskz_loadu_epi16(mask, w);
    const __m512i xv = _mm512_load_si512(x);
    acc = _mm512_dpbf16_ps(acc, reinterpret_cast<const __m512bh&>(wv),
                           reinterpret_cast<const __m512bh&>(xv));
  }
};

// Weight rows in flight: one (kWeightRowsFor above), except F16 for more than one activation row:
// its step is two dependent FMAs per accumulator, and MT accumulators alone leave the FMA latency
// exposed (BM_DecodeKernel, F16, m = 4).
template <class H, int MT>
constexpr int kHalfWeightRowsFor = (std::is_same_v<H, GemvF16> && MT > 1) ? kGemvWeightRows : 1;

// y[i, j] (+)= x_i . w_j for MT activation rows (ldx elements apart) and NT weight rows.
template <class H, int MT, int NT>
void GroupHalf(const typename H::Act* x, std::ptrdiff_t ldx, int k,
               const std::uint16_t* const* wrow, std::size_t row_bytes, float* y, int ldy,
               bool accumulate) noexcept {
  // A second accumulator per pair only where the pairs alone are too few chains for the FMA
  // latency (twice MT x NT registers beside the weights would spill).
  constexpr bool kSecondChain = MT * NT == 1;
  __m512 acc[MT][NT];
  __m512 second = _mm512_setzero_ps();  // the one pair's second chain (kSecondChain)
  ZeroAccumulators(acc);
  const std::size_t ahead = PrefetchAheadBytes<NT>(row_bytes);
  for (int s = 0; s < k; s += kHalfStep) {
    const __mmask32 mask = HalfMask(k - s);
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      // One step of a row is one 64-byte line: one prefetch per row and step reaches every line.
      _mm_prefetch(reinterpret_cast<const char*>(wrow[j] + s) + ahead,
                   internal::kStreamPrefetchHint);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) {
        H::Step(acc[i][j], kSecondChain ? second : acc[i][j], wrow[j] + s, x + i * ldx + s, mask);
      }
    }
  }
  if constexpr (kSecondChain) acc[0][0] = _mm512_add_ps(acc[0][0], second);
  StoreSums(acc, y, ldy, accumulate);
}

// The m fp32 activation rows rounded to bf16 (nearest even, vcvtne2ps2bf16), each padded with
// zeros to `kpad` (a multiple of kHalfStep) elements.
void PrepareBf16Act(const RowsKernelArgs& a, int k, int kpad, std::uint16_t* out) noexcept {
  for (int r = 0; r < a.m; ++r) {
    const auto* xr =
        reinterpret_cast<const float*>(a.act + static_cast<std::size_t>(r) * a.act_row_bytes);
    std::uint16_t* o = out + static_cast<std::ptrdiff_t>(r) * kpad;
    for (int s = 0; s < kpad; s += kHalfStep) {
      const __mmask32 mask = HalfMask(k - s);
      const __m512 lo = _mm512_maskz_loadu_ps(static_cast<__mmask16>(mask), xr + s);
      const __m512 hi = _mm512_maskz_loadu_ps(static_cast<__mmask16>(mask >> 16), xr + s + 16);
      // vcvtne2ps2bf16 puts its second operand in the low half.
      const __m512bh packed = _mm512_cvtne2ps_pbh(hi, lo);
      _mm512_store_si512(o + s, reinterpret_cast<const __m512i&>(packed));
    }
  }
}

template <class H>
void GemvHalf(const RowsKernelArgs& a, int row_begin, int row_end) {
  const int k = a.w->cols;
  if (row_begin >= row_end || k <= 0) return;
  const typename H::Act* x = nullptr;
  std::ptrdiff_t ldx = 0;
  if constexpr (std::is_same_v<H, GemvBf16>) {
    struct alignas(64) Line {
      std::uint16_t v[kHalfStep];
    };
    thread_local std::vector<Line> scratch;
    const int kpad = (k + kHalfStep - 1) / kHalfStep * kHalfStep;
    const auto lines = static_cast<std::size_t>(a.m) * static_cast<std::size_t>(kpad / kHalfStep);
    if (scratch.size() < lines) scratch.resize(lines);
    auto* xb = reinterpret_cast<std::uint16_t*>(scratch.data());
    PrepareBf16Act(a, k, kpad, xb);
    x = xb;
    ldx = kpad;
  } else {
    x = reinterpret_cast<const float*>(a.act);
    ldx = static_cast<std::ptrdiff_t>(a.act_row_bytes / sizeof(float));
  }
  const quant::WeightMatrix& w = *a.w;
  const auto row = [&w](int j) { return reinterpret_cast<const std::uint16_t*>(w.Row(j)); };
  ForCount<kGemvMaxRows>(a.m, [&]<int MT>() {
    ForRowGroups<kHalfWeightRowsFor<H, MT>>(
        row_begin, row_end, row, [&]<int NT>(const std::uint16_t* const* rows, int j) {
          GroupHalf<H, MT, NT>(x, ldx, k, rows, w.row_bytes, a.y + j, a.ldy, a.accumulate);
        });
  });
}

}  // namespace

RowsKernel GemvKernel(GgmlType type) noexcept {
  if (type == GgmlType::kF16) return GemvHalf<GemvF16>;
  if (type == GgmlType::kBF16) return GemvHalf<GemvBf16>;
  RowsKernel kernel = nullptr;
  VisitBlockDecoder(type, [&kernel]<class W>() {
    if constexpr (W::kSuperBlock) {
      kernel = GemvRowsK<W>;
    } else {
      kernel = GemvRowsQuad<W>;
    }
  });
  return kernel;
}

}  // namespace metronome::kernels::avx512
