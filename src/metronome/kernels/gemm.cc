#include "metronome/kernels/gemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "metronome/base/check.h"
#include "metronome/base/thread_pool.h"

namespace metronome::kernels {
namespace {

// Output columns are split in blocks of this many (a multiple of the 16-float AVX-512 vector and
// the 64-byte line), so every chunk's y columns start aligned like the whole row.
constexpr int kColumnsPerBlock = 16;
// Smallest chunk worth handing to another thread: ~128K flops (a 64K-MAC product, tens of
// microseconds), well above the pool's wake-up cost.
constexpr double kMinFlopsPerChunk = 128.0 * 1024.0;

// oneDNN (Debian's build uses the OpenMP runtime) would open its own libgomp team from every
// thread that calls it, and that team spin-waits. Our pool already gives every thread its share,
// so each thread tells OpenMP to use one thread (the ICV is per thread) before its first sgemm.
void SingleThreadedOneDnnOnThisThread() noexcept {
  thread_local const bool done = [] {
    omp_set_num_threads(1);
    return true;
  }();
  (void)done;
}

void SgemmColumns(const float* x, int m, int k, const float* w, int n0, int n1, int ldy, float* y,
                  bool accumulate) noexcept {
  SingleThreadedOneDnnOnThisThread();
  // dnnl_sgemm is row-major. It only fails for invalid arguments, which the engine never passes.
  const dnnl_status_t st =
      dnnl_sgemm('N', 'T', m, n1 - n0, k, 1.0f, x, k, w + static_cast<std::size_t>(n0) * k, k,
                 accumulate ? 1.0f : 0.0f, y + n0, ldy);
  MTR_DCHECK(st == dnnl_success, "dnnl_sgemm rejected its arguments");
  (void)st;
}

}  // namespace

void MatMulTransposedB(base::ThreadPool& pool, const float* x, int m, int k, const float* w, int n,
                       float* y, bool accumulate, int ldy) noexcept {
  // The N (output) dimension is cut across the pool: each chunk is one single-threaded sgemm over
  // all m rows and a block of W's rows, so each weight row is read by one thread only.
  const int y_stride = ldy > 0 ? ldy : n;
  const std::int64_t blocks = (n + kColumnsPerBlock - 1) / kColumnsPerBlock;
  const double flops_per_block = 2.0 * m * static_cast<double>(k) * kColumnsPerBlock;
  const auto min_blocks =
      static_cast<std::int64_t>(std::max(1.0, kMinFlopsPerChunk / std::max(1.0, flops_per_block)));
  pool.ParallelFor(blocks, min_blocks, [&](std::int64_t b, std::int64_t e) {
    const int n0 = static_cast<int>(b) * kColumnsPerBlock;
    const int n1 = std::min(n, static_cast<int>(e) * kColumnsPerBlock);
    SgemmColumns(x, m, k, w, n0, n1, y_stride, y, accumulate);
  });
}

double MeasureGemmPeakGflops(base::ThreadPool& pool, int n, int repeats) {
  const auto sz = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::vector<float> a(sz, 0.5f);
  std::vector<float> b(sz, 0.25f);
  std::vector<float> c(sz, 0.0f);
  MatMulTransposedB(pool, a.data(), n, n, b.data(), n, c.data(),
                    false);  // warm up threads and caches
  double best = 0.0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    MatMulTransposedB(pool, a.data(), n, n, b.data(), n, c.data(), false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * static_cast<double>(n) * n / s / 1e9);
  }
  return best;
}

}  // namespace metronome::kernels
