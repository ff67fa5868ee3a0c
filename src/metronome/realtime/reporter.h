// The one place the supervisor's events are written out: each event goes, as configured, to
// stderr (a line for operators), the JSON-lines event log and the engine's metric set, formatted
// here and nowhere else. The Supervisor decides; the Reporter only writes.
//
// Times: `now_s` arguments are the supervisor's (seconds since Start()); the event log gets ms.
// Thread-safety: single-threaded; owned by the loop thread (the sinks are thread-safe).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "metronome/admission/admission.h"
#include "metronome/kv/block_pool.h"
#include "metronome/realtime/session_observer.h"
#include "metronome/telemetry/engine_metrics.h"
#include "metronome/telemetry/event_log.h"
#include "metronome/telemetry/metrics.h"

namespace metronome::realtime {

class Reporter {
 public:
  // `registry` (optional) receives the engine metric set (one per registry); `events` (optional,
  // borrowed) the event log; `log_to_stderr`: alarms, limit changes, forecast warnings and session
  // errors also go to stderr (mute alarms rate-limited).
  Reporter(bool log_to_stderr, telemetry::MetricsRegistry* registry, telemetry::EventLog* events);

  void Frame(const FrameRecord& r);
  void MuteAlarm(const realtime::MuteAlarm& a);
  void SessionEnded(const realtime::SessionEnded& e, std::int64_t active);
  void Admitted(RealtimeSessionId id, double now_s, std::int64_t active, std::int64_t limit);
  void Rejected(const admission::Decision& d, double now_s, std::int64_t active,
                std::int64_t limit);
  void LimitChange(const admission::LimitChange& c);
  // Continuity: a session resumed after a dropped connection, or moved "out", "in" or "lost"
  // (Supervisor::Continuity), with the frames it missed while away (FrameOutcome::kMissed).
  void Resumed(RealtimeSessionId id, double now_s, std::int64_t missed_frames);
  // `state_bytes`: the size of the state that moved (0 for "lost").
  void Moved(RealtimeSessionId id, double now_s, std::string_view direction,
             std::int64_t missed_frames, std::int64_t state_bytes);
  // The budget admission allows now (Supervisor::admission_limit, units of work;
  // admission::kNoLimit: none) and the admitted work: the limit, headroom and work gauges.
  void Capacity(std::int64_t limit, double work_used);
  // The forecast turned to warning at now_s: the pool fills in t_sat_s at this rate.
  void ForecastWarning(double now_s, double t_sat_s, double occupancy, std::int64_t active);
  // A sample of the pool: gauges, and the blocks freed by windows since the previous sample.
  // t_sat_s < 0: no forecast.
  // A sample: the pool, the active count, the forecast (< 0: none) and the engine's busy fraction
  // and work utilization over the interval (NaN: unknown).
  void Sample(const kv::PoolStats& pool, std::int64_t active, double t_sat_s, double busy_fraction,
              double work_utilization);
  void Iteration(double seconds, int batch_tokens);

 private:
  [[nodiscard]] bool Logging() const { return events_ != nullptr && events_->enabled(); }

  bool log_to_stderr_;
  std::optional<telemetry::EngineMetrics> metrics_;
  telemetry::EventLog* events_;
  std::int64_t last_freed_by_window_ = 0;
};

}  // namespace metronome::realtime
