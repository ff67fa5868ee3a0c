// A run-time count turned into a template argument, for kernels whose register tiles are sized at
// compile time (the activation rows of a tile: quant_matmul_avx512*.cc, quant_gemv_avx512.cc).
#pragma once

namespace metronome::kernels {

// Calls f.template operator()<R>() for R = rem when 1 <= rem <= kMax; nothing otherwise.
template <int kMax, class F>
void ForCount(int rem, F&& f) noexcept {
  if constexpr (kMax > 0) {
    if (rem == kMax) {
      f.template operator()<kMax>();
    } else {
      ForCount<kMax - 1>(rem, f);
    }
  }
}

}  // namespace metronome::kernels
