#include "metronome/serving/engine_calibration.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <variant>

#include "metronome/engine/engine.h"
#include "metronome/model/model.h"
#include "metronome/realtime/realtime_loop.h"

namespace metronome::serving {
namespace {

std::unique_ptr<engine::Engine> TinyEngine(std::int64_t kv_blocks) {
  static const model::Model m = model::MakeSyntheticModel("tiny", 5);
  engine::EngineOptions o;
  o.kv_blocks = kv_blocks;
  o.block_tokens = 16;
  o.num_threads = 1;
  return std::make_unique<engine::Engine>(m, o);
}

realtime::SessionSpec Speech() {
  realtime::SessionSpec s;
  s.period_ms = 80.0;
  s.deadline_ms = 80.0;
  s.input_tokens_per_frame = 3;
  s.policy = kv::KvPolicy::Window(512, 4);
  return s;
}

SessionCalibration Calibrated(engine::Engine& eng, double budget_s) {
  auto c = CalibrateForSession(eng, Speech(), 0.7, budget_s);
  if (const auto* error = std::get_if<std::string>(&c)) ADD_FAILURE() << *error;
  return std::get<SessionCalibration>(c);
}

// Budgets far beyond what synthetic:tiny takes: the whole grid, every batch and both contexts.
TEST(StartCalibrationTest, AFastModelGetsTheWholeGrid) {
  const auto eng = TinyEngine(4096);
  const SessionCalibration c = Calibrated(*eng, 1e9);
  EXPECT_EQ(c.grid.size(), 14u);
  EXPECT_EQ(c.GridSummary(), "14 points: sessions 1/4/16, contexts 32/256/512 tokens");
  EXPECT_GT(c.predicted_limit, 0);
  EXPECT_GT(c.fit.model.c1_s_per_token, 0.0);
}

// No time at all (a model slower than any budget): only the single session's pairs, the long
// context shrunk to the shortest that still separates the terms, the window's pair (never
// skipped: it is what the price extrapolates to), and the fit still holds.
TEST(StartCalibrationTest, ASlowModelGetsTheSmallestGridThatFits) {
  const auto eng = TinyEngine(4096);
  const SessionCalibration c = Calibrated(*eng, 0.0);
  EXPECT_EQ(c.GridSummary(), "6 points: sessions 1, contexts 32/64/512 tokens");
  for (const CalibrationPoint& g : c.grid) EXPECT_EQ(g.sessions, 1);
  EXPECT_GT(c.predicted_limit, 0);
}

// A pool that holds two sessions of the largest point caps every batch there.
TEST(StartCalibrationTest, BatchesAreCappedByThePool) {
  // 256 + 4 x 4 tokens = 17 blocks of 16, + 1: 18 blocks a session.
  const auto eng = TinyEngine(2 * 18 + 5);
  const SessionCalibration c = Calibrated(*eng, 1e9);
  EXPECT_EQ(c.GridSummary(), "10 points: sessions 1/2, contexts 32/256/512 tokens");
}

// The window's pair: one session at the window, only the longer context prefilled and its KV
// repeated; the grid's visible keys reach the window, so c2 is fitted where the price uses it.
TEST(StartCalibrationTest, AWindowSessionIsTimedAtItsWindow) {
  const auto eng = TinyEngine(4096);
  const SessionCalibration c = Calibrated(*eng, 1e9);
  ASSERT_GE(c.grid.size(), 2u);
  for (std::size_t i = c.grid.size() - 2; i < c.grid.size(); ++i) {
    EXPECT_EQ(c.grid[i].sessions, 1);
    EXPECT_EQ(c.grid[i].context, 512);
    EXPECT_EQ(c.grid[i].prefilled, 256);
  }
  for (std::size_t i = 0; i + 2 < c.grid.size(); ++i) EXPECT_EQ(c.grid[i].prefilled, 0);
}

// The model prices the frame timed at the window (the chunk of a + 1, then o - 1 decodes) no
// faster than it ran, whatever the short points' fit said; the fit's own c2 is kept beside it.
TEST(StartCalibrationTest, TheModelIsAnchoredAtTheWindowsFrame) {
  const auto eng = TinyEngine(4096);
  realtime::SessionSpec s = Speech();
  s.output_tokens_per_frame = 3;
  auto c_or = CalibrateForSession(*eng, s, 0.7, 1e9);
  ASSERT_TRUE(std::holds_alternative<SessionCalibration>(c_or)) << std::get<std::string>(c_or);
  const SessionCalibration& c = std::get<SessionCalibration>(c_or);
  ASSERT_EQ(c.window_frame.size(), 3u);
  EXPECT_EQ(c.window_frame[0].batch_tokens, s.input_tokens_per_frame + 1);
  EXPECT_EQ(c.window_frame[1].batch_tokens, 1);
  EXPECT_EQ(c.window_frame[2].seconds, c.window_frame[1].seconds);
  double measured_s = 0.0;
  double modelled_s = 0.0;
  for (const realtime::StepObservation& step : c.window_frame) {
    EXPECT_GE(step.visible_kv_tokens, 512.0);
    measured_s += step.seconds;
    modelled_s += c.fit.model.StepSeconds(step.batch_tokens, step.visible_kv_tokens);
  }
  EXPECT_GE(modelled_s, measured_s * (1.0 - 1e-9));
  EXPECT_GE(c.fit.model.c2_s_per_kv_token, c.fitted_c2_s_per_kv_token);
}

// A pool that cannot hold the window: the longest multiple of the longer context it holds with
// the timed steps (199 free blocks of 16 after one for a partial block, less 4 steps x 4 tokens:
// 3168 tokens, so 3072).
TEST(StartCalibrationTest, TheWindowPairIsCappedByThePool) {
  const auto eng = TinyEngine(200);
  realtime::SessionSpec s = Speech();
  s.policy = kv::KvPolicy::Window(4096, 4);
  auto c = CalibrateForSession(*eng, s, 0.7, 1e9);
  ASSERT_TRUE(std::holds_alternative<SessionCalibration>(c)) << std::get<std::string>(c);
  EXPECT_EQ(std::get<SessionCalibration>(c).grid.back().context, 3072);
}

// A full-KV session has no window to extrapolate to: no such pair.
TEST(StartCalibrationTest, AFullKvSessionGetsNoWindowPair) {
  const auto eng = TinyEngine(4096);
  realtime::SessionSpec s = Speech();
  s.policy = kv::KvPolicy::Full();
  auto c = CalibrateForSession(*eng, s, 0.7, 1e9);
  ASSERT_TRUE(std::holds_alternative<SessionCalibration>(c)) << std::get<std::string>(c);
  EXPECT_EQ(std::get<SessionCalibration>(c).GridSummary(),
            "12 points: sessions 1/4/16, contexts 32/256 tokens");
  EXPECT_TRUE(std::get<SessionCalibration>(c).window_frame.empty());
  EXPECT_EQ(std::get<SessionCalibration>(c).fit.model.c2_s_per_kv_token,
            std::get<SessionCalibration>(c).fitted_c2_s_per_kv_token);
}

// A context repeated from a shorter prefill is measured as the prefilled one would be: the same
// keys attended to (the design's count), every step run.
TEST(CalibrationPointTest, ARepeatedContextAttendsToTheSameKeys) {
  const auto eng = TinyEngine(4096);
  const kv::KvPolicy policy = kv::KvPolicy::Window(1024, 4);
  const CalibrationSettings settings{.repeats = 3, .warmup = 1};
  std::mt19937 rng(1);
  for (const std::int64_t chunk : {1, 5}) {
    const CalibrationPoint prefilled{2, 768, chunk};
    const CalibrationPoint repeated{2, 768, chunk, 256};
    const auto a = MeasureCalibrationPoint(*eng, policy, settings, prefilled, rng);
    const auto b = MeasureCalibrationPoint(*eng, policy, settings, repeated, rng);
    ASSERT_TRUE(std::holds_alternative<CalibrationMeasurement>(a)) << std::get<std::string>(a);
    ASSERT_TRUE(std::holds_alternative<CalibrationMeasurement>(b)) << std::get<std::string>(b);
    const double design = CalibrationDesign({repeated}, policy, settings)[0].visible_kv_tokens;
    EXPECT_EQ(std::get<CalibrationMeasurement>(a).obs.visible_kv_tokens, design);
    EXPECT_EQ(std::get<CalibrationMeasurement>(b).obs.visible_kv_tokens, design);
    EXPECT_EQ(std::get<CalibrationMeasurement>(b).obs.batch_tokens, 2.0 * chunk);
  }
  EXPECT_EQ(eng->pool_stats().used_blocks, 0);  // every session closed again
}

TEST(CalibrationPointTest, AnUnrepeatablePrefixIsNamed) {
  const auto eng = TinyEngine(4096);
  const kv::KvPolicy policy = kv::KvPolicy::Window(1024, 4);
  const CalibrationSettings settings{.repeats = 1, .warmup = 0};
  std::mt19937 rng(1);
  const struct {
    CalibrationPoint point;
    const char* error;
  } cases[] = {
      {{1, 768, 1, 100}, "prefilled 100 is not a positive multiple of the block size 16"},
      {{1, 768, 1, 512}, "prefilled 512 does not divide the context"},
      {{1, 2048, 1, 256}, "the context is beyond the window 1024"},
  };
  for (const auto& c : cases) {
    const auto m = MeasureCalibrationPoint(*eng, policy, settings, c.point, rng);
    ASSERT_TRUE(std::holds_alternative<std::string>(m)) << c.error;
    EXPECT_NE(std::get<std::string>(m).find(c.error), std::string::npos)
        << std::get<std::string>(m);
  }
  EXPECT_EQ(eng->pool_stats().used_blocks, 0);
}

TEST(StartCalibrationTest, APoolWithoutRoomForOneSessionIsNamed) {
  const auto eng = TinyEngine(4);
  const auto c = CalibrateForSession(*eng, Speech(), 0.7, 1e9);
  ASSERT_TRUE(std::holds_alternative<std::string>(c));
  EXPECT_NE(std::get<std::string>(c).find("free blocks hold no session"), std::string::npos);
}

}  // namespace
}  // namespace metronome::serving
