#include "metronome/kernels/cpu_features.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "metronome/base/enum_names.h"

namespace metronome::kernels {
namespace {

constexpr std::array<EnumName<CpuIsa>, 3> kCpuIsaNames = {{
    {CpuIsa::kScalar, "scalar"},
    {CpuIsa::kAvx2, "avx2"},
    {CpuIsa::kAvx512, "avx512"},
}};

constexpr const char* kCapVariable = "METRONOME_MAX_CPU_ISA";

// FMA and F16C are not asked: every CPU with AVX-512F has both (and clang's
// __builtin_cpu_supports has no "f16c").
bool HardwareHasAvx512Vnni() noexcept {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

// F16C is not asked for the same reason: every CPU with AVX2 has it.
bool HardwareHasAvx2Fma() noexcept {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

// The cap from the environment; kAvx512 (none) when unset or unreadable.
CpuIsa CapFromEnvironment() noexcept {
  const char* value = std::getenv(kCapVariable);  // NOLINT(concurrency-mt-unsafe): read once
  if (value == nullptr || *value == '\0') return CpuIsa::kAvx512;
  if (const std::optional<CpuIsa> cap = ParseCpuIsa(value)) return *cap;
  std::fprintf(stderr, "warning: %s='%s' is not one of %s; not capping\n", kCapVariable, value,
               JoinedNames(kCpuIsaNames).c_str());
  return CpuIsa::kAvx512;
}

}  // namespace

const char* ToString(CpuIsa isa) noexcept { return NameOf(kCpuIsaNames, isa, "?"); }

std::optional<CpuIsa> ParseCpuIsa(std::string_view name) noexcept {
  return ValueOf(kCpuIsaNames, name);
}

CpuIsa ActiveCpuIsa() noexcept {
  static const CpuIsa isa = [] {
    const CpuIsa hardware = HardwareHasAvx512Vnni() ? CpuIsa::kAvx512
                            : HardwareHasAvx2Fma()  ? CpuIsa::kAvx2
                                                    : CpuIsa::kScalar;
    return std::min(hardware, CapFromEnvironment());
  }();
  return isa;
}

bool CpuHasAvx512Vnni() noexcept { return ActiveCpuIsa() >= CpuIsa::kAvx512; }

// An AVX-512 CPU without AVX2 does not exist: the level order holds.
bool CpuHasAvx2Fma() noexcept { return ActiveCpuIsa() >= CpuIsa::kAvx2; }

bool CpuHasAvx512Bf16() noexcept {
  static const bool has = CpuHasAvx512Vnni() && __builtin_cpu_supports("avx512bf16");
  return has;
}

}  // namespace metronome::kernels
