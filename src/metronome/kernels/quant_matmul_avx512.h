// AVX-512 entries of the per-type kernel table (quant_matmul.h: RowsKernel, chosen once in
// SelectKernels). Everything here may be called only after CpuHasAvx512Vnni() (cpu_features.h);
// the scalar kernels stay the reference and the path on other CPUs.
//
// Integer paths (vpdpbusd, u8 x s8 -> s32, sums of 4 products): every weight block is unpacked to
// unsigned bytes u = q + offset (Q8_0: q + 128, i.e. the sign bit flipped; Q4_0: the nibble,
// offset 8; Q5_0: 5 bits, offset 16; Q6_K: 6 bits, offset 32; Q4_1/Q5_1/Q4_K/Q5_K: no offset, a
// min term instead), so for one block with activation quants a_i (scale d_a)
//   sum_i w_i x_i = d_w d_a sum_i u_i a_i - offset d_w d_a sum_i a_i   (+ m d_a sum_i a_i)
// where sum_i a_i comes with the activations (ActQ8Block32::sum, BlockQ8_K::bsums). The integer
// dot of a block is exact, so the result differs from the scalar kernel only by fp32 rounding of
// scale products and summation order (the offset term is subtracted in fp32: the error bound is
// relative to sum |x| (|w| + offset term), see tests/kernels/quant_matmul_avx512_test.cc).
// The kernels are GEMM-form (register-blocked): a panel of up to 32 weight rows (one call's work
// item) is unpacked once per call to unsigned bytes and transposed so that int32 lane r of a
// vector holds 4 consecutive quants of weight row r; each vpdpbusd multiplies it by 4 int8
// activation quants broadcast to all lanes, i.e. 64 multiply-adds for 16 outputs, and each
// unpacked weight vector is reused from a register by 6 (8 for a 16-row panel) activation rows.
// The int32 sums go to fp32 once per weight scale (32 elements; Q6_K 16) and the outputs are
// stored as vectors: no horizontal sums. The offset term starts the int32 sum (-offset times the
// activation sub-block sum); the min types add m_w d_a sum(a) in fp32. The activations are read
// in the format MatMul prepared once per product (ActQ8Block32 / BlockQ8_K); nothing is
// re-quantised or re-laid out per call.
// Floating paths: BF16 with vdpbf16ps on activations rounded to bf16 (nearest even) once per
// call (1/32 of the call's work), products summed in fp32 (error: the activation rounding,
// relative ~2^-9 per product); F16 widened to an fp32 panel once per call (vcvtph2ps), fp32 FMA
// on fp32 activations broadcast. Both on panels transposed like the integer ones.
#pragma once

#include <cstdint>

#include "metronome/kernels/quant_matmul.h"
#include "metronome/quant/blocks.h"
#include "metronome/quant/ggml_type.h"

namespace metronome::kernels::avx512 {

// The AVX-512 kernel of `type` ({nullptr, ""} when there is none: F32, which oneDNN runs, and BF16
// unless `bf16`, i.e. CpuHasAvx512Bf16()). Names: "avx512-vnni", "avx512-bf16", "avx512-f16c".
[[nodiscard]] QuantKernel Kernel(quant::GgmlType type, bool bf16) noexcept;

// quant::QuantizeActivationsQ8 / QuantizeActivationsQ8_K (quant/codec.h) bit for bit, 16 lanes
// at a time: the same fp32 max |x|, scale and products, rounding to nearest even (the default
// mode, as std::nearbyint), clamping to [-127, 127]; PrepareActivations' path on AVX-512 CPUs
// (the quantiser runs on the calling thread before the product is split over the pool, so a
// scalar one is a serial share of every batched product: quant_benchmark BM_DecodeWeights, m = 32).
void QuantizeActivationsQ8(const float* x, std::int64_t n, quant::ActQ8Block32* out) noexcept;
void QuantizeActivationsQ8_K(const float* x, std::int64_t n, quant::BlockQ8_K* out) noexcept;

// The kernels themselves (RowsKernel signatures), for Kernel() and the tests.
void Bf16Rows(const RowsKernelArgs& a, int row_begin, int row_end);
void F16Rows(const RowsKernelArgs& a, int row_begin, int row_end);

}  // namespace metronome::kernels::avx512
