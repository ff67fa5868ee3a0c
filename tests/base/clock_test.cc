#include "metronome/base/clock.h"

#include <gtest/gtest.h>

namespace metronome {
namespace {

using std::chrono::milliseconds;

TEST(ManualClockTest, MovesOnlyWhenTold) {
  ManualClock c(milliseconds(5));
  EXPECT_EQ(c.Now(), milliseconds(5));
  c.Advance(milliseconds(10));
  EXPECT_EQ(c.Now(), milliseconds(15));
  c.SleepUntil(milliseconds(100));
  EXPECT_EQ(c.Now(), milliseconds(100));
  c.SleepUntil(milliseconds(50));  // the past: no change
  EXPECT_EQ(c.Now(), milliseconds(100));
  EXPECT_DOUBLE_EQ(c.NowSeconds(), 0.1);
}

TEST(SteadyClockTest, IsMonotonicAndSleeps) {
  SteadyClock c;
  const Nanos a = c.Now();
  c.SleepUntil(a + milliseconds(2));
  EXPECT_GE(c.Now() - a, milliseconds(2));
}

}  // namespace
}  // namespace metronome
