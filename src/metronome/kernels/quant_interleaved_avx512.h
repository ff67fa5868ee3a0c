// AVX-512 VNNI kernels for weights in the 16-row interleaved layout (quant/row_layout.h): Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K, every activation row count, decode and prefill.
// Callable only after CpuHasAvx512Vnni() (cpu_features.h). They compute the
// same integer block dots and the same scale algebra as the scalar kernel (d_w d_a per block,
// offsets folded in as -offset * sum of the activation block, mins as m * d_a * sum; the K-quants'
// integer sub-block scales exactly in int32), so they agree with it within fp32 rounding.
#pragma once

#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/ggml_type.h"

namespace metronome::kernels::avx512 {

// The kernel for an interleaved matrix of `type`, or nullptr for a type with no interleaved form.
// Rows kernels: [row_begin, row_end) must be whole 16-row groups (MatMul's row tiles are).
[[nodiscard]] RowsKernel InterleavedKernel(quant::GgmlType type) noexcept;

}  // namespace metronome::kernels::avx512
