// The interleaved-layout kernels of quant_interleaved_avx512.h. Compiled with the AVX-512 flags of
// kernels/CMakeLists.txt.
//
// One 16-row group at a time, the activation rows in register tiles of up to kTileRows. Per block
// and activation row: the block's 8 weight vectors (each 4 quants of the 16 rows; nibbles and
// fifth bits put together first) against the activation's 8 four-byte words broadcast, 8 vpdpbusd
// into an int32 vector that starts at -offset * (the activation block's sum), in two chains of 4
// (the vpdpbusd latency); then one conversion and one FMA by d_w (the group's 16 scales of the
// block, one 32-byte load) times d_a, and for Q4_1 / Q5_1 one more FMA of m_w by d_a * sum.
// The 16 lanes are the group's 16 output rows: no reduction, one store per activation row.
// Weight bytes are read once per tile; at m <= kTileRows (decode) that is once, as a stream with a
// software prefetch ahead (kPrefetchAheadBytes; the K-quants kKQuantPrefetchAheadBytes); larger m
// re-read the group (at most 16 rows of bytes: L1/L2) once per tile.
#include "metronome/kernels/quant_interleaved_avx512.h"

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "metronome/kernels/internal/for_count.h"
#include "metronome/kernels/internal/stream_prefetch.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/row_layout.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::kernels::avx512 {
namespace {

using quant::ActQ8Block32;
using quant::GgmlType;
using quant::kInterleaveRows;
using quant::kQk32;

constexpr int kTileRows = 4;    // activation rows per register tile
constexpr int kWords = 8;       // four-byte activation words of a 32-element block
constexpr int kLineBytes = 64;  // one vector, one cache line
// Software prefetch distance in the group stream (one thread's own contiguous rows) of the
// 32-element block types: far enough ahead to cover DRAM latency at one session's read rate;
// shorter leads were slower for Q4_0 and level for Q8_0 (bench-decode at one session;
// bench/quant_benchmark BM_DecodeDram).
constexpr std::size_t kPrefetchAheadBytes = 8192;
// The K-quants' distance: 3 KiB, more than a 16-row Q4_K super-block body (2304 bytes) ahead, into
// L2. Their bodies are one ascending stream the hardware prefetcher follows, but with a
// super-block's unpacking between its lines it runs too few lines ahead, and a stream read from
// DRAM loses a fifth to two fifths of the bandwidth to that. A lead of a third of a body is enough
// where DRAM latency is short; where it is longer (more lines in flight per core at the same read
// rate) 1.5-6 KiB keep up, level within the run-to-run spread (BM_DecodeDram, m = 1 and 8,
// alternated builds). The prefetches go out a few lines at a time as the kernel reads
// (KQuantPrefetchAhead beside the loads), not a body's 36-52 lines at a super-block's start: such a
// burst holds the core's miss buffers while the loads behind it wait, which cost Q6_K a twentieth
// of its read rate at one row and a tenth or more at 8 (internal/stream_prefetch.h).
constexpr std::size_t kKQuantPrefetchAheadBytes = 3072;
constexpr int kOrMasked = 0xF8;  // ternary logic: a | (b & c)

// Software prefetch of the kBytes from p on, kPrefetchAheadBytes ahead, one per line, into L2
// (internal/stream_prefetch.h).
template <std::size_t kBytes>
inline void PrefetchAhead(const std::byte* p) noexcept {
  internal::PrefetchStreamLines<kBytes>(p + kPrefetchAheadBytes);
}
// The K-quants': kKQuantPrefetchAheadBytes ahead, each prefetch kept beside the loads it stands
// with (not hoisted to the super-block's start).
template <std::size_t kBytes>
inline void KQuantPrefetchAhead(const std::byte* p) noexcept {
  internal::PrefetchStreamLines<kBytes, internal::PrefetchPlacement::kInPlace>(
      p + kKQuantPrefetchAheadBytes);
}

// A register tile's activation rows [r, r + MT), each a row of `Act` blocks.
template <class Act, int MT>
inline void TileActivations(const RowsKernelArgs& a, int r, const Act* (&act)[MT]) noexcept {
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
    act[i] =
        reinterpret_cast<const Act*>(a.act + static_cast<std::size_t>(r + i) * a.act_row_bytes);
  }
}

