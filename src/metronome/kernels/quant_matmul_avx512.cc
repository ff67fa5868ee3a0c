// Integer (VNNI) kernels of quant_matmul_avx512.h. This file is compiled with AVX-512 flags
// (kernels/CMakeLists.txt) and only entered after CpuHasAvx512Vnni(): keep code that may run on
// any CPU out of it.
#include "metronome/kernels/quant_matmul_avx512.h"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "metronome/base/check.h"
#include "metronome/kernels/internal/avx512_acc_tile.h"
#include "metronome/kernels/internal/avx512_transpose.h"
#include "metronome/kernels/internal/avx512_unpack.h"
#include "metronome/kernels/internal/for_count.h"
#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::kernels::avx512 {
namespace {

using quant::GgmlType;
using quant::kQk32;
using quant::kQkK;

// ---- The GEMM form (the batched kernels): 16 weight rows per vector, one output per lane.
// A panel of 16 * NT weight rows is unpacked ONCE per call to unsigned bytes and transposed so
// that the 64 bytes of step t of a sub-block hold, in int32 lane r, elements 4 t .. 4 t + 3 of
// weight row r. One vpdpbusd with an activation row's 4 int8 quants of the same elements
// broadcast to all lanes then does 64 multiply-adds for 16 outputs at once: no horizontal sums,
// each activation dword loaded once per 16 * NT outputs, each unpacked weight vector reused by MT
// activation rows from a register. Per sub-block (a scale of the weight: 32 elements, Q6_K 16)
// the int32 sums go to fp32 once: acc += float(isum) * (d_w per lane * d_a); the offset of the
// unsigned weights (q + offset) is removed in integers, isum starting at -offset * sum(a) of the
// sub-block; the types with a min add m_w per lane * d_a sum(a). The activations are consumed in
// the format MatMul prepared once per product (ActQ8Block32 / BlockQ8_K): nothing is re-laid
// out per call.
constexpr int kLanes = 16;      // weight rows per output vector
constexpr int kMaxGroups = 2;   // vectors of weight rows per panel (32 weight rows)
constexpr int kUnitElems = 32;  // elements of a weight row unpacked at a time (one __m256i)

// Activation rows per register tile for NT groups: MT * NT int32 sums + MT * NT fp32
// accumulators + NT weight vectors stay within the 32 zmm registers.
constexpr int ActTile(int groups) { return groups == 1 ? 8 : 6; }

inline __m256i Low4(__m256i v) noexcept { return _mm256_and_si256(v, _mm256_set1_epi8(15)); }

// 16 nibble bytes of a 32-element block as its 32 elements (low nibbles first).
inline __m256i Nibbles32(const std::uint8_t* qs) noexcept {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return Low4(_mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1));
}

inline __m256i AddFifthBit(__m256i lo, const std::uint8_t* qh) noexcept {
  std::uint32_t h = 0;
  std::memcpy(&h, qh, 4);
  return _mm256_mask_add_epi8(lo, h, lo, _mm256_set1_epi8(16));
}

// Per type: Unpack(row, u, scale, min) returns elements [32 u, 32 u + 32) of a row as unsigned
// bytes and writes the scale (and min) of each of the unit's 32 / kSub sub-blocks; the value of an
// element is scale * (byte - kOffset) + min. The 32-element types differ only in how a block's
// quants become bytes (Bytes::Of, a policy class: inlined, no indirect call) and in whether a
// min follows the scale.
struct Q8_0Bytes {
  static __m256i Of(const quant::BlockQ8_0& b) noexcept {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)),
                            _mm256_set1_epi8(-128));
  }
};
struct NibbleBytes {
  template <class Block>
  static __m256i Of(const Block& b) noexcept {
    return Nibbles32(b.qs);
  }
};
struct FiveBitBytes {
  template <class Block>
  static __m256i Of(const Block& b) noexcept {
    return AddFifthBit(Nibbles32(b.qs), b.qh);
  }
};

