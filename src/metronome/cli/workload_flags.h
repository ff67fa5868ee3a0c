// The workload flags `metronome sim` and `metronome drive` share (other tools rely on these
// spellings), and the run + report both commands end with. Internal to the cli module.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "metronome/base/clock.h"
#include "metronome/base/errors.h"
#include "metronome/realtime/backend.h"
#include "metronome/realtime/session_resolve.h"
#include "metronome/realtime/supervisor.h"
#include "metronome/realtime/workload_runner.h"

namespace metronome::cli {

// Defaults that depend on the model or preset; a flag given on the command line wins.
using SessionDefaults = realtime::SessionDefaults;

// Library errors name fields ("max_sessions = -1 must be >= 0"); the command line names flags. The
// one map between the two: every "FIELD = " of `message` whose field a flag sets becomes
// "--flag = ".
[[nodiscard]] std::string WithFlagNames(const std::string& message);
// Runs `f`; a ConfigError it throws comes back with WithFlagNames applied.
template <class F>
auto ReportingFlags(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const ConfigError& e) {
    throw ConfigError(WithFlagNames(e.what()));
  }
}

// The AIMD control window when --aimd-window-s is not given: 2 s or 25 periods of `period_ms`,
// whichever is longer, so a window holds enough frames. Scripts read it from `sim --list-presets
// --json` (aimd_window_s) rather than restating the rule.
[[nodiscard]] double DefaultAimdWindowS(double period_ms);

// Admission, alarm and forecast flags: the server's side of a workload (sim, drive and serve).
struct AdmissionFlags {
  std::string admission = "memory";
  std::int64_t max_sessions = 0;
  // The control window aimd and gradient2 share (the --aimd-window-* flags); unset durations take
  // their period-dependent defaults. The KV look-ahead guard is on in every command: a latency
  // signal cannot see the pool, and without the guard aimd and gradient2 over-admit wherever
  // memory binds before the deadline does (docs/results.md, 08: 1.8 N_true, 73-86% of frames
  // starved). --no-kv-guard gives the ablation.
  admission::WindowOptions window = [] {
    admission::WindowOptions w;
    w.kv_guard = true;
    return w;
  }();
  std::optional<double> aimd_window_s;
  std::optional<double> aimd_min_window_s;
  admission::AimdOptions aimd;            // its window is `window`
  admission::Gradient2Options gradient2;  // its window is `window`
  std::string aimd_cooldown = "drain";
  admission::MemoryOptions memory;
  realtime::WorkLimits work;  // the door rules on a session's price (--max-session-share, ...)
  int mute_after = 3;
  int max_step_tokens = 0;  // LoopOptions::max_step_tokens
  double forecast_horizon_s = 300.0;

  // --aimd-initial, once Register added it: given on the command line means a warm start (no
  // start-up calibration, start_calibration.h).
  const CLI::Option* aimd_initial_option = nullptr;

  void Register(CLI::App* app);
  // Register's groups, in --help order: the AIMD (and shared control-window) flags, gradient2's.
  void RegisterAimd(CLI::App* app);
  void RegisterGradient2(CLI::App* app);
  [[nodiscard]] bool aimd_initial_given() const {
    return aimd_initial_option != nullptr && aimd_initial_option->count() > 0;
  }
  // The admission controller, its parameters, the mute alarm and the forecast horizon; the AIMD
  // and gradient2 control windows last at most DefaultAimdWindowS(period_ms) and at least 0.5 s or
  // 2 periods (a new session's frames show in the window).
  // ConfigError naming the flag on bad values.
  [[nodiscard]] realtime::SupervisorOptions Supervisor(double period_ms) const;
};

// The admission a serving engine starts with (serve, drive): `aimd` (with the KV look-ahead guard,
// on by default), so the limit is anchored to the deadline and never promises more sessions than
// the pool holds; and the engine's step budget (serving::kEngineStepTokens). sim keeps
// AdmissionFlags' own defaults (`memory`, no step budget: its cost models are linear in the step's
// tokens), which its experiments and presets are stated in.
[[nodiscard]] AdmissionFlags ServingAdmissionFlags();

