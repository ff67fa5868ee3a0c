// The real-time engine's metric set, registered once on a MetricsRegistry: frame latency and
// outcomes, batch shape, KV pool occupancy, admission and the saturation forecast. The struct only
// holds references into the registry (which must outlive it); updating them is lock-free and
// allocation-free, so the frame loop records directly. Thread-safety: as Counter/Gauge/Histogram.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "metronome/telemetry/metrics.h"

namespace metronome::telemetry {

// How one session's frame ended; the `outcome` label of metronome_frames_total. The real-time loop
// (realtime::RealtimeLoop) produces these.
enum class FrameOutcome : std::uint8_t {
  kOk,       // all outputs, by the frame's deadline
  kLate,     // all outputs, after the deadline (compute overload)
  kStarved,  // delivered at the deadline with no output: the session could not get a KV block
  kShort,    // delivered at the deadline with fewer outputs than asked, for the same reason
  // Fell due while the session's client was away (a dropped connection before session.resume) or
  // while the session moved between replicas: no input came, so no output. Counted when the
  // session resumes, one per period away (the loop itself never produces it).
  kMissed,
};
inline constexpr int kNumFrameOutcomes = 5;
// "ok", "late", "starved", "short", "missed"
[[nodiscard]] std::string_view ToString(FrameOutcome outcome);

// Why a session ended: one vocabulary from the real-time loop (which ends a session itself at its
// context limit or on a backend error) through the supervisor and its drivers to the wire
// (`session.ended`'s reason) and the event log. ToString is the wire's spelling (docs/protocol.md).
enum class EndReason : std::uint8_t {
  kClient,          // "client": the client sent session.end (or its driver ended it)
  kContextFull,     // "context_full": a full-KV session reached its context limit (the loop)
  kServerShutdown,  // "server_shutdown"
  kDisconnect,      // "disconnect": the connection closed (logs and events; nobody to tell)
  kError,           // "error": the backend refused the session's work otherwise (the loop)
  kDuration,        // "duration": sim / drive, the session's sampled duration ran out (not wire)
  kIdle,            // "idle": the client sent no frame for the server's idle timeout (the server)
  // "nonfinite_logits": the model's logits for the session held a NaN or an infinity (the loop;
  // StepStatus::kNonFiniteLogits), so no token could be sampled: broken weights or a numerical
  // fault, not something the client did.
  kNonFiniteLogits,
  // "moved": the session's state went to another replica (a drain's handoff: session.moving);
  // the conversation goes on there. Not on the wire: its client hears session.moving instead.
  kMoved,
};
[[nodiscard]] std::string_view ToString(EndReason reason);

// Exposed names and units (all prefixed metronome_):
//   frame_latency_ms             histogram  ms, frame tick to its output, one per session-frame
//   frames_total{outcome}        counter    session-frames by FrameOutcome
//   deadline_misses_total        counter    session-frames whose output missed the deadline
//   mute_alarms_total            counter    alarms raised because a session went silent
//   tokens_per_frame             histogram  tokens generated for one session in one frame
//   iteration_ms                 histogram  ms, wall time of one engine iteration (batched step)
//   batch_tokens                 histogram  tokens (prefill + decode rows) in one engine iteration
//   kv_blocks_used / _free       gauge      KV pool blocks (used + free = pool size)
//   session_resident_blocks      histogram  blocks one session holds, one observation per
//                                           session-frame (a distribution, not per-session labels,
//                                           which would have unbounded cardinality)
//   kv_blocks_freed_by_window_total  counter  blocks returned because they left a session's window
//   admission_limit              gauge      what admission currently allows (the controller's
//                                           limit under the server's caps): units of work
//                                           (sessions of the reference shape) under aimd and
//                                           gradient2, sessions otherwise; +Inf with no count
//   admission_headroom           gauge      admission_limit - ceil(admission_work_used),
//                                           >= 0 (+Inf with no limit): the scaling signal
//                                           (deploy.md)
//   admission_work_used          gauge      what the limit is compared with: units of work the
//                                           admitted sessions take under aimd and gradient2 (each
//                                           priced by what it declares: realtime.md, "Admission
//                                           in units of work"), sessions under static and memory
//   sessions_active              gauge      sessions currently running
//   sessions_admitted_total      counter    sessions accepted
//   sessions_rejected_total{reason}  counter  sessions refused, by reason (small fixed vocabulary)
//   sessions_ended_total{reason}  counter  sessions ended, by EndReason (ToString's spelling)
//   sessions_resumed_total       counter    sessions taken back by session.resume on this replica
//                                           after their connection dropped
//   sessions_moved_total{direction}  counter  sessions handed between replicas: "out" (state
//                                           exported on a drain), "in" (imported), "lost" (an
//                                           exported state nobody fetched within the window)
//   session_state_bytes_total{direction}  counter  bytes of those states (the KV window and
//                                           sinks, positions, sampler, spec: the transfer form)
//   saturation_forecast_seconds  gauge      s until the KV pool is forecast to run out; +Inf when
//                                           it never does at the current rates
//   engine_busy_fraction         gauge      share of the last sample interval the engine spent
//                                           stepping, >= 0 (admission::StepLoad)
//   engine_work_utilization      gauge      share of it spent on per-token work (the queue's
//                                           load, what AIMD's growth cap reads); NaN while the
//                                           step sizes have not told it from the fixed cost
struct EngineMetrics {
  // Registers every metric above; throws ConfigError if any of the names is already registered.
  explicit EngineMetrics(MetricsRegistry& registry);

