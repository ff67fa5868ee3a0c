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

// Covers activation rows [0, m) with register tiles of kMaxRows rows and one of the rest (m = 32,
// kMaxRows = 6: five of 6 and one of 2), calling f.template operator()<R>(r) for each tile
// [r, r + R). Near-equal tiles (6, 6, 5, 5, 5, 5) were no faster in the integer GEMM (perf cycle
// ratios), so the full tiles come first: the integer GEMM's code is then the hand-written loop's.
// (The 16-bit kernels keep that loop written out: through this helper GCC 12 stops inlining their
// panel lambda and emits more vector moves.)
template <int kMaxRows, class F>
void ForRowTiles(int m, F&& f) noexcept {
  int r = 0;
  for (; r + kMaxRows <= m; r += kMaxRows) f.template operator()<kMaxRows>(r);
  ForCount<kMaxRows - 1>(m - r, [&]<int R>() { f.template operator()<R>(r); });
}

}  // namespace metronome::kernels
