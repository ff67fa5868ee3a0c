// BF16 and F16 weight kernels of quant_matmul_avx512.h. Compiled with AVX-512 (+BF16) flags
// (kernels/CMakeLists.txt); Bf16Rows is entered only after CpuHasAvx512Bf16(), F16Rows after
// CpuHasAvx512Vnni().
//
// Both are GEMM-form kernels like the integer ones (quant_matmul_avx512.cc): a panel of 16 * NT
// weight rows is transposed once per call so that int32 lane r of a vector holds weight row r,
// and one activation value (F16: an fp32 element; BF16: a bf16 pair) broadcast to all lanes
// updates 16 outputs per instruction, for MT activation rows per weight vector load. No
// horizontal sums; the panel (<= 200 KB at k = 1536) stays in L2 while every activation row
// passes over it.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "metronome/kernels/internal/avx512_acc_tile.h"
#include "metronome/kernels/internal/avx512_transpose.h"
#include "metronome/kernels/internal/for_count.h"
#include "metronome/kernels/quant_matmul.h"
#include "metronome/kernels/quant_matmul_avx512.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::kernels::avx512 {
namespace {

constexpr int kLanes = 16;     // weight rows per output vector
constexpr int kMaxGroups = 2;  // vectors of weight rows per panel (32 weight rows)
constexpr int kUnit = 16;      // 16-bit weights per row unpacked at a time (32 bytes, 8 dwords)

// Panel storage (a wrapper: a vector type as a template argument loses its alignment attribute).
struct alignas(64) VecI {
  __m512i v;
};
struct alignas(64) VecF {
  __m512 v;
};

// Activation rows per register tile: MT * NT fp32 accumulators + NT weight vectors.
constexpr int ActTile(int groups) { return groups == 1 ? 12 : 8; }

inline __mmask16 LaneMask(int n) noexcept {
  if (n >= kLanes) return static_cast<__mmask16>(0xFFFF);
  return static_cast<__mmask16>(n > 0 ? (1u << n) - 1u : 0u);
}

// Elements [16 u, 16 u + 16) of rows[0, 16) (16-bit values; past k: zeros) as 8 vectors: vector
// t holds in int32 lane r the pair of elements 16 u + 2 t, + 1 of row r (low half first).
inline void TransposeUnit(const std::uint16_t* const* rows, int u, int k,
                          __m512i (&out)[8]) noexcept {
  const int left = k - kUnit * u;
  const auto mask = static_cast<__mmask16>(LaneMask(left));
  __m512i in[8];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p) {
    const __m256i a = _mm256_maskz_loadu_epi16(mask, rows[p] + kUnit * u);
    const __m256i b = _mm256_maskz_loadu_epi16(mask, rows[p + 8] + kUnit * u);
    in[p] = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
  }
  Transpose16x8(in, out);
}

// A panel's NT groups of kLanes rows, unit by unit: put(g, u, t, v) takes TransposeUnit's out[t]
// of unit u of group g (how the panel stores it is the caller's).
template <int NT, class Put>
inline void TransposePanel(const std::uint16_t* const* rows, int units, int k, Put&& put) noexcept {
  for (int g = 0; g < NT; ++g) {
    for (int u = 0; u < units; ++u) {
      __m512i out[8];
      TransposeUnit(rows + kLanes * g, u, k, out);
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) put(g, u, t, out[t]);
    }
  }
}

// Runs `panel_fn.template operator()<NT>(rows, n, j)` for each panel of up to 32 weight rows
// starting at row j (rows past row_end repeat the last one; n valid).
template <class F>
void Panels(const quant::WeightMatrix& w, int row_begin, int row_end, F&& panel_fn) noexcept {
  for (int j = row_begin; j < row_end; j += kLanes * kMaxGroups) {
    const int n = row_end - j < kLanes * kMaxGroups ? row_end - j : kLanes * kMaxGroups;
    const std::uint16_t* rows[kLanes * kMaxGroups];
    for (int r = 0; r < kLanes * kMaxGroups; ++r) {
      rows[r] = reinterpret_cast<const std::uint16_t*>(w.Row(j + (r < n ? r : n - 1)));
    }
    if (n > kLanes) {
      panel_fn.template operator()<2>(rows, n, j);
    } else {
      panel_fn.template operator()<1>(rows, n, j);
    }
  }
}

