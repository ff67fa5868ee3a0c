#include "metronome/realtime/supervisor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "metronome/admission/step_load.h"
#include "metronome/base/errors.h"
#include "metronome/realtime/reporter.h"
#include "metronome/realtime/session_state.h"
#include "metronome/telemetry/quantile_sketch.h"

namespace metronome::realtime {

void WorkLimits::Validate() const {
  if (!(max_session_share > 0.0 && max_session_share <= 1.0)) {
    throw ConfigError("work.max_session_share = " + FormatValue(max_session_share) +
                      " must be in (0, 1]");
  }
  if (!(lone_frame_fraction > 0.0 && lone_frame_fraction <= 1.0)) {
    throw ConfigError("work.lone_frame_fraction = " + FormatValue(lone_frame_fraction) +
                      " must be in (0, 1]");
  }
  if (!(min_deadline_ms >= 0.0 && min_deadline_ms <= 3.6e6)) {
    throw ConfigError("work.min_deadline_ms = " + FormatValue(min_deadline_ms) +
                      " must be in [0, 3600000]");
  }
}

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
  work.Validate();
  if (cost_model) reference_session.Validate();
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

namespace {

// The loop's options, with a prompt's prefill paced by the cost model that prices sessions.
LoopOptions WithPromptPacing(const SupervisorOptions& o) {
  LoopOptions loop = o.loop;
  if (o.cost_model) {
    loop.prompt.c1_s_per_token = o.cost_model->c1_s_per_token;
    loop.prompt.c2_s_per_kv_token = o.cost_model->c2_s_per_kv_token;
  }
  return loop;
}

}  // namespace

// The loop's observer: the supervisor's own handling of every report, then the driver's.
struct Supervisor::State final : SessionObserver {
  State(Backend* b, Clock* c, const SupervisorOptions& o, telemetry::MetricsRegistry* registry,
        telemetry::EventLog* e)
      : backend(b),
        clock(c),
        options(o),
        loop(b, c, WithPromptPacing(o)),
        controller(admission::MakeController(o.admission, o.aimd, o.memory, o.gradient2)),
        forecast(o.forecast),
        reporter(o.log_to_stderr, registry, e) {
    loop.set_observer(this);
  }
  admission::SystemState System() const;
  void Sample(double now);
  void RecordLimitChanges();
  [[nodiscard]] std::int64_t EffectiveLimit() const;
  void OnFrame(const FrameRecord& r) override;
  void OnMuteAlarm(const MuteAlarm& a) override;
  void OnSessionEnded(const SessionEnded& e) override;
  void Forget(RealtimeSessionId id);
  [[nodiscard]] double AdmittedLoad() const {
    return controller->budgets_work() ? active_work : static_cast<double>(loop.active_sessions());
  }
  // PriceSession of `spec` at the size admission projects for it (ProjectedBlocks): requests and
  // the reference session priced by one rule. Needs options.cost_model.
  [[nodiscard]] SessionPrice PriceOf(const SessionSpec& spec) const;
  // The door rules of options.work and the request's work; a refusal, or nullopt.
  std::optional<admission::Decision> PriceRequest(const SessionSpec& spec,
                                                  admission::SessionRequest& request) const;

  SessionObserver* observer = nullptr;  // the driver's
  Backend* backend;
  Clock* clock;
  SupervisorOptions options;
  RealtimeLoop loop;
  std::unique_ptr<admission::AdmissionController> controller;
  kv::OccupancyForecast forecast;
  Reporter reporter;
  // The engine's step cost, fitted once for every reader: the controller's control windows (AIMD's
  // growth cap) and the samples' windows (the work utilization and busy fraction they report).
  admission::StepCostFit step_cost;
  admission::StepLoad sample_load;  // the steps since the previous sample
  double last_sample_s = 0.0;