  [[nodiscard]] Counter& frames(FrameOutcome outcome) const {
    return *frames_by_outcome[static_cast<int>(outcome)];
  }
  // The child for `reason`, created on first use (locks and allocates: cache the reference when
  // rejecting on a hot path). Reasons should come from a small fixed set, e.g. "limit", "kv_pool".
  [[nodiscard]] Counter& sessions_rejected(std::string_view reason) const {
    return sessions_rejected_by_reason.WithLabels({reason});
  }
  // The child for `reason` (created on first use, as sessions_rejected's).
  [[nodiscard]] Counter& sessions_ended(EndReason reason) const {
    return sessions_ended_by_reason.WithLabels({ToString(reason)});
  }
  // admission_limit, admission_headroom and admission_work_used from a limit (< 0: none, exposed
  // as +Inf), the admitted work (units; >= 0) and that work in the whole units the limit is
  // compared with (admission::WholeUnits, rounded by the caller: the rule lives there).
  void SetAdmissionCapacity(std::int64_t limit, double work_used,
                            std::int64_t whole_units_used) const noexcept;
  // seconds < 0 or NaN means "no forecast" and is exposed as +Inf, like an infinite horizon.
  void SetSaturationForecastSeconds(double seconds) const noexcept;

  Histogram& frame_latency_ms;
  Family<Counter>& frames_by_outcome_family;
  std::array<Counter*, kNumFrameOutcomes> frames_by_outcome;  // children, indexed by FrameOutcome
  Counter& deadline_misses;
  Counter& mute_alarms;
  Histogram& tokens_per_frame;
  Histogram& iteration_ms;
  Histogram& batch_tokens;
  Gauge& kv_blocks_used;
  Gauge& kv_blocks_free;
  Histogram& session_resident_blocks;
  Counter& kv_blocks_freed_by_window;
  Gauge& admission_limit;
  Gauge& admission_headroom;
  Gauge& admission_work_used;
  Gauge& sessions_active;
  Counter& sessions_admitted;
  Family<Counter>& sessions_rejected_by_reason;
  Family<Counter>& sessions_ended_by_reason;  // children by ToString(EndReason)
  Counter& sessions_resumed;
  Family<Counter>& sessions_moved_by_direction;       // children "out", "in", "lost"
  Family<Counter>& session_state_bytes_by_direction;  // children "out", "in"
  Gauge& saturation_forecast_seconds;
  Gauge& engine_busy_fraction;
  Gauge& engine_work_utilization;
};

}  // namespace metronome::telemetry
