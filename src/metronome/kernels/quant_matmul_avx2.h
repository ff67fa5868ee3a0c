// AVX2 entries of the per-type kernel table (quant_matmul.h: RowsKernel, chosen once in
// SelectKernels) for x86-64 CPUs without the AVX-512 VNNI kernels (Zen 2 / Zen 3, Intel before
// Ice Lake server, most desktop parts). Callable only after CpuHasAvx2Fma() (cpu_features.h).
//
// Integer paths compute the scalar kernels' integer block dots exactly, with vpmaddubsw (u8 x s8
// -> s16 pairs) and vpmaddwd (-> s32): signed weights (Q8_0; Q4_0 and Q5_0 after their offset) go
// through the sign trick (|w| as unsigned times a with w's sign), which cannot saturate for
// |w| <= 128 and activations in [-127, 127]; unsigned quants (<= 63) multiply the activations
// directly, K-quant sub-block scales in the same vpmaddwd, Q6_K's offset as -32 sum(sc a) from
// BlockQ8_K::bsums, the mins as m d_a sum(a). The int32 sums go to fp32 once per block, so the
// result differs from the scalar kernel only by fp32 rounding of scale products and summation
// order (tests/kernels/quant_matmul_avx2_test.cc). F16 (F16C) and BF16 weights are widened to
// fp32 and multiplied with the fp32 activations by FMA.
//
// Row-major weights only (PreferredRowLayout interleaves for the AVX-512 kernels alone). Each
// weight block is unpacked once and dotted with up to 4 activation rows from registers; at one or
// two activation rows several accumulator chains keep the FMA latency off the weight stream.
#pragma once

#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/ggml_type.h"

namespace metronome::kernels::avx2 {

// The AVX2 kernel of `type` ({nullptr, ""} for F32, which oneDNN runs, and for types without one),
// named "avx2". Every one hands compute-bound products to DequantGemmKernel like the scalar ones,
// from where dequant+sgemm is level or faster (bench/quant_benchmark BM_Prefill, path 3 against
// 1): m >= kDequantGemmMinRows, the K-quants (8-row sub-block tiles) from 2 x that.
[[nodiscard]] QuantKernel Kernel(quant::GgmlType type) noexcept;

}  // namespace metronome::kernels::avx2
