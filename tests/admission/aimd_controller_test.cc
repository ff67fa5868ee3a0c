// Single-step direction tests of the AIMD law: one control window in, one decision out. Time is a
// plain double, so nothing sleeps.
#include "metronome/admission/aimd_controller.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace metronome::admission {
namespace {

constexpr double kDeadlineMs = 100.0;  // so latency_ms / 100 is the signal

SystemState Active(std::int64_t n) {
  return {.active_sessions = n, .free_blocks = 1000, .total_blocks = 1000, .reserved_blocks = 0};
}

// Runs one full control window starting at `t_s`: `num_frames` frames at `latency_ms`, 10 ms
// apart, `num_misses` of them missed (spread evenly, so apart in time unless there are many),
// `active` sessions throughout. Returns the time the window closed.
double RunWindow(AimdController& c, double t_s, std::int64_t active, double latency_ms,
                 int num_frames = 100, int num_misses = 0, double window_s = 2.0) {
  c.OnTick(t_s, Active(active));
  for (int i = 0; i < num_frames; ++i) {
    const bool missed = num_misses > 0 && i % (num_frames / num_misses) == 0 &&
                        i / (num_frames / num_misses) < num_misses;
    c.OnFrame(t_s + 0.01 * i, latency_ms, kDeadlineMs, missed);
  }
  c.OnTick(t_s + window_s, Active(active));
  return t_s + window_s;
}

// The additive law alone: no slow start, fixed step, windows of window_s (the tests of slow
// start, headroom growth and frame-closed windows set those themselves).
AimdOptions Options(std::int64_t initial_limit) {
  AimdOptions o;
  o.initial_limit = initial_limit;
  o.slow_start_factor = 1.0;
  o.headroom_gain = 0.0;
  o.window.window_frames = 0;
  return o;
}

TEST(AimdControllerTest, GrowsByStepWhenBindingAndBelowLowTarget) {
  AimdController c(Options(10), {});
  RunWindow(c, 0.0, /*active=*/10, /*latency_ms=*/50.0);
  EXPECT_EQ(c.limit(), 11);
  const auto changes = c.TakeLimitChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_DOUBLE_EQ(changes[0].t_s, 2.0);
  EXPECT_EQ(changes[0].from, 10);
  EXPECT_EQ(changes[0].to, 11);
  EXPECT_EQ(changes[0].reason,
            "increase (additive): p99/D=0.500 < 0.65 over 100 frames, binding (peak active 10, "
            "0 limit rejections), 0 of 100 frames of 10s over it; projected low-target crossing "
            "13");
  EXPECT_TRUE(c.TakeLimitChanges().empty());  // taken once
}

TEST(AimdControllerTest, GrowsByConfiguredStepWhenOneBelowLimit) {
  AimdOptions o = Options(10);
  o.increase_step = 3;
  AimdController c(o, {});
  RunWindow(c, 0.0, 9, 50.0);  // active >= limit - 1 binds
  EXPECT_EQ(c.limit(), 13);
}

TEST(AimdControllerTest, HoldsInsideTheDeadBand) {
  AimdController c(Options(10), {});
  double t = RunWindow(c, 0.0, 10, 65.0);  // exactly the low target: not below it
  t = RunWindow(c, t, 10, 75.0);
  RunWindow(c, t, 10, 85.0);  // exactly the high target: not above it
  EXPECT_EQ(c.limit(), 10);
  EXPECT_TRUE(c.TakeLimitChanges().empty());
}

TEST(AimdControllerTest, HoldsWhenLimitIsNotBinding) {
  AimdController c(Options(10), {});
  RunWindow(c, 0.0, 8, 30.0);
  EXPECT_EQ(c.limit(), 10);
  EXPECT_FALSE(c.last_window().binding);
}

TEST(AimdControllerTest, LimitRejectionMakesTheWindowBinding) {
  AimdController c(Options(10), {});
  c.OnTick(0.0, Active(5));
  const Decision d =
      c.Decide({.period_ms = 80.0, .deadline_ms = 100.0, .projected_blocks = 1}, Active(10), 0.5);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, "limit");
  EXPECT_EQ(d.detail, "work 10.00 + 1.00 > budget 10 (10 sessions active)");
  // Not growing and no session ended yet: one period, jittered.
  EXPECT_GE(d.retry_after_ms, 80.0);
  EXPECT_LT(d.retry_after_ms, 80.0 * (1.0 + RetryHint::kJitterFraction));
  for (int i = 0; i < 100; ++i) c.OnFrame(0.01 * i, 40.0, kDeadlineMs, false);
  c.OnTick(2.0, Active(5));
  EXPECT_EQ(c.last_window().num_limit_rejections, 1);
  EXPECT_TRUE(c.last_window().binding);
  EXPECT_EQ(c.limit(), 11);
}

