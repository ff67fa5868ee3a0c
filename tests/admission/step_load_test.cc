// StepCostFit (step time = fixed + per-token x tokens) and StepLoad (a window's work utilization
// read against it).
#include "metronome/admission/step_load.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>

#include "metronome/admission/windowed_controller.h"

namespace metronome::admission {
namespace {

// Steps of an engine whose step costs fixed_s + per_token_s x tokens, batch sizes cycling through
// `sizes`, back to back from t0_s; returns the time after the last one.
// Every step goes to the fit and to the window, as the Supervisor hands them on.
struct Engine {
  StepCostFit fit;
  StepLoad load;
  void OnStep(double now_s, double step_s, std::int64_t tokens) {
    fit.OnStep(now_s, step_s, tokens);
    load.OnStep(step_s, tokens);
  }
  StepLoadWindow Close(double duration_s) { return load.Close(duration_s, fit.Estimate()); }
};

double RunSteps(Engine& load, double t0_s, int count, double fixed_s, double per_token_s,
                std::initializer_list<std::int64_t> sizes, double gap_s = 0.0) {
  double t = t0_s;
  int i = 0;
  while (i < count) {
    for (const std::int64_t tokens : sizes) {
      if (i++ == count) break;
      const double step_s = fixed_s + per_token_s * static_cast<double>(tokens);
      t += step_s;
      load.OnStep(t, step_s, tokens);
      t += gap_s;
    }
  }
  return t;
}

TEST(StepLoadTest, RecoversTheStepCostAndTheUtilization) {
  Engine load;
  // 2 ms fixed + 10 us per token, batches of 10..400 tokens, 1 ms idle after each step.
  const double end_s = RunSteps(load, 0.0, 400, 2e-3, 1e-5, {10, 100, 400, 50, 200}, 1e-3);
  const StepLoadWindow w = load.Close(end_s);
  ASSERT_TRUE(w.valid);
  EXPECT_EQ(w.steps, 400);
  EXPECT_NEAR(w.cost.fixed_s, 2e-3, 1e-9);
  EXPECT_NEAR(w.cost.per_token_s, 1e-5, 1e-12);
  // 80 rounds of 760 tokens at 10 us = 0.608 s of per-token work; each round lasts 5 x 3 ms of
  // fixed cost and idle plus that work.
  const double token_s = 80 * 760 * 1e-5;
  EXPECT_NEAR(w.utilization, token_s / end_s, 1e-9);
  EXPECT_NEAR(w.busy_fraction, (token_s + 400 * 2e-3) / end_s, 1e-9);
  // The next window starts from zero but keeps the fit.
  const StepLoadWindow idle = load.Close(1.0);
  EXPECT_FALSE(idle.valid);  // no steps: nothing to say of this window
  EXPECT_DOUBLE_EQ(idle.utilization, 0.0);
  EXPECT_EQ(idle.steps, 0);
  EXPECT_DOUBLE_EQ(idle.busy_fraction, 0.0);
}

TEST(StepLoadTest, OneBatchSizeCannotTellFixedFromPerTokenCost) {
  Engine load;
  const double end_s = RunSteps(load, 0.0, 100, 2e-3, 1e-5, {64});
  const StepLoadWindow w = load.Close(end_s);
  EXPECT_FALSE(w.valid);
  EXPECT_DOUBLE_EQ(w.utilization, 0.0);
  EXPECT_NEAR(w.busy_fraction, 1.0, 1e-9);  // back to back: busy throughout
}

// 50 steps at one time (so every step weighs the same in the fit), alternating between
// (tokens_a, seconds_a) and (tokens_b, seconds_b), closed as a 1 s window.
StepLoadWindow Alternating(std::int64_t tokens_a, double seconds_a, std::int64_t tokens_b,
                           double seconds_b) {
  Engine load;
  for (int i = 0; i < 50; ++i) {
    const bool a = i % 2 == 0;
    load.OnStep(1.0, a ? seconds_a : seconds_b, a ? tokens_a : tokens_b);
  }
  return load.Close(1.0);
}

TEST(StepLoadTest, CoefficientsAreNeverNegative) {
  // Steps get cheaper with more tokens (noise, a cache effect): all fixed cost, no token work.
  const StepLoadWindow fixed_only = Alternating(10, 4e-3, 100, 3e-3);
  ASSERT_TRUE(fixed_only.valid);
  EXPECT_DOUBLE_EQ(fixed_only.cost.per_token_s, 0.0);
  EXPECT_NEAR(fixed_only.cost.fixed_s, 3.5e-3, 1e-12);
  EXPECT_DOUBLE_EQ(fixed_only.utilization, 0.0);
  // A line that would cross zero above 0 tokens: no fixed part, all of the time per-token work.
  const StepLoadWindow tokens_only = Alternating(100, 1e-3, 300, 5e-3);
  ASSERT_TRUE(tokens_only.valid);
  EXPECT_DOUBLE_EQ(tokens_only.cost.fixed_s, 0.0);
  EXPECT_NEAR(tokens_only.cost.per_token_s, (25 * 1e-3 + 25 * 5e-3) / (25 * 100.0 + 25 * 300.0),
              1e-12);
  EXPECT_NEAR(tokens_only.utilization, tokens_only.busy_fraction, 1e-12);
}

TEST(StepLoadTest, TheFitFollowsAChangedEngineWithinAFewTimeConstants) {
  Engine load;
  double t = RunSteps(load, 0.0, 2000, 1e-3, 1e-5, {10, 200, 50});
  // The engine gets 3x slower per token (a co-tenant halves its cache, say): after 5 time
  // constants the old steps weigh e^-5 of the new.
  while (t < 6 * StepCostFit::kFitTauS) t = RunSteps(load, t, 300, 1e-3, 3e-5, {10, 200, 50});
  const StepLoadWindow w = load.Close(1.0);
  ASSERT_TRUE(w.valid);
  EXPECT_NEAR(w.cost.per_token_s, 3e-5, 0.2e-5);
}

// Runs steps until the clock passes until_s; returns the time after the last one.
double RunStepsUntil(Engine& load, double t, double until_s, double per_token_s) {
  while (t < until_s) t = RunSteps(load, t, 30, 1e-3, per_token_s, {10, 200, 50});
  return t;
}

TEST(StepLoadTest, TheSlowestRecentSpeedOutlivesASlowPhase) {
  Engine load;
  // A fast start: before the fit has seen kFitTauS of steps nothing is the slowest but now.
  double t = RunStepsUntil(load, 0.0, 0.5 * StepCostFit::kFitTauS, 1e-5);
  StepCost c = load.fit.Estimate();
  ASSERT_TRUE(c.valid);
  EXPECT_DOUBLE_EQ(c.slowest_per_token_s, c.per_token_s);
  t = RunStepsUntil(load, t, 30.0, 1e-5);
  c = load.fit.Estimate();
  EXPECT_NEAR(c.slowest_per_token_s, 1e-5, 1e-9);
  // A slow phase of 4 s, 30% dearer per token: the short fit reads most of it (1 - e^-2 = 86%
  // of the step), the long one a third.
  t = RunStepsUntil(load, t, 34.0, 1.3e-5);
  c = load.fit.Estimate();
  EXPECT_GT(c.slowest_per_token_s, 1.25e-5);
  EXPECT_LE(c.slowest_per_token_s, 1.3e-5 + 1e-9);
  EXPECT_LT(c.per_token_s, 1.15e-5);
  // Fast again for a minute: the long fit is back at the fast speed, the slowest still near the
  // slow phase's (e^(-60/300) of the difference is left).
  t = RunStepsUntil(load, t, 94.0, 1e-5);
  c = load.fit.Estimate();
  EXPECT_NEAR(c.per_token_s, 1e-5, 0.02e-5);
  EXPECT_GT(c.slowest_per_token_s, 1e-5 + 0.75 * 0.25e-5);
  // The window's utilization at the slowest speed scales its utilization by that ratio.
  load.Close(1.0);
  const double t0 = t;
  t = RunSteps(load, t, 300, 1e-3, 1e-5, {10, 200, 50});
  const StepLoadWindow w = load.Close(t - t0);
  ASSERT_TRUE(w.valid);
  EXPECT_NEAR(w.utilization_at_slowest,
              w.utilization * w.cost.slowest_per_token_s / w.cost.per_token_s, 1e-12);
  // Quiet for good: forgotten within a few kSlowestTauS.
  t = RunStepsUntil(load, t, 94.0 + 5 * StepCostFit::kSlowestTauS, 1e-5);
  c = load.fit.Estimate();
  EXPECT_NEAR(c.slowest_per_token_s, 1e-5, 0.02e-5);
}

TEST(StepLoadTest, ControlWindowReportsTheStepsOfItsWindow) {
  ControlWindow window({.window_s = 1.0, .window_frames = 0});
  StepCostFit fit;
  EXPECT_FALSE(window.Due(0.0, 1, 0));
  double t = 0.0;
  for (int i = 0; i < 100; ++i) {
    const std::int64_t tokens = i % 2 == 0 ? 20 : 80;
    const double step_s = 1e-3 + 1e-5 * static_cast<double>(tokens);
    t += 0.01;
    fit.OnStep(t, step_s, tokens);
    window.OnStep(step_s, tokens, fit.Estimate());
  }
  const ClosedWindow c = window.Close(1.0, 1);
  ASSERT_TRUE(c.load.valid);
  EXPECT_EQ(c.load.steps, 100);
  EXPECT_NEAR(c.load.utilization, 100 * 50 * 1e-5, 1e-9);  // 50 tokens a step on average, over 1 s
}

}  // namespace
}  // namespace metronome::admission
