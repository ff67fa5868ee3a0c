// AVX-512 decode-path kernels (m <= kGemvMaxRows activation rows, quant_matmul.h): the `gemv`
// entries of the per-type kernel table. Callable only after CpuHasAvx512Vnni() (cpu_features.h).
// They compute exactly what the type's "avx512-vnni" rows kernel computes (same integer block
// dots, same scale algebra: quant_matmul_avx512.h), organised for streaming W at small m: several
// weight rows in flight per thread, software prefetch a few rows ahead, one reduction per output.
#pragma once

#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/ggml_type.h"

namespace metronome::kernels::avx512 {

// The m <= kGemvMaxRows kernel of `type` (the 32-element types, the K-quants, F16, BF16), or
// nullptr (F32, which oneDNN runs). BF16's uses vdpbf16ps: call it only after CpuHasAvx512Bf16().
// Requires args.m in [1, kGemvMaxRows]. Whether MatMul installs a type's kernel is decided by
// measurement (quant_matmul.cc, SelectKernels).
[[nodiscard]] RowsKernel GemvKernel(quant::GgmlType type) noexcept;

}  // namespace metronome::kernels::avx512