TEST(AimdControllerTest, RetryAfterIsAtLeastOnePeriodAndJittered) {
  AimdController c(Options(1), {});
  c.OnTick(0.0, Active(1));
  const Decision d =
      c.Decide({.period_ms = 80.0, .deadline_ms = 100.0, .projected_blocks = 1}, Active(1), 1.99);
  // No session has ended and the limit is not growing: one period, jittered up to 1.5x.
  EXPECT_GE(d.retry_after_ms, 80.0);
  EXPECT_LT(d.retry_after_ms, 80.0 * (1.0 + RetryHint::kJitterFraction));
}

TEST(AimdControllerTest, RetryAfterWhileGrowingIsTheTimeToTheNextDecision) {
  AimdController c(Options(10), {});
  RunWindow(c, 0.0, 10, 50.0);  // grows to 11 at t = 2; the next window ends at t = 4
  ASSERT_EQ(c.limit(), 11);
  const Decision d =
      c.Decide({.period_ms = 80.0, .deadline_ms = 100.0, .projected_blocks = 1}, Active(11), 2.5);
  EXPECT_EQ(d.reason, "limit");
  EXPECT_GE(d.retry_after_ms, 1500.0);
  EXPECT_LT(d.retry_after_ms, 1500.0 * (1.0 + RetryHint::kJitterFraction));
}

TEST(AimdControllerTest, WindowsStillFillingHoldGrowthThatFullWindowsAllow) {
  // Signal 0.3 with 10 sessions at the limit: full windows grow; windows 10% full project the
  // signal to 0.3 x (1 + 0.25 x 9) = 0.975 at full KV, above the low target: hold.
  const SessionRequest r{.period_ms = 80.0, .deadline_ms = 100.0, .projected_blocks = 10};
  for (const std::int64_t held : {100, 10}) {
    AimdController c(Options(10), {});
    const SystemState st{.active_sessions = 10,
                         .free_blocks = 1000 - held,
                         .total_blocks = 1000,
                         .reserved_blocks = 100 - held};
    EXPECT_FALSE(c.Decide(r, st, 0.0).admit);  // at the limit
    RunWindow(c, 0.0, 10, 30.0);
    EXPECT_EQ(c.limit(), held == 100 ? 11 : 10) << held << " blocks held";
  }
}

TEST(AimdControllerTest, CutsToBetaTimesActiveOnHighLatency) {
  AimdController c(Options(20), {});
  RunWindow(c, 0.0, 20, 90.0);
  EXPECT_EQ(c.limit(), 18);  // floor(0.9 * 20)
  const auto changes = c.TakeLimitChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].reason,
            "cut: p99/D=0.900 > 0.85 over 100 frames, 5 bursts of late frames in 10 slots of 2 "
            "deadlines (stall rate 0.000 a slot); floor(0.9 * active 20) = 18");
  EXPECT_TRUE(c.cooling_down());
}

TEST(AimdControllerTest, CutUsesActiveNotLimit) {
  AimdController c(Options(40), {});
  RunWindow(c, 0.0, 25, 95.0);  // not binding, but overloaded: cut anyway
  EXPECT_EQ(c.limit(), 22);     // floor(0.9 * 25)
}

