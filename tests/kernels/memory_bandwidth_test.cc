// The read-bandwidth probe returns a usable figure (positive, finite) on the engine's pool, and 0
// for a buffer too small to give every pool thread's slices one line per stream. Its value is a
// measurement of the machine: docs/performance.md compares it with oneDNN's GEMV in the same run;
// no timing is asserted here.
#include "metronome/kernels/memory_bandwidth.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>

namespace metronome::kernels {
namespace {

TEST(MeasureReadBandwidth, IsPositiveAndFinite) {
  const double gbps = MeasureReadBandwidthGBps(std::size_t{32} << 20, 2);
  EXPECT_GT(gbps, 0.0);
  EXPECT_TRUE(std::isfinite(gbps));
}

TEST(MeasureReadBandwidth, TooSmallABufferReportsZero) {
  EXPECT_EQ(MeasureReadBandwidthGBps(64, 1), 0.0);
}

}  // namespace
}  // namespace metronome::kernels
