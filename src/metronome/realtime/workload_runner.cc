#include "metronome/realtime/workload_runner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>

#include "metronome/base/errors.h"
#include "metronome/realtime/workload.h"
#include "metronome/telemetry/engine_metrics.h"
#include "metronome/telemetry/quantile_sketch.h"

namespace metronome::realtime {
namespace {

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

nlohmann::json NullIfNan(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

std::string PolicyName(const kv::KvPolicy& p) {
  if (p.mode == kv::KvMode::kFull) return "full";
  return "window(W=" + std::to_string(p.window) + ",S=" + std::to_string(p.sinks) + "," +
         (p.positions == kv::PositionMode::kRolling ? "rolling" : "absolute") + ")";
}

// Events are scheduled in double seconds but the clock ticks in integer ns: an event within 1 ns
// of now is due, or a time whose ns rounding falls just short of it would never come.
constexpr double kDueSlackSeconds = 1e-9;

// A client's request for a session, due at t_s (run seconds).
struct Request {
  double t_s = 0.0;
  double first_t_s = 0.0;
  bool population = false;  // population clients never give up
  bool operator>(const Request& o) const { return t_s > o.t_s; }
};

}  // namespace

void WorkloadOptions::Validate() const {
  session.Validate();
  if (sessions < 0 || sessions > 1'000'000) {
    throw ConfigError("--sessions = " + std::to_string(sessions) + " must be in [0, 1000000]");
  }
  if (sessions == 0 && arrival.empty()) {
    throw ConfigError("give --sessions N (a fixed population) or --arrival (an arrival process)");
  }
  if (!(duration_s > 0.0 && duration_s <= 1e7)) {
    throw ConfigError("--duration = " + Num(duration_s) + " must be in (0, 1e7] seconds");
  }
  if (!(patience_s >= 0.0 && std::isfinite(patience_s))) {
    throw ConfigError("--patience-s = " + Num(patience_s) + " must be >= 0");
  }
  if (!(sample_interval_s > 0.0 && sample_interval_s <= 60.0)) {
    throw ConfigError("sample_interval_s = " + Num(sample_interval_s) + " must be in (0, 60]");
  }
  if (!(forecast_settle_s >= 0.0 && std::isfinite(forecast_settle_s))) {
    throw ConfigError("forecast_settle_s = " + Num(forecast_settle_s) + " must be >= 0");
  }
  if (!arrival.empty()) (void)ArrivalProcess::Parse(arrival);
  if (!session_duration.empty()) (void)SessionDuration::Parse(session_duration);
  forecast.Validate();
  loop.Validate();
}

nlohmann::json RunSummary::ToJson() const {
  nlohmann::json j;
  j["frames"] = frames;
  j["ok_frames"] = ok_frames;
  j["late_frames"] = late_frames;
  j["starved_frames"] = starved_frames;
  j["short_frames"] = short_frames;
  j["deadline_misses"] = deadline_misses;
  j["mute_alarms"] = mute_alarms;
  j["first_starved_at_s"] = NullIfNan(first_starved_at_s);
  j["t_sat_predicted_s"] = NullIfNan(t_sat_predicted_s);
  j["t_sat_forecast_at_s"] = NullIfNan(t_sat_forecast_at_s);
  j["kv_peak_fraction"] = kv_peak_fraction;
  j["admitted"] = admitted;
  j["rejected"] = rejected;
  j["abandoned"] = abandoned;
  j["ended_by_error"] = ended_by_error;
  j["limit_final"] =
      limit_final == admission::kNoLimit ? nlohmann::json(nullptr) : nlohmann::json(limit_final);
  j["limit_mean_second_half"] = NullIfNan(limit_mean_second_half);
  j["active_mean_second_half"] = active_mean_second_half;
  j["active_peak"] = active_peak;
  j["limit_changes"] = limit_changes;
  j["p50_frame_latency_ms"] = NullIfNan(p50_frame_latency_ms);
  j["p99_frame_latency_ms"] = NullIfNan(p99_frame_latency_ms);
  j["deadline_ms"] = deadline_ms;
  j["duration_s"] = duration_s;
  j["iterations"] = iterations;
  j["admission"] = admission;
  j["kv_policy"] = kv_policy;
  return j;
}

struct WorkloadRunner::State {
  State(Backend* b, Clock* c, const WorkloadOptions& o, telemetry::MetricsRegistry* registry,
        telemetry::EventLog* e)
      : backend(b),
        clock(c),
        options(o),
        loop(b, c, o.loop),
        controller(admission::MakeController(o.admission, o.aimd, o.memory)),
        forecast(o.forecast),
        events(e),
        rng(o.seed) {
    if (registry != nullptr) metrics.emplace(*registry);
    if (!o.arrival.empty()) arrival = ArrivalProcess::Parse(o.arrival);
    if (!o.session_duration.empty()) duration = SessionDuration::Parse(o.session_duration);
    deadline_ms = o.session.deadline_ms > 0.0 ? o.session.deadline_ms : o.session.period_ms;
    request.period_ms = o.session.period_ms;
    request.deadline_ms = deadline_ms;
    const int block_tokens = b->block_tokens();
    const int chunk = static_cast<int>(o.session.prompt.size()) + 1 +
                      o.session.input_tokens_per_frame;  // largest item a frame appends
    request.projected_blocks =
        o.session.policy.mode == kv::KvMode::kWindow
            ? o.session.policy.MaxResidentBlocks(block_tokens, chunk)
            : admission::ProjectFullModeBlocks(
                  o.memory, o.session.period_ms,
                  o.session.input_tokens_per_frame + o.session.output_tokens_per_frame,
                  static_cast<std::int64_t>(o.session.prompt.size()), block_tokens);
  }