// y[r + i, row .. row + 16) = (or +=) the tile's outputs acc[i], the group's 16 rows in lanes.
// A tile's MT accumulators, zeroed.
template <int MT>
inline void ZeroTile(__m512 (&acc)[MT]) noexcept {
#pragma GCC unroll 8
  for (auto& v : acc) v = _mm512_setzero_ps();
}

template <int MT>
inline void StoreTile(const RowsKernelArgs& a, int r, int row, const __m512 (&acc)[MT]) noexcept {
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
    float* y = a.y + static_cast<std::ptrdiff_t>(r + i) * a.ldy + row;
    _mm512_storeu_ps(y, a.accumulate ? _mm512_add_ps(_mm512_loadu_ps(y), acc[i]) : acc[i]);
  }
}

// Per type: how a block's vectors become the 8 weight vectors of its 8 four-byte activation
// words (vector k: 4 unsigned quants of each of the 16 rows, elements 4k .. 4k + 3), the offset
// the quants carry (a quant u stands for u - kOffset), and whether the type adds a min m per block.
// Q8_0: 8 vectors of q + 128.
struct Q8_0I {
  static constexpr GgmlType kType = GgmlType::kQ8_0;
  static constexpr std::int32_t kOffset = quant::kInterleavedQ8_0Bias;
  static constexpr bool kHasMin = false;
  static void Load(const std::byte* q, __m512i (&v)[kWords]) noexcept {
#pragma GCC unroll 8
    for (int k = 0; k < kWords; ++k) v[k] = _mm512_loadu_si512(q + kLineBytes * k);
  }
};
// Q4_0 / Q4_1: 4 vectors of nibbles; vector j's low nibbles are word j, its high nibbles word
// 4 + j.
inline void LoadNibbles(const std::byte* q, __m512i (&v)[kWords]) noexcept {
  const __m512i low = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
  for (int j = 0; j < kWords / 2; ++j) {
    const __m512i x = _mm512_loadu_si512(q + kLineBytes * j);
    v[j] = _mm512_and_si512(x, low);
    v[j + kWords / 2] = _mm512_and_si512(_mm512_srli_epi16(x, 4), low);
  }
}
// Q5_0 / Q5_1: the fifth-bit vector, then 4 vectors of nibbles. After a shift right by j, bit 4
// of each byte of the fifth-bit vector is the fifth bit of quant vector j's low nibble and bit 0
// that of its high nibble (quant/row_layout.h); the shift spills the next byte's bits into bits
// 5..7 only, which the mask 0x11 clears.
inline void LoadNibblesWithFifthBits(const std::byte* q, __m512i (&v)[kWords]) noexcept {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i bits = _mm512_set1_epi8(0x11);
  constexpr int kSelect = 0xE4;  // ternary logic: c ? a : b, bit by bit
  const __m512i fifth = _mm512_loadu_si512(q);
#pragma GCC unroll 4
  for (int j = 0; j < kWords / 2; ++j) {
    const __m512i x = _mm512_loadu_si512(q + kLineBytes * (j + 1));
    const __m512i h = _mm512_and_si512(_mm512_srli_epi16(fifth, static_cast<unsigned>(j)), bits);
    v[j] = _mm512_ternarylogic_epi32(x, h, low, kSelect);
    v[j + kWords / 2] =
        _mm512_ternarylogic_epi32(_mm512_srli_epi16(x, 4), _mm512_slli_epi16(h, 4), low, kSelect);
  }
}
// The four nibble types: an offset (kOffset) or a min per block (kHasMin); fifth bits for Q5_x.
template <GgmlType kT, std::int32_t kOff, bool kMin, bool kFifthBits>
struct NibbleI {
  static constexpr GgmlType kType = kT;
  static constexpr std::int32_t kOffset = kOff;
  static constexpr bool kHasMin = kMin;
  static void Load(const std::byte* q, __m512i (&v)[kWords]) noexcept {
    if constexpr (kFifthBits) {
      LoadNibblesWithFifthBits(q, v);
    } else {
      LoadNibbles(q, v);
    }
  }
};
using Q4_0I = NibbleI<GgmlType::kQ4_0, 8, false, false>;
using Q4_1I = NibbleI<GgmlType::kQ4_1, 0, true, false>;
using Q5_0I = NibbleI<GgmlType::kQ5_0, 16, false, true>;
using Q5_1I = NibbleI<GgmlType::kQ5_1, 0, true, true>;

