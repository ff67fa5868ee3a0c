// AVX-512 kernels for y = x W^T with W kept in its stored type (quant/blocks.h), one function per
// weight type. Callers must first check CpuHasAvx512Vnni() (CpuHasAvx512Bf16() for BF16); the
// portable scalar kernels are the reference and the path on other CPUs.
//
// Shapes and layouts (every function):
//   W: n rows of k elements, row j at w + j * row_bytes, row_bytes = k / block_elems * block_bytes
//      of the type (ggml's layout: a row is a whole number of blocks, no padding between rows).
//   y: y[r * ldy + j] = sum_i x[r, i] * W[j, i] for r < m and j in [n_begin, n_end); other
//      columns are not touched, so threads may own disjoint column ranges of one y.
//   All counts are elements; nothing is allocated per call beyond a per-thread scratch that grows
//   to the largest activation tile seen (m * k bytes plus scales).
//
// Integer paths (vpdpbusd, u8 x s8 -> s32, sums of 4 products): every weight block is unpacked to
// unsigned bytes u = q + offset (Q8_0: q + 128; Q4_0: the nibble, offset 8; Q5_0: 5 bits, offset
// 16; Q6_K: 6 bits, offset 32; Q4_1/Q5_1/Q4_K/Q5_K: no offset, a min term instead), so
//   sum_i w_i a_i = d_w d_a (sum_i u_i q_i) - offset d_w d_a (sum_i q_i)   (+ min d_a sum_i q_i)
// and the activation sums sum_i q_i are computed once per activation block (Q8_K carries them as
// bsums). The integer dot of a block is exact; the result differs from a scalar evaluation of the
// same blocks only by the fp32 rounding of the scale products and the summation order.
// Tiles: a weight block is unpacked once per tile of up to 4 activation rows and reused from
// registers across them; a tile of 2 weight rows (a few KB) stays in L1 while all row tiles pass
// over it, so each weight byte comes from memory once per call.
#pragma once

#include <cstdint>

#include "metronome/quant/blocks.h"
#include "metronome/quant/ggml_type.h"

namespace metronome::kernels::avx512 {

// True for the types with an integer (VNNI) kernel below: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (their
// activations are BlockQ8_0 rows) and Q4_K, Q5_K, Q6_K (activations BlockQ8_K rows).
[[nodiscard]] bool HasIntKernel(quant::GgmlType type) noexcept;
// The activation block type a weight type's integer kernel takes: kQ8_0 or kQ8_K.
[[nodiscard]] quant::GgmlType ActivationType(quant::GgmlType weight_type) noexcept;

// x: m rows of k / 32 BlockQ8_0 each (row r at x + r * k / 32) for the 32-element types, or
// k / 256 BlockQ8_K each for the K-quants. Requires HasIntKernel(type) and k a multiple of the
// type's block size.
void QuantMatMul(quant::GgmlType type, const void* x, int m, int k, const void* w, int n_begin,
                 int n_end, float* y, int ldy) noexcept;

// W's rows [0, rows) as fp32 into out[rows, k] (row-major), exactly the values the integer
// kernel multiplies with: d * q (+ m / - offset terms) in fp32. The prefill path's tile of W for
// an fp32 GEMM. Requires HasIntKernel(type).
void DequantizeRows(quant::GgmlType type, const void* w, int rows, int k, float* out) noexcept;

// BF16 weights (w: n rows of k bf16 bit patterns), fp32 x [m, k] rounded to bf16 (nearest even)
// per call, products summed in fp32 by vdpbf16ps. Any k. The rounding of x is the only error
// beyond fp32 summation: relative ~2^-9 per product, measured in tests/kernels.
void Bf16MatMul(const float* x, int m, int k, const std::uint16_t* w, int n_begin, int n_end,
                float* y, int ldy) noexcept;

// F16 weights widened to fp32 per 16-element tile (vcvtph2ps), fp32 x and fp32 FMA. Any k.
void F16MatMul(const float* x, int m, int k, const std::uint16_t* w, int n_begin, int n_end,
               float* y, int ldy) noexcept;

}  // namespace metronome::kernels::avx512
