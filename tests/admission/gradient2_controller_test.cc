// Single-step tests of the gradient2 law: one window in, one estimate out.
#include "metronome/admission/gradient2_controller.h"

#include <gtest/gtest.h>

#include <string>

namespace metronome::admission {
namespace {

constexpr double kDeadlineMs = 100.0;

SystemState Active(std::int64_t n) {
  return {.active_sessions = n, .free_blocks = 1000, .total_blocks = 1000, .reserved_blocks = 0};
}

// One 2 s window of 100 frames at `latency_ms` with `active` sessions, starting at t_s.
double RunWindow(Gradient2Controller& c, double t_s, std::int64_t active, double latency_ms) {
  c.OnTick(t_s, Active(active));
  for (int i = 0; i < 100; ++i) c.OnFrame(t_s + 0.01 * i, latency_ms, kDeadlineMs, false);
  c.OnTick(t_s + 2.0, Active(active));
  return t_s + 2.0;
}

Gradient2Options Options(std::int64_t initial_limit) {
  Gradient2Options o;
  o.initial_limit = initial_limit;
  o.window.window_frames = 0;  // windows of window_s
  return o;
}

TEST(Gradient2ControllerTest, SteadyLatencyGrowsBySmoothedQueueSize) {
  Gradient2Controller c(Options(10), {});
  RunWindow(c, 0.0, 10, 40.0);
  // gradient = clamp(1.5 x 0.4 / 0.4, 0.5, 1) = 1: estimate = 0.8 x 10 + 0.2 x (10 + 4) = 10.8.
  EXPECT_DOUBLE_EQ(c.estimate(), 10.8);
  EXPECT_EQ(c.limit(), 10);
  RunWindow(c, 2.0, 10, 40.0);
  EXPECT_NEAR(c.estimate(), 11.6, 1e-12);
  EXPECT_EQ(c.limit(), 11);
  const auto changes = c.TakeLimitChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].reason.rfind("increase: gradient 1.000", 0), 0u) << changes[0].reason;
}

TEST(Gradient2ControllerTest, ShortRunLatencyAboveToleranceCuts) {
  Gradient2Controller c(Options(40), {});
  double t = 0.0;
  for (int i = 0; i < 10; ++i) t = RunWindow(c, t, 40, 20.0);  // warm-up: long = 0.2
  const double before = c.estimate();
  RunWindow(c, t, 40, 60.0);  // short 0.6 > 1.5 x long
  // long moves by 2/601 of the gap; gradient = 1.5 x long / 0.6, about 0.5.
  const double long_signal = c.long_signal();
  const double gradient = std::clamp(1.5 * long_signal / 0.6, 0.5, 1.0);
  EXPECT_NEAR(c.estimate(), 0.8 * before + 0.2 * (gradient * before + 4.0), 1e-9);
  EXPECT_LT(c.estimate(), before);
}

TEST(Gradient2ControllerTest, HoldsWhenNotBinding) {
  Gradient2Controller c(Options(40), {});
  RunWindow(c, 0.0, 19, 40.0);  // peak active 19 < limit / 2
  EXPECT_DOUBLE_EQ(c.estimate(), 40.0);
}

TEST(Gradient2ControllerTest, FallingLoadDecaysTheLongRunBaseline) {
  Gradient2Controller c(Options(10), {});
  double t = 0.0;
  for (int i = 0; i < 10; ++i) t = RunWindow(c, t, 10, 60.0);
  EXPECT_NEAR(c.long_signal(), 0.6, 1e-12);
  RunWindow(c, t, 10, 20.0);  // long / short = 3 > 2: long decays by 5% on top of the average
  const double averaged = 0.6 + 2.0 / 601.0 * (0.2 - 0.6);
  EXPECT_NEAR(c.long_signal(), 0.95 * averaged, 1e-12);
}

TEST(Gradient2ControllerTest, RejectsAtTheLimitAndWithTheKvGuard) {
  Gradient2Options o = Options(2);
  o.window.kv_guard = true;
  Gradient2Controller c(o, {});
  const SessionRequest r{.period_ms = 80.0, .deadline_ms = 100.0, .projected_blocks = 600};
  EXPECT_TRUE(c.Decide(r, Active(0), 0.0).admit);
  const Decision guard =
      c.Decide(r, {.active_sessions = 1, .free_blocks = 400, .total_blocks = 1000}, 0.0);
  EXPECT_FALSE(guard.admit);
  EXPECT_EQ(guard.reason, "kv_guard");
  const Decision limit = c.Decide(r, Active(2), 0.0);
  EXPECT_FALSE(limit.admit);
  EXPECT_EQ(limit.reason, "limit");
  EXPECT_GE(limit.retry_after_ms, 80.0);
}

// The windowed controllers share the rule: a lone session over the budget is admitted into an
// empty engine and the budget follows its price (gradient2's additive growth would otherwise
// never reach it, with no frames to grow on).
TEST(Gradient2ControllerTest, ALoneSessionOverTheBudgetIsAdmitted) {
  Gradient2Controller c(Options(1), {});
  EXPECT_TRUE(
      c.Decide({.period_ms = 40.0, .deadline_ms = 40.0, .work = 5.5}, Active(0), 0.0).admit);
  EXPECT_EQ(c.limit(), 6);
  EXPECT_EQ(c.TakeLimitChanges().size(), 1U);
}

}  // namespace
}  // namespace metronome::admission
