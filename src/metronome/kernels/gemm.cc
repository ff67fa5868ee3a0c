#include "metronome/kernels/gemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "metronome/base/check.h"

namespace metronome::kernels {

void MatMulTransposedB(const float* x, int m, int k, const float* w, int n, float* y,
                       bool accumulate, int ldy) noexcept {
  // dnnl_sgemm is row-major. It only fails for invalid arguments, which the engine never passes.
  const dnnl_status_t st = dnnl_sgemm('N', 'T', m, n, k, 1.0f, x, k, w, k, accumulate ? 1.0f : 0.0f,
                                      y, ldy > 0 ? ldy : n);
  MTR_DCHECK(st == dnnl_success, "dnnl_sgemm rejected its arguments");
  (void)st;
}

double MeasureGemmPeakGflops(int n, int repeats) {
  const auto sz = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::vector<float> a(sz, 0.5f);
  std::vector<float> b(sz, 0.25f);
  std::vector<float> c(sz, 0.0f);
  MatMulTransposedB(a.data(), n, n, b.data(), n, c.data(), false);  // warm up threads and caches
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    MatMulTransposedB(a.data(), n, n, b.data(), n, c.data(), false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * static_cast<double>(n) * n / s / 1e9);
  }
  return best;
}

void SetNumThreads(int n) { omp_set_num_threads(n); }

int NumThreads() { return omp_get_max_threads(); }

}  // namespace metronome::kernels
