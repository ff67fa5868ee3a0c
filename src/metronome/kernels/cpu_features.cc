#include "metronome/kernels/cpu_features.h"

namespace metronome::kernels {

bool CpuHasAvx512Vnni() noexcept {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c") &&
                          __builtin_cpu_supports("fma");
  return has;
}

bool CpuHasAvx512Bf16() noexcept {
  static const bool has = CpuHasAvx512Vnni() && __builtin_cpu_supports("avx512bf16");
  return has;
}

}  // namespace metronome::kernels