TEST(AimdControllerTest, CutsOnMissRatioEvenWithLowLatencyPercentile) {
  AimdController c(Options(20), {});
  // 0.3% > 0.1%, three misses 3.3 s apart: three bursts (two could be two stalls).
  RunWindow(c, 0.0, 20, 50.0, /*num_frames=*/1000, /*num_misses=*/3);
  EXPECT_EQ(c.limit(), 18);
  const auto changes = c.TakeLimitChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].reason.rfind("cut: miss ratio 0.0030 > 0.001", 0), 0u) << changes[0].reason;
}

// One engine stall: every frame in flight late at once. The window's p99 and miss ratio cross,
// but it is one burst of late frames: hold, and cut only when later windows confirm it.
TEST(AimdControllerTest, OneBurstOfLateFramesHoldsAndRepeatedBurstsCut) {
  AimdController c(Options(20), {});
  // A 2 s window: 100 frames 10 ms apart, the first `late` of them at 1.5 D (one burst), the rest
  // at 0.7 D (the dead band: no growth).
  const auto window = [&](double t_s, int late) {
    c.OnTick(t_s, Active(20));
    for (int i = 0; i < 100; ++i) {
      c.OnFrame(t_s + 0.01 * i, i < late ? 150.0 : 70.0, kDeadlineMs, i < late);
    }
    c.OnTick(t_s + 2.0, Active(20));
  };
  window(0.0, 20);  // 20% missed, p99 1.5 D, but one burst: hold
  EXPECT_EQ(c.limit(), 20);
  double t_s = 2.0;
  for (int k = 0; k < 9; ++k, t_s += 2.0) window(t_s, 0);  // the stall rate: 1 burst in 100 slots
  EXPECT_EQ(c.limit(), 20);
  for (int k = 0; k < 3; ++k, t_s += 2.0) {
    window(t_s, 20);  // P(>= 3 bursts in 30 slots at 0.01 a slot) = 0.0036: still stalls
    EXPECT_EQ(c.limit(), 20) << k;
  }
  window(t_s, 20);  // P(>= 4 in 40) = 0.0008 < 0.001: confirmed
  EXPECT_EQ(c.limit(), 18);
  const auto changes = c.TakeLimitChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_NE(changes[0].reason.find("4 bursts of late frames in 40 slots of 2 deadlines (stall "
                                   "rate 0.010 a slot)"),
            std::string::npos)
      << changes[0].reason;
}

TEST(AimdControllerTest, MissRatioAtThresholdDoesNotCut) {
  AimdController c(Options(20), {});
  RunWindow(c, 0.0, 10, 50.0, 1000, 1);  // 0.1%: not above
  EXPECT_EQ(c.limit(), 20);
}

TEST(AimdControllerTest, DrainCooldownCutsOnceUntilACleanWindow) {
  AimdController c(Options(20), {});
  double t = RunWindow(c, 0.0, 20, 90.0);
  ASSERT_EQ(c.limit(), 18);
  // Sessions admitted before the cut are still there (never evicted): latency stays high, but the
  // controller holds instead of cutting again.
  t = RunWindow(c, t, 20, 95.0);
  t = RunWindow(c, t, 19, 95.0);
  EXPECT_EQ(c.limit(), 18);
  EXPECT_TRUE(c.cooling_down());
  // A session ends mid-window: the window that saw 19 is not clean yet.
  c.OnTick(t, Active(19));
  c.OnTick(t + 0.5, Active(18));
  for (int i = 0; i < 100; ++i) c.OnFrame(t + 0.01 * i, 95.0, kDeadlineMs, false);
  t += 2.0;
  c.OnTick(t, Active(18));
  EXPECT_EQ(c.limit(), 18);
  // A whole window at active <= limit measures what the cut allows; still overloaded: cut again.
  RunWindow(c, t, 18, 95.0);
  EXPECT_EQ(c.limit(), 16);
  EXPECT_EQ(c.TakeLimitChanges().size(), 2u);
}

