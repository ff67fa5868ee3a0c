// Runs one workload on a RealtimeLoop: sessions asked for by a fixed population (--sessions N) or
// an arrival process (--arrival), each asking the admission controller first (a rejected client
// retries after the controller's retry-after hint), living for a sampled duration, and observed
// throughout: metrics, the JSON-lines event log, the online saturation forecast and a run summary.
// This is the one driver behind `metronome sim` (cost-model backend, virtual clock) and `metronome
// drive` (the real engine, real clock): the scheduler, KV manager, admission and telemetry are the
// same code.
//
// Thread-safety: single-threaded; Run() owns the loop thread.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "metronome/admission/admission.h"
#include "metronome/base/clock.h"
#include "metronome/kv/occupancy_forecast.h"
#include "metronome/realtime/backend.h"
#include "metronome/realtime/frame_summary.h"
#include "metronome/realtime/realtime_loop.h"
#include "metronome/realtime/supervisor.h"
#include "metronome/realtime/workload.h"
#include "metronome/telemetry/event_log.h"
#include "metronome/telemetry/metrics.h"

namespace metronome::realtime {

// One class of a mixed workload (ParseSessionMix), resolved.
struct WorkloadClass {
  std::string name;
  SessionSpec session;
  double share = 1.0;  // relative weight of its arrivals (and of a fixed population), > 0
};

// A workload: one session shape or a mix of classes, who asks for sessions, and the serving core's
// options.
struct WorkloadOptions {
  // Every session's resolved shape (ResolveSession): P, D, a, o, KV, prompt; with classes, the
  // reference shape (one unit of work) and nothing else.
  SessionSpec session;
  // A mix: each asking client draws its class by share. Empty: every session is `session`.
  std::vector<WorkloadClass> classes;
  PopulationOptions population;
  SupervisorOptions supervisor;  // admission, cap, forecast, sampling, alarms, logging
  // The forecast reported in the summary is the one made this long after the active count first
  // reached its peak (so the fit has seen the full population grow), s.
  double forecast_settle_s = 5.0;

  void Validate() const;  // ConfigError naming the field and value
};

// The state of the run at one sample (every sample_interval_s): the supervisor's sample (the pool,
// the limit, the forecast, the engine's busy fraction and work utilization), the cumulative frame
// counts (FrameCounts) since the start of the run, and:
struct RunSample : FrameCounts, SupervisorSample {
  std::int64_t admitted = 0;
  std::int64_t rejected = 0;
  // Frames delivered since the previous sample: their count, latency percentiles (ms; NaN when
  // none) and mean output tokens per frame (the conversation's pulse: it drops to 0 when
  // sessions starve).
  std::int64_t interval_frames = 0;
  double interval_p50_latency_ms = std::numeric_limits<double>::quiet_NaN();
  double interval_p99_latency_ms = std::numeric_limits<double>::quiet_NaN();
  double interval_tokens_per_frame = std::numeric_limits<double>::quiet_NaN();
};

// One admitted session's life.
struct SessionRecord {
  RealtimeSessionId id = 0;
  double admitted_s = 0.0;
  double scheduled_end_s = std::numeric_limits<double>::infinity();  // from its sampled duration
  double ended_s = std::numeric_limits<double>::quiet_NaN();         // NaN while running
  std::int64_t frames = 0;      // frames delivered to it, any outcome
  bool ended_by_error = false;  // the loop ended it (full-mode context limit)
};

// One class of a mixed run, as the engine saw it: its clients' asks and its sessions' frames.
struct ClassSummary : FrameCounts {
  std::string name;
  std::int64_t arrivals = 0;  // clients of this class that asked (each once)
  std::int64_t admitted = 0;
  std::int64_t rejected = 0;
  double admitted_work = 0.0;  // the admitted sessions' prices summed, units of work
  // The class's active work (units), time-weighted over the second half of the run.
  double active_work_mean_second_half = 0.0;
  // The prompts' prefill of the sessions admitted in the second half (PriceSession's
  // prompt_work_s, in unit-seconds), over its length: units of work, like the active work.
  double prompt_work_mean_second_half = 0.0;
  double p99_frame_latency_ms = std::numeric_limits<double>::quiet_NaN();
  double deadline_ms = 0.0;
  // Frames that arrived before their session's own prompt was in (the prompt's frame included):
  // their wait is the session's own doing (counted above as any frame, and here apart). The
  // other frames' late count and p99 say whether the class met its deadline.
  std::int64_t own_prompt_frames = 0;
  std::int64_t own_prompt_late_frames = 0;
  double p99_after_own_prompt_ms = std::numeric_limits<double>::quiet_NaN();

  [[nodiscard]] nlohmann::json ToJson() const;  // NaN as null; frames under FrameCounts' keys
};

// Everything `--summary-json` prints. NaN fields are written as null.
// The engine's summary of a sim or drive run.
struct RunSummary : FrameSummary {
  // Predicted clock time at which the pool fills: forecast time + t_sat of the forecast made
  // forecast_settle_s after the active count first reached its peak. NaN: infinite.
  double t_sat_predicted_s = std::numeric_limits<double>::quiet_NaN();
  double t_sat_forecast_at_s = std::numeric_limits<double>::quiet_NaN();  // when it was made
  double kv_peak_fraction = 0.0;
  std::int64_t limit_final = admission::kNoLimit;
  double limit_mean_second_half = std::numeric_limits<double>::quiet_NaN();  // time-weighted
  double active_mean_second_half = 0.0;                                      // time-weighted
  std::int64_t limit_changes = 0;
  std::int64_t iterations = 0;
  std::string admission;              // the controller with every parameter
  std::vector<ClassSummary> classes;  // a mixed run's classes (WorkloadOptions::classes' order)

  [[nodiscard]] nlohmann::json ToJson() const;
};

class WorkloadRunner {
 public:
  // Borrows everything (all must outlive the runner). `registry` (optional) receives the engine
  // metric set (telemetry::EngineMetrics; one runner per registry); `events` (optional) receives
  // frames, admissions, limit changes, alarms and session ends. Throws ConfigError for bad options.
  WorkloadRunner(Backend* backend, Clock* clock, const WorkloadOptions& options,
                 telemetry::MetricsRegistry* registry = nullptr,
                 telemetry::EventLog* events = nullptr);
  ~WorkloadRunner();
  WorkloadRunner(const WorkloadRunner&) = delete;
  WorkloadRunner& operator=(const WorkloadRunner&) = delete;

  // Runs from the clock's current time for options.duration_s. Call once.
  RunSummary Run();

  [[nodiscard]] const std::vector<RunSample>& samples() const;
  [[nodiscard]] const std::vector<SessionRecord>& sessions() const;
  [[nodiscard]] const std::vector<admission::LimitChange>& limit_changes() const;
  [[nodiscard]] const admission::AdmissionController& controller() const;
  [[nodiscard]] std::int64_t active_sessions() const;

  // Called at every sample (may be empty), e.g. for a progress line.
  std::function<void(const RunSample&)> on_sample;
  // Called for every delivered frame after the runner's own handling (may be empty).
  std::function<void(const FrameRecord&)> on_frame;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace metronome::realtime
