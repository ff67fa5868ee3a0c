#include "metronome/serving/engine_calibration.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "metronome/base/errors.h"

namespace metronome::serving {
namespace {

constexpr int kPrefillTokensPerStep = 2048;  // prefill steps batch sessions up to this many tokens

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// Runs one batched step; the failure's reason, empty if every item ran.
std::string RunStep(engine::Engine& eng, const std::vector<engine::StepItem>& items,
                    std::vector<engine::StepItemResult>* results, const char* phase) {
  eng.Step(items, results);
  for (const engine::StepItemResult& r : *results) {
    if (r.status != engine::StepStatus::kOk) {
      return std::string(phase) + " step failed: " + engine::ToString(r.status);
    }
  }
  return "";
}

}  // namespace

namespace {

// The sessions of one point and the tokens each submits: its context, then the timed steps'.
struct PointSessions {
  engine::SessionOptions options;
  std::vector<engine::SessionId> ids;
  std::vector<std::vector<TokenId>> streams;

  [[nodiscard]] std::span<const TokenId> Tokens(std::size_t s, std::int64_t begin,
                                                std::int64_t n) const {
    return std::span<const TokenId>(streams[s])
        .subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(n));
  }
  void CloseAll(engine::Engine& eng) const {
    for (const engine::SessionId id : ids) eng.CloseSession(id);
  }
};

// Untimed prefill of every session to `tokens`: chunks of kCalibrationPrefillChunk, several
// sessions a step. The failed step's reason, empty if all ran.
std::string Prefill(engine::Engine& eng, const PointSessions& ps, std::int64_t tokens) {
  std::vector<engine::StepItem> items;
  std::vector<engine::StepItemResult> results;
  const auto sessions = static_cast<std::int64_t>(ps.ids.size());
  const std::int64_t per_step = std::max(1, kPrefillTokensPerStep / kCalibrationPrefillChunk);
  for (std::int64_t begin = 0; begin < tokens; begin += kCalibrationPrefillChunk) {
    const std::int64_t n = std::min<std::int64_t>(kCalibrationPrefillChunk, tokens - begin);
    for (std::int64_t s0 = 0; s0 < sessions; s0 += per_step) {
      items.clear();
      for (std::int64_t s = s0; s < std::min(sessions, s0 + per_step); ++s) {
        const auto i = static_cast<std::size_t>(s);
        items.push_back({ps.ids[i], ps.Tokens(i, begin, n), engine::LogitsMode::kNone});
      }
      if (std::string error = RunStep(eng, items, &results, "prefill"); !error.empty()) {
        return error;
      }
    }
  }
  return "";
}

// Replaces session *id, which holds a prefix whose length divides `context` (whole blocks, none
// left the window), with a session of `context` tokens: the prefix's KV blocks repeated, imported.
std::string RepeatContext(engine::Engine& eng, const engine::SessionOptions& options,
                          std::int64_t context, engine::SessionId* id) {
  const std::optional<kv::SessionKvSnapshot> prefix = eng.ExportSession(*id);
  if (!prefix.has_value() || prefix->length <= 0) return "no prefix to repeat";
  kv::SessionKvSnapshot repeated;
  repeated.length = context;
  repeated.window_first_block = prefix->window_first_block;
  const std::int64_t copies = context / prefix->length;
  repeated.blocks.reserve(prefix->blocks.size() * static_cast<std::size_t>(copies));
  for (std::int64_t k = 0; k < copies; ++k) {
    repeated.blocks.insert(repeated.blocks.end(), prefix->blocks.begin(), prefix->blocks.end());
  }
  eng.CloseSession(*id);
  std::string error;
  switch (eng.ImportSession(options, repeated, id, &error)) {
    case kv::RestoreResult::kOk:
      return "";
    case kv::RestoreResult::kPoolExhausted:
      return "the KV pool holds no session of " + std::to_string(context) + " tokens";
    case kv::RestoreResult::kInvalid:
      break;
  }
  return "a context of " + std::to_string(context) + " repeated: " + error;
}

// The timed steps: every session submits `chunk` tokens and asks for its next token, as the
// real-time loop's EngineBackend does. The clock brackets Engine::Step only, which is the part
// of EngineBackend::Step the simulator's cost model replaces. The failed step's reason, or the
// observation: median seconds against the mean visible keys (visible_kv_tokens grows linearly
// over the timed steps, so its mean is the middle step's count: the median's natural partner).
std::variant<realtime::StepObservation, std::string> TimeSteps(
    engine::Engine& eng, const PointSessions& ps, const CalibrationPoint& g,
    const CalibrationSettings& settings) {
  std::vector<engine::StepItem> items;
  std::vector<engine::StepItemResult> results;
  std::vector<double> seconds;
  double visible_sum = 0.0;
  for (int k = 0; k < settings.warmup + settings.repeats; ++k) {
    items.clear();
    double visible = 0.0;
    for (std::size_t s = 0; s < ps.ids.size(); ++s) {
      const kv::SessionKv* kv = eng.session_kv(ps.ids[s]);
      visible += static_cast<double>(kv->policy().VisibleKeysOfChunk(kv->length(), g.chunk));
      items.push_back({ps.ids[s], ps.Tokens(s, kv->length(), g.chunk), engine::LogitsMode::kLast});
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (std::string error = RunStep(eng, items, &results, "timed"); !error.empty()) return error;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (k >= settings.warmup) {
      seconds.push_back(dt);
      visible_sum += visible;
    }
  }
  return realtime::StepObservation{static_cast<double>(g.sessions * g.chunk),
                                   visible_sum / settings.repeats, Median(std::move(seconds))};
}

}  // namespace

std::string CalibrationPointError(const CalibrationPoint& g, const kv::KvPolicy& policy,
                                  std::int64_t block_tokens) {
  if (g.prefilled == 0 || g.prefilled >= g.context) return "";  // a negative one is named below
  const std::string what = "calibration point with context " + std::to_string(g.context) +
                           ": prefilled " + std::to_string(g.prefilled);
  if (g.prefilled < 0 || g.prefilled % block_tokens != 0) {
    return what + " is not a positive multiple of the block size " + std::to_string(block_tokens);
  }
  if (g.context % g.prefilled != 0) return what + " does not divide the context";
  if (policy.mode == kv::KvMode::kWindow && g.context > policy.window) {
    return what + ": the context is beyond the window " + std::to_string(policy.window);
  }
  return "";
}

std::variant<CalibrationMeasurement, std::string> MeasureCalibrationPoint(
    engine::Engine& eng, const kv::KvPolicy& policy, const CalibrationSettings& settings,
    const CalibrationPoint& g, std::mt19937& rng) {
  if (std::string error = CalibrationPointError(g, policy, eng.pool_stats().block_tokens);
      !error.empty()) {
    return error;
  }
  const int vocab = eng.config().vocab_size;
  std::uniform_int_distribution<TokenId> tok(0, vocab - 1);
  const std::int64_t total = g.TotalTokens(settings.warmup + settings.repeats);
  PointSessions ps;
  ps.options.policy = policy;
  ps.options.max_context = settings.max_context > 0 ? settings.max_context : total;
  for (std::int64_t s = 0; s < g.sessions; ++s) {
    ps.ids.push_back(eng.OpenSession(ps.options));
    std::vector<TokenId>& stream = ps.streams.emplace_back(static_cast<std::size_t>(total));
    for (TokenId& t : stream) t = tok(rng);
  }
  const auto prefill_t0 = std::chrono::steady_clock::now();
  std::string error = Prefill(eng, ps, g.PrefillTokens());
  for (std::size_t s = 0; g.Repeats() && error.empty() && s < ps.ids.size(); ++s) {
    error = RepeatContext(eng, ps.options, g.context, &ps.ids[s]);
  }
  const double prefill_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_t0).count();
  auto obs = error.empty() ? TimeSteps(eng, ps, g, settings)
                           : std::variant<realtime::StepObservation, std::string>(error);
  ps.CloseAll(eng);
  if (auto* failed = std::get_if<std::string>(&obs)) return std::move(*failed);
  return CalibrationMeasurement{.point = g,
                                .obs = std::get<realtime::StepObservation>(obs),
                                .prefill_seconds = prefill_seconds};
}

