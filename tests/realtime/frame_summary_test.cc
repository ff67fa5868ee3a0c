#include "metronome/realtime/frame_summary.h"

#include <gtest/gtest.h>

namespace metronome::realtime {
namespace {

// Distinct counts per outcome, so that a counter table in the wrong order cannot pass.
FrameCounts CountOneTwoThreeFour() {
  FrameCounts c;
  const FrameOutcome outcomes[] = {FrameOutcome::kOk, FrameOutcome::kLate, FrameOutcome::kStarved,
                                   FrameOutcome::kShort};
  for (int i = 0; i < 4; ++i) {
    for (int n = 0; n <= i; ++n) c.Count(outcomes[i]);
  }
  return c;
}

TEST(FrameCountsTest, EachOutcomeCountsInItsOwnField) {
  const FrameCounts c = CountOneTwoThreeFour();
  EXPECT_EQ(c.frames, 10);
  EXPECT_EQ(c.ok, 1);
  EXPECT_EQ(c.late, 2);
  EXPECT_EQ(c.starved, 3);
  EXPECT_EQ(c.short_frames, 4);
  EXPECT_EQ(c.of(FrameOutcome::kOk), 1);
  EXPECT_EQ(c.of(FrameOutcome::kLate), 2);
  EXPECT_EQ(c.of(FrameOutcome::kStarved), 3);
  EXPECT_EQ(c.of(FrameOutcome::kShort), 4);
}

TEST(FrameCountsTest, AValueOutsideTheEnumCountsAFrameAndNoOutcome) {
  FrameCounts c;
  c.Count(static_cast<FrameOutcome>(9));
  EXPECT_EQ(c.frames, 1);
  EXPECT_EQ(c.ok + c.late + c.starved + c.short_frames, 0);
  EXPECT_EQ(c.of(static_cast<FrameOutcome>(9)), 0);
}

TEST(FrameSummaryTest, SetCountsMapsEveryCounterAndTheLateFramesAreTheDeadlineMisses) {
  FrameCounts c = CountOneTwoThreeFour();
  c.mute_alarms = 5;
  FrameSummary s;
  s.SetCounts(c);
  const nlohmann::json j = s.ToJson();
  EXPECT_EQ(j["frames"], 10);
  EXPECT_EQ(j["ok_frames"], 1);
  EXPECT_EQ(j["late_frames"], 2);
  EXPECT_EQ(j["deadline_misses"], 2);
  EXPECT_EQ(j["starved_frames"], 3);
  EXPECT_EQ(j["short_frames"], 4);
  EXPECT_EQ(j["mute_alarms"], 5);
  EXPECT_TRUE(j["first_starved_at_s"].is_null());
}

}  // namespace
}  // namespace metronome::realtime
