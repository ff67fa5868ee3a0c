// The AVX2 kernels of quant_matmul_avx2.h. Compiled with AVX2 + FMA + F16C flags whatever
// METRONOME_ARCH is (kernels/CMakeLists.txt) and entered only after CpuHasAvx2Fma().
//
// Two kernel shapes. The 32-element families: a policy T unpacks a weight block into registers
// (T::Unpack) and adds its dot with one activation block to a fp32 accumulator vector
// (T::Accumulate); RowTile runs it for MI <= 4 activation rows per unpacked block, each row with
// kChains / MI accumulators used in turn over consecutive blocks (independent FMA chains). The
// K-quants: SuperRowTile unpacks a super-block one sub-block at a time and dots each with up to 8
// activation rows before the next (the K-quant section). Every kernel prefetches its weight stream
// ahead, F16 / BF16 (HalfRowTile) too.
#include "metronome/kernels/quant_matmul_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "metronome/base/half.h"
#include "metronome/kernels/internal/avx2_sum.h"
#include "metronome/kernels/internal/for_count.h"
#include "metronome/kernels/internal/stream_prefetch.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/unpack.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::kernels::avx2 {
namespace {

using internal::HorizontalSum;
using quant::ActQ8Block32;
using quant::BlockQ8_K;
using quant::GgmlType;

constexpr int kMaxActRows = 4;  // activation rows per unpacked weight block
// The K-quants' tiles (SuperRowTile): 8 rows' int32 sums, one quants and one scale vector in the
// 16 ymm registers.
constexpr int kMaxSuperActRows = 8;
// Rows from which a K-quant product goes to dequant+sgemm: SuperRows beats it at 16 and 32 rows
// and loses at 64 (bench/quant_benchmark BM_Prefill paths 1 and 3, oneDNN on AVX2).
constexpr int kSuperDequantGemmMinRows = 2 * kDequantGemmMinRows;
// Software prefetch distance on the weight stream. A decode product streams W from DRAM once,
// one row after the next; the hardware prefetcher alone leaves the kernel waiting on it (the
// AVX-512 decode kernels prefetch as far ahead for the same reason: quant_gemv_avx512.cc).
constexpr std::size_t kPrefetchAheadBytes = 8192;

inline float HalfToFloat(std::uint16_t h) noexcept { return _cvtsh_ss(h); }

inline __m256i Load256(const void* p) noexcept {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}
inline __m128i Load128(const void* p) noexcept {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

// 8 int32 lanes, each the sum of 4 products u[j] s[j] (u unsigned bytes, s signed): exact while
// every adjacent pair of products sums within int16 (|u| <= 128, |s| <= 127).
inline __m256i DotU8S8(__m256i u, __m256i s) noexcept {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// A signed weight vector ready for the sign trick: |w| as unsigned bytes, and w for its signs.
struct SignedQuants {
  __m256i abs;
  __m256i sign;
};
inline SignedQuants Signed(__m256i q) noexcept { return {_mm256_sign_epi8(q, q), q}; }
inline __m256i Dot(const SignedQuants& w, __m256i a) noexcept {
  return DotU8S8(w.abs, _mm256_sign_epi8(a, w.sign));
}

// Byte l of the result is 0xFF where bit l of `bits` is set, else 0.
inline __m256i BitsToBytes(std::uint32_t bits) noexcept {
  const __m256i byte_of_word =
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i v =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<std::int32_t>(bits)), byte_of_word);
  // Every bit of byte j set but bit j: the byte is all ones exactly where its bit was set.
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  return _mm256_cmpeq_epi8(_mm256_or_si256(v, others), _mm256_set1_epi64x(-1));
}

// 16 packed bytes of nibbles as 32 bytes: the low nibbles (elements 0-15), then the high ones.
inline __m256i Nibbles(__m128i packed) noexcept {
  const __m128i low4 = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low4),
                          _mm_and_si128(packed, low4));
}