// A session's KV as the command line spells it (--kv, --window, --sinks, --positions): sim, drive
// and loadgen ask for it per session (WorkloadFlags), serve sets its defaults with it; each
// command registers the flags with its own help text and bounds. Unset flags stay unset.
struct SessionKvFlags {
  std::optional<std::string> kv;  // full | window (CLI11 admits only these)
  std::optional<std::int64_t> window;
  std::optional<std::int64_t> sinks;
  std::optional<std::string> positions;  // absolute | rolling (CLI11 admits only these)
  // Sets the KV fields of `shape` that the flags give.
  void ApplyTo(realtime::SessionShape* shape) const;
};

struct WorkloadFlags {
  // Session shape. Unset optionals take SessionDefaults.
  std::optional<double> period_ms;
  std::optional<double> deadline_ms;
  std::optional<int> tokens_per_frame;
  std::optional<int> output_tokens_per_frame;
  int prompt_tokens = 0;
  // A mix of session classes (realtime::ParseSessionMix; sim and drive): each class's fields
  // override the shape above, which stays the reference (one unit of work). Empty: no mix.
  std::string mix;
  SessionKvFlags kv;  // unset: SessionDefaults' (loadgen: the server's)
  // Who asks for sessions and for how long.
  std::int64_t sessions = 0;
  std::string arrival;
  std::string session_duration;
  double duration_s = 60.0;
  std::uint64_t seed = 1;
  double patience_s = 10.0;
  bool aligned_phases = false;
  // Admission, alarms and forecast.
  AdmissionFlags admission;
  // Outputs.
  std::string events_out;
  std::string metrics_out;
  std::string timeseries_out;  // CSV, one row per sample
  bool summary_json = false;
  double report_every_s = 0.0;
  bool quiet = false;

  // Every flag (sim, drive). The parts are for tools that take only some of them: loadgen is a
  // client, so it has the session shape, the population and the outputs but no admission.
  void Register(CLI::App* app);
  void RegisterSessionShape(CLI::App* app);
  void RegisterPopulation(CLI::App* app);
  void RegisterAdmission(CLI::App* app);
  void RegisterOutputs(CLI::App* app, bool with_metrics_out);
  // The session shape the flags ask for (unset flags left unset), the population they give.
  [[nodiscard]] realtime::SessionShape Shape() const;
  [[nodiscard]] realtime::PopulationOptions Population() const;
  // ConfigError naming the flag on bad values. `vocab` bounds the prompt's synthetic token ids.
  [[nodiscard]] realtime::WorkloadOptions Options(SessionDefaults defaults, int vocab) const;
};

// The frames of a summary by outcome, as the human summaries (sim, drive, loadgen) print them:
// "F = O ok + L late + S starved + H short (P% starved or short)".
[[nodiscard]] std::string FrameBreakdown(const realtime::FrameCounts& c);
// "N arrivals, R rejections per arrival" (or "no arrivals"): the retry load a run's admission put
// on its clients, for the summaries of sim, drive and loadgen.
[[nodiscard]] std::string ArrivalsLine(const realtime::FrameSummary& s);
// `n` as a percentage of c.frames (0 when there are none).
[[nodiscard]] double PercentOfFrames(const realtime::FrameCounts& c, std::int64_t n);

// Runs the workload on `backend` and `clock`, printing `header` first, a progress table every
// --report-every seconds, a human summary, and (with --summary-json) the summary as the last
// line. Writes --events-out and --metrics-out. Returns the exit code.
int RunWorkload(realtime::Backend* backend, Clock* clock, const WorkloadFlags& flags,
                const realtime::WorkloadOptions& options, const std::string& header);

}  // namespace metronome::cli