template <class B, int kByteOffset, bool kHasMin, class Bytes>
struct Blocks32G {
  using Block = B;
  static constexpr bool kSuper = false;
  static constexpr int kSub = 32;
  static constexpr int kOffset = kByteOffset;
  static constexpr bool kMin = kHasMin;
  static __m256i Unpack(const Block* row, int u, float* scale, float* min) noexcept {
    scale[0] = Half(row[u].d);
    if constexpr (kHasMin) min[0] = Half(row[u].m);
    return Bytes::Of(row[u]);
  }
};
using Q8_0G = Blocks32G<quant::BlockQ8_0, 128, false, Q8_0Bytes>;
using Q4_0G = Blocks32G<quant::BlockQ4_0, 8, false, NibbleBytes>;
using Q4_1G = Blocks32G<quant::BlockQ4_1, 0, true, NibbleBytes>;
using Q5_0G = Blocks32G<quant::BlockQ5_0, 16, false, FiveBitBytes>;
using Q5_1G = Blocks32G<quant::BlockQ5_1, 0, true, FiveBitBytes>;

// The K-quants: the shared super-block decoders of avx512_unpack.h (Q4_KW, Q5_KW, Q6_KW), whose
// UnpackedSuper holds a row's 256 bytes and the fp32 scale of every element quad (scales decoded
// once per super-block, in vector registers); only the sub-block length and how the offset goes
// are the GEMM's.
template <class D>
struct SuperG {
  using Decoder = D;
  using Block = typename D::Block;
  static constexpr bool kSuper = true;
  static constexpr int kSub = D::kSubBlock;
  static constexpr int kOffset = static_cast<int>(D::kOffset);
  static constexpr bool kMin = D::kMin;
};
using Q4_KG = SuperG<Q4_KW>;
using Q5_KG = SuperG<Q5_KW>;
using Q6_KG = SuperG<Q6_KW>;

// The activations of sub-block s of a prepared row: its int8 quants, scale and quant sum.
struct ActBlock32 {  // quant::ActQ8Block32, sub-block = block
  static const quant::ActQ8Block32& B(const std::byte* row, int s) noexcept {
    return reinterpret_cast<const quant::ActQ8Block32*>(row)[s];
  }
  static const std::int8_t* Qs(const std::byte* row, int s) noexcept { return B(row, s).qs; }
  static float D(const std::byte* row, int s) noexcept { return B(row, s).d; }
  static int Sum(const std::byte* row, int s) noexcept { return B(row, s).sum; }
};
template <int kSub>
struct ActQ8K {  // quant::BlockQ8_K, sub-blocks of 32 (two bsums) or 16 (one)
  static constexpr int kPer = kQkK / kSub;
  static const quant::BlockQ8_K& B(const std::byte* row, int s) noexcept {
    return reinterpret_cast<const quant::BlockQ8_K*>(row)[s / kPer];
  }
  static const std::int8_t* Qs(const std::byte* row, int s) noexcept {
    return B(row, s).qs + kSub * (s % kPer);
  }
  static float D(const std::byte* row, int s) noexcept { return B(row, s).d; }
  static int Sum(const std::byte* row, int s) noexcept {
    const std::int16_t* bs = B(row, s).bsums + (kSub / 16) * (s % kPer);
    return kSub == 16 ? bs[0] : bs[0] + bs[1];
  }
};

// One sub-block of a panel of NT groups of 16 weight rows.
template <int kSub, int NT>
struct alignas(64) PanelSub {
  std::uint8_t w[kSub / 4][NT][64];  // step t, group g: lane r = elements 4t..4t+3 of row 16g+r
  float scale[NT][kLanes];
  float min[NT][kLanes];
};

// The next panel's weight bytes (contiguous rows), prefetched a slice per packed unit so that
// they arrive while this panel is packed and its tiles run: rows of a few hundred bytes are too
// short streams for the hardware prefetcher to ramp up on.
struct NextPanel {
  const char* begin = nullptr;
  std::size_t bytes = 0;
};
inline void PrefetchSlice(const NextPanel& next, int slice, int slices) noexcept {
  const std::size_t per = (next.bytes / static_cast<std::size_t>(slices) + 63) / 64 * 64;
  for (std::size_t off = per * static_cast<std::size_t>(slice);
       off < per * static_cast<std::size_t>(slice + 1) && off < next.bytes; off += 64) {
    _mm_prefetch(next.begin + off, _MM_HINT_T0);
  }
}

