// The control window aimd and gradient2 share: when it closes and what a close reports.
#include "metronome/admission/windowed_controller.h"

#include <gtest/gtest.h>

namespace metronome::admission {
namespace {

TEST(ControlWindowTest, ClosesAtWindowSOrOnFramesAfterMinWindowS) {
  ControlWindow w({.window_s = 2.0, .window_frames = 10, .min_window_s = 0.5});
  EXPECT_FALSE(w.Due(1.0, 3, 10));  // opens the window at t = 1
  for (int i = 0; i < 10; ++i) w.OnFrame(1.1);
  EXPECT_FALSE(w.Due(1.4, 5, 10));  // enough frames, but shorter than min_window_s
  EXPECT_TRUE(w.Due(1.5, 5, 10));
  EXPECT_FALSE(w.Due(1.5, 5, 11));  // 11 needed: only window_s closes it
  EXPECT_TRUE(w.Due(3.0, 5, 11));
}

TEST(ControlWindowTest, CloseReportsTheWindowAndOpensTheNext) {
  ControlWindow w({.window_s = 2.0, .window_frames = 0});
  EXPECT_FALSE(w.Due(0.0, 4, 0));
  for (int i = 0; i < 50; ++i) w.OnFrame(0.01 * i);
  w.NoteAdmitted(7);  // the load after the admission: peak 7
  w.NoteLimitRejection();
  EXPECT_FALSE(w.Due(1.0, 2, 0));  // window_frames 0: frames never close it
  const ClosedWindow c = w.Close(2.0, 3);
  EXPECT_DOUBLE_EQ(c.duration_s, 2.0);
  EXPECT_EQ(c.num_frames, 50);
  EXPECT_EQ(c.peak_active, 7);
  EXPECT_EQ(c.num_limit_rejections, 1);
  EXPECT_DOUBLE_EQ(w.last_frames_per_s(), 25.0);
  EXPECT_EQ(w.num_frames(), 0);
  const ClosedWindow next = w.Close(2.0, 1);  // the next window opened at 2 with peak 3
  EXPECT_EQ(next.peak_active, 3);
  EXPECT_EQ(next.num_limit_rejections, 0);
  EXPECT_DOUBLE_EQ(w.last_frames_per_s(), 0.0);  // no frames, no duration: no rate
}

TEST(ControlWindowTest, NextCloseAtTheLastWindowsFrameRate) {
  ControlWindow w({.window_s = 10.0, .window_frames = 100, .min_window_s = 1.0});
  EXPECT_DOUBLE_EQ(w.NextCloseS(0.0, 100), 10.0);  // no rate yet: window_s
  EXPECT_FALSE(w.Due(0.0, 1, 100));
  for (int i = 0; i < 50; ++i) w.OnFrame(0.1 * i);
  (void)w.Close(5.0, 1);  // 10 frames/s
  for (int i = 0; i < 80; ++i) w.OnFrame(5.0);
  EXPECT_DOUBLE_EQ(w.NextCloseS(5.5, 100), 7.5);    // 20 frames left at 10/s
  EXPECT_DOUBLE_EQ(w.NextCloseS(5.0, 50), 6.0);     // already enough: not before min_window_s
  EXPECT_DOUBLE_EQ(w.NextCloseS(20.0, 100), 20.0);  // never in the past
}

}  // namespace
}  // namespace metronome::admission
