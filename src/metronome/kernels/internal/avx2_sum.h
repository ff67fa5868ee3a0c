// The horizontal sum of an 8-lane fp32 vector, shared by the AVX2 weight kernels
// (quant_matmul_avx2.cc) and the attention loop's AVX2 head (attention_loop.h, Avx2Vec). Include
// only where __AVX2__ is defined. Internal linkage on purpose (each translation unit gets its own
// copy, compiled for its own instruction set; see attention_loop.h).
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

namespace metronome::kernels::internal {
namespace {  // internal linkage per translation unit, see above

// lanes 0..7 summed as ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)): a fixed order, so a kernel's
// result does not depend on which caller sums it.
[[maybe_unused]] inline float HorizontalSum(__m256 v) noexcept {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace
}  // namespace metronome::kernels::internal
#endif