// Unpacks weight rows rows[0, 16 NT) (pointers; rows past the matrix repeat a valid one) into
// `panel` (subs sub-blocks).
template <class W, int NT>
void PackPanel(const typename W::Block* const* rows, int units, PanelSub<W::kSub, NT>* panel,
               const NextPanel& next) noexcept {
  constexpr int kSubsPerUnit = kUnitElems / W::kSub;
  constexpr int kSteps = W::kSub / 4;
  for (int g = 0; g < NT; ++g) {
    for (int u = 0; u < units; ++u) {
      PrefetchSlice(next, g * units + u, NT * units);
      __m512i in[8];
      float scale[kLanes][kSubsPerUnit];
      float min[kLanes][kSubsPerUnit] = {};
#pragma GCC unroll 8
      for (int p = 0; p < 8; ++p) {
        const __m256i a = W::Unpack(rows[kLanes * g + p], u, scale[p], min[p]);
        const __m256i b = W::Unpack(rows[kLanes * g + p + 8], u, scale[p + 8], min[p + 8]);
        in[p] = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
      }
      __m512i out[8];
      Transpose16x8(in, out);
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) {
        auto& sub = panel[kSubsPerUnit * u + t / kSteps];
        _mm512_store_si512(sub.w[t % kSteps][g], out[t]);
      }
      for (int s = 0; s < kSubsPerUnit; ++s) {
        auto& sub = panel[kSubsPerUnit * u + s];
        for (int r = 0; r < kLanes; ++r) {
          sub.scale[g][r] = scale[r][s];
          if constexpr (W::kMin) sub.min[g][r] = min[r][s];
        }
      }
    }
  }
}

// The same for the K-quants: 16 rows of a super-block decoded into UnpackedSuper (stack, 9 KB: L1),
// then transposed unit by unit; each sub-block's 16 scales (and mins) are one gather.
template <class W, int NT>
void PackPanelK(const typename W::Block* const* rows, int supers, PanelSub<W::kSub, NT>* panel,
                const NextPanel& next) noexcept {
  using Decoder = typename W::Decoder;
  constexpr int kSubsPerUnit = kUnitElems / W::kSub;
  constexpr int kSteps = W::kSub / 4;
  constexpr int kUnits = kQkK / kUnitElems;
  constexpr int kStride = static_cast<int>(sizeof(UnpackedSuper) / sizeof(float));
  const __m512i lane_stride =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(kStride));
  UnpackedSuper us[kLanes];
  for (int g = 0; g < NT; ++g) {
    for (int sb = 0; sb < supers; ++sb) {
      PrefetchSlice(next, g * supers + sb, NT * supers);
      for (int r = 0; r < kLanes; ++r) Decoder::Unpack(rows[kLanes * g + r][sb], &us[r]);
#pragma GCC unroll 2
      for (int u = 0; u < kUnits; ++u) {
        __m512i in[8];
#pragma GCC unroll 8
        for (int p = 0; p < 8; ++p) {
          const auto* a = reinterpret_cast<const __m256i*>(us[p].u[u / 2] + 32 * (u % 2));
          const auto* b = reinterpret_cast<const __m256i*>(us[p + 8].u[u / 2] + 32 * (u % 2));
          in[p] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_load_si256(a)),
                                     _mm256_load_si256(b), 1);
        }
        __m512i out[8];
        Transpose16x8(in, out);
        const int unit = kUnits * sb + u;
#pragma GCC unroll 8
        for (int t = 0; t < 8; ++t) {
          _mm512_store_si512(panel[kSubsPerUnit * unit + t / kSteps].w[t % kSteps][g], out[t]);
        }
#pragma GCC unroll 2
        for (int s = 0; s < kSubsPerUnit; ++s) {
          auto& sub = panel[kSubsPerUnit * unit + s];
          const int e = kUnitElems * u + W::kSub * s;  // first element of the sub-block
          _mm512_store_ps(sub.scale[g],
                          _mm512_i32gather_ps(lane_stride, &us[0].ws[e / 64][(e % 64) / 4], 4));
          if constexpr (W::kMin) {
            _mm512_store_ps(sub.min[g], _mm512_i32gather_ps(lane_stride, &us[0].wm[e / 16], 4));
          }
        }
      }
    }
  }
}

