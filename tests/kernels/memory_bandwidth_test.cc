// The read-bandwidth probe returns a usable figure (positive, finite) on the engine's pool, as
// often as it is asked from one buffer, and 0 for a buffer too small to give every pool thread's
// slices one line per stream. Its value is a measurement of the machine: docs/performance.md
// compares it with oneDNN's GEMV in the same run; no timing is asserted here.
#include "metronome/kernels/memory_bandwidth.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>

#include "support/test_pool.h"

namespace metronome::kernels {
namespace {

TEST(MeasureReadBandwidth, IsPositiveAndFinite) {
  const double gbps = MeasureReadBandwidthGBps(testing::TestPool(), std::size_t{32} << 20, 2);
  EXPECT_GT(gbps, 0.0);
  EXPECT_TRUE(std::isfinite(gbps));
}

TEST(MeasureReadBandwidth, TooSmallABufferReportsZero) {
  EXPECT_EQ(MeasureReadBandwidthGBps(testing::TestPool(), 64, 1), 0.0);
  const ReadBandwidthProbe probe(testing::TestPool(), 64);
  EXPECT_EQ(probe.MeasureGBps(1), 0.0);
  EXPECT_EQ(probe.MeasureGBps(2), 0.0);
}

TEST(MeasureReadBandwidth, OneProbeMeasuresAgainAndAgain) {
  const ReadBandwidthProbe probe(testing::TestPool(), std::size_t{32} << 20);
  for (int i = 0; i < 3; ++i) {
    const double gbps = probe.MeasureGBps(1);
    EXPECT_GT(gbps, 0.0) << "measurement " << i;
    EXPECT_TRUE(std::isfinite(gbps)) << "measurement " << i;
  }
}

}  // namespace
}  // namespace metronome::kernels
