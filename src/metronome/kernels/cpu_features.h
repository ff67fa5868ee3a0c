// What this CPU can run, asked once (CPUID through the compiler's builtins). Kernels compiled for
// instruction sets beyond the build's baseline are only called after these say yes.
#pragma once

namespace metronome::kernels {

// AVX2 + FMA (and F16C, which every AVX2 CPU has): the kernels of quant_matmul_avx2.h.
[[nodiscard]] bool CpuHasAvx2Fma() noexcept;
// AVX-512 F + BW + VL + DQ + VNNI (vpdpbusd): the int8 paths of the quantised kernels and F16.
[[nodiscard]] bool CpuHasAvx512Vnni() noexcept;
// CpuHasAvx512Vnni() plus AVX512_BF16 (vdpbf16ps, vcvtne2ps2bf16): the BF16 weight path.
[[nodiscard]] bool CpuHasAvx512Bf16() noexcept;

}  // namespace metronome::kernels