  [[nodiscard]] double Now() const { return clock->NowSeconds() - t0; }
  admission::SystemState System(bool with_reserved) const;
  void Admit(double now, bool population);
  void HandleRequests(double now);
  void EndDueSessions(double now);
  void Sample(double now);
  void Accumulate(double now);
  void RecordLimitChanges();
  void OnFrame(const FrameRecord& r);

  Backend* backend;
  Clock* clock;
  WorkloadOptions options;
  RealtimeLoop loop;
  std::unique_ptr<admission::AdmissionController> controller;
  kv::OccupancyForecast forecast;
  std::optional<telemetry::EngineMetrics> metrics;
  telemetry::EventLog* events;
  std::mt19937_64 rng;
  std::optional<ArrivalProcess> arrival;
  std::optional<SessionDuration> duration;
  admission::SessionRequest request;
  double deadline_ms = 0.0;
  double t0 = 0.0;  // clock seconds at the start of Run

  std::priority_queue<Request, std::vector<Request>, std::greater<>> requests;
  double next_arrival_s = std::numeric_limits<double>::infinity();
  // Scheduled ends: (run seconds, session id), earliest first.
  std::priority_queue<std::pair<double, RealtimeSessionId>,
                      std::vector<std::pair<double, RealtimeSessionId>>, std::greater<>>
      ends;
  std::unordered_map<RealtimeSessionId, std::size_t> record_of;  // index into records
  std::vector<SessionRecord> records;
  std::vector<RunSample> samples;
  std::vector<admission::LimitChange> limit_changes;
  telemetry::QuantileSketch latency_ms;
  RunSummary summary;