inline std::uint32_t Word32(const std::uint8_t (&b)[4]) noexcept {
  return static_cast<std::uint32_t>(b[0]) | static_cast<std::uint32_t>(b[1]) << 8 |
         static_cast<std::uint32_t>(b[2]) << 16 | static_cast<std::uint32_t>(b[3]) << 24;
}

inline __m256 Fma(float scale, __m256i isum, __m256 acc) noexcept {
  return _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(isum), acc);
}

// ---- 32-element families: x = d q (+ m) ----

// Q8_0, Q4_0 (q = nibble - 8), Q5_0 (q = 5 bits - 16): signed quants, the sign trick.
template <typename B>
struct SignedBlocks32 {
  using Block = B;
  using Act = ActQ8Block32;
  static constexpr int kElems = quant::kQk32;
  static constexpr int kChains = 4;
  struct Unpacked {
    SignedQuants q;
    float d;
  };
  static Unpacked Unpack(const Block& b) noexcept {
    __m256i q;
    if constexpr (std::is_same_v<B, quant::BlockQ8_0>) {
      q = Load256(b.qs);
    } else if constexpr (std::is_same_v<B, quant::BlockQ4_0>) {
      q = _mm256_sub_epi8(Nibbles(Load128(b.qs)), _mm256_set1_epi8(8));
    } else {
      const __m256i high = _mm256_and_si256(BitsToBytes(Word32(b.qh)), _mm256_set1_epi8(16));
      q = _mm256_sub_epi8(_mm256_or_si256(Nibbles(Load128(b.qs)), high), _mm256_set1_epi8(16));
    }
    return {Signed(q), HalfToFloat(b.d)};
  }
  static void Accumulate(const Unpacked& u, const Act& x, __m256& acc, float& /*extra*/) noexcept {
    acc = Fma(u.d * x.d, Dot(u.q, Load256(x.qs)), acc);
  }
};

// Q4_1 / Q5_1: unsigned quants and a min: dot = d_w d_a sum(q a) + m_w d_a sum(a).
template <typename B>
struct MinBlocks32 {
  using Block = B;
  using Act = ActQ8Block32;
  static constexpr int kElems = quant::kQk32;
  static constexpr int kChains = 4;
  struct Unpacked {
    __m256i q;
    float d;
    float m;
  };
  static Unpacked Unpack(const Block& b) noexcept {
    __m256i q = Nibbles(Load128(b.qs));
    if constexpr (std::is_same_v<B, quant::BlockQ5_1>) {
      q = _mm256_or_si256(q, _mm256_and_si256(BitsToBytes(Word32(b.qh)), _mm256_set1_epi8(16)));
    }
    return {q, HalfToFloat(b.d), HalfToFloat(b.m)};
  }
  static void Accumulate(const Unpacked& u, const Act& x, __m256& acc, float& extra) noexcept {
    acc = Fma(u.d * x.d, DotU8S8(u.q, Load256(x.qs)), acc);
    extra += u.m * x.d * static_cast<float>(x.sum);
  }
};

// ---- K-quants (256-element super-blocks) ----
//
// Read a sub-block at a time (SuperRowTile): Begin takes a super-block's scales once, Quants
// unpacks sub-block (pair) j's 32 quants as unsigned bytes, Scale spreads its scales over the int16
// lanes, Finish scales the activation row's int32 dot into the fp32 accumulator. The tile dots
// each unpacked sub-block with every activation row before the next, so what stays live across the
// rows is one quants vector and one scale vector, not a whole unpacked super-block (16 ymm
// registers hold the row sums of 8 activation rows that way).