inline __m512i Broadcast4(const std::int8_t* p) noexcept {
  std::int32_t v = 0;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// y rows [0, MT) x columns [0, 16 NT) of the panel (the last group's lanes masked by `last`).
template <class W, class A, int MT, int NT>
void GemmTile(const PanelSub<W::kSub, NT>* panel, int subs, const std::byte* act,
              std::size_t act_row_bytes, float* y, int ldy, bool accumulate,
              __mmask16 last) noexcept {
  constexpr int kSteps = W::kSub / 4;
  const std::byte* rows[MT];
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) rows[i] = act + static_cast<std::size_t>(i) * act_row_bytes;
  __m512 acc[MT][NT];
  ZeroAccumulators(acc);
  for (int s = 0; s < subs; ++s) {
    const auto& p = panel[s];
    __m512i isum[MT][NT];
    const std::int8_t* q[MT];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      q[i] = A::Qs(rows[i], s);
      const __m512i init = W::kOffset != 0 ? _mm512_set1_epi32(-W::kOffset * A::Sum(rows[i], s))
                                           : _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int g = 0; g < NT; ++g) isum[i][g] = init;
    }
#pragma GCC unroll 8
    for (int t = 0; t < kSteps; ++t) {
      __m512i w[NT];
#pragma GCC unroll 8
      for (int g = 0; g < NT; ++g) w[g] = _mm512_load_si512(p.w[t][g]);
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const __m512i x = Broadcast4(q[i] + 4 * t);
#pragma GCC unroll 8
        for (int g = 0; g < NT; ++g) isum[i][g] = _mm512_dpbusd_epi32(isum[i][g], w[g], x);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const float da = A::D(rows[i], s);
      const __m512 dav = _mm512_set1_ps(da);
#pragma GCC unroll 8
      for (int g = 0; g < NT; ++g) {
        acc[i][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i][g]),
                                    _mm512_mul_ps(_mm512_load_ps(p.scale[g]), dav), acc[i][g]);
      }
      if constexpr (W::kMin) {
        const __m512 ms = _mm512_set1_ps(da * static_cast<float>(A::Sum(rows[i], s)));
#pragma GCC unroll 8
        for (int g = 0; g < NT; ++g) {
          acc[i][g] = _mm512_fmadd_ps(_mm512_load_ps(p.min[g]), ms, acc[i][g]);
        }
      }
    }
  }
  StoreAccumulators(acc, y, ldy, accumulate, last);
}

template <class W, class A, int NT>
void GemmPanel(const RowsKernelArgs& a, const typename W::Block* const* rows, int n, float* y,
               const NextPanel& next) noexcept {
  using Sub = PanelSub<W::kSub, NT>;
  const int units = a.w->cols / kUnitElems;
  const int subs = a.w->cols / W::kSub;
  thread_local std::vector<Sub> panel;
  if (panel.size() < static_cast<std::size_t>(subs)) panel.resize(static_cast<std::size_t>(subs));
  if constexpr (W::kSuper) {
    PackPanelK<W, NT>(rows, a.w->cols / kQkK, panel.data(), next);
  } else {
    PackPanel<W, NT>(rows, units, panel.data(), next);
  }
  const int tail = n - kLanes * (NT - 1);  // valid lanes of the last group, 1..16
  const auto last = static_cast<__mmask16>(tail >= kLanes ? 0xFFFFu : (1u << tail) - 1u);
  const auto at = [&a](int row) { return a.act + static_cast<std::size_t>(row) * a.act_row_bytes; };
  ForRowTiles<ActTile(NT)>(a.m, [&]<int R>(int r) {
    GemmTile<W, A, R, NT>(panel.data(), subs, at(r), a.act_row_bytes,
                          y + static_cast<std::ptrdiff_t>(r) * a.ldy, a.ldy, a.accumulate, last);
  });
}

