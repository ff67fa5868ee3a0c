#include "metronome/telemetry/engine_metrics.h"

#include <algorithm>
#include <array>
#include <limits>

#include "metronome/base/enum_names.h"

namespace metronome::telemetry {

namespace {

constexpr std::array<EnumName<FrameOutcome>, kNumFrameOutcomes> kFrameOutcomeNames = {
    {{FrameOutcome::kOk, "ok"},
     {FrameOutcome::kLate, "late"},
     {FrameOutcome::kStarved, "starved"},
     {FrameOutcome::kShort, "short"},
     {FrameOutcome::kMissed, "missed"}}};

constexpr std::array<EnumName<EndReason>, 9> kEndReasonNames = {
    {{EndReason::kClient, "client"},
     {EndReason::kContextFull, "context_full"},
     {EndReason::kServerShutdown, "server_shutdown"},
     {EndReason::kDisconnect, "disconnect"},
     {EndReason::kError, "error"},
     {EndReason::kDuration, "duration"},
     {EndReason::kIdle, "idle"},
     {EndReason::kNonFiniteLogits, "nonfinite_logits"},
     {EndReason::kMoved, "moved"}}};

}  // namespace

std::string_view ToString(FrameOutcome outcome) {
  return NameOf(kFrameOutcomeNames, outcome, "unknown");
}

std::string_view ToString(EndReason reason) { return NameOf(kEndReasonNames, reason, "error"); }

EngineMetrics::EngineMetrics(MetricsRegistry& registry)
    : frame_latency_ms(registry.AddHistogram(
          "frame_latency_ms", "Latency from a frame's tick to its output, per session-frame (ms).",
          DefaultLatencyBucketsMs())),
      frames_by_outcome_family(registry.AddCounterFamily(
          "frames_total", "Session-frames by outcome (ok, late, starved, short).", {"outcome"})),
      frames_by_outcome{},
      deadline_misses(registry.AddCounter(
          "deadline_misses_total", "Session-frames whose output missed the frame deadline.")),
      mute_alarms(registry.AddCounter("mute_alarms_total",
                                      "Alarms raised because a session produced no output.")),
      // 0 gets its own bucket: a frame with no tokens is the interesting case.
      tokens_per_frame(registry.AddHistogram(
          "tokens_per_frame", "Tokens generated for one session in one frame (tokens).",
          {0, 1, 2, 4, 8, 16, 32, 64, 128})),
      iteration_ms(
          registry.AddHistogram("iteration_ms", "Wall time of one batched engine iteration (ms).",
                                {0.5, 1, 2, 5, 10, 20, 40, 60, 80, 100, 150, 200, 300, 500, 1000})),
      batch_tokens(registry.AddHistogram(
          "batch_tokens", "Tokens (prefill and decode rows) in one engine iteration (tokens).",
          ExponentialBuckets(1, 2, 14))),
      kv_blocks_used(registry.AddGauge("kv_blocks_used", "KV pool blocks in use (blocks).")),
      kv_blocks_free(registry.AddGauge("kv_blocks_free", "KV pool blocks free (blocks).")),
      session_resident_blocks(registry.AddHistogram(
          "session_resident_blocks",
          "KV blocks held by one session, one observation per session-frame (blocks).",
          ExponentialBuckets(1, 2, 14))),
      kv_blocks_freed_by_window(registry.AddCounter(
          "kv_blocks_freed_by_window_total",
          "KV blocks returned to the pool because they left a session's window (blocks).")),
      admission_limit(registry.AddGauge(
          "admission_limit",
          "The budget admission allows now, in units of work (sessions of the reference shape); "
          "+Inf when no count applies.")),
      admission_headroom(registry.AddGauge(
          "admission_headroom",
          "Units of work admission would still take: limit - ceil(work used), >= 0 (sessions of "
          "the reference shape); +Inf with no limit.")),
      admission_work_used(registry.AddGauge(
          "admission_work_used",
          "Units of work the admitted sessions take (each priced by what it declares; sessions "
          "of the reference shape).")),
      sessions_active(registry.AddGauge("sessions_active", "Sessions currently running.")),
      sessions_admitted(registry.AddCounter("sessions_admitted_total", "Sessions admitted.")),
      sessions_rejected_by_reason(registry.AddCounterFamily(
          "sessions_rejected_total", "Sessions refused admission, by reason.", {"reason"})),
      sessions_ended_by_reason(registry.AddCounterFamily(
          "sessions_ended_total",
          "Sessions ended, by reason (client, context_full, server_shutdown, disconnect, error, "
          "idle, nonfinite_logits, moved).",
          {"reason"})),
      sessions_resumed(registry.AddCounter(
          "sessions_resumed_total",
          "Sessions taken back by session.resume after their connection dropped.")),
      sessions_moved_by_direction(registry.AddCounterFamily(
          "sessions_moved_total",
          "Sessions handed between replicas: out (exported on a drain), in (imported), lost (an "
          "exported state nobody fetched within the resume window).",
          {"direction"})),
      session_state_bytes_by_direction(registry.AddCounterFamily(
          "session_state_bytes_total",
          "Bytes of moved sessions' state (the transfer form: KV window and sinks, positions, "
          "sampler, spec): out (exported on a drain), in (imported).",
          {"direction"})),
      saturation_forecast_seconds(registry.AddGauge(
          "saturation_forecast_seconds",
          "Forecast time until the KV pool runs out at current rates (s); +Inf when never.")),
      engine_busy_fraction(registry.AddGauge(
          "engine_busy_fraction",
          "Share of the last sample interval the engine spent stepping (fraction of wall time).")),
      engine_work_utilization(registry.AddGauge(
          "engine_work_utilization",
          "Share of the last sample interval spent on per-token work, from a fitted step cost "
          "(fraction of wall time); NaN until the step sizes tell it.")) {
  for (int i = 0; i < kNumFrameOutcomes; ++i) {
    // Created up front so every outcome is exposed (as 0) before it first happens.
    frames_by_outcome[i] =
        &frames_by_outcome_family.WithLabels({ToString(static_cast<FrameOutcome>(i))});
  }
  saturation_forecast_seconds.Set(std::numeric_limits<double>::infinity());
  engine_work_utilization.Set(std::numeric_limits<double>::quiet_NaN());
  SetAdmissionCapacity(-1, 0, 0);
}

void EngineMetrics::SetAdmissionCapacity(std::int64_t limit, double work_used,
                                         std::int64_t whole_units_used) const noexcept {
  admission_work_used.Set(work_used);
  if (limit < 0) {
    admission_limit.Set(std::numeric_limits<double>::infinity());
    admission_headroom.Set(std::numeric_limits<double>::infinity());
    return;
  }
  admission_limit.Set(static_cast<double>(limit));
  admission_headroom.Set(static_cast<double>(std::max<std::int64_t>(0, limit - whole_units_used)));
}

void EngineMetrics::SetSaturationForecastSeconds(double seconds) const noexcept {
  saturation_forecast_seconds.Set(seconds >= 0.0 ? seconds
                                                 : std::numeric_limits<double>::infinity());
}

}  // namespace metronome::telemetry