std::vector<realtime::StepObservation> CalibrationDesign(const std::vector<CalibrationPoint>& grid,
                                                         const kv::KvPolicy& policy,
                                                         const CalibrationSettings& settings) {
  std::vector<realtime::StepObservation> design;
  for (const CalibrationPoint& g : grid) {
    double visible = 0.0;  // per session, summed over the timed steps
    for (std::int64_t k = settings.warmup; k < settings.warmup + settings.repeats; ++k) {
      visible += static_cast<double>(policy.VisibleKeysOfChunk(g.context + k * g.chunk, g.chunk));
    }
    design.push_back({static_cast<double>(g.sessions * g.chunk),
                      static_cast<double>(g.sessions) * visible / settings.repeats, 1.0});
  }
  return design;
}

std::string SessionCalibration::GridSummary() const {
  std::vector<std::int64_t> batches;
  std::vector<std::int64_t> contexts;
  for (const CalibrationPoint& g : grid) {
    if (std::find(batches.begin(), batches.end(), g.sessions) == batches.end())
      batches.push_back(g.sessions);
    if (std::find(contexts.begin(), contexts.end(), g.context) == contexts.end())
      contexts.push_back(g.context);
  }
  const auto join = [](const std::vector<std::int64_t>& v) {
    std::string out;
    for (const std::int64_t x : v) out += (out.empty() ? "" : "/") + std::to_string(x);
    return out;
  };
  return std::to_string(grid.size()) + " points: sessions " + join(batches) + ", contexts " +
         join(contexts) + " tokens";
}

