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

// Covers activation rows [0, m) with ceil(m / kMaxRows) register tiles of near-equal size and
// calls f.template operator()<R>(r) for each tile [r, r + R): m = 32 with kMaxRows = 6 runs
// 6, 6, 5, 5, 5, 5 rather than five of 6 and one of 2. The count of tiles (so of weight vector
// loads) is the same either way; a short tile has too few independent accumulators to cover the
// latency of its dot-product instructions.
template <int kMaxRows, class F>
void ForRowTiles(int m, F&& f) noexcept {
  const int tiles = (m + kMaxRows - 1) / kMaxRows;
  int r = 0;
  for (int t = 0; t < tiles; ++t) {
    const int tiles_left = tiles - t;
    const int rows = (m - r + tiles_left - 1) / tiles_left;
    ForCount<kMaxRows>(rows, [&]<int R>() { f.template operator()<R>(r); });
    r += rows;
  }
}

}  // namespace metronome::kernels