template <class W, class A>
void RowsGemm(const RowsKernelArgs& a, int row_begin, int row_end) {
  using Block = typename W::Block;
  const quant::WeightMatrix& w = *a.w;
  if (a.m <= 0 || row_begin >= row_end) return;
  for (int j = row_begin; j < row_end; j += kLanes * kMaxGroups) {
    const int n = row_end - j < kLanes * kMaxGroups ? row_end - j : kLanes * kMaxGroups;
    const Block* rows[kLanes * kMaxGroups];
    for (int r = 0; r < kLanes * kMaxGroups; ++r) {
      rows[r] = reinterpret_cast<const Block*>(w.Row(j + (r < n ? r : n - 1)));
    }
    NextPanel next;
    const int next_row = j + kLanes * kMaxGroups;
    if (next_row < row_end) {
      const int next_rows = std::min(row_end - next_row, kLanes * kMaxGroups);
      next = {reinterpret_cast<const char*>(w.Row(next_row)),
              static_cast<std::size_t>(next_rows) * w.row_bytes};
    }
    if (n > kLanes) {
      GemmPanel<W, A, 2>(a, rows, n, a.y + j, next);
    } else {
      GemmPanel<W, A, 1>(a, rows, n, a.y + j, next);
    }
  }
}

}  // namespace

QuantKernel Kernel(GgmlType type, bool bf16) noexcept {
  constexpr std::string_view kVnni = "avx512-vnni";
  switch (type) {
    case GgmlType::kQ8_0:
      return {RowsGemm<Q8_0G, ActBlock32>, kVnni};
    case GgmlType::kQ4_0:
      return {RowsGemm<Q4_0G, ActBlock32>, kVnni};
    case GgmlType::kQ4_1:
      return {RowsGemm<Q4_1G, ActBlock32>, kVnni};
    case GgmlType::kQ5_0:
      return {RowsGemm<Q5_0G, ActBlock32>, kVnni};
    case GgmlType::kQ5_1:
      return {RowsGemm<Q5_1G, ActBlock32>, kVnni};
    case GgmlType::kQ4_K:
      return {RowsGemm<Q4_KG, ActQ8K<32>>, kVnni};
    case GgmlType::kQ5_K:
      return {RowsGemm<Q5_KG, ActQ8K<32>>, kVnni};
    case GgmlType::kQ6_K:
      return {RowsGemm<Q6_KG, ActQ8K<16>>, kVnni};
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
namespace {

// One activation block of kLen elements (a multiple of 16) quantised as quant/codec.cc's
// QuantizeSymmetric127 does; q[j] = the int32 quants of elements [16 j, 16 j + 16). Returns d.
template <int kLen>
float QuantizeBlock127(const float* x, std::int8_t* qs, __m512i (&q)[kLen / 16]) noexcept {
  constexpr int kVecs = kLen / 16;
  __m512 v[kVecs];
  __m512 amax = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int j = 0; j < kVecs; ++j) {
    v[j] = _mm512_loadu_ps(x + 16 * j);
    // max(|x|, amax) keeps amax where |x| is NaN, as std::max(amax, |x|) does.
    amax = _mm512_max_ps(_mm512_abs_ps(v[j]), amax);
  }
  const float am = _mm512_reduce_max_ps(amax);
  const __m512 inv = _mm512_set1_ps(am > 0.0f ? 127.0f / am : 0.0f);
#pragma GCC unroll 16
  for (int j = 0; j < kVecs; ++j) {
    // vcvtps2dq rounds by MXCSR: nearest even, the mode std::nearbyint uses by default.
    const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(v[j], inv));
    q[j] = _mm512_max_epi32(_mm512_min_epi32(r, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16 * j), _mm512_cvtepi32_epi8(q[j]));
  }
  return am / 127.0f;
}

}  // namespace

void QuantizeActivationsQ8(const float* x, std::int64_t n, quant::ActQ8Block32* out) noexcept {
  for (std::int64_t i = 0; i < n / kQk32; ++i) {
    quant::ActQ8Block32& b = out[i];
    __m512i q[2];
    b.d = QuantizeBlock127<kQk32>(x + kQk32 * i, b.qs, q);
    b.sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
  }
}

void QuantizeActivationsQ8_K(const float* x, std::int64_t n, quant::BlockQ8_K* out) noexcept {
  for (std::int64_t i = 0; i < n / kQkK; ++i) {
    quant::BlockQ8_K& b = out[i];
    __m512i q[kQkK / 16];
    b.d = QuantizeBlock127<kQkK>(x + kQkK * i, b.qs, q);
#pragma GCC unroll 16
    for (int k = 0; k < kQkK / 16; ++k) {
      b.bsums[k] = static_cast<std::int16_t>(_mm512_reduce_add_epi32(q[k]));
    }
  }
}

}  // namespace metronome::kernels::avx512
