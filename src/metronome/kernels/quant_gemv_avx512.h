// AVX-512 decode-path kernels (m <= kGemvMaxRows activation rows, quant_matmul.h): the `gemv`
// entries of the per-type kernel table. Callable only after CpuHasAvx512Vnni() (cpu_features.h).
// They compute exactly what the type's "avx512-vnni" rows kernel computes (same integer block
// dots, same scale algebra: quant_matmul_avx512.h), organised for streaming W at small m: several
// weight rows in flight per thread, software prefetch a few rows ahead, one reduction per output.
#pragma once

#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/ggml_type.h"

namespace metronome::kernels::avx512 {

// The m <= kGemvMaxRows kernel of `type`, or nullptr where the general rows kernel is used at every
// m (the K-quants, F16/BF16 and F32 for now). Requires args.m in [1, kGemvMaxRows].
[[nodiscard]] RowsKernel GemvKernel(quant::GgmlType type) noexcept;

}  // namespace metronome::kernels::avx512