TEST(AimdControllerTest, DrainCooldownEndsIntoGrowthWhenTheCleanWindowIsFast) {
  AimdController c(Options(20), {});
  double t = RunWindow(c, 0.0, 20, 90.0);
  t = RunWindow(c, t, 18, 40.0);  // began at the cut with 20 active: not clean, hold
  EXPECT_TRUE(c.cooling_down());
  EXPECT_EQ(c.limit(), 18);
  t = RunWindow(c, t, 18, 40.0);
  EXPECT_FALSE(c.cooling_down());
  // Growth needs the growth horizon (10 s) free of the crossing: the window that cut at t = 2
  // still counts until t = 12.
  EXPECT_EQ(c.limit(), 18);
  while (t < 12.0) t = RunWindow(c, t, 18, 40.0);
  EXPECT_EQ(c.limit(), 18);
  RunWindow(c, t, 18, 40.0);
  EXPECT_EQ(c.limit(), 19);
}

TEST(AimdControllerTest, GrowthNeedsTheHorizonsPooledPercentileUnderTheLowTarget) {
  AimdOptions o = Options(10);
  o.growth_horizon_s = 6.0;
  AimdController c(o, {});
  // A window with 3 of 100 frames over the low target (p99 over it) but under the high target:
  // neither a cut nor growth.
  c.OnTick(0.0, Active(10));
  for (int i = 0; i < 100; ++i) c.OnFrame(0.01 * i, i < 3 ? 70.0 : 30.0, kDeadlineMs, false);
  c.OnTick(2.0, Active(10));
  EXPECT_EQ(c.limit(), 10);
  // Calm windows after it: each alone says grow, but pooled with it the p99 (nearest rank) stays
  // over the low target while more than frames - ceil(0.99 frames) frames are over it.
  double t = RunWindow(c, 2.0, 10, 30.0);
  EXPECT_EQ(c.limit(), 10);  // 3 of 200 over: the 198th value is over
  t = RunWindow(c, t, 10, 30.0);
  EXPECT_EQ(c.limit(), 11);  // 3 of 300 over: the 297th value is under
  // A window of 100 at 70 ms on its own would cut nothing (under 0.85) and hold growth for 6 s.
  t = RunWindow(c, t, 11, 70.0);
  EXPECT_EQ(c.limit(), 11);
  while (t < 14.0) t = RunWindow(c, t, 11, 30.0);
  EXPECT_EQ(c.limit(), 11);  // the 70 ms window (closed at t = 8) is within 6 s until t = 14
  RunWindow(c, t, 11, 30.0);
  EXPECT_EQ(c.limit(), 12);
}

// The binary's AIMD defaults with a calibrated prediction, windows of window_s (not frame-closed).
AimdOptions PredictedOptions(std::int64_t initial_limit, std::int64_t predicted_limit) {
  AimdOptions o;
  o.initial_limit = initial_limit;
  o.predicted_limit = predicted_limit;
  o.window.window_frames = 0;
  return o;
}

// A calibrated prediction seeds the limit with no slow start; calm windows take it past the
// prediction only by the least step once per growth horizon (drive's default on the CPU engine:
// seeded 74, N_true 83, the first 0.5 s window doubled it to 148: 99% of frames late after).
TEST(AimdControllerTest, GrowthPastAPredictedLimitIsPaced) {
  AimdController c(PredictedOptions(1, 70), {});
  ASSERT_TRUE(c.Decide({.period_ms = 40.0, .deadline_ms = 100.0}, Active(0), 0.0).admit);
  ASSERT_EQ(c.limit(), 70);
  double t = 0.0;
  std::vector<std::int64_t> limits;
  while (t < 30.0) {
    t = RunWindow(c, t, /*active=*/c.limit(), /*latency_ms=*/10.0);
    limits.push_back(c.limit());
  }
  // Windows of 2 s: +1 at 10 s, 20 s and 30 s (the horizon since the seed, then each increase).
  EXPECT_EQ(limits, (std::vector<std::int64_t>{70, 70, 70, 70, 71, 71, 71, 71, 71, 72, 72, 72, 72,
                                               72, 73}));
  const auto changes = c.TakeLimitChanges();
  ASSERT_GE(changes.size(), 2u);
  EXPECT_EQ(changes[0].reason, "seed: the cost model's predicted N* 70");
  EXPECT_EQ(changes[1].reason.rfind("increase (paced above the predicted N*)", 0), 0u)
      << changes[1].reason;
}

