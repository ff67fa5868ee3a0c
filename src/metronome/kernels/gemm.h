// fp32 GEMM for the weight projections, backed by oneDNN (JIT kernels chosen for this CPU at run
// time; its OpenMP threads are the same pool as the engine's attention loops). All projections in
// the runtime have the form y[m, n] (+)= x[m, k] * W[n, k]^T with W row-major [out, in], the layout
// of ModelWeights.
#pragma once

namespace metronome::kernels {

// y = x * W^T (accumulate = false) or y += x * W^T (accumulate = true). y's rows are `ldy` floats
// apart (0: n).
void MatMulTransposedB(const float* x, int m, int k, const float* w, int n, float* y,
                       bool accumulate, int ldy = 0) noexcept;

// The fp32 GEMM throughput of the CPU it runs on, through the same backend: the best of a few runs
// of square products of size `n` (GFLOP/s). Used as the in-run "peak" for roofline fractions.
[[nodiscard]] double MeasureGemmPeakGflops(int n = 1024, int repeats = 5);

// Number of threads the backend and the engine's parallel loops use.
void SetNumThreads(int n);
[[nodiscard]] int NumThreads();

}  // namespace metronome::kernels
