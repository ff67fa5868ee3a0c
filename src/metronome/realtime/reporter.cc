#include "metronome/realtime/reporter.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "metronome/base/errors.h"

namespace metronome::realtime {

Reporter::Reporter(bool log_to_stderr, telemetry::MetricsRegistry* registry,
                   telemetry::EventLog* events)
    : log_to_stderr_(log_to_stderr), events_(events) {
  if (registry != nullptr) metrics_.emplace(*registry);
}

void Reporter::Frame(const FrameRecord& r) {
  const bool missed = r.outcome == FrameOutcome::kLate;
  if (metrics_) {
    metrics_->frame_latency_ms.Observe(r.latency_ms);
    metrics_->frames(r.outcome).Inc();
    if (missed) metrics_->deadline_misses.Inc();
    metrics_->tokens_per_frame.Observe(static_cast<double>(r.tokens.size()));
    metrics_->session_resident_blocks.Observe(static_cast<double>(r.resident_blocks));
  }
  if (Logging()) {
    events_->Frame(r.delivered_s * 1e3, {.session_id = r.session,
                                         .frame = r.index,
                                         .outcome = telemetry::ToString(r.outcome),
                                         .latency_ms = r.latency_ms,
                                         .num_tokens = static_cast<int>(r.tokens.size())});
  }
}

void Reporter::MuteAlarm(const realtime::MuteAlarm& a) {
  if (metrics_) metrics_->mute_alarms.Inc();
  const std::int64_t n = a.alarms_so_far;
  // The first alarms name their session; after that a running count keeps stderr readable.
  if (log_to_stderr_ && (n <= 5 || n % 100 == 0)) {
    std::fprintf(stderr, "[alarm] mute: session %llu starved %d consecutive frames at t=%.2f s%s\n",
                 static_cast<unsigned long long>(a.session), a.consecutive_starved, a.t_s,
                 n > 5 ? (" (" + std::to_string(n) + " alarms so far)").c_str() : "");
  }
  if (Logging()) {
    events_->Alarm(a.t_s * 1e3, {.kind = "mute",
                                 .session_id = a.session,
                                 .detail = std::to_string(a.consecutive_starved) +
                                           " consecutive starved frames"});
  }
}

void Reporter::SessionEnded(const realtime::SessionEnded& e, std::int64_t active) {
  if (e.by_loop() && log_to_stderr_) {
    std::fprintf(stderr, "[error] session %llu ended at t=%.2f s: %s\n",
                 static_cast<unsigned long long>(e.session), e.t_s, ToString(e.status));
  }
  if (metrics_) {
    metrics_->sessions_active.Set(static_cast<double>(active));
    metrics_->sessions_ended(e.reason).Inc();
  }
  if (Logging()) {
    nlohmann::json fields = {{"session_id", e.session}};
    if (e.by_loop()) {
      fields["reason"] = "error";
      fields["error"] = ToString(e.status);
    } else {
      fields["reason"] = ToString(e.reason);
    }
    events_->Write(e.t_s * 1e3, "session_end", std::move(fields));
  }
}

void Reporter::Admitted(RealtimeSessionId id, double now_s, std::int64_t active,
                        std::int64_t limit) {
  if (metrics_) {
    metrics_->sessions_admitted.Inc();
    metrics_->sessions_active.Set(static_cast<double>(active));
  }
  if (Logging()) {
    events_->Admission(now_s * 1e3, {.session_id = id,
                                     .admitted = true,
                                     .num_active = static_cast<int>(active),
                                     .limit = static_cast<int>(limit)});
  }
}

void Reporter::Rejected(const admission::Decision& d, double now_s, std::int64_t active,
                        std::int64_t limit) {
  if (metrics_) metrics_->sessions_rejected(d.reason).Inc();
  if (Logging()) {
    events_->Admission(now_s * 1e3, {.session_id = 0,
                                     .admitted = false,
                                     .reason = d.reason,
                                     .num_active = static_cast<int>(active),
                                     .limit = static_cast<int>(limit)});
  }
}

void Reporter::LimitChange(const admission::LimitChange& c) {
  if (log_to_stderr_) {
    std::fprintf(stderr, "[admission] t=%.1f s limit %lld -> %lld: %s\n", c.t_s,
                 static_cast<long long>(c.from), static_cast<long long>(c.to), c.reason.c_str());
  }
  if (Logging()) {
    events_->LimitChange(c.t_s * 1e3, {.old_limit = static_cast<int>(c.from),
                                       .new_limit = static_cast<int>(c.to),
                                       .reason = c.reason});
  }
}

void Reporter::Resumed(RealtimeSessionId id, double now_s, std::int64_t missed_frames) {
  if (metrics_) {
    metrics_->sessions_resumed.Inc();
    metrics_->frames(FrameOutcome::kMissed).Inc(static_cast<std::uint64_t>(missed_frames));
  }
  if (Logging()) {
    events_->Write(now_s * 1e3, "session_resumed",
                   {{"session", id}, {"missed_frames", missed_frames}});
  }
}

void Reporter::Moved(RealtimeSessionId id, double now_s, std::string_view direction,
                     std::int64_t missed_frames, std::int64_t state_bytes) {
  if (metrics_) {
    metrics_->sessions_moved_by_direction.WithLabels({direction}).Inc();
    if (state_bytes > 0) {
      metrics_->session_state_bytes_by_direction.WithLabels({direction})
          .Inc(static_cast<std::uint64_t>(state_bytes));
    }
    metrics_->frames(FrameOutcome::kMissed).Inc(static_cast<std::uint64_t>(missed_frames));
  }
  if (log_to_stderr_ && direction == "lost") {
    std::fprintf(stderr, "[warn] t=%.1f s session %llu: its moved state was never fetched\n", now_s,
                 static_cast<unsigned long long>(id));
  }
  if (Logging()) {
    events_->Write(now_s * 1e3, "session_moved",
                   {{"session", id},
                    {"direction", direction},
                    {"missed_frames", missed_frames},
                    {"state_bytes", state_bytes}});
  }
}

void Reporter::Capacity(std::int64_t limit, double work_used) {
  if (metrics_) metrics_->SetAdmissionCapacity(limit, work_used, admission::WholeUnits(work_used));
}

void Reporter::ForecastWarning(double now_s, double t_sat_s, double occupancy,
                               std::int64_t active) {
  if (log_to_stderr_) {
    std::fprintf(stderr,
                 "[warn] t=%.1f s KV pool forecast to fill in %.1f s (occupancy %.1f%%, %lld "
                 "sessions)\n",
                 now_s, t_sat_s, 100.0 * occupancy, static_cast<long long>(active));
  }
  if (Logging()) {
    events_->Alarm(now_s * 1e3,
                   {.kind = "saturation_forecast", .detail = "t_sat_s=" + FormatValue(t_sat_s)});
  }
}

void Reporter::Sample(const kv::PoolStats& pool, std::int64_t active, double t_sat_s,
                      double busy_fraction, double work_utilization) {
  if (metrics_) {
    metrics_->engine_busy_fraction.Set(busy_fraction);
    metrics_->engine_work_utilization.Set(work_utilization);
    metrics_->kv_blocks_used.Set(static_cast<double>(pool.used_blocks));
    metrics_->kv_blocks_free.Set(static_cast<double>(pool.free_blocks));
    metrics_->kv_blocks_freed_by_window.Inc(
        static_cast<std::uint64_t>(pool.blocks_freed_by_window - last_freed_by_window_));
    metrics_->sessions_active.Set(static_cast<double>(active));
    metrics_->SetSaturationForecastSeconds(t_sat_s);
  }
  last_freed_by_window_ = pool.blocks_freed_by_window;
}

void Reporter::Iteration(double seconds, int batch_tokens) {
  if (!metrics_) return;
  metrics_->iteration_ms.Observe(seconds * 1e3);
  metrics_->batch_tokens.Observe(static_cast<double>(batch_tokens));
}

}  // namespace metronome::realtime