// The prediction prices every window full: a window read while they fill (cheaper frames) does
// not take the limit past it, one read at full KV does, paced (drive on a 30B MoE at W 2048: grown
// from the predicted 1 to 2 at 18% filled, 38% of frames late once the windows were full).
TEST(AimdControllerTest, GrowthPastAPredictedLimitWaitsForFullKv) {
  AimdController c(PredictedOptions(4, 1), {});
  const SessionRequest request{.period_ms = 40.0, .deadline_ms = 100.0};
  ASSERT_TRUE(c.Decide(request, Active(0), 0.0).admit);
  ASSERT_EQ(c.limit(), 1);
  SystemState filling = Active(1);  // 18 blocks held, 82 more promised to its window
  filling.free_blocks = 982;
  filling.reserved_blocks = 82;
  double t = 0.0;
  while (t < 30.0) {
    EXPECT_FALSE(c.Decide(request, filling, t).admit);  // a second session asks: binding
    t = RunWindow(c, t, /*active=*/1, /*latency_ms=*/10.0);
  }
  EXPECT_EQ(c.limit(), 1);  // p99 0.1 D, 0.21 D projected: the latency alone would have grown it
  SystemState full = Active(1);  // the window full: 100 blocks held, none promised
  full.free_blocks = 900;
  while (c.limit() == 1 && t < 60.0) {
    (void)c.Decide(request, full, t);
    t = RunWindow(c, t, 1, 10.0);
  }
  EXPECT_EQ(c.limit(), 2);
  EXPECT_LE(t, 42.0);  // within the growth horizon (10 s) of windows at full KV
  const auto changes = c.TakeLimitChanges();
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[1].reason.rfind("increase (paced above the predicted N*)", 0), 0u)
      << changes[1].reason;
}

TEST(AimdControllerTest, FixedCooldownHoldsForCooldownSeconds) {
  AimdOptions o = Options(20);
  o.cooldown_mode = CooldownMode::kFixed;
  o.cooldown_s = 5.0;
  AimdController c(o, {});
  double t = RunWindow(c, 0.0, 20, 90.0);  // cut at t = 2 to 18
  ASSERT_EQ(c.limit(), 18);
  t = RunWindow(c, t, 20, 90.0);  // t = 4: 2 s after the cut
  t = RunWindow(c, t, 20, 90.0);  // t = 6: 4 s
  EXPECT_EQ(c.limit(), 18);
  RunWindow(c, t, 20, 90.0);  // t = 8: 6 s >= 5 s; floor(0.9 * 20) = 18 is no cut below 18
  EXPECT_EQ(c.limit(), 18);
  EXPECT_FALSE(c.cooling_down());
  RunWindow(c, 8.0, 19, 90.0);  // floor(17.1) = 17
  EXPECT_EQ(c.limit(), 17);
}

TEST(AimdControllerTest, ClampsToMaxLimit) {
  AimdOptions o = Options(10);
  o.window.max_limit = 11;
  AimdController c(o, {});
  double t = RunWindow(c, 0.0, 10, 30.0);
  t = RunWindow(c, t, 11, 30.0);
  RunWindow(c, t, 11, 30.0);
  EXPECT_EQ(c.limit(), 11);
  EXPECT_EQ(c.TakeLimitChanges().size(), 1u);
}

TEST(AimdControllerTest, ClampsToMinLimit) {
  AimdOptions o = Options(6);
  o.window.min_limit = 5;
  AimdController c(o, {});
  double t = RunWindow(c, 0.0, 5, 99.0);  // floor(4.5) = 4, clamped to 5
  EXPECT_EQ(c.limit(), 5);
  EXPECT_TRUE(c.cooling_down());
  // Cooling ends (5 <= 5 throughout) and nothing goes below the floor, nor is a non-change logged.
  RunWindow(c, t, 5, 99.0);
  EXPECT_EQ(c.limit(), 5);
  EXPECT_EQ(c.TakeLimitChanges().size(), 1u);
}

