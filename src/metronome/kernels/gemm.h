// fp32 GEMM for the weight projections, backed by oneDNN (JIT kernels chosen for this CPU at run
// time), run on the caller's thread pool: each pool chunk is one single-threaded sgemm. All
// projections in the runtime have the form y[m, n] (+)= x[m, k] * W[n, k]^T with W row-major
// [out, in], the layout of ModelWeights.
#pragma once

namespace metronome::base {
class ThreadPool;
}

namespace metronome::kernels {

// y = x * W^T (accumulate = false) or y += x * W^T (accumulate = true). y's rows are `ldy` floats
// apart (0: n). The output columns are split over `pool`'s threads.
void MatMulTransposedB(base::ThreadPool& pool, const float* x, int m, int k, const float* w, int n,
                       float* y, bool accumulate, int ldy = 0) noexcept;

// The fp32 GEMM throughput of the CPU it runs on, through the same backend on `pool`: the best of
// a few runs of square products of size `n` (GFLOP/s). Used as the in-run "peak" for roofline
// fractions.
[[nodiscard]] double MeasureGemmPeakGflops(base::ThreadPool& pool, int n = 1024, int repeats = 5);

}  // namespace metronome::kernels