// Q4_K / Q5_K: x = d sc[j] q - dmin mn[j] per sub-block j of 32 (q <= 31).
// dot = d_a (d_w sum_j sc[j] sum(q a) - dmin_w sum_j mn[j] (bsums[2j] + bsums[2j+1])).
template <typename B>
struct KMin {
  using Block = B;
  static constexpr int kSubBlocks = 8;
  struct Header {
    __m256i sc16;      // the 8 scales (6 bits) as int16 lanes 0-7 of both 128-bit halves
    __m256i mn_pairs;  // mn[j] in int16 lanes 2j and 2j + 1, against bsums
    float d;
    float dmin;
  };
  static Header Begin(const Block& b) noexcept {
    const quant::KScaleWords words = quant::UnpackKScaleWords(b.scales);
    Header h;
    h.sc16 = _mm256_broadcastsi128_si256(
        _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<std::int64_t>(words.sc))));
    const __m128i mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<std::int64_t>(words.mn)));
    h.mn_pairs = _mm256_set_m128i(_mm_unpackhi_epi16(mn, mn), _mm_unpacklo_epi16(mn, mn));
    h.d = HalfToFloat(b.d);
    h.dmin = HalfToFloat(b.dmin);
    return h;
  }
  // Sub-block j: the low (even j) or high (odd j) nibbles of bytes 32 (j / 2) .. + 31, and for
  // Q5_K the fifth bit, bit j of qh[l].
  static __m256i Quants(const Block& b, int j) noexcept {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i v = Load256(b.qs + 32 * (j / 2));
    __m256i q = _mm256_and_si256(j % 2 == 0 ? v : _mm256_srli_epi16(v, 4), low4);
    if constexpr (std::is_same_v<B, quant::BlockQ5_K>) {
      const __m256i bit =
          _mm256_and_si256(_mm256_srli_epi16(Load256(b.qh), j), _mm256_set1_epi8(1));
      q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
    }
    return q;
  }
  // sc[j] (int16 bytes 2j, 2j + 1) in every lane: one byte shuffle.
  static __m256i Scale(const Header& h, int j) noexcept {
    return _mm256_shuffle_epi8(
        h.sc16, _mm256_set1_epi16(static_cast<std::int16_t>((2 * j + 1) << 8 | 2 * j)));
  }
  static __m256 Finish(const Header& h, const BlockQ8_K& x, __m256i sumi, __m256 acc) noexcept {
    const __m256i summ = _mm256_madd_epi16(Load256(x.bsums), h.mn_pairs);
    acc = Fma(h.d * x.d, sumi, acc);
    return _mm256_fnmadd_ps(_mm256_set1_ps(h.dmin * x.d), _mm256_cvtepi32_ps(summ), acc);
  }
};

// Q6_K: x = d sc[k] (q - 32) per sub-block k of 16 (q <= 63).
// dot = d_a d_w (sum_k sc[k] sum(q a) - 32 sum_k sc[k] bsums[k]). Unit v of 32 elements holds
// sub-blocks 2v (low 128-bit half) and 2v + 1 (high half).
struct Q6K {
  using Block = quant::BlockQ6_K;
  static constexpr int kSubBlocks = 8;
  struct Header {
    __m128i scales;  // the 16 scale bytes (int8)
    float d;
  };
  static Header Begin(const Block& b) noexcept { return {Load128(b.scales), HalfToFloat(b.d)}; }
  // Unit v = 4 h + t: elements [128 h + 32 t, + 32): low (t < 2) or high nibbles of ql bytes
  // 64 h + 32 (t % 2) .., and bits 2t, 2t + 1 of qh[32 h + l] moved to bits 4-5.
  static __m256i Quants(const Block& b, int v) noexcept {
    const int h = v / 4;
    const int t = v % 4;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i ql = Load256(b.ql + 64 * h + 32 * (t % 2));
    const __m256i qh = Load256(b.qh + 32 * h);
    const __m256i low = _mm256_and_si256(t < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
    const __m256i high_mask = _mm256_set1_epi8(static_cast<char>(0x03 << (2 * t)));
    const __m256i masked = _mm256_and_si256(qh, high_mask);
    // Bits 2t, 2t + 1 to bits 4, 5: a shift left by 4 - 2t (t < 2) or right by 2t - 4.
    const __m256i high = t == 0   ? _mm256_slli_epi16(masked, 4)
                         : t == 1 ? _mm256_slli_epi16(masked, 2)
                         : t == 2 ? masked
                                  : _mm256_srli_epi16(masked, 2);
    return _mm256_or_si256(low, high);
  }
  // int16 lanes 0-7: sc[2v], 8-15: sc[2v + 1]: one byte shuffle and one sign extension.
  static __m256i Scale(const Header& h, int v) noexcept {
    const __m128i pick =
        _mm_set_epi64x(0x0101010101010101LL * (2 * v + 1), 0x0101010101010101LL * (2 * v));
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(h.scales, pick));
  }
  static __m256 Finish(const Header& h, const BlockQ8_K& x, __m256i sumi, __m256 acc) noexcept {
    const __m256i offset =
        _mm256_slli_epi32(_mm256_madd_epi16(Load256(x.bsums), _mm256_cvtepi8_epi16(h.scales)), 5);
    return Fma(h.d * x.d, _mm256_sub_epi32(sumi, offset), acc);
  }
};

