// metronome calibrate: fits the simulator's step-time model (realtime::CostModel,
// t = c0 + c1 * batch_tokens + c2 * visible_kv_tokens) to steps of the real CPU engine.
//
// For every grid point (B sessions, context C, chunk n) it opens B fresh sessions, prefills each
// to C tokens (untimed; beyond --repeat-prefix, repeats a shorter prefill's KV to C), runs `warmup`
// untimed steps, then times `repeats` steps in which every session submits n tokens (n = 1 is a
// decode step), and records the median step time against batch_tokens = B n and visible_kv_tokens
// computed exactly as CostModelBackend::Step does. The fit over all grid points is printed as a
// table, a summary line and a final JSON line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/base/number_list.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/realtime/cost_model.h"
#include "metronome/serving/engine_calibration.h"

namespace metronome::cli {
namespace {

struct CalibrateFlags {
  ModelFlags model;
  KvFlags kv;
  EngineFlags engine;
  std::string batch_sessions = "1,4,16,32";
  std::string contexts = "64,256,1024";
  std::string chunk_tokens = "1,16";
  std::int64_t repeat_prefix = 0;
  int repeats = 5;
  int warmup = 1;
  std::string out;
  void Register(CLI::App* sub);
};

void CalibrateFlags::Register(CLI::App* sub) {
  model.Register(sub, false);
  kv.Register(sub);
  engine.Register(sub);
  sub->add_option("--batch-sessions", batch_sessions,
                  "Grid: sessions taking part in each measured step, a comma-separated list")
      ->capture_default_str();
  sub->add_option("--contexts", contexts,
                  "Grid: tokens each session holds before the measured steps (C), a "
                  "comma-separated list; prefilled untimed")
      ->capture_default_str();
  sub->add_option("--chunk-tokens", chunk_tokens,
                  "Grid: tokens each session submits per measured step (n; 1 = decode), a "
                  "comma-separated list")
      ->capture_default_str();
  sub->add_option("--repeat-prefix", repeat_prefix,
                  "Contexts longer than this many tokens are not prefilled: the KV of a prefill "
                  "this long is repeated to them (a step's cost depends on how many keys it "
                  "reads, not on their values). A multiple of --block-tokens that divides each "
                  "longer context, which must fit the window; 0: prefill every context")
      ->capture_default_str();
  sub->add_option("--repeats", repeats,
                  "Measured steps per grid point; the median step time is fitted")
      ->capture_default_str();
  sub->add_option("--warmup", warmup, "Unmeasured steps per grid point before those")
      ->capture_default_str();
  sub->add_option("--out", out,
                  "Also write the fit as JSON to this file: c0_s, c1_s_per_token, "
                  "c2_s_per_kv_token, fit quality, run settings and every measured point");
}

// Limits of the grid values; generous, they only stop typos from asking for absurd runs.
constexpr std::int64_t kMaxBatchSessions = 4096;
constexpr std::int64_t kMaxContext = std::int64_t{1} << 24;
constexpr std::int64_t kMaxChunk = 1 << 16;
using GridPoint = serving::CalibrationPoint;
constexpr int kPrefillChunk = serving::kCalibrationPrefillChunk;

// "1,4,16" (commas or spaces) -> values in [lo, hi]; ConfigError naming the flag and its value.
std::vector<std::int64_t> ParseList(const std::string& text, const std::string& flag,
                                    std::int64_t lo, std::int64_t hi) {
  const auto error = [&](const std::string& what) {
    std::string msg = flag;
    msg += " = '" + text + "': " + what;
    return ConfigError(msg);
  };
  const auto words = base::SplitIntegers(text);
  if (const auto* bad = std::get_if<std::string>(&words)) {
    throw error("'" + *bad + "' is not an integer");
  }
  std::vector<std::int64_t> values;
  for (const base::IntegerWord& w : std::get<std::vector<base::IntegerWord>>(words)) {
    if (w.value < lo || w.value > hi) {
      throw error(w.word + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    values.push_back(w.value);
  }
  if (values.empty()) throw error("needs at least one value");
  return values;
}

serving::CalibrationSettings SettingsOf(const CalibrateFlags& f) {
  return {.repeats = f.repeats, .warmup = f.warmup, .max_context = f.kv.max_context};
}

// Fails fast (before any measuring) when the grid's design cannot separate the three terms, e.g.
// a single context and chunk size make visible_kv_tokens proportional to batch_tokens. The design
// (batch_tokens, visible_kv_tokens) of every point is known in advance; only the times are not.
void CheckGridIdentifiesTheModel(const std::vector<GridPoint>& grid, const kv::KvPolicy& policy,
                                 const CalibrateFlags& f) {
  const std::vector<realtime::StepObservation> design =
      serving::CalibrationDesign(grid, policy, SettingsOf(f));
  try {
    (void)realtime::FitCostModel(design);
  } catch (const ConfigError& e) {
    std::string msg = "--batch-sessions '" + f.batch_sessions + "' --contexts '" + f.contexts +
                      "' --chunk-tokens '" + f.chunk_tokens + "': ";
    msg += e.what();
    throw ConfigError(msg);
  }
}

// The grid of the flags (batch sessions x contexts x chunk sizes), checked before any measuring,
// and the tokens per session its largest point needs.
struct Grid {
  std::vector<GridPoint> points;
  std::int64_t max_total_tokens = 0;
};

Grid ParseGrid(const CalibrateFlags& f, const kv::KvPolicy& policy) {
  const std::vector<std::int64_t> batch =
      ParseList(f.batch_sessions, "--batch-sessions", 1, kMaxBatchSessions);
  const std::vector<std::int64_t> contexts = ParseList(f.contexts, "--contexts", 0, kMaxContext);
  const std::vector<std::int64_t> chunks =
      ParseList(f.chunk_tokens, "--chunk-tokens", 1, kMaxChunk);
  if (f.repeats < 1 || f.repeats > 10000) {
    throw ConfigError("--repeats = " + std::to_string(f.repeats) + " must be in [1, 10000]");
  }
  if (f.warmup < 0 || f.warmup > 1000) {
    throw ConfigError("--warmup = " + std::to_string(f.warmup) + " must be in [0, 1000]");
  }
  if (f.repeat_prefix < 0) {
    throw ConfigError("--repeat-prefix = " + std::to_string(f.repeat_prefix) + " must be >= 0");
  }
  Grid grid;
  for (const std::int64_t b : batch) {
    for (const std::int64_t c : contexts) {
      const std::int64_t prefilled = c > f.repeat_prefix ? f.repeat_prefix : 0;
      for (const std::int64_t n : chunks) {
        const GridPoint g{b, c, n, prefilled};
        if (const std::string error =
                serving::CalibrationPointError(g, policy, f.engine.block_tokens);
            !error.empty()) {
          throw ConfigError("--repeat-prefix = " + std::to_string(f.repeat_prefix) + ": " + error);
        }
        grid.points.push_back(g);
      }
    }
  }
  if (grid.points.size() < 3) {
    throw ConfigError("--batch-sessions x --contexts x --chunk-tokens give " +
                      std::to_string(grid.points.size()) +
                      " grid points; fitting 3 coefficients needs at least 3");
  }
  const int steps = f.warmup + f.repeats;
  for (const GridPoint& g : grid.points) {
    grid.max_total_tokens = std::max(grid.max_total_tokens, g.TotalTokens(steps));
  }
  if (f.kv.max_context > 0 && f.kv.max_context < grid.max_total_tokens) {
    throw ConfigError("--max-context = " + std::to_string(f.kv.max_context) + " is below the " +
                      std::to_string(grid.max_total_tokens) +
                      " tokens per session the grid needs (largest context + (--warmup + "
                      "--repeats) x largest chunk)");
  }
  return grid;
}

// The engine for the grid: room for its largest batch, context and chunk.
engine::EngineOptions EngineOptionsFor(const CalibrateFlags& f, const model::Model& m,
                                       const kv::KvPolicy& policy, const Grid& grid) {
  std::int64_t max_b = 0;
  std::int64_t max_chunk = 0;
  for (const GridPoint& g : grid.points) {
    max_b = std::max(max_b, g.sessions);
    max_chunk = std::max(max_chunk, g.chunk);
  }
  engine::EngineOptions eo =
      f.engine.Options(m.config, policy, max_b, grid.max_total_tokens,
                       static_cast<int>(std::max(max_chunk, std::int64_t{kPrefillChunk})));
  if (f.engine.kv_blocks == 0 && f.engine.kv_pool_mb <= 0.0) {
    // Sized for the largest single grid point rather than (largest B) x (largest context): every
    // point runs on fresh sessions that are closed afterwards.
    const int steps = f.warmup + f.repeats;
    std::int64_t blocks = 1;
    for (const GridPoint& g : grid.points) {
      const engine::EngineOptions one =
          f.engine.Options(m.config, policy, 1, g.TotalTokens(steps),
                           static_cast<int>(std::max(g.chunk, std::int64_t{kPrefillChunk})));
      blocks = std::max(blocks, g.sessions * one.kv_blocks);
    }
    eo.kv_blocks = blocks;
  }
  return eo;
}

// Times every grid point into *measured: 0, or the exit status of a failed point.
int MeasureGrid(engine::Engine& eng, const kv::KvPolicy& policy, const CalibrateFlags& f,
                const Grid& grid, std::vector<serving::CalibrationMeasurement>* measured) {
  std::mt19937 rng(7);  // token ids only; they do not affect the timing
  for (const GridPoint& g : grid.points) {
    auto meas = serving::MeasureCalibrationPoint(eng, policy, SettingsOf(f), g, rng);
    if (const auto* error = std::get_if<std::string>(&meas)) {
      std::fprintf(stderr, "error: %s%s\n", error->c_str(),
                   error->find("pool_exhausted") != std::string::npos
                       ? " (raise --kv-pool-mb or --kv-blocks)"
                       : "");
      return 3;
    }
    measured->push_back(std::get<serving::CalibrationMeasurement>(meas));
  }
  return 0;
}

// Prints the table of timed against modelled step times and the fit; returns the points as
// JSON (for --out).
nlohmann::json PrintFit(const engine::Engine& eng, const kv::KvPolicy& policy,
                        const CalibrateFlags& f,
                        const std::vector<serving::CalibrationMeasurement>& measured,
                        const realtime::CostModelFit& fit, double run_s) {
  std::printf(
      "calibrate model=%s kv=%s kv-dtype=%s threads=%d block-tokens=%d repeats=%d warmup=%d\n",
      f.model.model.c_str(), policy.ToString().c_str(), kv::ToString(eng.kv_layout().dtype),
      eng.num_threads(), eng.kv_layout().block_tokens, f.repeats, f.warmup);
  std::printf("%8s %8s %6s %12s %18s %12s %10s %9s\n", "sessions", "context", "chunk",
              "batch_tokens", "visible_kv_tokens", "measured_ms", "model_ms", "rel_err");
  nlohmann::json points = nlohmann::json::array();
  for (const serving::CalibrationMeasurement& meas : measured) {
    const realtime::StepObservation& o = meas.obs;
    const double model_s = fit.model.StepSeconds(o.batch_tokens, o.visible_kv_tokens);
    const double rel = (model_s - o.seconds) / o.seconds;
    std::printf("%8lld %8lld %6lld %12.0f %18.0f %12.4f %10.4f %8.1f%%\n",
                static_cast<long long>(meas.point.sessions),
                static_cast<long long>(meas.point.context),
                static_cast<long long>(meas.point.chunk), o.batch_tokens, o.visible_kv_tokens,
                o.seconds * 1e3, model_s * 1e3, rel * 100.0);
    points.push_back({{"batch_sessions", meas.point.sessions},
                      {"context", meas.point.context},
                      {"chunk_tokens", meas.point.chunk},
                      {"prefilled_tokens", meas.point.PrefillTokens()},
                      {"batch_tokens", o.batch_tokens},
                      {"visible_kv_tokens", o.visible_kv_tokens},
                      {"measured_s", o.seconds},
                      {"model_s", model_s},
                      {"rel_error", rel}});
  }
  std::printf(
      "fit c0_s=%.4g c1_s_per_token=%.4g c2_s_per_kv_token=%.4g r2=%.4f "
      "median_abs_rel_error=%.3f max_abs_rel_error=%.3f num_points=%lld (measured in %.1f s)\n",
      fit.model.c0_s, fit.model.c1_s_per_token, fit.model.c2_s_per_kv_token, fit.r2,
      fit.median_abs_rel_error, fit.max_abs_rel_error, static_cast<long long>(fit.num_points),
      run_s);
  return points;
}

// The cost model as JSON (printed, and with the points written to --out when given).
void WriteCostModel(const engine::Engine& eng, const kv::KvPolicy& policy, const CalibrateFlags& f,
                    const realtime::CostModelFit& fit, nlohmann::json points,
                    std::ofstream& out_file) {
  nlohmann::json j = realtime::CostModelToJson(fit.model);
  j["fit"] = {{"r2", fit.r2},
              {"median_abs_rel_error", fit.median_abs_rel_error},
              {"max_abs_rel_error", fit.max_abs_rel_error},
              {"num_points", fit.num_points}};
  j["model"] = f.model.model;
  j["kv"] = policy.ToString();
  j["kv_dtype"] = kv::ToString(eng.kv_layout().dtype);
  j["threads"] = eng.num_threads();
  j["block_tokens"] = eng.kv_layout().block_tokens;
  std::printf("%s\n", j.dump().c_str());
  if (out_file.is_open()) {
    j["points"] = std::move(points);
    out_file << j.dump(2) << '\n';
    out_file.flush();
    if (!out_file) throw ConfigError("--out: cannot write '" + f.out + "'");
  }
}

int RunCalibrate(const CalibrateFlags& f) {
  const kv::KvPolicy policy = f.kv.Policy();
  const Grid grid = ParseGrid(f, policy);
  CheckGridIdentifiesTheModel(grid.points, policy, f);
  // Open --out now so that an unwritable path fails before minutes of measuring.
  std::ofstream out_file;
  if (!f.out.empty()) {
    out_file.open(f.out);
    if (!out_file) throw ConfigError("--out: cannot write '" + f.out + "'");
  }

  const model::Model m = f.model.Load();
  engine::Engine eng(m, EngineOptionsFor(f, m, policy, grid));
  std::vector<serving::CalibrationMeasurement> measured;
  const auto t0 = std::chrono::steady_clock::now();
  if (const int rc = MeasureGrid(eng, policy, f, grid, &measured); rc != 0) return rc;
  const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<realtime::StepObservation> obs;
  obs.reserve(measured.size());
  for (const serving::CalibrationMeasurement& meas : measured) obs.push_back(meas.obs);
  const realtime::CostModelFit fit = realtime::FitCostModel(obs);
  nlohmann::json points = PrintFit(eng, policy, f, measured, fit, run_s);
  WriteCostModel(eng, policy, f, fit, std::move(points), out_file);
  return 0;
}

}  // namespace

const AddCommandFlags kAddCalibrateFlags = &AddFlagsAndRun<CalibrateFlags, RunCalibrate>;

}  // namespace metronome::cli
