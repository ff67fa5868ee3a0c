// The serving core around a RealtimeLoop: every new session asks the admission controller first;
// every delivered frame feeds the controller, the metrics, the event log and the run's latency
// sketch; every loop turn ticks the controller (control windows, limit changes) and, every
// sample_interval_s, samples the pool into the saturation forecast and the gauges. The same code
// serves `metronome sim` / `drive` (WorkloadRunner generates the sessions) and the network server
// (sessions come from clients).
//
// Drivers (the server's EngineService, WorkloadRunner) go through the Supervisor only: admission,
// frames, iterations and ends; results come back through one SessionObserver (frames, mute
// alarms, every session's end with its EndReason), after the supervisor's own handling.
//
// Times: one origin. Start() sets the loop's origin to the clock's now; every time in or out
// (`now_s` arguments, Now(), NextEventSeconds(), the observer's reports) is seconds since then.
// Thread-safety: single-threaded; owned by the loop thread.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "metronome/admission/admission.h"
#include "metronome/base/clock.h"
#include "metronome/kv/occupancy_forecast.h"
#include "metronome/realtime/backend.h"
#include "metronome/realtime/cost_model.h"
#include "metronome/realtime/realtime_loop.h"
#include "metronome/realtime/session_observer.h"
#include "metronome/telemetry/event_log.h"
#include "metronome/telemetry/metrics.h"

namespace metronome::realtime {

// The door rules that rest on a session's price (PriceSession): refusals that no later state
// reverses (the client must change the request), so their retry_after_ms is 0.
struct WorkLimits {
  // No session may take more than this share of the engine per second (its work_share): one
  // session heavier than that is refused with reason "work", naming its share. In (0, 1].
  double max_session_share = 0.5;
  // A deadline must leave the session's frame alone on the engine (PriceSession::lone_frame_s) at
  // most this fraction of it, and a period at least the whole frame: the calibrated floors. Below
  // them, reason "deadline" or "period" with the floor. In (0, 1].
  double lone_frame_fraction = 0.5;
  // The operator's floor under every deadline and period, ms (0: the calibrated floor alone;
  // without a cost model, the only one). >= 0.
  double min_deadline_ms = 0.0;

  void Validate() const;  // ConfigError naming the field and value
};

struct SupervisorOptions {
  std::string admission = "memory";  // "static:N", "memory", "aimd" or "gradient2"
  // A hard cap on concurrent sessions whatever the controller says (0: none): the operator's
  // ceiling (e.g. a server's file descriptors), rejected with reason "max_sessions".
  std::int64_t max_sessions = 0;
  admission::AimdOptions aimd;
  admission::Gradient2Options gradient2;
  admission::MemoryOptions memory;
  kv::OccupancyForecastOptions forecast;
  double sample_interval_s = 0.5;  // pool/forecast/gauge sampling period, s
  LoopOptions loop;
  // Hold every full-KV session to the blocks admission reserved for it (its ProjectedBlocks), when
  // the controller reserves KV (AdmissionController::reserves_kv: memory, aimd with kv_guard): the
  // session's context ends there (SessionSpec::max_context_tokens, kContextFull), so no client
  // behaviour can take blocks other sessions were promised. Off, a full-KV session that outlives
  // the projection grows until the pool is full (the simulator's KV wall). The server turns it on.
  bool enforce_kv_budget = false;
  // KV blocks of one session of the driver's default shape (the server's: its default window and
  // sinks; 0: none). A controller that reserves KV (memory; aimd with kv_guard) has no session
  // count of its own, or one the pool may undercut: the admission limit it reports
  // (Supervisor::admission_limit, the metronome_admission_limit gauge, HAProxy's maxconn) is then
  // how many sessions of this size the pool's unpromised blocks still hold, plus the active ones.
  std::int64_t reference_session_blocks = 0;
  // The calibrated step-cost model that prices each session (PriceSession) in units of work, and
  // the session that is one unit (the driver's default shape, resolved): the controllers' limits
  // are then budgets of work in "sessions of the reference shape", and `work` applies. Without a
  // model every session is one unit (a budget counts sessions) and only work.min_deadline_ms
  // applies. The model also paces prompts (LoopOptions::prompt's coefficients).
  std::optional<CostModel> cost_model;
  SessionSpec reference_session;
  WorkLimits work;
  // Alarms, limit changes, forecast warnings and session errors also go to stderr (mute alarms
  // rate-limited).
  bool log_to_stderr = true;