// ---- the rows kernel ----

inline void Store(const RowsKernelArgs& a, int i, int r, float v) noexcept {
  float& dst = a.y[static_cast<std::size_t>(i) * static_cast<std::size_t>(a.ldy) +
                   static_cast<std::size_t>(r)];
  dst = a.accumulate ? dst + v : v;
}

// Activation rows [i0, i0 + MI) against weight rows [row_begin, row_end).
template <class T, int MI>
void RowTile(const RowsKernelArgs& a, int i0, int row_begin, int row_end) noexcept {
  constexpr int kChains = std::max(1, T::kChains / MI);
  const quant::WeightMatrix& w = *a.w;
  const int nb = w.cols / T::kElems;
  const typename T::Act* act[MI];
#pragma GCC unroll 4
  for (int i = 0; i < MI; ++i) {
    act[i] = reinterpret_cast<const typename T::Act*>(a.act + static_cast<std::size_t>(i0 + i) *
                                                                  a.act_row_bytes);
  }
  for (int r = row_begin; r < row_end; ++r) {
    const auto* blocks = reinterpret_cast<const typename T::Block*>(w.Row(r));
    __m256 acc[MI][kChains];
    float extra[MI];
#pragma GCC unroll 4
    for (int i = 0; i < MI; ++i) {
      extra[i] = 0.0f;
#pragma GCC unroll 4
      for (int c = 0; c < kChains; ++c) acc[i][c] = _mm256_setzero_ps();
    }
    int b = 0;
    for (; b + kChains <= nb; b += kChains) {
      // The weight stream a fixed distance ahead (rows are contiguous: across row ends too).
      internal::PrefetchStreamLines<kChains * sizeof(typename T::Block)>(
          reinterpret_cast<const char*>(blocks + b) + kPrefetchAheadBytes);
#pragma GCC unroll 4
      for (int c = 0; c < kChains; ++c) {
        const typename T::Unpacked u = T::Unpack(blocks[b + c]);
#pragma GCC unroll 4
        for (int i = 0; i < MI; ++i) T::Accumulate(u, act[i][b + c], acc[i][c], extra[i]);
      }
    }
    for (; b < nb; ++b) {
      const typename T::Unpacked u = T::Unpack(blocks[b]);
#pragma GCC unroll 4
      for (int i = 0; i < MI; ++i) T::Accumulate(u, act[i][b], acc[i][0], extra[i]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MI; ++i) {
      __m256 sum = acc[i][0];
#pragma GCC unroll 4
      for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[i][c]);
      Store(a, i0 + i, r, HorizontalSum(sum) + extra[i]);
    }
  }
}

