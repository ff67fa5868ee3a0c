// Register transposes shared by the AVX-512 weight kernels (quant_matmul_avx512*.cc): the
// batched kernels keep 16 weight rows in the 16 int32 lanes of a vector, 4 bytes (4 int8 quants
// or 2 bf16 values) of one row per lane, so each weight tile is transposed once when unpacked.
// Include only from translation units compiled with AVX-512 flags. Internal linkage on purpose
// (each such translation unit gets its own copy; see attention_loop.h).
#pragma once

#include <immintrin.h>

namespace metronome::kernels::avx512 {
namespace {  // internal linkage per translation unit, see above

// 8x8 transposes of dwords in both 256-bit halves: in[p] = [row p | row p + 8] (8 dwords each),
// out[t] = [dword t of rows 0..7 | dword t of rows 8..15].
[[maybe_unused]] inline void Transpose16x8(const __m512i (&in)[8], __m512i (&out)[8]) noexcept {
  __m512i t[8];
  __m512i u[8];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm512_unpacklo_epi32(in[2 * p], in[2 * p + 1]);
    t[2 * p + 1] = _mm512_unpackhi_epi32(in[2 * p], in[2 * p + 1]);
  }
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {  // rows 0-3 (h = 0) and 4-7 of each half
    u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  // u[c] (rows 0-3) and u[4 + c] (rows 4-7): 128-bit lane 2 e + k holds dword 4 k + c of half e.
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    out[c] = _mm512_permutex2var_epi64(u[c], lo, u[4 + c]);
    out[4 + c] = _mm512_permutex2var_epi64(u[c], hi, u[4 + c]);
  }
}

}  // namespace
}  // namespace metronome::kernels::avx512