template <class T>
constexpr quant::InterleavedGeometry kGeometry = quant::InterleavedGeometryOf(T::kType);
static_assert(kGeometry<Q8_0I>.quant_vectors == kWords, "Q8_0: a vector per word");
static_assert(kGeometry<Q5_1I>.quant_vectors == kWords / 2, "nibbles: a vector per 2 words");

// acc + the 16 lanes' dots of w's unsigned bytes with the signed four-byte word at `word`, the word
// broadcast by the instruction's own {1to16} memory form: for the set1 intrinsic GCC emits a
// separate broadcast load, one more operation per dot, and a dot is most of a decode kernel's
// work once a few sessions share each weight vector (bench/quant_benchmark BM_DecodeDram).
inline __m512i DotWord(__m512i acc, __m512i w, const std::int8_t* word) noexcept {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(w), "m"(*reinterpret_cast<const std::int8_t(*)[4]>(word)));
  return acc;
}

// The 16 rows' fp16 values of one scale line's half (block 2p + half of the pair at `pair`).
inline __m512 LoadHalves(const std::byte* line, int half) noexcept {
  return _mm512_cvtph_ps(_mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(line + half * quant::kInterleavedLineBytes / 2)));
}

// acc[i] += d_w d_a[i] (dot of block `b` for the 16 rows) (+ m_w d_a[i] sum_a[i] with a min), for
// the tile's activation rows.
template <class T, int MT>
inline void Block(const __m512i (&w)[kWords], __m512 dw, __m512 mw,
                  const ActQ8Block32* const (&act)[MT], int b, __m512 (&acc)[MT]) noexcept {
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
    const ActQ8Block32& a = act[i][b];
    __m512i even = _mm512_set1_epi32(-T::kOffset * a.sum);
    __m512i odd = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int k = 0; k < kWords; k += 2) {
      even = DotWord(even, w[k], a.qs + 4 * k);
      odd = DotWord(odd, w[k + 1], a.qs + 4 * k + 4);
    }
    const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d));
    acc[i] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd)), acc[i]);
    if constexpr (T::kHasMin) {
      acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.d * static_cast<float>(a.sum)), acc[i]);
    }
  }
}

// Activation rows [r, r + MT) against one group (its first output row `row`).
template <class T, int MT>
void GroupTile(const RowsKernelArgs& a, int r, const std::byte* group, int blocks, int row) {
  const ActQ8Block32* act[MT];
  TileActivations(a, r, act);
  __m512 acc[MT];
  ZeroTile(acc);
  constexpr quant::InterleavedGeometry kGeo = kGeometry<T>;
  constexpr std::size_t kBlocksAt = kGeo.scale_lines * quant::kInterleavedLineBytes;
  constexpr std::size_t kPairBytes = kGeo.PairBytes();
  const std::byte* p = group;
  for (int b = 0; b < blocks; b += 2, p += kPairBytes) {
    PrefetchAhead<kPairBytes>(p);
    const std::byte* m_line = p + quant::kInterleavedLineBytes;  // types with a min
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      __m512i w[kWords];
      T::Load(p + kBlocksAt + half * kGeo.BlockBytes(), w);
      const __m512 mw = T::kHasMin ? LoadHalves(m_line, half) : _mm512_setzero_ps();
      Block<T, MT>(w, LoadHalves(p, half), mw, act, b + half, acc);
    }
  }
  StoreTile(a, r, row, acc);
}

template <class T>
void Rows(const RowsKernelArgs& a, int row_begin, int row_end) {
  const quant::WeightMatrix& w = *a.w;
  const int blocks = w.cols / kQk32;
  for (int row = row_begin; row < row_end; row += kInterleaveRows) {
    const std::byte* group = w.Row(row);
    ForRowTiles<kTileRows>(a.m, [&]<int MT>(int r) { GroupTile<T, MT>(a, r, group, blocks, row); });
  }
}