  double next_sample_s = 0.0;
  double last_turn_s = 0.0;
  double weighted_active = 0.0;  // integral of active over the second half, session-seconds
  double weighted_limit = 0.0;
  double weighted_limit_s = 0.0;  // time covered by a finite limit
  std::int64_t peak_active = 0;
  double forecast_due_s = std::numeric_limits<double>::infinity();
  bool forecast_warning = false;
  std::int64_t last_freed_by_window = 0;
  std::int64_t last_mute_alarms = 0;
};

admission::SystemState WorkloadRunner::State::System(bool with_reserved) const {
  const engine::PoolStats pool = backend->pool();
  admission::SystemState s;
  s.active_sessions = loop.active_sessions();
  s.free_blocks = pool.free_blocks;
  s.total_blocks = pool.num_blocks;
  if (with_reserved) {
    for (const RealtimeSessionId id : loop.session_ids()) {
      s.reserved_blocks +=
          std::max<std::int64_t>(0, request.projected_blocks - loop.resident_blocks(id));
    }
  }
  return s;
}

void WorkloadRunner::State::Admit(double now, bool population) {
  SessionSpec spec = options.session;
  if (population && !options.aligned_phases) {
    spec.phase_ms = std::uniform_real_distribution<double>(0.0, spec.period_ms)(rng);
    if (spec.phase_ms >= spec.period_ms) spec.phase_ms = 0.0;
  }
  const RealtimeSessionId id = loop.AddSession(spec);
  SessionRecord rec;
  rec.id = id;
  rec.admitted_s = now;
  if (duration) {
    rec.scheduled_end_s = now + duration->Sample(rng);
    ends.emplace(rec.scheduled_end_s, id);
  }
  record_of.emplace(id, records.size());
  records.push_back(rec);
  ++summary.admitted;
  if (metrics) {
    metrics->sessions_admitted.Inc();
    metrics->sessions_active.Set(static_cast<double>(loop.active_sessions()));
  }
  if (events != nullptr && events->enabled()) {
    const std::int64_t limit = controller->limit();
    events->Admission(now * 1e3, {.session_id = id,
                                  .admitted = true,
                                  .num_active = static_cast<int>(loop.active_sessions()),
                                  .limit = static_cast<int>(limit)});
  }
  if (loop.active_sessions() > peak_active) {
    peak_active = loop.active_sessions();
    forecast_due_s = now + options.forecast_settle_s;
  }
}

void WorkloadRunner::State::HandleRequests(double now) {
  while (arrival && next_arrival_s <= now + kDueSlackSeconds) {
    requests.push({next_arrival_s, next_arrival_s, false});
    next_arrival_s = arrival->NextAfter(next_arrival_s, rng);
  }
  if (requests.empty() || requests.top().t_s > now + kDueSlackSeconds) return;
  const admission::SystemState state = System(/*with_reserved=*/true);
  std::int64_t admitted_now = 0;
  while (!requests.empty() && requests.top().t_s <= now + kDueSlackSeconds) {
    Request req = requests.top();
    requests.pop();
    admission::SystemState s = state;
    // Sessions admitted in this batch hold nothing yet: count them as active and reserved.
    s.active_sessions += admitted_now;
    s.reserved_blocks += admitted_now * request.projected_blocks;
    const admission::Decision d = controller->Decide(request, s, now);
    if (d.admit) {
      Admit(now, req.population);
      ++admitted_now;
      continue;
    }
    ++summary.rejected;
    if (metrics) metrics->sessions_rejected(d.reason).Inc();
    if (events != nullptr && events->enabled()) {
      events->Admission(now * 1e3, {.session_id = 0,
                                    .admitted = false,
                                    .reason = d.reason,
                                    .num_active = static_cast<int>(s.active_sessions),
                                    .limit = static_cast<int>(controller->limit())});
    }
    const double retry_s = std::max(d.retry_after_ms, options.session.period_ms) / 1e3;
    req.t_s = now + retry_s;
    if (req.population || req.t_s - req.first_t_s <= options.patience_s) {
      requests.push(req);
    } else {
      ++summary.abandoned;
    }
  }
}

void WorkloadRunner::State::EndDueSessions(double now) {
  while (!ends.empty() && ends.top().first <= now + kDueSlackSeconds) {
    const RealtimeSessionId id = ends.top().second;
    ends.pop();
    SessionRecord& rec = records[record_of.at(id)];
    if (!std::isnan(rec.ended_s)) continue;  // already ended by the loop
    loop.EndSession(id);
    rec.ended_s = now;
    if (events != nullptr && events->enabled()) {
      events->Write(now * 1e3, "session_end", {{"session_id", id}, {"frames", rec.frames}});
    }
  }
}

void WorkloadRunner::State::RecordLimitChanges() {
  for (admission::LimitChange& c : controller->TakeLimitChanges()) {
    if (options.log_to_stderr)
      std::fprintf(stderr, "[admission] t=%.1f s limit %lld -> %lld: %s\n", c.t_s,
                   static_cast<long long>(c.from), static_cast<long long>(c.to), c.reason.c_str());
    if (events != nullptr && events->enabled()) {
      events->LimitChange(c.t_s * 1e3, {.old_limit = static_cast<int>(c.from),
                                        .new_limit = static_cast<int>(c.to),
                                        .reason = c.reason});
    }
    limit_changes.push_back(std::move(c));
  }
  if (metrics) metrics->admission_limit.Set(static_cast<double>(controller->limit()));
}

void WorkloadRunner::State::Sample(double now) {
  const engine::PoolStats pool = backend->pool();
  const std::int64_t active = loop.active_sessions();
  // Window sessions are bounded: together they can never hold more than active x bound.
  const std::int64_t bounded =
      options.session.policy.mode == kv::KvMode::kWindow ? active * request.projected_blocks : -1;
  forecast.Observe(now, pool.used_blocks, pool.num_blocks, active, bounded);
  const std::optional<double> t_sat = forecast.TimeToSaturationSeconds();
  if (now >= forecast_due_s) {
    summary.t_sat_forecast_at_s = now;
    summary.t_sat_predicted_s = t_sat ? now + *t_sat : std::numeric_limits<double>::quiet_NaN();
    forecast_due_s = std::numeric_limits<double>::infinity();
  }
  const bool warning = forecast.Warning();
  if (warning && !forecast_warning) {
    if (options.log_to_stderr)
      std::fprintf(stderr,
                   "[warn] t=%.1f s KV pool forecast to fill in %.1f s (occupancy %.1f%%, %lld "
                   "sessions)\n",
                   now, t_sat.value_or(0.0), 100.0 * forecast.occupancy(),
                   static_cast<long long>(active));
    if (events != nullptr && events->enabled()) {
      events->Alarm(now * 1e3, {.kind = "saturation_forecast",
                                .detail = "t_sat_s=" + Num(t_sat.value_or(0.0))});
    }
  }
  forecast_warning = warning;

  RunSample s;
  s.t_s = now;
  s.active = active;
  s.limit = controller->limit();
  s.kv_used_fraction = pool.num_blocks > 0 ? static_cast<double>(pool.used_blocks) /
                                                 static_cast<double>(pool.num_blocks)
                                           : 0.0;
  s.t_sat_s = t_sat.value_or(std::numeric_limits<double>::infinity());
  const LoopStats& ls = loop.stats();
  s.frames = ls.frames;
  s.ok = ls.ok;
  s.late = ls.late;
  s.starved = ls.starved;
  s.short_frames = ls.short_frames;
  s.mute_alarms = ls.mute_alarms;
  s.admitted = summary.admitted;
  s.rejected = summary.rejected;
  samples.push_back(s);

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

void WorkloadRunner::State::Accumulate(double now) {
  // Time-weighted means over the second half of the run: each turn's state holds since the last.
  const double half = options.duration_s / 2.0;
  const double from = std::max(last_turn_s, half);
  if (now > from) {
    const double dt = now - from;
    weighted_active += static_cast<double>(loop.active_sessions()) * dt;
    const std::int64_t limit = controller->limit();
    if (limit != admission::kNoLimit) {
      weighted_limit += static_cast<double>(limit) * dt;
      weighted_limit_s += dt;
    }
  }
  last_turn_s = now;
  const engine::PoolStats pool = backend->pool();
  if (pool.num_blocks > 0) {
    summary.kv_peak_fraction =
        std::max(summary.kv_peak_fraction,
                 static_cast<double>(pool.used_blocks) / static_cast<double>(pool.num_blocks));
  }
}

void WorkloadRunner::State::OnFrame(const FrameRecord& r) {
  const double now = r.delivered_s - t0;
  const bool missed = r.outcome == FrameOutcome::kLate;
  controller->OnFrame(now, r.latency_ms, deadline_ms, missed);
  latency_ms.Add(r.latency_ms);
  const auto it = record_of.find(r.session);
  if (it != record_of.end()) ++records[it->second].frames;
  if (metrics) {
    metrics->frame_latency_ms.Observe(r.latency_ms);
    metrics->frames(r.outcome).Inc();
    if (missed) metrics->deadline_misses.Inc();
    metrics->tokens_per_frame.Observe(static_cast<double>(r.tokens.size()));
    metrics->session_resident_blocks.Observe(static_cast<double>(r.resident_blocks));
  }
  if (events != nullptr && events->enabled()) {
    events->Frame(now * 1e3, {.session_id = r.session,
                              .frame = r.index,
                              .outcome = telemetry::ToString(r.outcome),
                              .latency_ms = r.latency_ms,
                              .num_tokens = static_cast<int>(r.tokens.size())});
  }
}

WorkloadRunner::WorkloadRunner(Backend* backend, Clock* clock, const WorkloadOptions& options,
                               telemetry::MetricsRegistry* registry, telemetry::EventLog* events) {
  options.Validate();
  WorkloadOptions o = options;
  o.loop.log_to_stderr = false;  // the runner logs alarms itself, rate-limited
  state_ = std::make_unique<State>(backend, clock, o, registry, events);
  State& st = *state_;
  st.loop.on_frame = [&st](const FrameRecord& r) { st.OnFrame(r); };
  st.loop.on_mute_alarm = [&st](RealtimeSessionId id, double t_s) {
    if (st.metrics) st.metrics->mute_alarms.Inc();
    const std::int64_t n = st.loop.stats().mute_alarms;
    // The first alarms name their session; after that a running count keeps stderr readable.
    if (st.options.log_to_stderr && (n <= 5 || n % 100 == 0)) {
      std::fprintf(
          stderr, "[alarm] mute: session %llu starved %d consecutive frames at t=%.2f s%s\n",
          static_cast<unsigned long long>(id), st.options.loop.mute_after_starved, t_s - st.t0,
          n > 5 ? (" (" + std::to_string(n) + " alarms so far)").c_str() : "");
    }
    if (st.events != nullptr && st.events->enabled()) {
      st.events->Alarm((t_s - st.t0) * 1e3,
                       {.kind = "mute",
                        .session_id = id,
                        .detail = std::to_string(st.options.loop.mute_after_starved) +
                                  " consecutive starved frames"});
    }
  };
  st.loop.on_iteration = [&st](double seconds, int batch_tokens) {
    if (!st.metrics) return;
    st.metrics->iteration_ms.Observe(seconds * 1e3);
    st.metrics->batch_tokens.Observe(static_cast<double>(batch_tokens));
  };
  st.loop.on_session_error = [&st](RealtimeSessionId id, double t_s, engine::StepStatus status) {
    const auto it = st.record_of.find(id);
    if (it == st.record_of.end()) return;
    SessionRecord& rec = st.records[it->second];
    rec.ended_s = t_s - st.t0;
    rec.ended_by_error = true;
    ++st.summary.ended_by_error;
    if (st.options.log_to_stderr) {
      std::fprintf(stderr, "[error] session %llu ended at t=%.2f s: %s\n",
                   static_cast<unsigned long long>(id), rec.ended_s, ToString(status));
    }
    if (st.events != nullptr && st.events->enabled()) {
      st.events->Write(rec.ended_s * 1e3, "session_end",
                       {{"session_id", id}, {"frames", rec.frames}, {"error", ToString(status)}});
    }
  };
}

WorkloadRunner::~WorkloadRunner() = default;

RunSummary WorkloadRunner::Run() {
  State& st = *state_;
  st.t0 = st.clock->NowSeconds();
  const double end = st.options.duration_s;
  for (std::int64_t i = 0; i < st.options.sessions; ++i) st.requests.push({0.0, 0.0, true});
  if (st.arrival) st.next_arrival_s = st.arrival->NextAfter(0.0, st.rng);
  if (st.metrics) st.metrics->admission_limit.Set(static_cast<double>(st.controller->limit()));

  while (true) {
    const double now = st.Now();
    if (now >= end) break;
    const double due = now + kDueSlackSeconds;
    st.EndDueSessions(now);
    st.HandleRequests(now);
    st.controller->OnTick(now, st.System(/*with_reserved=*/false));
    st.RecordLimitChanges();
    if (due >= st.next_sample_s) {
      st.Sample(now);
      if (on_sample) on_sample(st.samples.back());
      while (st.next_sample_s <= due) st.next_sample_s += st.options.sample_interval_s;
    }
    st.Accumulate(now);
    double next = std::min({end, st.next_sample_s, st.next_arrival_s});
    if (!st.ends.empty()) next = std::min(next, st.ends.top().first);
    if (!st.requests.empty()) next = std::min(next, st.requests.top().t_s);
    st.loop.RunOnce(st.t0 + next);
  }
  st.Accumulate(end);

  RunSummary& s = st.summary;
  const LoopStats& ls = st.loop.stats();
  s.frames = ls.frames;
  s.ok_frames = ls.ok;
  s.late_frames = ls.late;
  s.starved_frames = ls.starved;
  s.short_frames = ls.short_frames;
  s.deadline_misses = ls.late;
  s.mute_alarms = ls.mute_alarms;
  s.first_starved_at_s = ls.first_starved_at_s - st.t0;
  s.limit_final = st.controller->limit();
  const double half = end / 2.0;
  s.active_mean_second_half = st.weighted_active / (end - half);
  s.limit_mean_second_half = st.weighted_limit_s > 0.0 ? st.weighted_limit / st.weighted_limit_s
                                                       : std::numeric_limits<double>::quiet_NaN();
  s.active_peak = st.peak_active;
  s.limit_changes = static_cast<std::int64_t>(st.limit_changes.size());
  s.p50_frame_latency_ms = st.latency_ms.Quantile(0.50);
  s.p99_frame_latency_ms = st.latency_ms.Quantile(0.99);
  s.deadline_ms = st.deadline_ms;
  s.duration_s = end;
  s.iterations = ls.iterations;
  s.admission = st.controller->Describe();
  s.kv_policy = PolicyName(st.options.session.policy);
  if (st.events != nullptr) st.events->Flush();
  return s;
}

const std::vector<RunSample>& WorkloadRunner::samples() const { return state_->samples; }
const std::vector<SessionRecord>& WorkloadRunner::sessions() const { return state_->records; }
const std::vector<admission::LimitChange>& WorkloadRunner::limit_changes() const {
  return state_->limit_changes;
}
const admission::AdmissionController& WorkloadRunner::controller() const {
  return *state_->controller;
}
RealtimeLoop& WorkloadRunner::loop() { return state_->loop; }

}  // namespace metronome::realtime