namespace {

// What the measured (1 session, C0 tokens) pair predicts a (B, C) pair of the same chunks costs:
// its prefill at the pair's per-token prefill time, and its steps at the single session's step
// time plus the prefill's per-token time for each further session's tokens.
struct PairCost {
  double prefill_s_per_token = 0.0;
  double step_s[2] = {0.0, 0.0};  // the single session's median step, chunk 1 and a + 1
  std::int64_t chunk[2] = {1, 1};
  int steps = 0;  // warmup + repeats

  [[nodiscard]] double Predict(std::int64_t sessions, std::int64_t context_tokens) const {
    const double prefill_s = prefill_s_per_token * static_cast<double>(sessions * context_tokens);
    double total = 0.0;
    for (int k = 0; k < 2; ++k) {
      const double step =
          step_s[k] + prefill_s_per_token * static_cast<double>((sessions - 1) * chunk[k]);
      total += prefill_s + steps * step;
    }
    return total;
  }
};

// The contexts of the start-up grid's longer pair, longest first: the first whose pair fits the
// time budget is measured.
constexpr std::int64_t kLongContexts[] = {256, 128, 64};

// The start-up grid's batch sizes: 1, 4 and 16 sessions, each capped at as many sessions as the
// pool holds at the largest point (a server capped at a few sessions sizes its pool to them); one
// session still separates the terms (chunks 1 and a + 1, contexts 32 and a longer one). An error
// when the pool holds no session of that point.
std::variant<std::vector<std::int64_t>, std::string> StartupBatches(
    const kv::PoolStats& pool, std::int64_t chunk, const CalibrationSettings& settings) {
  const std::int64_t largest_tokens =
      CalibrationPoint{1, kLongContexts[0], chunk}.TotalTokens(settings.warmup + settings.repeats);
  const std::int64_t blocks_each = (largest_tokens + pool.block_tokens - 1) / pool.block_tokens + 1;
  const std::int64_t most_sessions = pool.free_blocks / std::max<std::int64_t>(1, blocks_each);
  if (most_sessions < 1) {
    return "the KV pool's " + std::to_string(pool.free_blocks) +
           " free blocks hold no session of " + std::to_string(largest_tokens) + " tokens";
  }
  std::vector<std::int64_t> batches;
  for (const std::int64_t b : {1, 4, 16}) {
    const std::int64_t capped = std::min(b, most_sessions);
    if (std::find(batches.begin(), batches.end(), capped) == batches.end()) {
      batches.push_back(capped);
    }
  }
  return batches;
}

// The context of the start-up grid's window pair: the longest multiple of `prefilled` within the
// policy's window whose session, with its timed steps, the pool's free blocks hold; 0 when there
// is none (not a window session, or a context CalibrationPointError refuses).
std::int64_t WindowContext(const kv::KvPolicy& policy, const kv::PoolStats& pool,
                           std::int64_t prefilled, std::int64_t chunk,
                           const CalibrationSettings& settings) {
  if (policy.mode != kv::KvMode::kWindow) return 0;
  const std::int64_t step_tokens = (settings.warmup + settings.repeats) * chunk;
  // A session of C tokens plus the steps' holds at most (C + steps) / B + 1 blocks (a partial one).
  const std::int64_t pool_tokens = (pool.free_blocks - 1) * pool.block_tokens - step_tokens;
  const std::int64_t context =
      std::min<std::int64_t>(policy.window, pool_tokens) / prefilled * prefilled;
  const CalibrationPoint point{1, context, chunk, prefilled};
  return CalibrationPointError(point, policy, pool.block_tokens).empty() ? context : 0;
}

// The start-up grid's fit, anchored at out->window_frame (if any), and N* from it; the reason if
// the fit failed.
std::string FitAnchorAndPredict(const std::vector<realtime::StepObservation>& observations,
                                const realtime::SessionSpec& session, double latency_fraction,
                                SessionCalibration* out) {
  try {
    out->fit = realtime::FitCostModel(observations);
  } catch (const ConfigError& e) {
    return std::string("the fit failed: ") + e.what();
  }
  out->fitted_c2_s_per_kv_token = out->fit.model.c2_s_per_kv_token;
  out->fit.model = realtime::AnchorKvCost(out->fit.model, out->window_frame);
  out->predicted_limit = realtime::PredictedSessionLimit(out->fit.model, session, latency_fraction);
  return "";
}

}  // namespace