  void Validate() const;  // ConfigError naming the field
};

// The pool and the run at one sample.
struct SupervisorSample {
  double t_s = 0.0;
  std::int64_t active = 0;
  std::int64_t limit = admission::kNoLimit;
  std::int64_t used_blocks = 0;
  std::int64_t total_blocks = 0;
  double kv_used_fraction = 0.0;
  // Forecast time until the pool is full, s from t_s; +inf when it never fills at this rate.
  double t_sat_s = std::numeric_limits<double>::infinity();
  bool forecast_warning = false;
  // The engine's steps since the previous sample (admission::StepLoad): the share of the time
  // spent stepping, and the share spent on per-token work (the queue's load; NaN while the step
  // sizes have not varied enough to tell it from the fixed cost of a step).
  double busy_fraction = 0.0;
  double work_utilization = std::numeric_limits<double>::quiet_NaN();
};

// Blocks a session with `spec` holds at most: its window bound, or in full mode its size after
// memory.full_mode_session_s of frames, capped by the backend's context limit (a full-KV session
// ends there; 0: no limit). What admission reserves for it.
[[nodiscard]] std::int64_t ProjectedBlocks(const SessionSpec& spec, int block_tokens,
                                           const admission::MemoryOptions& memory,
                                           TokenPos context_limit = 0);

class Supervisor {
 public:
  // Borrows everything (all must outlive it). `registry` (optional) receives the engine metric set
  // (telemetry::EngineMetrics; one supervisor per registry); `events` (optional) receives frames,
  // admissions, limit changes, alarms and session ends. Throws ConfigError for bad options.
  Supervisor(Backend* backend, Clock* clock, const SupervisorOptions& options,
             telemetry::MetricsRegistry* registry = nullptr, telemetry::EventLog* events = nullptr);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Sets time zero to the clock's now.
  void Start();
  [[nodiscard]] double Now() const;  // seconds since Start()
  // The driver's observer (borrowed; null: none). Called after the supervisor's own handling.
  void set_observer(SessionObserver* observer);

  struct AdmitResult {
    admission::Decision decision;
    RealtimeSessionId id = 0;  // when admitted
    // Tokens the admitted full-KV session may append before it ends with kContextFull (its KV
    // budget, or the backend's context limit); 0: no limit (window KV, or none known).
    TokenPos max_context_tokens = 0;
    // The session's price in units of work (SessionRequest::work): 1 when sessions are not priced.
    double work = 1.0;
    // Its prompt's prefill in unit-seconds (PriceSession's prompt_work_s over the reference
    // session's share: seconds of one unit's work); 0 without a prompt or a cost model.
    double prompt_work_unit_s = 0.0;
  };
  // Asks the controller whether a session with `spec` may join now; if so adds it to the loop.
  // Throws ConfigError for an invalid spec (before asking).
  AdmitResult Admit(const SessionSpec& spec, double now_s);
  // A session moved from another replica (session_state.h): admission decides as for a new
  // session of its spec (a move can be refused: reason and hint as usual); admitted, the session
  // continues the state (RealtimeLoop::ImportSession). A backend that cannot take the state after
  // the decision refuses it: reason "pool" (no room for its KV now, retry after a period) or
  // "state" (the bytes, named in the detail; retry_after_ms 0).
  AdmitResult AdmitMoved(const SessionState& state, double now_s);
  // A live session's state for moving it (RealtimeLoop::ExportSession): false while it has frames
  // waiting or in progress.
  bool ExportSession(RealtimeSessionId id, SessionState* state) const;
  [[nodiscard]] bool HasFrames(RealtimeSessionId id) const;
  // RealtimeLoop's: a live session's spec (null: unknown) and its next frame's index.
  [[nodiscard]] const SessionSpec* session_spec(RealtimeSessionId id) const;
  [[nodiscard]] std::int64_t next_frame(RealtimeSessionId id) const;
  // Continuity, reported (metrics, event log) and counted (missed_frames()): a session resumed
  // after its connection dropped, or moved out / in / lost between replicas, with the frames that
  // fell due while it was away (FrameOutcome::kMissed).
  enum class Continuity : std::uint8_t { kResumed, kMovedOut, kMovedIn, kMoveLost };
  // `state_bytes`: the size of the moved state (kMovedOut, kMovedIn).
  void ReportContinuity(Continuity event, RealtimeSessionId id, std::int64_t missed_frames = 0,
                        std::int64_t state_bytes = 0);
  [[nodiscard]] std::int64_t missed_frames() const;
  // What ReportContinuity has counted since the start (the sessions_resumed_total,
  // sessions_moved_total and session_state_bytes_total metrics, for /v1/stats).
  struct ContinuityCounts {
    std::int64_t resumed = 0, moved_out = 0, moved_in = 0, moved_lost = 0;  // sessions
    std::int64_t state_bytes_out = 0, state_bytes_in = 0;                   // their states
  };
  [[nodiscard]] const ContinuityCounts& continuity_counts() const;
  // Ends a session (its blocks return to the pool) and reports it to the observer with `reason`;
  // nothing for a session that is unknown or already ended.
  void End(RealtimeSessionId id, double now_s, EndReason reason);
  // A frame of an external-frames session (RealtimeLoop::SubmitFrame: the one refusal enum).
  RealtimeLoop::SubmitResult Submit(RealtimeSessionId id, std::vector<TokenId> tokens,
                                    std::optional<Nanos> arrival = std::nullopt);
  // One loop iteration; false if there was no work (RealtimeLoop::RunIteration).
  bool RunIteration();
  // One iteration, or a sleep until the next frame event but no later than t_limit_s.
  void RunOnce(double t_limit_s);
  // The next frame arrival or blocked frame's deadline, s since Start(); +inf with no sessions.
  [[nodiscard]] double NextEventSeconds() const;