TEST(AimdControllerTest, TooFewSamplesHold) {
  AimdController c(Options(20), {});
  double t = RunWindow(c, 0.0, 20, 200.0, /*num_frames=*/19, /*num_misses=*/19);
  t = RunWindow(c, t, 20, 10.0, 19);
  RunWindow(c, t, 20, 10.0, 0);  // no frames at all
  EXPECT_EQ(c.limit(), 20);
  EXPECT_EQ(c.last_window().num_frames, 0);
}

TEST(AimdControllerTest, SignalIsTheExactConfiguredPercentile) {
  for (const auto& [p, want] : {std::pair{99.0, 0.99}, {50.0, 0.50}, {100.0, 1.00}, {0.5, 0.01}}) {
    AimdOptions o = Options(10);
    o.percentile = p;
    AimdController c(o, {});
    c.OnTick(0.0, Active(1));
    // Latencies 100, 99, ..., 1 ms (order must not matter).
    for (int i = 100; i >= 1; --i) c.OnFrame(0.0, i, kDeadlineMs, false);
    c.OnTick(2.0, Active(1));
    EXPECT_DOUBLE_EQ(c.last_window().signal, want) << "p" << p;
  }
}

TEST(AimdControllerTest, ReservoirBoundsMemoryAndStaysClose) {
  AimdOptions o = Options(10);
  o.max_samples = 256;
  AimdController c(o, {});
  c.OnTick(0.0, Active(1));
  for (int i = 0; i < 100000; ++i) c.OnFrame(0.0, 1 + i % 100, kDeadlineMs, false);
  c.OnTick(2.0, Active(1));
  EXPECT_EQ(c.last_window().num_frames, 100000);
  EXPECT_GE(c.last_window().signal, 0.95);
  EXPECT_LE(c.last_window().signal, 1.00);
}

TEST(AimdControllerTest, SignalIsLatencyOverEachFramesOwnDeadline) {
  AimdController c(Options(10), {});
  c.OnTick(0.0, Active(10));
  for (int i = 0; i < 50; ++i) c.OnFrame(0.0, 40.0, 80.0, false);    // 0.5 of an 80 ms deadline
  for (int i = 0; i < 50; ++i) c.OnFrame(0.0, 100.0, 200.0, false);  // 0.5 of a 200 ms deadline
  c.OnTick(2.0, Active(10));
  EXPECT_DOUBLE_EQ(c.last_window().signal, 0.5);
}

TEST(AimdControllerTest, KvGuardRejectsWhenThePoolCannotHoldOneMore) {
  AimdOptions o = Options(10);
  o.window.kv_guard = true;
  AimdController c(o, {});
  const SessionRequest r{.period_ms = 80.0, .deadline_ms = 80.0, .projected_blocks = 10};
  // free 20, promised 0: two more fit (N_mem = 5).
  EXPECT_TRUE(c.Decide(r, {3, 20, 100, 0}, 0.0).admit);
  // promised 15 of the 20 free: none fits.
  const Decision d = c.Decide(r, {3, 20, 100, 15}, 0.1);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, "kv_guard");
  EXPECT_EQ(d.detail, "active 3 >= N_mem 3 (needs 10 blocks; free 20, promised 15 of 100)");
  EXPECT_GE(d.retry_after_ms, 80.0);  // one period (no session has ended yet), jittered
  EXPECT_LT(d.retry_after_ms, 80.0 * (1.0 + RetryHint::kJitterFraction));
  // Without the guard the same request is admitted: the latency limit alone allows it.
  AimdController unguarded(Options(10), {});
  EXPECT_TRUE(unguarded.Decide(r, {3, 20, 100, 15}, 0.1).admit);
}

TEST(AimdControllerTest, LimitBelowActiveOnlyBlocksNewSessions) {
  AimdController c(Options(20), {});
  RunWindow(c, 0.0, 20, 90.0);
  ASSERT_EQ(c.limit(), 18);
  // 20 sessions keep running (there is no eviction API); a 21st is refused.
  const Decision d =
      c.Decide({.period_ms = 80.0, .deadline_ms = 100.0, .projected_blocks = 0}, Active(20), 2.5);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, "limit");
}

