#include "metronome/realtime/supervisor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "metronome/base/errors.h"
#include "metronome/telemetry/engine_metrics.h"
#include "metronome/telemetry/quantile_sketch.h"

namespace metronome::realtime {

void SupervisorOptions::Validate() const {
  if (max_sessions < 0) {
    throw ConfigError("max_sessions = " + std::to_string(max_sessions) + " must be >= 0");
  }
  if (!(sample_interval_s > 0.0 && sample_interval_s <= 60.0)) {
    throw ConfigError("sample_interval_s = " + FormatValue(sample_interval_s) +
                      " must be in (0, 60]");
  }
  forecast.Validate();
  loop.Validate();
}

std::int64_t ProjectedBlocks(const SessionSpec& spec, int block_tokens,
                             const admission::MemoryOptions& memory, TokenPos context_limit) {
  if (spec.policy.mode == kv::KvMode::kWindow) {
    // The largest item a frame appends: prompt + the previous output + the input.
    const int chunk = static_cast<int>(spec.prompt.size()) + 1 + spec.input_tokens_per_frame;
    return spec.policy.MaxResidentBlocks(block_tokens, chunk);
  }
  const std::int64_t projected = admission::ProjectFullModeBlocks(
      memory, spec.period_ms, spec.input_tokens_per_frame + spec.output_tokens_per_frame,
      static_cast<std::int64_t>(spec.prompt.size()), block_tokens);
  if (context_limit <= 0) return projected;
  return std::min(projected, (context_limit + block_tokens - 1) / block_tokens);
}

struct Supervisor::State {
  State(Supervisor& owner_, Backend* b, Clock* c, const SupervisorOptions& o,
        telemetry::MetricsRegistry* registry, telemetry::EventLog* e)
      : owner(owner_),
        backend(b),
        clock(c),
        options(o),
        loop(b, c, LoopWithoutLogging(o.loop)),
        controller(admission::MakeController(o.admission, o.aimd, o.memory)),
        forecast(o.forecast),
        events(e) {
    if (registry != nullptr) metrics.emplace(*registry);
  }

  static LoopOptions LoopWithoutLogging(LoopOptions o) {
    o.log_to_stderr = false;  // the supervisor logs alarms itself, rate-limited
    return o;
  }
  [[nodiscard]] bool Logging() const { return events != nullptr && events->enabled(); }
  admission::SystemState System() const;
  void Sample(double now);
  void RecordLimitChanges();
  void OnFrame(const FrameRecord& r);
  void Forget(RealtimeSessionId id) { projected.erase(id); }

  Supervisor& owner;  // its public observers are called after the supervisor's own handling
  Backend* backend;
  Clock* clock;
  SupervisorOptions options;
  RealtimeLoop loop;
  std::unique_ptr<admission::AdmissionController> controller;
  kv::OccupancyForecast forecast;
  std::optional<telemetry::EngineMetrics> metrics;
  telemetry::EventLog* events;
  double t0 = 0.0;

  // Every live session's projection: what admission reserved for it, and whether that is a hard
  // bound (window KV) or only an estimate (full KV).
  struct Projection {
    std::int64_t blocks = 0;
    bool bounded = false;
  };
  std::unordered_map<RealtimeSessionId, Projection> projected;
  // SystemState for Admit, computed once per turn (O(sessions)) and kept current by Admit itself:
  // a crowd retrying every period costs one pass, not one per request.
  std::optional<admission::SystemState> system_cache;

