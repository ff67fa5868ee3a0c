// Timing the real engine's steps over a grid of operating points, the measurements the simulator's
// cost model (CostModel, t = c0 + c1 * batch_tokens + c2 * visible_kv_tokens) is fitted to:
// `metronome calibrate` runs a grid the user gives; `serve` and `drive` run a small one at start
// to seed the AIMD limit with a predicted N* (PredictedSessionLimit).
//
// For every grid point (B sessions, context C, chunk n) the measurement opens B fresh sessions,
// prefills each to C tokens (untimed; or repeats a shorter prefill's KV to C, see
// CalibrationPoint::prefilled), runs `warmup` untimed steps, then times `repeats` steps in
// which every session submits n tokens (n = 1 is a decode step), and records the median step time
// against batch_tokens = B n and visible_kv_tokens counted exactly as CostModelBackend::Step does.
// The sessions are closed again, so the pool must hold one point's sessions, not the grid's.
//
// Thread-safety: uses the engine, which is not thread-safe.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "metronome/engine/engine.h"
#include "metronome/kv/kv_policy.h"
#include "metronome/realtime/cost_model.h"

namespace metronome::serving {

struct CalibrationPoint {
  std::int64_t sessions = 0;  // B
  std::int64_t context = 0;   // C, tokens each session holds before any other step
  std::int64_t chunk = 0;     // n, tokens each session submits per step
  // 0: the context is prefilled. Otherwise only this many tokens are (a multiple of the block
  // size, dividing C, C within the policy's window) and their KV is repeated to C tokens and
  // imported: a step's cost depends on how many keys it attends to, not on their values, so a
  // window of thousands is timed without its minutes of prefill.
  std::int64_t prefilled = 0;
  // Whether the context is repeated from a shorter prefill, and the tokens actually prefilled.
  [[nodiscard]] bool Repeats() const { return prefilled > 0 && prefilled < context; }
  [[nodiscard]] std::int64_t PrefillTokens() const { return Repeats() ? prefilled : context; }
  // Tokens each session holds after `steps` steps of `chunk` tokens on top of the context.
  [[nodiscard]] std::int64_t TotalTokens(int steps) const { return context + steps * chunk; }
};

struct CalibrationSettings {
  int repeats = 5;           // timed steps per point; the median is recorded; >= 1
  int warmup = 1;            // untimed steps per point before those; >= 0
  TokenPos max_context = 0;  // each session's context limit (0: what the point needs)
};

struct CalibrationMeasurement {
  CalibrationPoint point;
  realtime::StepObservation obs;  // median seconds; mean visible_kv_tokens over the timed steps
  double prefill_seconds = 0.0;   // wall time of the untimed prefill to the point's context
};

// Why `point` cannot be timed under `policy` with KV blocks of `block_tokens` tokens (its
// `prefilled` tokens cannot be repeated to its context); empty if it can.
[[nodiscard]] std::string CalibrationPointError(const CalibrationPoint& point,
                                                const kv::KvPolicy& policy,
                                                std::int64_t block_tokens);

// Tokens per session per prefill step; a pool for a point must hold chunks this large.
inline constexpr int kCalibrationPrefillChunk = 256;

// The point timed on fresh sessions, or the reason a step failed ("prefill step failed:
// pool_exhausted").
[[nodiscard]] std::variant<CalibrationMeasurement, std::string> MeasureCalibrationPoint(
    engine::Engine& engine, const kv::KvPolicy& policy, const CalibrationSettings& settings,
    const CalibrationPoint& point, std::mt19937& rng);

// The design (batch_tokens, visible_kv_tokens) each point will have, with unit times: what
// FitCostModel needs to tell, before anything is timed, whether the grid separates the terms.
[[nodiscard]] std::vector<realtime::StepObservation> CalibrationDesign(
    const std::vector<CalibrationPoint>& grid, const kv::KvPolicy& policy,
    const CalibrationSettings& settings);

// The start-up calibration of serve and drive: a small grid around `session`, the fit, and
// N* = PredictedSessionLimit(fit, session, latency_fraction), the fit's linear c2 extrapolated to
// the session's full window. The grid: B = 1, 4, 16 sessions x contexts 32 and 256 tokens x chunks
// 1 and a + 1, 3 timed steps after 1 untimed (about 12k prefill tokens and 72 timed steps: well
// under a second on synthetic:tiny). Batch sizes are capped at the sessions of 256 + 4 (a + 1)
// tokens the pool's free blocks hold (a + 1 <= 256: larger chunks are not calibrated here).
// The grid is sized to the model within `budget_s` of wall time: the (1 session, 32 tokens) pair
// runs first and its prefill and step times predict what every further (B, C) pair costs; the
// second context (which separates c2) is the longest of 256, 128, 64 that fits (64 if none does),
// then the larger batches while they fit. A model that decodes a few tokens a second thus
// calibrates in about the budget, not in the full grid's minutes. Last, whatever the budget, a
// window session's pair at one session and its window (the longest multiple of the longer
// context within W that the pool holds), its context repeated, not prefilled: the price
// extrapolates c2 to the full window, and a c2 fitted at a few hundred keys is at the mercy of
// noise (a co-tenant's burst during the start fitted it to 0 and priced a window of 8192 keys
// as free). The fit's c2 is then raised, if need be, until the model prices that frame (the
// chunk of a + 1 and o - 1 decodes at the window) no faster than it ran (realtime::AnchorKvCost).
// The failed step's reason if a step failed, the pool holds no such session, or the fit did not.
inline constexpr double kStartCalibrationBudgetS = 30.0;
struct SessionCalibration {
  realtime::CostModelFit fit;  // its model anchored at the window's frame; r2 and errors: the fit's
  double fitted_c2_s_per_kv_token = 0.0;  // the least-squares c2, before the anchoring
  // The frame at the window the model is anchored at: its iterations as timed (empty: no window
  // pair, not anchored).
  std::vector<realtime::StepObservation> window_frame;
  std::int64_t predicted_limit = 0;    // PredictedSessionLimit; 0: none
  double seconds = 0.0;                // wall time of the measuring
  std::vector<CalibrationPoint> grid;  // the points measured, in order
  [[nodiscard]] std::string GridSummary()
      const;  // "8 points: sessions 1/4, contexts 32/256 tokens"
};
[[nodiscard]] std::variant<SessionCalibration, std::string> CalibrateForSession(
    engine::Engine& engine, const realtime::SessionSpec& session, double latency_fraction,
    double budget_s = kStartCalibrationBudgetS);

}  // namespace metronome::serving