// The K-quants' activation rows per register tile: 2 up to kSmallTileMaxRows rows (the decode of a
// few sessions: fewer accumulators, no spills), 4 beyond (the weights unpacked half as often);
// bench/quant_benchmark BM_RowLayout, Q4_K, m = 4 and 32.
constexpr int kSmallTileRows = 2;
constexpr int kLargeTileRows = 4;
constexpr int kSmallTileMaxRows = 4;

// The K-quant kernels' loop: every 16-row group of [row_begin, row_end), every register tile of
// activation rows; tile.template operator()<MT>(r, group, supers, row) computes one.
template <class Tile>
void ForSuperGroupTiles(const RowsKernelArgs& a, int row_begin, int row_end, Tile&& tile) {
  const quant::WeightMatrix& w = *a.w;
  const int supers = w.cols / quant::kQkK;
  for (int row = row_begin; row < row_end; row += kInterleaveRows) {
    const std::byte* group = w.Row(row);
    const auto one = [&]<int MT>(int r) { tile.template operator()<MT>(r, group, supers, row); };
    if (a.m <= kSmallTileMaxRows) {
      ForRowTiles<kSmallTileRows>(a.m, one);
    } else {
      ForRowTiles<kLargeTileRows>(a.m, one);
    }
  }
}

// ---- Q6_K: per super-block (256 elements), for each half h and each half of its 32-byte groups,
// four quads k at once: quant vector for word w = 32 h + 8 k + l (l < 8, 4 elements each) is the
// nibble of ql vector 16 h + 8 (k % 2) + l (low for k < 2, high after) with qh vector 8 h + l's
// bits 2k, 2k + 1 at bits 4, 5 (ggml's Q6_K, quant/blocks.h). Four words of a quad make sub-block
// j = 8 h + 2 k + (l / 4): its int32 dot starts at -32 x the activation's bsum j (exact), is
// converted to fp32 and added to the super-block's fp32 sum times the 16 rows' int8 scale j (one
// 16-byte load, sign-extended and converted once for the tile's rows): one FMA per dot, not a
// vpmulld into an int32 sum, whose latency bound this kernel at 32 rows (BM_RowLayout, Q6_K,
// m = 32). One FMA by d_w d_a per super-block.
constexpr int kQ6KOffset = 32;

template <int MT>
void GroupTileQ6K(const RowsKernelArgs& a, int r, const std::byte* group, int supers, int row) {
  const quant::BlockQ8_K* act[MT];
  TileActivations(a, r, act);
  __m512 acc[MT];
  ZeroTile(acc);
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i two_bits = _mm512_set1_epi8(0x30);
  const std::byte* tail = group + static_cast<std::size_t>(supers) * quant::kQ6KBodyBytes;
  for (int sb = 0; sb < supers; ++sb) {
    const std::byte* body = group + static_cast<std::size_t>(sb) * quant::kQ6KBodyBytes;
    KQuantPrefetchAhead<quant::kQ6KScaleBytes>(body);
    __m512 sum[MT];
    ZeroTile(sum);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        __m512i dot[MT][4];
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 4
          for (int k = 0; k < 4; ++k) {
            dot[i][k] = _mm512_set1_epi32(-kQ6KOffset * act[i][sb].bsums[8 * h + 2 * k + half]);
          }
        }
#pragma GCC unroll 4
        for (int l = 4 * half; l < 4 * half + 4; ++l) {
          // The triple of lines from qh vector 8 h + l on (quant/row_layout.h).
          const std::byte* triple = body + quant::Q6KQhOffset(8 * h + l);
          KQuantPrefetchAhead<3 * kLineBytes>(triple);
          const __m512i qh = _mm512_loadu_si512(triple);
          const __m512i v0 = _mm512_loadu_si512(body + quant::Q6KQlOffset(16 * h + l));
          const __m512i v1 = _mm512_loadu_si512(body + quant::Q6KQlOffset(16 * h + 8 + l));
          __m512i w[4];
          w[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(v0, low), _mm512_slli_epi16(qh, 4),
                                           two_bits, kOrMasked);
          w[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(v1, low), _mm512_slli_epi16(qh, 2),
                                           two_bits, kOrMasked);
          w[2] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v0, 4), low), qh,
                                           two_bits, kOrMasked);
          w[3] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v1, 4), low),
                                           _mm512_srli_epi16(qh, 2), two_bits, kOrMasked);
