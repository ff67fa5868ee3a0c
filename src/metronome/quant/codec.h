// Reference codecs of the computable ggml types: rows of fp32 to and from their stored blocks
// (quant/blocks.h), and the quantisation of activations for the integer dot products.
//
// DequantizeRow follows ggml's definitions exactly (bit for bit: the same products in fp32).
// QuantizeRow is our own quantiser; it writes valid blocks of the exact layout that any GGUF
// reader decodes the same way:
//   - 32-element types: round to nearest with the scale from the block's extreme (Q4_0/Q5_0: the
//     signed extreme maps to the lowest level, as ggml does; Q4_1/Q5_1: [min, max] over 15/31
//     steps; Q8_0: max|x| over 127 steps);
//   - K-quants: per sub-block the range [min(x, 0), max(x)] is covered (scales and mins rounded up
//     to the 6-bit grid of the f16 super-block scales), then for Q4_K/Q5_K a few smaller scales are
//     tried and the one with the least squared error kept;
//   - F16/BF16: round to nearest even (base/half.h).
// Every element is then within half a decoded step of its input for Q8_0/Q4_1/Q5_1/Q6_K and the
// range-covering K scales, within one step at the clamped extreme of Q4_0/Q5_0.
//
// Preconditions (checked in debug builds): Traits(type).computable, n a multiple of the block
// size. `out`/`blocks` hold n / block_elems blocks; no alignment is required.
#pragma once

#include <cstdint>

#include "metronome/quant/blocks.h"
#include "metronome/quant/ggml_type.h"

namespace metronome::quant {

void DequantizeRow(GgmlType type, const void* blocks, std::int64_t n, float* out) noexcept;
void QuantizeRow(GgmlType type, const float* x, std::int64_t n, void* out) noexcept;

// Activations for the dot kernels. x[i] = d * qs[i] with d = max|x| / 127 in fp32 (exact to half
// a step); n a multiple of 32 resp. 256.
void QuantizeActivationsQ8(const float* x, std::int64_t n, ActQ8Block32* out) noexcept;
void QuantizeActivationsQ8_K(const float* x, std::int64_t n, BlockQ8_K* out) noexcept;

}  // namespace metronome::quant