// One register tile: y rows [0, MT) x columns [0, 16 NT) of a panel, acc[i][g] += the step's
// weight vector g times activation row i's operand of the step broadcast to all lanes. K (a
// policy, inlined: no call or type switch in the loop) supplies the panel's vector type, the
// broadcast and the multiply-add.
template <class K, int MT, int NT>
void Tile16(const typename K::Panel* panel, int steps, const typename K::Act* x, std::ptrdiff_t ldx,
            float* y, int ldy, bool accumulate, __mmask16 last) noexcept {
  __m512 acc[MT][NT];
  ZeroAccumulators(acc);
  for (int p = 0; p < steps; ++p) {
    typename K::Vec w[NT];
#pragma GCC unroll 8
    for (int g = 0; g < NT; ++g) w[g] = panel[static_cast<std::ptrdiff_t>(p) * NT + g].v;
#pragma GCC unroll 16
    for (int i = 0; i < MT; ++i) {
      const typename K::Vec xv = K::Broadcast(x + i * ldx, p);
#pragma GCC unroll 8
      for (int g = 0; g < NT; ++g) acc[i][g] = K::MulAdd(acc[i][g], w[g], xv);
    }
  }
  StoreAccumulators(acc, y, ldy, accumulate, last);
}

// ---- BF16: x rounded to bf16 (nearest even) once per call, rows padded with zeros to a
// multiple of 32; the panel holds bf16 pairs, vdpbf16ps adds two products per lane (a step = one
// pair of elements).
constexpr int kBf16Step = 32;

inline __m512bh AsBh(__m512i v) noexcept { return reinterpret_cast<__m512bh&>(v); }

struct Bf16Tile {
  using Panel = VecI;
  using Vec = __m512i;
  using Act = std::uint16_t;
  static __m512i Broadcast(const std::uint16_t* row, int pair_index) noexcept {
    std::int32_t pair = 0;
    std::memcpy(&pair, row + 2 * pair_index, 4);
    return _mm512_set1_epi32(pair);
  }
  static __m512 MulAdd(__m512 acc, __m512i w, __m512i x) noexcept {
    return _mm512_dpbf16_ps(acc, AsBh(w), AsBh(x));
  }
};

// ---- F16: the panel widened to fp32 once per call; fp32 FMA against fp32 x broadcast (a step =
// one element).
struct F16Tile {
  using Panel = VecF;
  using Vec = __m512;
  using Act = float;
  static __m512 Broadcast(const float* row, int e) noexcept { return _mm512_set1_ps(row[e]); }
  static __m512 MulAdd(__m512 acc, __m512 w, __m512 x) noexcept {
    return _mm512_fmadd_ps(w, x, acc);
  }
};

}  // namespace