TEST(AimdControllerTest, DescribeReportsEveryParameter) {
  AimdOptions o = Options(7);
  o.window.kv_guard = true;
  AimdController c(o, MemoryOptions{.full_mode_session_s = 120.0, .headroom_fraction = 0.05});
  EXPECT_EQ(c.Describe(),
            "aimd(window_s=2, percentile=99, low_target=0.65D, high_target=0.85D, "
            "miss_ratio_threshold=0.001, increase_step=1, slow_start_factor=1, "
            "slow_start_exit=0.8, headroom_gain=0, growth_horizon_s=10, max_utilization=0.9, "
            "self_late_work_fraction=0.05, beta=0.9, cooldown=drain, window_frames=0, "
            "min_window_s=0.5, initial_limit=7, predicted_limit=0, min_limit=1, max_limit=1024, "
            "min_samples=20, max_samples=4096, kv_guard=on, full_mode_session_s=120, "
            "headroom_fraction=0.05)");
  o.cooldown_mode = CooldownMode::kFixed;
  o.window.kv_guard = false;
  EXPECT_NE(AimdController(o, {}).Describe().find("cooldown=fixed 4s"), std::string::npos);
}

// --- Work units and sessions late by themselves -----------------------------------------------

TEST(AimdControllerTest, TheLimitIsABudgetOfWork) {
  AimdController c(Options(10), {});
  SystemState s = Active(4);
  s.active_work = 7.5;  // four sessions, some heavier than the reference
  const SessionRequest light{.period_ms = 80.0, .deadline_ms = 100.0, .work = 2.5};
  EXPECT_TRUE(c.Decide(light, s, 0.0).admit);  // 7.5 + 2.5 = 10: fits exactly
  const SessionRequest heavy{.period_ms = 80.0, .deadline_ms = 100.0, .work = 2.6};
  const Decision d = c.Decide(heavy, s, 0.1);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, "limit");
  EXPECT_EQ(d.detail, "work 7.50 + 2.60 > budget 10 (4 sessions active)");
}

// A budget below one session's price would refuse it even into an empty engine, and with no
// frames no window could ever raise it: the lone session is admitted and the budget follows its
// price (logged). Only alone: with anything admitted, the budget rule holds as before.
TEST(AimdControllerTest, ALoneSessionOverTheBudgetIsAdmittedAndTheBudgetFollowsItsPrice) {
  AimdController c(Options(1), {});
  const SessionRequest heavy{.period_ms = 40.0, .deadline_ms = 40.0, .work = 7.3};
  EXPECT_TRUE(c.Decide(heavy, Active(0), 0.0).admit);
  EXPECT_EQ(c.limit(), 8);
  const std::vector<LimitChange> changes = c.TakeLimitChanges();
  ASSERT_EQ(changes.size(), 1U);
  EXPECT_EQ(changes[0].from, 1);
  EXPECT_EQ(changes[0].to, 8);
  EXPECT_NE(changes[0].reason.find("lone session's price: 7.30 units over budget 1"),
            std::string::npos)
      << changes[0].reason;
  SystemState one = Active(1);
  one.active_work = 7.3;
  const Decision second = c.Decide(SessionRequest{.work = 1.0}, one, 0.1);  // 8.3 > 8
  EXPECT_FALSE(second.admit);
  EXPECT_EQ(second.reason, "limit");
  EXPECT_EQ(c.limit(), 8);
  EXPECT_TRUE(c.TakeLimitChanges().empty());
}

TEST(AimdControllerTest, OverTheBudgetBesideAnotherSessionOrPastMaxLimitIsRefused) {
  const SessionRequest heavy{.period_ms = 40.0, .deadline_ms = 40.0, .work = 7.3};
  AimdController busy(Options(1), {});
  SystemState light = Active(1);
  light.active_work = 0.4;
  EXPECT_EQ(busy.Decide(heavy, light, 0.0).reason, "limit");
  EXPECT_EQ(busy.limit(), 1);
  // max_limit is the operator's bound on the budget: no lone session raises it past that.
  AimdOptions capped = Options(1);
  capped.window.max_limit = 4;
  AimdController c(capped, {});
  const Decision d = c.Decide(heavy, Active(0), 0.0);
  EXPECT_FALSE(d.admit);
  EXPECT_EQ(d.reason, "limit");
  EXPECT_EQ(c.limit(), 1);
  // Nor a pool that cannot hold the session's window.
  AimdOptions guarded = Options(1);
  guarded.window.kv_guard = true;
  AimdController g(guarded, {});
  SessionRequest big = heavy;
  big.projected_blocks = 2000;
  EXPECT_FALSE(g.Decide(big, Active(0), 0.0).admit);
  EXPECT_EQ(g.limit(), 1);
}

