// What this CPU can run, asked once (CPUID through the compiler's builtins). Kernels compiled for
// instruction sets beyond the build's baseline are only called after these say yes.
//
// The answers are capped by the environment variable METRONOME_MAX_CPU_ISA (read once, like
// oneDNN's ONEDNN_MAX_CPU_ISA): `avx512` (no cap), `avx2` or `scalar`. A CPU with AVX-512 then
// runs the engine on the AVX2 or the scalar kernels end to end, which is how CI checks those paths
// on such a CPU and how a benchmark measures an AVX2 machine's kernels on a wider one. The cap
// governs this project's kernels only; the build's baseline (METRONOME_ARCH) and oneDNN's own
// dispatch stay as they are.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace metronome::kernels {

// The instruction-set levels the kernels are written for, narrowest first.
enum class CpuIsa : std::uint8_t { kScalar, kAvx2, kAvx512 };

[[nodiscard]] const char* ToString(CpuIsa isa) noexcept;
// "scalar", "avx2" or "avx512"; nullopt for anything else.
[[nodiscard]] std::optional<CpuIsa> ParseCpuIsa(std::string_view name) noexcept;

// The widest level the kernels use on this CPU under the cap. A METRONOME_MAX_CPU_ISA value that
// names no level leaves the CPU uncapped and is reported once on stderr.
[[nodiscard]] CpuIsa ActiveCpuIsa() noexcept;

// AVX2 + FMA (and F16C, which every AVX2 CPU has): the kernels of quant_matmul_avx2.h.
[[nodiscard]] bool CpuHasAvx2Fma() noexcept;
// AVX-512 F + BW + VL + DQ + VNNI (vpdpbusd): the int8 paths of the quantised kernels and F16.
[[nodiscard]] bool CpuHasAvx512Vnni() noexcept;
// CpuHasAvx512Vnni() plus AVX512_BF16 (vdpbf16ps, vcvtne2ps2bf16): the BF16 weight path.
[[nodiscard]] bool CpuHasAvx512Bf16() noexcept;

}  // namespace metronome::kernels