#pragma GCC unroll 8
          for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 4
            for (int k = 0; k < 4; ++k) {
              dot[i][k] = DotWord(dot[i][k], w[k], act[i][sb].qs + 128 * h + 32 * k + 4 * l);
            }
          }
        }
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          const int j = 8 * h + 2 * k + half;
          const __m512 scale = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(body + kInterleaveRows * j))));
#pragma GCC unroll 8
          for (int i = 0; i < MT; ++i) {
            sum[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][k]), scale, sum[i]);
          }
        }
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
        tail + static_cast<std::size_t>(sb) * quant::kQ6KTailBytesPerSuper)));
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(act[i][sb].d)), sum[i], acc[i]);
    }
  }
  StoreTile(a, r, row, acc);
}

void RowsQ6K(const RowsKernelArgs& a, int row_begin, int row_end) {
  ForSuperGroupTiles(a, row_begin, row_end,
                     [&a]<int MT>(int r, const std::byte* group, int supers, int row) {
                       GroupTileQ6K<MT>(a, r, group, supers, row);
                     });
}

// ---- Q4_K / Q5_K: per super-block the 16 rows' 6-bit scales and mins unpacked from the three
// scale vectors into bytes (lane r: sc[0..3], sc[4..7], mn[0..3], mn[4..7] of row r); per
// 64-element group g the 8 qs vectors give sub-block 2g (low nibbles) and 2g + 1 (high nibbles),
// Q5_K's fifth bits (bit 2g / 2g + 1 of qh vector l's bytes) shifted to bit 4 and merged in one
// ternary-logic op (Q4_K's high nibbles stay in place, 16 x the quant, the 16 taken out of the
// scale). Each sub-block's int32 dot (one chain at one row, two from more; exact) is converted to
// fp32 and accumulated into the super-block's fp32 sum times its 16 row scales (converted once per
// tile, one FMA per dot, not a vpmulld into an int32 sum: BM_RowLayout, Q4_K, m = 32); the min term
// sum_j mn_j bsum32_j comes from two vpmaddwd per 4 sub-blocks on the mins as 16-bit pairs. One FMA
// pair by d_a (d_w x sum - dmin_w x mins) per super-block.

// Byte b (0..3) of each 32-bit lane, zero-extended.
inline __m512i LaneByte(__m512i v, int b) noexcept {
  const __m512i byte = _mm512_set1_epi32(0xFF);
  switch (b) {
    case 0:
      return _mm512_and_si512(v, byte);
    case 1:
      return _mm512_and_si512(_mm512_srli_epi32(v, 8), byte);
    case 2:
      return _mm512_and_si512(_mm512_srli_epi32(v, 16), byte);
    default:
      return _mm512_srli_epi32(v, 24);
  }
}

// Bit `from` of every byte moved to bit 4 (the other bits of the result are junk: callers mask).
inline __m512i BitToFour(__m512i v, int from) noexcept {
  switch (from) {
    case 0:
      return _mm512_slli_epi16(v, 4);
    case 1:
      return _mm512_slli_epi16(v, 3);
    case 2:
      return _mm512_slli_epi16(v, 2);
    case 3:
      return _mm512_slli_epi16(v, 1);
    case 4:
      return v;
    case 5:
      return _mm512_srli_epi16(v, 1);
    case 6:
      return _mm512_srli_epi16(v, 2);
    default:
      return _mm512_srli_epi16(v, 3);
  }
}

// The sum of a sub-block's dot chains.
template <int kChains>
inline __m512i ChainSum(const __m512i (&chains)[kChains]) noexcept {
  if constexpr (kChains == 1) {
    return chains[0];
  } else {
    return _mm512_add_epi32(chains[0], chains[1]);
  }
}

// Q4_K's high nibbles enter the dots in place (x & 0xF0, 16 x the quant): one operation a line
// fewer than a shift and a mask. A line's operations bound how far ahead of its loads the core
// runs, so the DRAM read rate at one session (BM_DecodeDram). The factor 16 keeps the sums exact
// (|sum| <= 16 x 32 x 15 x 128 < 2^24, so their fp32 conversion is exact too) and comes out of the
// sub-block's scale, a power of 2: bit for bit the result of the shifted nibbles.
constexpr float kInPlaceHighNibble = 1.0f / 16.0f;