std::variant<SessionCalibration, std::string> CalibrateForSession(
    engine::Engine& engine, const realtime::SessionSpec& session, double latency_fraction,
    double budget_s) {
  const std::int64_t chunk = session.input_tokens_per_frame + 1;
  if (chunk > kCalibrationPrefillChunk) {
    return "a frame of " + std::to_string(session.input_tokens_per_frame) +
           " tokens is beyond the start-up calibration's grid";
  }
  const CalibrationSettings settings{.repeats = 3, .warmup = 1};
  constexpr std::int64_t kShortContext = 32;
  auto batches_or = StartupBatches(engine.pool_stats(), chunk, settings);
  if (auto* error = std::get_if<std::string>(&batches_or)) return std::move(*error);
  const std::vector<std::int64_t>& batches = std::get<std::vector<std::int64_t>>(batches_or);

  std::mt19937 rng(7);  // token ids only; they do not affect the timing
  SessionCalibration out;
  std::vector<realtime::StepObservation> observations;
  const auto t0 = std::chrono::steady_clock::now();
  const auto elapsed_s = [&t0] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // The pair of points (chunks 1 and a + 1) at B sessions and context C; the measurements.
  std::vector<CalibrationMeasurement> pair;
  const auto measure_pair = [&](std::int64_t b, std::int64_t c,
                                std::int64_t prefilled = 0) -> std::string {
    pair.clear();
    // a >= 1, so the chunk is >= 2: two distinct points per (B, C).
    for (const std::int64_t n : {std::int64_t{1}, chunk}) {
      const CalibrationPoint g{b, c, n, prefilled};
      auto m = MeasureCalibrationPoint(engine, session.policy, settings, g, rng);
      if (auto* error = std::get_if<std::string>(&m)) return std::move(*error);
      pair.push_back(std::get<CalibrationMeasurement>(m));
      observations.push_back(pair.back().obs);
      out.grid.push_back(g);
    }
    return "";
  };

  if (std::string error = measure_pair(1, kShortContext); !error.empty()) return error;
  PairCost cost;
  cost.prefill_s_per_token = pair[0].prefill_seconds / static_cast<double>(kShortContext);
  cost.step_s[0] = pair[0].obs.seconds;
  cost.step_s[1] = pair[1].obs.seconds;
  cost.chunk[1] = chunk;
  cost.steps = settings.warmup + settings.repeats;
  std::int64_t long_context = kLongContexts[std::size(kLongContexts) - 1];
  for (const std::int64_t c : kLongContexts) {
    if (elapsed_s() + cost.Predict(1, c) <= budget_s) {
      long_context = c;
      break;
    }
  }
  if (std::string error = measure_pair(1, long_context); !error.empty()) return error;
  for (const std::int64_t b : batches) {
    if (b == 1) continue;
    for (const std::int64_t c : {kShortContext, long_context}) {
      if (elapsed_s() + cost.Predict(b, c) > budget_s) continue;
      if (std::string error = measure_pair(b, c); !error.empty()) return error;
    }
  }
  const std::int64_t window_context =
      WindowContext(session.policy, engine.pool_stats(), long_context, chunk, settings);
  // One frame of the session at its window, as its iterations: the chunk of a + 1, then decodes.
  std::vector<realtime::StepObservation>& window_frame = out.window_frame;
  if (window_context > long_context) {
    if (std::string error = measure_pair(1, window_context, long_context); !error.empty()) {
      return error;
    }
    window_frame.push_back(pair[1].obs);
    window_frame.insert(window_frame.end(), realtime::FrameIterations(session) - 1, pair[0].obs);
  }
  out.seconds = elapsed_s();
  if (std::string error = FitAnchorAndPredict(observations, session, latency_fraction, &out);
      !error.empty()) {
    return error;
  }
  return out;
}

}  // namespace metronome::serving