// Every activation row in tiles of kMaxActRows (the weight rows re-read from cache per tile).
template <class T>
void Rows(const RowsKernelArgs& a, int row_begin, int row_end) {
  ForRowTiles<kMaxActRows>(a.m, [&]<int MI>(int i0) { RowTile<T, MI>(a, i0, row_begin, row_end); });
}

// Activation rows [i0, i0 + MI) against weight rows [row_begin, row_end) of a K-quant, one
// sub-block at a time (the K-quant section's comment). One fp32 accumulator per activation row:
// a super-block's work (8 sub-blocks) is long beside its two dependent FMAs. (Two weight rows in
// flight for tiles of 1 and 2 rows measured level with one.)
template <class T, int MI>
void SuperRowTile(const RowsKernelArgs& a, int i0, int row_begin, int row_end) noexcept {
  const quant::WeightMatrix& w = *a.w;
  const int nb = w.cols / quant::kQkK;
  const BlockQ8_K* act[MI];
#pragma GCC unroll 8
  for (int i = 0; i < MI; ++i) {
    act[i] = reinterpret_cast<const BlockQ8_K*>(a.act +
                                                static_cast<std::size_t>(i0 + i) * a.act_row_bytes);
  }
  for (int r = row_begin; r < row_end; ++r) {
    const auto* blocks = reinterpret_cast<const typename T::Block*>(w.Row(r));
    __m256 acc[MI];
#pragma GCC unroll 8
    for (int i = 0; i < MI; ++i) acc[i] = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
      // The weight stream a fixed distance ahead (rows are contiguous: across row ends too).
      internal::PrefetchStreamLines<sizeof(typename T::Block)>(
          reinterpret_cast<const char*>(blocks + b) + kPrefetchAheadBytes);
      const typename T::Block& block = blocks[b];
      const typename T::Header h = T::Begin(block);
      __m256i sumi[MI];
#pragma GCC unroll 8
      for (int i = 0; i < MI; ++i) sumi[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int j = 0; j < T::kSubBlocks; ++j) {
        const __m256i q = T::Quants(block, j);
        const __m256i sc = T::Scale(h, j);
#pragma GCC unroll 8
        for (int i = 0; i < MI; ++i) {
          const __m256i p = _mm256_maddubs_epi16(q, Load256(act[i][b].qs + 32 * j));
          sumi[i] = _mm256_add_epi32(sumi[i], _mm256_madd_epi16(p, sc));
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < MI; ++i) acc[i] = T::Finish(h, act[i][b], sumi[i], acc[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MI; ++i) Store(a, i0 + i, r, HorizontalSum(acc[i]));
  }
}

// Every activation row in tiles of kMaxSuperActRows.
template <class T>
void SuperRows(const RowsKernelArgs& a, int row_begin, int row_end) {
  ForRowTiles<kMaxSuperActRows>(
      a.m, [&]<int MI>(int i0) { SuperRowTile<T, MI>(a, i0, row_begin, row_end); });
}

// ---- F16 / BF16: widened to fp32, FMA on the fp32 activations ----

template <GgmlType kType>
inline __m256 Widen8(const std::uint16_t* p) noexcept {
  const __m128i h = Load128(p);
  if constexpr (kType == GgmlType::kF16) {
    return _mm256_cvtph_ps(h);
  } else {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <GgmlType kType>
inline float Widen1(std::uint16_t h) noexcept {
  if constexpr (kType == GgmlType::kF16) {
    return HalfToFloat(h);
  } else {
    return Bf16ToFloat(h);
  }
}

template <GgmlType kType, int MI>
void HalfRowTile(const RowsKernelArgs& a, int i0, int row_begin, int row_end) noexcept {
  constexpr int kChains = std::max(1, 4 / MI);
  const quant::WeightMatrix& w = *a.w;
  const int cols = w.cols;
  const float* x[MI];
#pragma GCC unroll 4
  for (int i = 0; i < MI; ++i) {
    x[i] =
        reinterpret_cast<const float*>(a.act + static_cast<std::size_t>(i0 + i) * a.act_row_bytes);
  }
  for (int r = row_begin; r < row_end; ++r) {
    const auto* row = reinterpret_cast<const std::uint16_t*>(w.Row(r));
    __m256 acc[MI][kChains];
#pragma GCC unroll 4
    for (int i = 0; i < MI; ++i) {
#pragma GCC unroll 4
      for (int c = 0; c < kChains; ++c) acc[i][c] = _mm256_setzero_ps();
    }
    int k = 0;
    for (; k + 8 * kChains <= cols; k += 8 * kChains) {
      // A step reads 16 kChains bytes: one prefetch each, a line's first reaching it (at MI >= 2
      // the others are redundant and cheap beside the step's MI x kChains FMAs).
      internal::PrefetchStreamLines<1>(reinterpret_cast<const char*>(row + k) +
                                       kPrefetchAheadBytes);
#pragma GCC unroll 4
      for (int c = 0; c < kChains; ++c) {
        const __m256 wv = Widen8<kType>(row + k + 8 * c);
#pragma GCC unroll 4
        for (int i = 0; i < MI; ++i) {
          acc[i][c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[i] + k + 8 * c), acc[i][c]);
        }
      }
    }
    for (; k + 8 <= cols; k += 8) {
      const __m256 wv = Widen8<kType>(row + k);
#pragma GCC unroll 4
      for (int i = 0; i < MI; ++i) {
        acc[i][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[i] + k), acc[i][0]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MI; ++i) {
      __m256 sum = acc[i][0];
#pragma GCC unroll 4
      for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[i][c]);
      float v = HorizontalSum(sum);
      for (int t = k; t < cols; ++t) v += Widen1<kType>(row[t]) * x[i][t];
      Store(a, i0 + i, r, v);
    }
  }
}

template <GgmlType kType>
void HalfRows(const RowsKernelArgs& a, int row_begin, int row_end) {
  ForRowTiles<kMaxActRows>(
      a.m, [&]<int MI>(int i0) { HalfRowTile<kType, MI>(a, i0, row_begin, row_end); });
}

}  // namespace

QuantKernel Kernel(GgmlType type) noexcept {
  constexpr std::string_view kName = "avx2";
  const auto kernel = [&](RowsKernel rows, int dequant_gemm_min_rows = kDequantGemmMinRows) {
    return QuantKernel{rows, kName, nullptr, dequant_gemm_min_rows};
  };
  switch (type) {
    case GgmlType::kQ8_0:
      return kernel(Rows<SignedBlocks32<quant::BlockQ8_0>>);
    case GgmlType::kQ4_0:
      return kernel(Rows<SignedBlocks32<quant::BlockQ4_0>>);
    case GgmlType::kQ5_0:
      return kernel(Rows<SignedBlocks32<quant::BlockQ5_0>>);
    case GgmlType::kQ4_1:
      return kernel(Rows<MinBlocks32<quant::BlockQ4_1>>);
    case GgmlType::kQ5_1:
      return kernel(Rows<MinBlocks32<quant::BlockQ5_1>>);
    case GgmlType::kQ4_K:
      return kernel(SuperRows<KMin<quant::BlockQ4_K>>, kSuperDequantGemmMinRows);
    case GgmlType::kQ5_K:
      return kernel(SuperRows<KMin<quant::BlockQ5_K>>, kSuperDequantGemmMinRows);
    case GgmlType::kQ6_K:
      return kernel(SuperRows<Q6K>, kSuperDequantGemmMinRows);
    case GgmlType::kF16:
      return kernel(HalfRows<GgmlType::kF16>);
    case GgmlType::kBF16:
      return kernel(HalfRows<GgmlType::kBF16>);
    default:
      return {};
  }
}

}  // namespace metronome::kernels::avx2