// Runs one control window: `sessions` honest sessions (ids 1..sessions, one unit each) at
// `latency_ms`, and optionally one more session (id 1000, `poison_work` units) whose every frame
// is late by itself. The load noted is the sum of the work.
double RunWindowWithPoison(AimdController& c, double t_s, int sessions, double latency_ms,
                           double poison_work) {
  SystemState s = Active(sessions + (poison_work > 0 ? 1 : 0));
  s.active_work = sessions + poison_work;
  c.OnTick(t_s, s);
  for (int i = 0; i < 100; ++i) {
    const double t = t_s + 0.01 * i;
    c.OnFrame(FrameSample{.now_s = t,
                          .latency_ms = latency_ms,
                          .deadline_ms = kDeadlineMs,
                          .session = static_cast<std::uint64_t>(1 + i % sessions)});
    if (poison_work > 0 && i % 5 == 0) {
      c.OnFrame(FrameSample{.now_s = t,
                            .latency_ms = 1e6,  // a deadline its own frame cannot meet
                            .deadline_ms = 1e-4,
                            .missed = true,
                            .session = 1000,
                            .work = poison_work});
    }
  }
  c.OnTick(t_s + 2.0, s);
  return t_s + 2.0;
}

// The rule: a session late by itself moves the budget by at most its own share. Property over a
// range of shares and honest latencies: the limit with the poisoned session never falls more than
// its work below the limit of the same run without it.
TEST(AimdControllerTest, OnePoisonedSessionMovesTheBudgetByAtMostItsShare) {
  for (const double poison_work : {0.01, 0.5, 1.0, 3.0, 8.0}) {
    for (const double latency_ms : {20.0, 50.0, 75.0, 95.0}) {
      AimdController clean(Options(20), {});
      AimdController poisoned(Options(20), {});
      double t_clean = 0.0;
      double t_poisoned = 0.0;
      for (int k = 0; k < 20; ++k) {
        const int sessions = static_cast<int>(clean.limit());
        t_clean = RunWindowWithPoison(clean, t_clean, sessions, latency_ms, 0.0);
        t_poisoned = RunWindowWithPoison(
            poisoned, t_poisoned,
            std::max(1, static_cast<int>(poisoned.limit() - std::ceil(poison_work))), latency_ms,
            poison_work);
        EXPECT_GE(static_cast<double>(poisoned.limit()),
                  static_cast<double>(clean.limit()) - poison_work - 1e-9)
            << "poison " << poison_work << " latency " << latency_ms << " window " << k;
      }
      EXPECT_GE(poisoned.last_window().self_late_sessions, 1);
    }
  }
}

TEST(AimdControllerTest, WithoutTheRuleOnePoisonedSessionCutsEveryone) {
  AimdOptions o = Options(20);
  o.self_late_work_fraction = 0.0;
  AimdController c(o, {});
  double t = 0.0;
  for (int k = 0; k < 10; ++k) t = RunWindowWithPoison(c, t, 19, 20.0, 1.0);
  EXPECT_LT(c.limit(), 20);  // the failure the rule removes
}

TEST(AimdControllerTest, ALoadEveryoneFeelsStillCuts) {
  AimdController c(Options(20), {});
  double t = 0.0;
  // Every session over the high target: leaving the worst out leaves the rest.
  for (int k = 0; k < 10; ++k) t = RunWindowWithPoison(c, t, 20, 95.0, 0.0);
  EXPECT_LT(c.limit(), 20);
  EXPECT_EQ(c.last_window().self_late_sessions, 1);
}

}  // namespace
}  // namespace metronome::admission