// Dot chains a nibble half: one for a single activation row, whose 8 dots a sub-block take less
// time than the line reads they wait for (a second chain is one more addition and zeroing a
// sub-block in the line's budget); two for tiles of more rows (vpdpbusd's latency from L2).
constexpr int KQuantDotChains(int tile_rows) { return tile_rows == 1 ? 1 : 2; }

// A super-block's 16 rows' scales and mins as bytes (lane r: sc[0] = scales 0..3, sc[1] = 4..7,
// mn likewise, of row r), from its three scale vectors (quant/blocks.h): j < 4 the low 6 bits of
// bytes j, j + 4; j >= 4 a nibble of byte j + 4 with the top 2 bits of byte j - 4 (scale) or j
// (min) above it.
struct KScalesMins {
  __m512i sc[2];
  __m512i mn[2];
};
inline KScalesMins UnpackKScalesMins(const std::byte* scale_vectors) noexcept {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i six = _mm512_set1_epi8(0x3F);
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  const __m512i v0 = _mm512_loadu_si512(scale_vectors);
  const __m512i v1 = _mm512_loadu_si512(scale_vectors + kLineBytes);
  const __m512i v2 = _mm512_loadu_si512(scale_vectors + 2 * kLineBytes);
  return {{_mm512_and_si512(v0, six),
           _mm512_ternarylogic_epi32(_mm512_and_si512(v2, low), _mm512_srli_epi16(v0, 2), bits45,
                                     kOrMasked)},
          {_mm512_and_si512(v1, six),
           _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v2, 4), low),
                                     _mm512_srli_epi16(v1, 2), bits45, kOrMasked)}};
}

// sum_j mn_j bsum32_j per row: the mins as 16-bit pairs (bytes 0, 2 and 1, 3 of each lane) against
// the activation's 32-element sums (pairs of its 16-element bsums) packed in matching pairs.
inline __m512i KMinTerm(const __m512i (&mn)[2], const std::int16_t* bsums) noexcept {
  const __m512i low_words = _mm512_set1_epi32(0x00FF00FF);
  const auto pair = [bsums](int j0, int j1) {
    const auto s0 = static_cast<std::uint16_t>(bsums[2 * j0] + bsums[2 * j0 + 1]);
    const auto s1 = static_cast<std::uint16_t>(bsums[2 * j1] + bsums[2 * j1 + 1]);
    return _mm512_set1_epi32(static_cast<std::int32_t>(s0 | static_cast<std::uint32_t>(s1) << 16));
  };
  __m512i m = _mm512_madd_epi16(_mm512_and_si512(mn[0], low_words), pair(0, 2));
  m = _mm512_add_epi32(m, _mm512_madd_epi16(_mm512_srli_epi16(mn[0], 8), pair(1, 3)));
  m = _mm512_add_epi32(m, _mm512_madd_epi16(_mm512_and_si512(mn[1], low_words), pair(4, 6)));
  return _mm512_add_epi32(m, _mm512_madd_epi16(_mm512_srli_epi16(mn[1], 8), pair(5, 7)));
}