  std::vector<admission::LimitChange> limit_changes;
  SupervisorSample last_sample;
  telemetry::QuantileSketch latency_ms;
  double next_sample_s = 0.0;
  std::int64_t admitted = 0;
  std::int64_t rejected = 0;
  std::int64_t ended_by_error = 0;
  std::int64_t peak_active = 0;
  double kv_peak_fraction = 0.0;
  bool forecast_warning = false;
  std::int64_t last_freed_by_window = 0;
};

admission::SystemState Supervisor::State::System() const {
  const engine::PoolStats pool = backend->pool();
  admission::SystemState s;
  s.active_sessions = loop.active_sessions();
  s.free_blocks = pool.free_blocks;
  s.total_blocks = pool.num_blocks;
  for (const auto& [id, p] : projected) {
    s.reserved_blocks += std::max<std::int64_t>(0, p.blocks - loop.resident_blocks(id));
  }
  return s;
}

void Supervisor::State::RecordLimitChanges() {
  for (admission::LimitChange& c : controller->TakeLimitChanges()) {
    if (options.log_to_stderr) {
      std::fprintf(stderr, "[admission] t=%.1f s limit %lld -> %lld: %s\n", c.t_s,
                   static_cast<long long>(c.from), static_cast<long long>(c.to), c.reason.c_str());
    }
    if (Logging()) {
      events->LimitChange(c.t_s * 1e3, {.old_limit = static_cast<int>(c.from),
                                        .new_limit = static_cast<int>(c.to),
                                        .reason = c.reason});
    }
    limit_changes.push_back(std::move(c));
  }
  if (metrics) metrics->admission_limit.Set(static_cast<double>(controller->limit()));
}

void Supervisor::State::Sample(double now) {
  const engine::PoolStats pool = backend->pool();
  const std::int64_t active = loop.active_sessions();
  // Bounded sessions can never hold more than the sum of their bounds; any full-KV session makes
  // the total unbounded.
  std::int64_t bounded = 0;
  for (const auto& [id, p] : projected) {
    if (!p.bounded) {
      bounded = -1;
      break;
    }
    bounded += p.blocks;
  }
  forecast.Observe(now, pool.used_blocks, pool.num_blocks, active, bounded);
  const std::optional<double> t_sat = forecast.TimeToSaturationSeconds();
  const bool warning = forecast.Warning();
  if (warning && !forecast_warning) {
    if (options.log_to_stderr) {
      std::fprintf(stderr,
                   "[warn] t=%.1f s KV pool forecast to fill in %.1f s (occupancy %.1f%%, %lld "
                   "sessions)\n",
                   now, t_sat.value_or(0.0), 100.0 * forecast.occupancy(),
                   static_cast<long long>(active));
    }
    if (Logging()) {
      events->Alarm(now * 1e3, {.kind = "saturation_forecast",
                                .detail = "t_sat_s=" + FormatValue(t_sat.value_or(0.0))});
    }
  }
  forecast_warning = warning;

  SupervisorSample& s = last_sample;
  s.t_s = now;
  s.active = active;
  s.limit = controller->limit();
  s.used_blocks = pool.used_blocks;
  s.total_blocks = pool.num_blocks;
  s.kv_used_fraction = pool.num_blocks > 0 ? static_cast<double>(pool.used_blocks) /
                                                 static_cast<double>(pool.num_blocks)
                                           : 0.0;
  s.t_sat_s = t_sat.value_or(std::numeric_limits<double>::infinity());
  s.forecast_warning = warning;

  if (metrics) {
    metrics->kv_blocks_used.Set(static_cast<double>(pool.used_blocks));
    metrics->kv_blocks_free.Set(static_cast<double>(pool.free_blocks));
    metrics->kv_blocks_freed_by_window.Inc(
        static_cast<std::uint64_t>(pool.blocks_freed_by_window - last_freed_by_window));
    metrics->sessions_active.Set(static_cast<double>(active));
    metrics->SetSaturationForecastSeconds(t_sat.value_or(-1.0));
  }
  last_freed_by_window = pool.blocks_freed_by_window;
}

void Supervisor::State::OnFrame(const FrameRecord& r) {
  const double now = r.delivered_s - t0;
  const bool missed = r.outcome == FrameOutcome::kLate;
  controller->OnFrame(now, r.latency_ms, r.deadline_ms, missed);
  latency_ms.Add(r.latency_ms);
  if (metrics) {
    metrics->frame_latency_ms.Observe(r.latency_ms);
    metrics->frames(r.outcome).Inc();
    if (missed) metrics->deadline_misses.Inc();
    metrics->tokens_per_frame.Observe(static_cast<double>(r.tokens.size()));
    metrics->session_resident_blocks.Observe(static_cast<double>(r.resident_blocks));
  }
  if (Logging()) {
    events->Frame(now * 1e3, {.session_id = r.session,
                              .frame = r.index,
                              .outcome = telemetry::ToString(r.outcome),
                              .latency_ms = r.latency_ms,
                              .num_tokens = static_cast<int>(r.tokens.size())});
  }
  if (owner.on_frame) owner.on_frame(r);
}

Supervisor::Supervisor(Backend* backend, Clock* clock, const SupervisorOptions& options,
                       telemetry::MetricsRegistry* registry, telemetry::EventLog* events) {
  options.Validate();
  state_ = std::make_unique<State>(*this, backend, clock, options, registry, events);
  State& st = *state_;
  st.loop.on_frame = [&st](const FrameRecord& r) { st.OnFrame(r); };
  st.loop.on_mute_alarm = [this, &st](RealtimeSessionId id, double t_s) {
    if (st.metrics) st.metrics->mute_alarms.Inc();
    const std::int64_t n = st.loop.stats().mute_alarms;
    const double now = t_s - st.t0;
    // The first alarms name their session; after that a running count keeps stderr readable.
    if (st.options.log_to_stderr && (n <= 5 || n % 100 == 0)) {
      std::fprintf(stderr,
                   "[alarm] mute: session %llu starved %d consecutive frames at t=%.2f s%s\n",
                   static_cast<unsigned long long>(id), st.options.loop.mute_after_starved, now,
                   n > 5 ? (" (" + std::to_string(n) + " alarms so far)").c_str() : "");
    }
    if (st.Logging()) {
      st.events->Alarm(now * 1e3, {.kind = "mute",
                                   .session_id = id,
                                   .detail = std::to_string(st.options.loop.mute_after_starved) +
                                             " consecutive starved frames"});
    }
    if (on_mute_alarm) on_mute_alarm(id, now);
  };
  st.loop.on_iteration = [&st](double seconds, int batch_tokens) {
    st.system_cache.reset();
    if (!st.metrics) return;
    st.metrics->iteration_ms.Observe(seconds * 1e3);
    st.metrics->batch_tokens.Observe(static_cast<double>(batch_tokens));
  };
  st.loop.on_session_error = [this, &st](RealtimeSessionId id, double t_s,
                                         engine::StepStatus status) {
    const double now = t_s - st.t0;
    st.Forget(id);
    ++st.ended_by_error;
    if (st.options.log_to_stderr) {
      std::fprintf(stderr, "[error] session %llu ended at t=%.2f s: %s\n",
                   static_cast<unsigned long long>(id), now, ToString(status));
    }
    if (st.Logging()) {
      st.events->Write(now * 1e3, "session_end",
                       {{"session_id", id}, {"reason", "error"}, {"error", ToString(status)}});
    }
    if (on_session_error) on_session_error(id, now, status);
  };
}

Supervisor::~Supervisor() = default;

void Supervisor::Start() {
  state_->t0 = state_->clock->NowSeconds();
  state_->next_sample_s = 0.0;
  if (state_->metrics) {
    state_->metrics->admission_limit.Set(static_cast<double>(state_->controller->limit()));
  }
}

double Supervisor::Now() const { return state_->clock->NowSeconds() - state_->t0; }
double Supervisor::StartSeconds() const { return state_->t0; }

Supervisor::AdmitResult Supervisor::Admit(const SessionSpec& spec, double now_s) {
  State& st = *state_;
  spec.Validate();
  admission::SessionRequest request;
  request.period_ms = spec.period_ms;
  request.deadline_ms = spec.deadline_ms;
  request.projected_blocks = ProjectedBlocks(spec, st.backend->block_tokens(), st.options.memory,
                                             st.backend->full_kv_context_limit());
  if (!st.system_cache) st.system_cache = st.System();
  admission::SystemState& system = *st.system_cache;

  AdmitResult result;
  if (st.options.max_sessions > 0 && system.active_sessions >= st.options.max_sessions) {
    result.decision = {.admit = false,
                       .reason = "max_sessions",
                       .detail = std::to_string(system.active_sessions) +
                                 " sessions are active, the server's max_sessions",
                       .retry_after_ms = request.period_ms};
  } else {
    result.decision = st.controller->Decide(request, system, now_s);
  }
  const admission::Decision& d = result.decision;
  if (!d.admit) {
    ++st.rejected;
    if (st.metrics) st.metrics->sessions_rejected(d.reason).Inc();
    if (st.Logging()) {
      st.events->Admission(now_s * 1e3, {.session_id = 0,
                                         .admitted = false,
                                         .reason = d.reason,
                                         .num_active = static_cast<int>(system.active_sessions),
                                         .limit = static_cast<int>(st.controller->limit())});
    }
    return result;
  }
  const bool full = spec.policy.mode == kv::KvMode::kFull;
  const TokenPos backend_limit = st.backend->full_kv_context_limit();
  result.max_context_tokens = full ? backend_limit : 0;
  if (full && st.options.enforce_kv_budget && st.controller->reserves_kv()) {
    // The promise made to everyone else: this session never holds more than it was granted.
    result.max_context_tokens = request.projected_blocks * st.backend->block_tokens();
    if (backend_limit > 0)
      result.max_context_tokens = std::min(result.max_context_tokens, backend_limit);
    SessionSpec budgeted = spec;
    budgeted.max_context_tokens = result.max_context_tokens;
    result.id = st.loop.AddSession(budgeted);
  } else {
    result.id = st.loop.AddSession(spec);
  }
  st.projected.emplace(result.id,
                       State::Projection{.blocks = request.projected_blocks,
                                         .bounded = spec.policy.mode == kv::KvMode::kWindow});
  // The new session holds nothing yet: all of its projection is reserved.
  ++system.active_sessions;
  system.reserved_blocks += request.projected_blocks;
  ++st.admitted;
  const std::int64_t active = st.loop.active_sessions();
  if (st.metrics) {
    st.metrics->sessions_admitted.Inc();
    st.metrics->sessions_active.Set(static_cast<double>(active));
  }
  if (st.Logging()) {
    st.events->Admission(now_s * 1e3, {.session_id = result.id,
                                       .admitted = true,
                                       .num_active = static_cast<int>(active),
                                       .limit = static_cast<int>(st.controller->limit())});
  }
  if (active > st.peak_active) {
    st.peak_active = active;
    if (on_new_peak) on_new_peak(now_s);
  }
  return result;
}

void Supervisor::End(RealtimeSessionId id, double now_s, const std::string& reason) {
  State& st = *state_;
  if (!st.projected.contains(id)) return;  // unknown, or already ended by the loop
  st.loop.EndSession(id);
  st.Forget(id);
  st.system_cache.reset();
  if (st.metrics) st.metrics->sessions_active.Set(static_cast<double>(st.loop.active_sessions()));
  if (st.Logging()) {
    st.events->Write(now_s * 1e3, "session_end", {{"session_id", id}, {"reason", reason}});
  }
}

bool Supervisor::Tick(double now_s) {
  State& st = *state_;
  st.system_cache.reset();
  admission::SystemState light;  // OnTick needs counts, not the O(sessions) reservation sum
  const engine::PoolStats pool = st.backend->pool();
  light.active_sessions = st.loop.active_sessions();
  light.free_blocks = pool.free_blocks;
  light.total_blocks = pool.num_blocks;
  st.controller->OnTick(now_s, light);
  st.RecordLimitChanges();
  if (pool.num_blocks > 0) {
    st.kv_peak_fraction = std::max(st.kv_peak_fraction, static_cast<double>(pool.used_blocks) /
                                                            static_cast<double>(pool.num_blocks));
  }
  // Events are scheduled in double seconds but the clock ticks in integer ns: within 1 ns is due.
  if (now_s + 1e-9 < st.next_sample_s) return false;
  st.Sample(now_s);
  while (st.next_sample_s <= now_s + 1e-9) st.next_sample_s += st.options.sample_interval_s;
  return true;
}

RealtimeLoop& Supervisor::loop() { return state_->loop; }
const RealtimeLoop& Supervisor::loop() const { return state_->loop; }
const admission::AdmissionController& Supervisor::controller() const { return *state_->controller; }
const std::vector<admission::LimitChange>& Supervisor::limit_changes() const {
  return state_->limit_changes;
}
const SupervisorSample& Supervisor::last_sample() const { return state_->last_sample; }
double Supervisor::next_sample_s() const { return state_->next_sample_s; }
std::int64_t Supervisor::admitted() const { return state_->admitted; }
std::int64_t Supervisor::rejected() const { return state_->rejected; }
std::int64_t Supervisor::ended_by_error() const { return state_->ended_by_error; }
std::int64_t Supervisor::peak_active() const { return state_->peak_active; }
std::int64_t Supervisor::tracked_sessions() const {
  return static_cast<std::int64_t>(state_->projected.size());
}
double Supervisor::kv_peak_fraction() const { return state_->kv_peak_fraction; }
double Supervisor::LatencyQuantileMs(double q) const { return state_->latency_ms.Quantile(q); }

}  // namespace metronome::realtime
