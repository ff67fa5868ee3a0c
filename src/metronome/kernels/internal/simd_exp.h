// e^x on 16 fp32 lanes, shared by the softmax of vector_ops.cc and the blockwise attention kernel.
//
// Internal linkage on purpose (as internal/attention_loop.h): paged_attention_bf16.cc includes this
// header under an AVX512_BF16 target pragma, so each translation unit gets its own copy.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

namespace metronome::kernels {
namespace {  // internal linkage per translation unit, see above

// e^x as 2^n * e^r with n = round(x log2 e), |r| <= ln2/2, e^r by its degree-7 Taylor polynomial
// (relative error < 1e-8 before rounding). x is clamped to [-87, 88]: below, the result is ~0
// (softmax tails; callers that need an exact 0 mask it), above, it would overflow fp32.
inline __m512 Exp(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln2 split hi/lo
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace
}  // namespace metronome::kernels
#endif