template <bool kHighBits, int MT>
void GroupTileK(const RowsKernelArgs& a, int r, const std::byte* group, int supers, int row) {
  using Block = std::conditional_t<kHighBits, quant::BlockQ5_K, quant::BlockQ4_K>;
  constexpr std::size_t kBodyBytes = kInterleaveRows * sizeof(Block);
  constexpr std::size_t kScalesAt = kLineBytes;
  constexpr std::size_t kQhAt = kScalesAt + quant::kKScaleVectors * kLineBytes;
  constexpr std::size_t kQsAt = kQhAt + (kHighBits ? quant::kQ5KHighBitVectors * kLineBytes : 0);
  const quant::BlockQ8_K* act[MT];
  TileActivations(a, r, act);
  __m512 acc[MT];
  ZeroTile(acc);
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  constexpr int kChains = KQuantDotChains(MT);
  for (int sb = 0; sb < supers; ++sb) {
    const std::byte* body = group + static_cast<std::size_t>(sb) * kBodyBytes;
    KQuantPrefetchAhead<kQsAt>(body);  // d, dmin, scales (and qh)
    const KScalesMins scales = UnpackKScalesMins(body + kScalesAt);
    const __m512i(&sc)[2] = scales.sc;
    __m512 sum[MT];
    __m512i mins[MT];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      sum[i] = _mm512_setzero_ps();
      mins[i] = KMinTerm(scales.mn, act[i][sb].bsums);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      __m512i dot[MT][2][kChains];  // [row][low / high nibbles][l % kChains]
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        for (auto& half : dot[i]) {
          for (__m512i& chain : half) chain = _mm512_setzero_si512();
        }
      }
#pragma GCC unroll 8
      for (int l = 0; l < 8; ++l) {
        const std::byte* qs_line = body + kQsAt + kLineBytes * (8 * g + l);
        KQuantPrefetchAhead<kLineBytes>(qs_line);
        const __m512i x = _mm512_loadu_si512(qs_line);
        __m512i lo = _mm512_and_si512(x, low);
        __m512i hi;
        if constexpr (kHighBits) {
          const __m512i qh = _mm512_loadu_si512(body + kQhAt + kLineBytes * l);
          lo = _mm512_ternarylogic_epi32(lo, BitToFour(qh, 2 * g), bit4, kOrMasked);
          hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(x, 4), low),
                                         BitToFour(qh, 2 * g + 1), bit4, kOrMasked);
        } else {
          hi = _mm512_andnot_si512(low, x);  // 16 x the high nibble (kInPlaceHighNibble)
        }
#pragma GCC unroll 8
        for (int i = 0; i < MT; ++i) {
          const std::int8_t* q = act[i][sb].qs + 64 * g + 4 * l;
          dot[i][0][l % kChains] = DotWord(dot[i][0][l % kChains], lo, q);
          dot[i][1][l % kChains] = DotWord(dot[i][1][l % kChains], hi, q + 32);
        }
      }
      // Sub-blocks 2g and 2g + 1: scale bytes (2g) % 4 and (2g + 1) % 4 of sc[g / 2].
      const __m512 sc_lo = _mm512_cvtepi32_ps(LaneByte(sc[g / 2], (2 * g) % 4));
      __m512 sc_hi = _mm512_cvtepi32_ps(LaneByte(sc[g / 2], (2 * g + 1) % 4));
      if constexpr (!kHighBits) sc_hi = _mm512_mul_ps(sc_hi, _mm512_set1_ps(kInPlaceHighNibble));
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        sum[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ChainSum(dot[i][0])), sc_lo, sum[i]);
        sum[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ChainSum(dot[i][1])), sc_hi, sum[i]);
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(body)));
    const __m512 mw = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(body + kInterleaveRows * 2)));
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const __m512 t = _mm512_fmsub_ps(dw, sum[i], _mm512_mul_ps(mw, _mm512_cvtepi32_ps(mins[i])));
      acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(act[i][sb].d), t, acc[i]);
    }
  }
  StoreTile(a, r, row, acc);
}

template <bool kHighBits>
void RowsK(const RowsKernelArgs& a, int row_begin, int row_end) {
  ForSuperGroupTiles(a, row_begin, row_end,
                     [&a]<int MT>(int r, const std::byte* group, int supers, int row) {
                       GroupTileK<kHighBits, MT>(a, r, group, supers, row);
                     });
}

// Rows<T> for the block type T of `type` among Ts; nullptr if none.
template <class... Ts>
RowsKernel BlockRows(GgmlType type) noexcept {
  RowsKernel kernel = nullptr;
  (void)((type == Ts::kType && ((kernel = Rows<Ts>), true)) || ...);
  return kernel;
}

}  // namespace

RowsKernel InterleavedKernel(GgmlType type) noexcept {
  if (const RowsKernel k = BlockRows<Q8_0I, Q4_0I, Q4_1I, Q5_0I, Q5_1I>(type)) return k;
  switch (type) {
    case GgmlType::kQ4_K:
      return RowsK<false>;
    case GgmlType::kQ5_K:
      return RowsK<true>;
    case GgmlType::kQ6_K:
      return RowsQ6K;
    default:
      return nullptr;
  }
}

}  // namespace metronome::kernels::avx512