  // Once per loop turn: controller tick and limit changes; a sample when one is due. Returns true
  // when a sample was taken (see last_sample()).
  bool Tick(double now_s);

  [[nodiscard]] const LoopStats& stats() const;  // the loop's frame counts (times since Start())
  [[nodiscard]] std::int64_t active_sessions() const;
  // The admitted sessions' work, in units of the reference session (SessionRequest::work summed).
  [[nodiscard]] double active_work() const;
  // Whether sessions are priced by a cost model (otherwise each is one unit).
  [[nodiscard]] bool priced() const;
  // What admission_limit() is compared with: active_work() when the controller budgets work,
  // the active session count when it counts sessions.
  [[nodiscard]] double admitted_load() const;
  [[nodiscard]] std::int64_t resident_blocks(RealtimeSessionId id) const;
  [[nodiscard]] LoopFootprint loop_footprint() const;
  [[nodiscard]] const admission::AdmissionController& controller() const;
  // Sessions admission allows now, as of the last Tick (admission::kNoLimit: no count applies):
  // the controller's limit, capped by options.max_sessions and, for a controller that reserves
  // KV, by the sessions of options.reference_session_blocks the pool still holds.
  [[nodiscard]] std::int64_t admission_limit() const;
  [[nodiscard]] const std::vector<admission::LimitChange>& limit_changes() const;
  [[nodiscard]] const SupervisorSample& last_sample() const;
  [[nodiscard]] double next_sample_s() const;
  [[nodiscard]] std::int64_t admitted() const;
  [[nodiscard]] std::int64_t rejected() const;
  [[nodiscard]] std::int64_t ended_by_error() const;
  [[nodiscard]] std::int64_t peak_active() const;
  // Sessions whose admission projection the supervisor still tracks (live ones only).
  [[nodiscard]] std::int64_t tracked_sessions() const;
  [[nodiscard]] double kv_peak_fraction() const;  // over every Tick
  // Percentile (q in [0, 1]) of every frame latency so far, ms; NaN before the first frame.
  [[nodiscard]] double LatencyQuantileMs(double q) const;

 private:
  // Opens an admitted session with its budgeted spec (AdmitResult::id); false with
  // AdmitResult::decision set when it cannot after all.
  using OpenSession = std::function<bool(const SessionSpec& budgeted, AdmitResult* result)>;
  AdmitResult AdmitAndOpen(const SessionSpec& spec, double now_s, const OpenSession& open);

  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace metronome::realtime
