#include "metronome/realtime/frame_summary.h"

#include <gtest/gtest.h>

#include <cmath>

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

TEST(FrameSummaryTest, TheCountsGoUnderTheirKeysAndTheLateFramesAreTheDeadlineMisses) {
  FrameSummary s;
  static_cast<FrameCounts&>(s) = CountOneTwoThreeFour();
  s.mute_alarms = 5;
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

TEST(FrameSummaryTest, TheJsonIsTheTextScriptsRead) {
  FrameSummary s;
  static_cast<FrameCounts&>(s) = CountOneTwoThreeFour();
  s.mute_alarms = 5;
  s.first_starved_at_s = 1.5;
  s.admitted = 6;
  s.arrivals = 14;
  s.rejected = 7;
  s.abandoned = 8;
  s.ended_by_error = 9;
  s.active_peak = 11;
  s.p50_frame_latency_ms = 12.5;
  s.deadline_ms = 40.0;
  s.duration_s = 3.25;
  s.kv_policy = "window";
  // Every key and value: those the summary wrote before FrameSummary held a FrameCounts, and the
  // arrivals with the rejections per arrival.
  EXPECT_EQ(s.ToJson().dump(),
            R"({"abandoned":8,"active_peak":11,"admitted":6,"arrivals":14,"deadline_misses":2,)"
            R"("deadline_ms":40.0,"duration_s":3.25,"ended_by_error":9,"first_starved_at_s":1.5,)"
            R"("frames":10,"kv_policy":"window","late_frames":2,"missed_frames":0,)"
            R"("mute_alarms":5,"ok_frames":1,)"
            R"("p50_frame_latency_ms":12.5,"p99_frame_latency_ms":null,"rejected":7,)"
            R"("rejections_per_arrival":0.5,"short_frames":4,"starved_frames":3})");
}

TEST(FrameSummaryTest, RejectionsPerArrivalAreUnknownBeforeAnyArrival) {
  FrameSummary s;
  s.rejected = 3;
  EXPECT_TRUE(std::isnan(s.rejections_per_arrival()));
  EXPECT_TRUE(s.ToJson()["rejections_per_arrival"].is_null());
  s.arrivals = 4;
  EXPECT_DOUBLE_EQ(s.rejections_per_arrival(), 0.75);
}

TEST(FrameCountsTest, AddOutcomesToWritesTheFramesOfEachOutcomeAndNothingElse) {
  FrameCounts c = CountOneTwoThreeFour();
  c.mute_alarms = 5;  // not an outcome: a summary writes it itself
  nlohmann::json j = {{"kept", 1}};
  c.AddOutcomesTo(j);
  EXPECT_EQ(j.dump(), R"({"frames":10,"kept":1,"late_frames":2,"missed_frames":0,"ok_frames":1,)"
                      R"("short_frames":4,"starved_frames":3})");
}

}  // namespace
}  // namespace metronome::realtime
