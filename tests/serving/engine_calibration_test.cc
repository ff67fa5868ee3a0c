#include "metronome/serving/engine_calibration.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
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
  EXPECT_EQ(c.grid.size(), 12u);
  EXPECT_EQ(c.GridSummary(), "12 points: sessions 1/4/16, contexts 32/256 tokens");
  EXPECT_GT(c.predicted_limit, 0);
  EXPECT_GT(c.fit.model.c1_s_per_token, 0.0);
}

// No time at all (a model slower than any budget): only the single session's two pairs, the long
// context shrunk to the shortest that still separates the terms, and the fit still holds.
TEST(StartCalibrationTest, ASlowModelGetsTheSmallestGridThatFits) {
  const auto eng = TinyEngine(4096);
  const SessionCalibration c = Calibrated(*eng, 0.0);
  EXPECT_EQ(c.GridSummary(), "4 points: sessions 1, contexts 32/64 tokens");
  for (const CalibrationPoint& g : c.grid) EXPECT_EQ(g.sessions, 1);
  EXPECT_GT(c.predicted_limit, 0);
}

// A pool that holds two sessions of the largest point caps every batch there.
TEST(StartCalibrationTest, BatchesAreCappedByThePool) {
  // 256 + 4 x 4 tokens = 17 blocks of 16, + 1: 18 blocks a session.
  const auto eng = TinyEngine(2 * 18 + 5);
  const SessionCalibration c = Calibrated(*eng, 1e9);
  EXPECT_EQ(c.GridSummary(), "8 points: sessions 1/2, contexts 32/256 tokens");
}

TEST(StartCalibrationTest, APoolWithoutRoomForOneSessionIsNamed) {
  const auto eng = TinyEngine(4);
  const auto c = CalibrateForSession(*eng, Speech(), 0.7, 1e9);
  ASSERT_TRUE(std::holds_alternative<std::string>(c));
  EXPECT_NE(std::get<std::string>(c).find("free blocks hold no session"), std::string::npos);
}

}  // namespace
}  // namespace metronome::serving
