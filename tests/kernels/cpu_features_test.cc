#include "metronome/kernels/cpu_features.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string_view>

namespace metronome::kernels {
namespace {

TEST(CpuFeaturesTest, IsaNamesParseBothWays) {
  for (const CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    EXPECT_EQ(ParseCpuIsa(ToString(isa)), isa) << ToString(isa);
  }
  for (const std::string_view bad : {"", "AVX2", "avx-512", "avx512vnni", "sse4", " avx2"}) {
    EXPECT_EQ(ParseCpuIsa(bad), std::nullopt) << "'" << bad << "'";
  }
}

// The feature answers follow the active level, and the level never exceeds the cap this process
// was started under (tests/CMakeLists.txt runs this binary again under each cap).
TEST(CpuFeaturesTest, AnswersFollowTheCappedLevel) {
  const CpuIsa active = ActiveCpuIsa();
  EXPECT_EQ(CpuHasAvx512Vnni(), active == CpuIsa::kAvx512);
  EXPECT_EQ(CpuHasAvx2Fma(), active >= CpuIsa::kAvx2);
  EXPECT_TRUE(!CpuHasAvx512Bf16() || CpuHasAvx512Vnni());
  const char* cap = std::getenv("METRONOME_MAX_CPU_ISA");  // NOLINT(concurrency-mt-unsafe)
  if (cap == nullptr) GTEST_SKIP() << "not run under a cap";
  const std::optional<CpuIsa> level = ParseCpuIsa(cap);
  ASSERT_TRUE(level.has_value()) << cap;
  EXPECT_LE(active, *level);
}

}  // namespace
}  // namespace metronome::kernels