  // Every live session's projection: what admission reserved for it, and whether that is a hard
  // bound (window KV) or only an estimate (full KV).
  struct Projection {
    std::int64_t blocks = 0;
    bool bounded = false;
    double work = 1.0;  // SessionRequest::work
  };
  double active_work = 0.0;  // sum of the live sessions' work
  // Hints for the max_sessions refusal: only a session end frees a place under the hard cap.
  admission::RetryHint max_sessions_hint;
  double reference_share = 0.0;  // the reference session's work_share (0: no cost model)
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
  std::int64_t missed_frames = 0;  // FrameOutcome::kMissed, from ReportContinuity
  Supervisor::ContinuityCounts continuity;
  std::int64_t ended_by_error = 0;
  std::int64_t peak_active = 0;
  double kv_peak_fraction = 0.0;
  bool forecast_warning = false;
  std::int64_t admission_limit = admission::kNoLimit;  // EffectiveLimit() at the last Tick
};

admission::SystemState Supervisor::State::System() const {
  const kv::PoolStats pool = backend->pool();
  admission::SystemState s;
  s.active_sessions = loop.active_sessions();
  s.active_work = active_work;
  s.free_blocks = pool.free_blocks;
  s.total_blocks = pool.num_blocks;
  for (const auto& [id, p] : projected) {
    s.reserved_blocks += std::max<std::int64_t>(0, p.blocks - loop.resident_blocks(id));
  }
  return s;
}

std::int64_t Supervisor::State::EffectiveLimit() const {
  std::int64_t limit = controller->limit();
  const auto cap = [&limit](std::int64_t bound) {
    limit = limit == admission::kNoLimit ? bound : std::min(limit, bound);
  };
  if (controller->reserves_kv() && options.reference_session_blocks > 0) {
    // O(sessions): the reservations are summed over the live sessions' projections.
    cap(admission::SessionsThatFit({.projected_blocks = options.reference_session_blocks}, System(),
                                   options.memory));
  }
  if (options.max_sessions > 0) cap(options.max_sessions);
  return limit;
}

void Supervisor::State::RecordLimitChanges() {
  for (admission::LimitChange& c : controller->TakeLimitChanges()) {
    reporter.LimitChange(c);
    limit_changes.push_back(std::move(c));
  }
  admission_limit = EffectiveLimit();
  reporter.Capacity(admission_limit, AdmittedLoad());
}

void Supervisor::State::Sample(double now) {
  const kv::PoolStats pool = backend->pool();
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
    reporter.ForecastWarning(now, t_sat.value_or(0.0), forecast.occupancy(), active);
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
  const admission::StepLoadWindow load =
      sample_load.Close(now - last_sample_s, step_cost.Estimate());
  last_sample_s = now;
  s.busy_fraction = load.busy_fraction;
  s.work_utilization = load.valid ? load.utilization : std::numeric_limits<double>::quiet_NaN();

  reporter.Sample(pool, active, t_sat.value_or(-1.0), s.busy_fraction, s.work_utilization);
}

void Supervisor::State::Forget(RealtimeSessionId id) {
  const auto it = projected.find(id);
  if (it == projected.end()) return;
  active_work -= it->second.work;
  projected.erase(it);
  if (projected.empty()) active_work = 0.0;  // no rounding left behind
  controller->OnSessionEnded(id);
}

SessionPrice Supervisor::State::PriceOf(const SessionSpec& spec) const {
  const int block_tokens = backend->block_tokens();
  // A full-KV session at its projected size, which no session outgrows the pool to reach.
  const std::int64_t blocks = std::min(
      ProjectedBlocks(spec, block_tokens, options.memory, backend->full_kv_context_limit()),
      backend->pool().num_blocks);
  return PriceSession(*options.cost_model, spec, blocks * block_tokens);
}

std::optional<admission::Decision> Supervisor::State::PriceRequest(
    const SessionSpec& spec, admission::SessionRequest& request) const {
  const WorkLimits& limits = options.work;
  const auto refuse = [](std::string reason, std::string detail) {
    return admission::Decision{
        .admit = false, .reason = std::move(reason), .detail = std::move(detail)};
  };
  // The floors: the operator's, and the frame's own time alone on the engine (a deadline must
  // leave it at most lone_frame_fraction; a period at least the whole of it, or frames come
  // faster than one runs).
  std::optional<SessionPrice> price;
  if (options.cost_model) price = PriceOf(spec);
  const double lone_ms = price ? 1000.0 * price->lone_frame_s : 0.0;
  const auto floor_check = [&](const char* field, double value_ms,
                               double calibrated_ms) -> std::optional<admission::Decision> {
    const double floor_ms = std::max(limits.min_deadline_ms, calibrated_ms);
    if (value_ms >= floor_ms) return std::nullopt;
    const std::string why = calibrated_ms > limits.min_deadline_ms
                                ? "this server's floor for the frame (" + FormatValue(lone_ms) +
                                      " ms alone on the engine)"
                                : std::string("this server's minimum");
    return refuse(std::string(field).substr(0, std::string(field).find('_')),
                  std::string(field) + " " + FormatValue(value_ms) + " is under " +
                      FormatValue(floor_ms) + " ms, " + why);
  };
  if (auto d = floor_check("deadline_ms", spec.deadline_ms, lone_ms / limits.lone_frame_fraction)) {
    return d;
  }
  if (auto d = floor_check("period_ms", spec.period_ms, lone_ms)) return d;
  if (!price) return std::nullopt;
  if (price->work_share > limits.max_session_share) {
    return refuse("work", "the session's frames take " + FormatValue(price->work_share) +
                              " of the engine per second (" +
                              FormatValue(1000.0 * price->frame_work_s) + " ms of compute every " +
                              FormatValue(spec.period_ms) + " ms); one session may take at most " +
                              FormatValue(limits.max_session_share));
  }
  // A session priced at nothing (a model with no per-token cost) still counts a sliver, so the
  // budget bounds the number of such sessions.
  request.work = reference_share > 0.0 ? std::max(price->work_share / reference_share, 1e-3) : 1.0;
  return std::nullopt;
}

void Supervisor::State::OnFrame(const FrameRecord& r) {
  const auto it = projected.find(r.session);
  // A frame that waited for its session's own prompt (scheduled after everyone else's frames)
  // says nothing about the load.
  if (!r.behind_own_prompt) {
    controller->OnFrame(
        admission::FrameSample{.now_s = r.delivered_s,
                               .latency_ms = r.latency_ms,
                               .deadline_ms = r.deadline_ms,
                               .missed = r.outcome == FrameOutcome::kLate,
                               .session = r.session,
                               .work = it != projected.end() ? it->second.work : 1.0});
  }
  latency_ms.Add(r.latency_ms);
  reporter.Frame(r);
  if (observer != nullptr) observer->OnFrame(r);
}

void Supervisor::State::OnMuteAlarm(const MuteAlarm& a) {
  reporter.MuteAlarm(a);
  if (observer != nullptr) observer->OnMuteAlarm(a);
}

void Supervisor::State::OnSessionEnded(const SessionEnded& e) {
  Forget(e.session);
  system_cache.reset();
  if (e.by_loop()) ++ended_by_error;
  reporter.SessionEnded(e, loop.active_sessions());
  if (observer != nullptr) observer->OnSessionEnded(e);
}

Supervisor::Supervisor(Backend* backend, Clock* clock, const SupervisorOptions& options,
                       telemetry::MetricsRegistry* registry, telemetry::EventLog* events) {
  options.Validate();
  state_ = std::make_unique<State>(backend, clock, options, registry, events);
  State& st = *state_;
  if (options.cost_model) {
    st.reference_share = st.PriceOf(options.reference_session).work_share;
  }
  st.loop.on_iteration = [&st](double seconds, int batch_tokens) {
    st.system_cache.reset();
    const double now_s = st.loop.Now();
    st.step_cost.OnStep(now_s, seconds, batch_tokens);
    st.controller->OnStep(seconds, batch_tokens, st.step_cost.Estimate());
    st.sample_load.OnStep(seconds, batch_tokens);
    st.reporter.Iteration(seconds, batch_tokens);
  };
}

Supervisor::~Supervisor() = default;

void Supervisor::Start() {
  state_->loop.SetOrigin(state_->clock->Now());
  state_->next_sample_s = 0.0;
  state_->RecordLimitChanges();
}

double Supervisor::Now() const { return state_->loop.Now(); }
void Supervisor::set_observer(SessionObserver* observer) { state_->observer = observer; }

Supervisor::AdmitResult Supervisor::Admit(const SessionSpec& spec, double now_s) {
  return AdmitAndOpen(spec, now_s, [this](const SessionSpec& budgeted, AdmitResult* result) {
    result->id = state_->loop.AddSession(budgeted);
    return true;
  });
}

Supervisor::AdmitResult Supervisor::AdmitMoved(const SessionState& state, double now_s) {
  return AdmitAndOpen(
      state.spec, now_s, [this, &state](const SessionSpec& budgeted, AdmitResult* result) {
        SessionState moved = state;
        moved.spec = budgeted;
        const BackendImport imported = state_->loop.ImportSession(moved, &result->id);
        if (imported.ok()) return true;
        result->decision = {.admit = false,
                            .reason = imported.pool_exhausted ? "pool" : "state",
                            .detail = imported.pool_exhausted
                                          ? "the KV pool has no room for the session's blocks now"
                                          : imported.error,
                            .retry_after_ms = imported.pool_exhausted ? state.spec.period_ms : 0.0};
        return false;
      });
}

bool Supervisor::ExportSession(RealtimeSessionId id, SessionState* state) const {
  return state_->projected.contains(id) && state_->loop.ExportSession(id, state);
}

bool Supervisor::HasFrames(RealtimeSessionId id) const { return state_->loop.HasFrames(id); }

const SessionSpec* Supervisor::session_spec(RealtimeSessionId id) const {
  return state_->loop.session_spec(id);
}

std::int64_t Supervisor::next_frame(RealtimeSessionId id) const {
  return state_->loop.next_frame(id);
}

void Supervisor::ReportContinuity(Continuity event, RealtimeSessionId id,
                                  std::int64_t missed_frames, std::int64_t state_bytes) {
  State& st = *state_;
  st.missed_frames += missed_frames;
  const double now_s = Now();
  ContinuityCounts& c = st.continuity;
  switch (event) {
    case Continuity::kResumed:
      ++c.resumed;
      st.reporter.Resumed(id, now_s, missed_frames);
      return;
    case Continuity::kMovedOut:
      ++c.moved_out;
      c.state_bytes_out += state_bytes;
      st.reporter.Moved(id, now_s, "out", missed_frames, state_bytes);
      return;
    case Continuity::kMovedIn:
      ++c.moved_in;
      c.state_bytes_in += state_bytes;
      st.reporter.Moved(id, now_s, "in", missed_frames, state_bytes);
      return;
    case Continuity::kMoveLost:
      ++c.moved_lost;
      st.reporter.Moved(id, now_s, "lost", missed_frames, 0);
      return;
  }
}

const Supervisor::ContinuityCounts& Supervisor::continuity_counts() const {
  return state_->continuity;
}

std::int64_t Supervisor::missed_frames() const { return state_->missed_frames; }

Supervisor::AdmitResult Supervisor::AdmitAndOpen(const SessionSpec& spec, double now_s,
                                                 const OpenSession& open) {
  State& st = *state_;
  spec.Validate();
  admission::SessionRequest request;
  request.period_ms = spec.period_ms;
  request.deadline_ms = spec.deadline_ms;
  request.projected_blocks = ProjectedBlocks(spec, st.backend->block_tokens(), st.options.memory,
                                             st.backend->full_kv_context_limit());
  if (!st.system_cache) st.system_cache = st.System();
  admission::SystemState& system = *st.system_cache;
  st.max_sessions_hint.Observe(now_s, system.active_sessions);

  AdmitResult result;
  if (std::optional<admission::Decision> refused = st.PriceRequest(spec, request)) {
    result.decision = std::move(*refused);
  } else if (st.options.max_sessions > 0 && system.active_sessions >= st.options.max_sessions) {
    result.decision = {.admit = false,
                       .reason = "max_sessions",
                       .detail = std::to_string(system.active_sessions) +
                                 " sessions are active, the server's max_sessions",
                       .retry_after_ms = st.max_sessions_hint.Ms(
                           now_s, request.period_ms, std::numeric_limits<double>::infinity())};
  } else {
    result.decision = st.controller->Decide(request, system, now_s);
  }
  const admission::Decision& d = result.decision;
  if (!d.admit) {
    ++st.rejected;
    st.reporter.Rejected(d, now_s, system.active_sessions, st.controller->limit());
    return result;
  }
  const bool full = spec.policy.mode == kv::KvMode::kFull;
  const TokenPos backend_limit = st.backend->full_kv_context_limit();
  result.max_context_tokens = full ? backend_limit : 0;
  SessionSpec budgeted = spec;
  if (full && st.options.enforce_kv_budget && st.controller->reserves_kv()) {
    // The promise made to everyone else: this session never holds more than it was granted.
    result.max_context_tokens = request.projected_blocks * st.backend->block_tokens();
    if (backend_limit > 0)
      result.max_context_tokens = std::min(result.max_context_tokens, backend_limit);
    budgeted.max_context_tokens = result.max_context_tokens;
  }
  if (!open(budgeted, &result)) {
    ++st.rejected;
    st.reporter.Rejected(result.decision, now_s, system.active_sessions, st.controller->limit());
    return result;
  }
  st.projected.emplace(result.id,
                       State::Projection{.blocks = request.projected_blocks,
                                         .bounded = spec.policy.mode == kv::KvMode::kWindow,
                                         .work = request.work});
  st.active_work += request.work;
  st.max_sessions_hint.OnAdmit();
  result.work = request.work;
  if (st.reference_share > 0.0 && !spec.prompt.empty()) {
    result.prompt_work_unit_s = st.PriceOf(spec).prompt_work_s / st.reference_share;
  }
  // The new session holds nothing yet: all of its projection is reserved.
  ++system.active_sessions;
  system.active_work = st.active_work;
  system.reserved_blocks += request.projected_blocks;
  ++st.admitted;
  const std::int64_t active = st.loop.active_sessions();
  st.reporter.Admitted(result.id, now_s, active, st.controller->limit());
  st.peak_active = std::max(st.peak_active, active);
  return result;
}

void Supervisor::End(RealtimeSessionId id, double now_s, EndReason reason) {
  State& st = *state_;
  if (!st.projected.contains(id)) return;  // unknown, or already ended by the loop
  st.loop.EndSession(id);
  st.OnSessionEnded({.session = id, .t_s = now_s, .reason = reason});
}

RealtimeLoop::SubmitResult Supervisor::Submit(RealtimeSessionId id, std::vector<TokenId> tokens,
                                              std::optional<Nanos> arrival) {
  return state_->loop.SubmitFrame(id, std::move(tokens), arrival);
}
bool Supervisor::RunIteration() { return state_->loop.RunIteration(); }
void Supervisor::RunOnce(double t_limit_s) { state_->loop.RunOnce(t_limit_s); }
double Supervisor::NextEventSeconds() const { return state_->loop.NextEventSeconds(); }

bool Supervisor::Tick(double now_s) {
  State& st = *state_;
  st.system_cache.reset();
  admission::SystemState light;  // OnTick needs counts, not the O(sessions) reservation sum
  const kv::PoolStats pool = st.backend->pool();
  light.active_sessions = st.loop.active_sessions();
  light.active_work = st.active_work;
  light.free_blocks = pool.free_blocks;
  light.total_blocks = pool.num_blocks;
  st.controller->OnTick(now_s, light);
  st.max_sessions_hint.Observe(now_s, light.active_sessions);
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

const LoopStats& Supervisor::stats() const { return state_->loop.stats(); }
std::int64_t Supervisor::active_sessions() const { return state_->loop.active_sessions(); }
double Supervisor::active_work() const { return state_->active_work; }
bool Supervisor::priced() const { return state_->options.cost_model.has_value(); }
double Supervisor::admitted_load() const { return state_->AdmittedLoad(); }
std::int64_t Supervisor::resident_blocks(RealtimeSessionId id) const {
  return state_->loop.resident_blocks(id);
}
LoopFootprint Supervisor::loop_footprint() const { return state_->loop.footprint(); }
const admission::AdmissionController& Supervisor::controller() const { return *state_->controller; }
std::int64_t Supervisor::admission_limit() const { return state_->admission_limit; }
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
