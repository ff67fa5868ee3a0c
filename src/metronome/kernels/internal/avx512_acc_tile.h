// The fp32 accumulators of a GEMM register tile, shared by the integer (quant_matmul_avx512.cc)
// and 16-bit (quant_matmul_avx512_float.cc) kernels: acc[i][g] holds y row i, columns
// [16 g, 16 g + 16). AVX-512 translation units only. always_inline: inlined before GCC's scalar
// replacement of aggregates, so the tile stays in registers; the integer GEMM's inner loops are
// then instruction for instruction those of the loops written out (objdump-compared).
#pragma once

#include <immintrin.h>

#include <cstddef>

namespace metronome::kernels {

template <int MT, int NT>
[[gnu::always_inline]] inline void ZeroAccumulators(__m512 (&acc)[MT][NT]) noexcept {
#pragma GCC unroll 8
  for (auto& row : acc) {
#pragma GCC unroll 8
    for (auto& a : row) a = _mm512_setzero_ps();
  }
}

// One accumulator into 16 floats at `out` (lanes masked by `mask`), added to them with
// `accumulate`.
[[gnu::always_inline]] inline void StoreAccumulator(float* out, __mmask16 mask, bool accumulate,
                                                    __m512 v) noexcept {
  if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, out));
  _mm512_mask_storeu_ps(out, mask, v);
}

// Writes the tile to y rows [0, MT) (row stride ldy floats), or adds it to what is there with
// `accumulate`; the last column group's lanes are masked by `last` (the panel's valid rows).
template <int MT, int NT>
[[gnu::always_inline]] inline void StoreAccumulators(const __m512 (&acc)[MT][NT], float* y, int ldy,
                                                     bool accumulate, __mmask16 last) noexcept {
#pragma GCC unroll 16
  for (int i = 0; i < MT; ++i) {
#pragma GCC unroll 8
    for (int g = 0; g < NT; ++g) {
      StoreAccumulator(y + static_cast<std::ptrdiff_t>(i) * ldy + 16 * g,
                       g == NT - 1 ? last : static_cast<__mmask16>(0xFFFF), accumulate, acc[i][g]);
    }
  }
}

}  // namespace metronome::kernels