void Bf16Rows(const RowsKernelArgs& a, int row_begin, int row_end) {
  const quant::WeightMatrix& w = *a.w;
  const int m = a.m;
  const int k = w.cols;
  if (m <= 0 || row_begin >= row_end || k <= 0) return;
  const int kpad = (k + kBf16Step - 1) / kBf16Step * kBf16Step;
  struct alignas(64) Line {
    std::uint16_t v[kBf16Step];
  };
  // The activations in bf16: m * k / 32 conversions per call, 1/32 of the call's dot products
  // (for a 32-row panel), so they are not worth a per-product activation format.
  thread_local std::vector<Line> scratch;
  const auto lines = static_cast<std::size_t>(m) * static_cast<std::size_t>(kpad / kBf16Step);
  if (scratch.size() < lines) scratch.resize(lines);
  auto* xb = reinterpret_cast<std::uint16_t*>(scratch.data());
  for (int r = 0; r < m; ++r) {
    const auto* xr =
        reinterpret_cast<const float*>(a.act + static_cast<std::size_t>(r) * a.act_row_bytes);
    std::uint16_t* out = xb + static_cast<std::ptrdiff_t>(r) * kpad;
    for (int i0 = 0; i0 < kpad; i0 += kBf16Step) {
      const int left = k - i0;
      const __m512 lo = _mm512_maskz_loadu_ps(LaneMask(left), xr + i0);
      const __m512 hi = _mm512_maskz_loadu_ps(LaneMask(left - 16), xr + i0 + 16);
      // vcvtne2ps2bf16 puts its second operand in the low half; rounds to nearest even.
      const __m512bh packed = _mm512_cvtne2ps_pbh(hi, lo);
      _mm512_store_si512(out + i0, reinterpret_cast<const __m512i&>(packed));
    }
  }
  const int units = (k + kUnit - 1) / kUnit;
  const int pairs = units * (kUnit / 2);
  thread_local std::vector<VecI> panel;
  Panels(w, row_begin, row_end, [&]<int NT>(const std::uint16_t* const* rows, int n, int j) {
    const auto need = static_cast<std::size_t>(pairs) * NT;
    if (panel.size() < need) panel.resize(need);
    TransposePanel<NT>(rows, units, k, [&](int g, int u, int t, __m512i v) {
      panel[static_cast<std::size_t>(8 * u + t) * NT + g].v = v;
    });
    const __mmask16 last = LaneMask(n - kLanes * (NT - 1));
    constexpr int kMt = ActTile(NT);
    int r = 0;
    const auto tile = [&]<int R>() {
      Tile16<Bf16Tile, R, NT>(panel.data(), pairs, xb + static_cast<std::ptrdiff_t>(r) * kpad, kpad,
                              a.y + static_cast<std::ptrdiff_t>(r) * a.ldy + j, a.ldy, a.accumulate,
                              last);
    };
    for (; r + kMt <= m; r += kMt) tile.template operator()<kMt>();
    ForCount<kMt - 1>(m - r, tile);
  });
}

void F16Rows(const RowsKernelArgs& a, int row_begin, int row_end) {
  const quant::WeightMatrix& w = *a.w;
  const int m = a.m;
  const int k = w.cols;
  if (m <= 0 || row_begin >= row_end || k <= 0) return;
  const auto* x = reinterpret_cast<const float*>(a.act);
  const auto ldx = static_cast<std::ptrdiff_t>(a.act_row_bytes / sizeof(float));
  const int units = (k + kUnit - 1) / kUnit;
  thread_local std::vector<VecF> panel;
  Panels(w, row_begin, row_end, [&]<int NT>(const std::uint16_t* const* rows, int n, int j) {
    const auto need = static_cast<std::size_t>(units) * kUnit * NT;
    if (panel.size() < need) panel.resize(need);
    TransposePanel<NT>(rows, units, k, [&](int g, int u, int t, __m512i v) {
      // Lane r of v: elements 2t (low 16 bits) and 2t + 1 of row r, widened.
      const __m512 even = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
      const __m512 odd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
      panel[static_cast<std::size_t>(kUnit * u + 2 * t) * NT + g].v = even;
      panel[static_cast<std::size_t>(kUnit * u + 2 * t + 1) * NT + g].v = odd;
    });
    const __mmask16 last = LaneMask(n - kLanes * (NT - 1));
    constexpr int kMt = ActTile(NT);
    int r = 0;
    const auto tile = [&]<int R>() {
      Tile16<F16Tile, R, NT>(panel.data(), k, x + r * ldx, ldx,
                             a.y + static_cast<std::ptrdiff_t>(r) * a.ldy + j, a.ldy, a.accumulate,
                             last);
    };
    for (; r + kMt <= m; r += kMt) tile.template operator()<kMt>();
    ForCount<kMt - 1>(m - r, tile);
  });
}

}  // namespace metronome::kernels::avx512
