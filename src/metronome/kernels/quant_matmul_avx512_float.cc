// BF16 and F16 weight kernels of quant_matmul_avx512.h. Compiled with AVX-512 (+BF16) flags
// (kernels/CMakeLists.txt); Bf16MatMul is entered only after CpuHasAvx512Bf16(), F16MatMul after
// CpuHasAvx512Vnni().
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "metronome/kernels/quant_matmul.h"
#include "metronome/kernels/quant_matmul_avx512.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/weight_matrix.h"

namespace metronome::kernels::avx512 {
namespace {

constexpr int kRowTile = 4;     // activation rows per tile
constexpr int kWeightTile = 4;  // weight rows per tile: 16 accumulators, 8 operand registers

// ---- BF16: x rounded to bf16 once per call, rows padded with zeros to a multiple of 32 (one
// vdpbf16ps consumes 32 bf16 pairs-of-products into 16 fp32 lanes).
constexpr int kBf16Step = 32;

inline __m512bh AsBh(__m512i v) noexcept { return reinterpret_cast<__m512bh&>(v); }

template <int MT, int NT>
void TileBf16(const std::uint16_t* xb, int kpad, int k, const std::uint16_t* const* wrow, float* y,
              int ldy, bool accumulate) noexcept {
  __m512 acc[MT][NT];
#pragma GCC unroll 8
  for (auto& row : acc) {
#pragma GCC unroll 8
    for (auto& a : row) a = _mm512_setzero_ps();
  }
  for (int i0 = 0; i0 < kpad; i0 += kBf16Step) {
    const int left = k - i0;
    const __mmask32 mask = left >= kBf16Step ? ~__mmask32{0} : (__mmask32{1} << left) - 1;
    __m512i w[NT];
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) w[j] = _mm512_maskz_loadu_epi16(mask, wrow[j] + i0);
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const __m512i xv = _mm512_load_si512(xb + static_cast<std::ptrdiff_t>(i) * kpad + i0);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], AsBh(w[j]), AsBh(xv));
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

// ---- F16: 16 weights widened per vcvtph2ps, fp32 FMA against fp32 x.
constexpr int kF16Step = 16;

template <int MT, int NT>
void TileF16(const float* x, std::ptrdiff_t ldx, int k, const std::uint16_t* const* wrow, float* y,
             int ldy, bool accumulate) noexcept {
  __m512 acc[MT][NT];
#pragma GCC unroll 8
  for (auto& row : acc) {
#pragma GCC unroll 8
    for (auto& a : row) a = _mm512_setzero_ps();
  }
  for (int i0 = 0; i0 < k; i0 += kF16Step) {
    const int left = k - i0;
    const __mmask16 mask = left >= kF16Step ? static_cast<__mmask16>(0xFFFF)
                                            : static_cast<__mmask16>((1u << left) - 1);
    __m512 w[NT];
#pragma GCC unroll 8
    for (int j = 0; j < NT; ++j) {
      w[j] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, wrow[j] + i0));
    }
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * ldx + i0);
#pragma GCC unroll 8
      for (int j = 0; j < NT; ++j) acc[i][j] = _mm512_fmadd_ps(w[j], xv, acc[i][j]);
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

// The tile drivers shared by both types: `Tile<MT, NT>(row r, weight rows, y)`.
template <int NT, class Tile>
void RowTiles(int m, Tile&& tile) noexcept {
  int r = 0;
  for (; r + kRowTile <= m; r += kRowTile) tile.template operator()<kRowTile, NT>(r);
  switch (m - r) {
    case 3:
      tile.template operator()<3, NT>(r);
      break;
    case 2:
      tile.template operator()<2, NT>(r);
      break;
    case 1:
      tile.template operator()<1, NT>(r);
      break;
    default:
      break;
  }
}

template <class Tile>
void WeightTiles(int n_begin, int n_end, Tile&& tile) noexcept {
  int j = n_begin;
  for (; j + kWeightTile <= n_end; j += kWeightTile) tile.template operator()<kWeightTile>(j);
  switch (n_end - j) {
    case 3:
      tile.template operator()<3>(j);
      break;
    case 2:
      tile.template operator()<2>(j);
      break;
    case 1:
      tile.template operator()<1>(j);
      break;
    default:
      break;
  }
}

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
      const auto lane_mask = [](int n) {
        return n >= 16 ? static_cast<__mmask16>(0xFFFF)
                       : static_cast<__mmask16>(n > 0 ? (1u << n) - 1 : 0);
      };
      const __m512 lo = _mm512_maskz_loadu_ps(lane_mask(left), xr + i0);
      const __m512 hi = _mm512_maskz_loadu_ps(lane_mask(left - 16), xr + i0 + 16);
      // vcvtne2ps2bf16 puts its second operand in the low half; rounds to nearest even.
      const __m512bh packed = _mm512_cvtne2ps_pbh(hi, lo);
      _mm512_store_si512(out + i0, reinterpret_cast<const __m512i&>(packed));
    }
  }
  WeightTiles(row_begin, row_end, [&]<int NT>(int j) {
    const std::uint16_t* rows[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) rows[t] = reinterpret_cast<const std::uint16_t*>(w.Row(j + t));
    RowTiles<NT>(m, [&]<int MT, int NT2>(int r) {
      TileBf16<MT, NT2>(xb + static_cast<std::ptrdiff_t>(r) * kpad, kpad, k, rows,
                        a.y + static_cast<std::ptrdiff_t>(r) * a.ldy + j, a.ldy, a.accumulate);
    });
  });
}

void F16Rows(const RowsKernelArgs& a, int row_begin, int row_end) {
  const quant::WeightMatrix& w = *a.w;
  const int k = w.cols;
  if (a.m <= 0 || row_begin >= row_end || k <= 0) return;
  const auto* x = reinterpret_cast<const float*>(a.act);
  const auto ldx = static_cast<std::ptrdiff_t>(a.act_row_bytes / sizeof(float));
  WeightTiles(row_begin, row_end, [&]<int NT>(int j) {
    const std::uint16_t* rows[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) rows[t] = reinterpret_cast<const std::uint16_t*>(w.Row(j + t));
    RowTiles<NT>(a.m, [&]<int MT, int NT2>(int r) {
      TileF16<MT, NT2>(x + r * ldx, ldx, k, rows, a.y + static_cast<std::ptrdiff_t>(r) * a.ldy + j,
                       a.ldy, a.accumulate);
    });
  });
}

}  // namespace metronome::kernels::avx512
