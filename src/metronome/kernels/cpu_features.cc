#include "metronome/kernels/cpu_features.h"

namespace metronome::kernels {

// FMA and F16C are not asked: every CPU with AVX-512F has both (and clang's
// __builtin_cpu_supports has no "f16c").
bool CpuHasAvx512Vnni() noexcept {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
}

// F16C is not asked for the same reason: every CPU with AVX2 has it.
bool CpuHasAvx2Fma() noexcept {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

bool CpuHasAvx512Bf16() noexcept {
  static const bool has = CpuHasAvx512Vnni() && __builtin_cpu_supports("avx512bf16");
  return has;
}

}  // namespace metronome::kernels
