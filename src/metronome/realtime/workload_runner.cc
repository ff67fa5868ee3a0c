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
#include "metronome/realtime/supervisor.h"
#include "metronome/realtime/workload.h"
#include "metronome/telemetry/quantile_sketch.h"

namespace metronome::realtime {
namespace {

// Events are scheduled in double seconds but the clock ticks in integer ns: an event within 1 ns
// of now is due, or a time whose ns rounding falls just short of it would never come.
constexpr double kDueSlackSeconds = 1e-9;

// A client's request for a session, due at t_s (run seconds).
struct Request {
  double t_s = 0.0;
  double first_t_s = 0.0;
  bool population = false;    // population clients never give up
  std::int64_t refusals = 0;  // in a row, for the retry backoff
  std::size_t cls = 0;        // its class (WorkloadOptions::classes), 0 without a mix
  bool operator>(const Request& o) const { return t_s > o.t_s; }
};

}  // namespace

void WorkloadOptions::Validate() const {
  session.Validate();
  for (const WorkloadClass& c : classes) {
    c.session.Validate();
    if (!(c.share > 0.0 && std::isfinite(c.share))) {
      throw ConfigError("mix: class '" + c.name + "' share = " + FormatValue(c.share) +
                        " must be > 0");
    }
  }
  population.Validate();
  supervisor.Validate();
  if (!(forecast_settle_s >= 0.0 && std::isfinite(forecast_settle_s))) {
    throw ConfigError("forecast_settle_s = " + FormatValue(forecast_settle_s) + " must be >= 0");
  }
}

nlohmann::json ClassSummary::ToJson() const {
  nlohmann::json j = {{"name", name},
                      {"arrivals", arrivals},
                      {"admitted", admitted},
                      {"rejected", rejected},
                      {"admitted_work", admitted_work},
                      {"active_work_mean_second_half", active_work_mean_second_half},
                      {"prompt_work_mean_second_half", prompt_work_mean_second_half},
                      {"deadline_misses", late},
                      {"p99_frame_latency_ms", NullIfNan(p99_frame_latency_ms)},
                      {"deadline_ms", deadline_ms},
                      {"own_prompt_frames", own_prompt_frames},
                      {"own_prompt_late_frames", own_prompt_late_frames},
                      {"p99_after_own_prompt_ms", NullIfNan(p99_after_own_prompt_ms)}};
  AddOutcomesTo(j);
  return j;
}

nlohmann::json RunSummary::ToJson() const {
  nlohmann::json j = FrameSummary::ToJson();
  j["t_sat_predicted_s"] = NullIfNan(t_sat_predicted_s);
  j["t_sat_forecast_at_s"] = NullIfNan(t_sat_forecast_at_s);
  j["kv_peak_fraction"] = kv_peak_fraction;
  j["limit_final"] =
      limit_final == admission::kNoLimit ? nlohmann::json(nullptr) : nlohmann::json(limit_final);
  j["limit_mean_second_half"] = NullIfNan(limit_mean_second_half);
  j["active_mean_second_half"] = active_mean_second_half;
  j["limit_changes"] = limit_changes;
  j["iterations"] = iterations;
  j["admission"] = admission;
  if (!classes.empty()) {
    nlohmann::json c = nlohmann::json::array();
    for (const ClassSummary& x : classes) c.push_back(x.ToJson());
    j["classes"] = std::move(c);
  }
  return j;
}

// The supervisor's observer: the run's per-session records and per-sample frame statistics.
struct WorkloadRunner::State final : SessionObserver {
  State(WorkloadRunner& owner_, Backend* b, Clock* c, const WorkloadOptions& o,
        telemetry::MetricsRegistry* registry, telemetry::EventLog* e)
      : owner(owner_),
        options(o),
        supervisor(b, c, o.supervisor, registry, e),
        events(e),
        rng(o.population.seed) {
    supervisor.set_observer(this);
    if (!o.population.arrival.empty()) arrival = ArrivalProcess::Parse(o.population.arrival);
    if (!o.population.session_duration.empty()) {
      duration = SessionDuration::Parse(o.population.session_duration);
    }
    std::vector<double> shares;
    for (const WorkloadClass& k : o.classes) {
      shares.push_back(k.share);
      ClassSummary cs;
      cs.name = k.name;
      cs.deadline_ms = k.session.deadline_ms;
      summary.classes.push_back(std::move(cs));
    }
    class_of_draw = std::discrete_distribution<std::size_t>(shares.begin(), shares.end());
    class_latency_ms.resize(o.classes.size());
    class_latency_after_prompt_ms.resize(o.classes.size());
    class_active_work.assign(o.classes.size(), 0.0);
    class_weighted_work.assign(o.classes.size(), 0.0);
    class_prompt_work_unit_s.assign(o.classes.size(), 0.0);
  }
  // A new client's class: drawn by share in a mix (0 without one; no draw, so a run without a mix
  // keeps its random stream).
  std::size_t DrawClass() { return options.classes.empty() ? 0 : class_of_draw(rng); }

  void OnFrame(const FrameRecord& r) override;
  void OnMuteAlarm(const MuteAlarm& /*alarm*/) override {}
  void OnSessionEnded(const SessionEnded& e) override;
  void Admitted(RealtimeSessionId id, double now);
  void HandleRequests(double now);
  void EndDueSessions(double now);
  void RecordSample();
  void Accumulate(double now);

  WorkloadRunner& owner;  // its on_frame tap
  WorkloadOptions options;
  Supervisor supervisor;
  telemetry::EventLog* events;
  std::mt19937_64 rng;
  std::optional<ArrivalProcess> arrival;
  std::optional<SessionDuration> duration;

  std::priority_queue<Request, std::vector<Request>, std::greater<>> requests;
  double next_arrival_s = std::numeric_limits<double>::infinity();
  // Scheduled ends: (run seconds, session id), earliest first.
  std::priority_queue<std::pair<double, RealtimeSessionId>,
                      std::vector<std::pair<double, RealtimeSessionId>>, std::greater<>>
      ends;
  std::unordered_map<RealtimeSessionId, std::size_t> record_of;  // index into records
  std::vector<SessionRecord> records;
  std::vector<RunSample> samples;
  RunSummary summary;
  telemetry::QuantileSketch interval_latency_ms;  // frames since the last sample
  std::int64_t interval_tokens = 0;
  // A mix: the class of each admitted session and its price, per class the frames' latencies,
  // the active work and its integral over the second half.
  std::discrete_distribution<std::size_t> class_of_draw;
  struct Member {
    std::size_t cls = 0;
    double work = 0.0;  // its price, units
  };
  std::unordered_map<RealtimeSessionId, Member> class_of_session;
  std::vector<telemetry::QuantileSketch> class_latency_ms;
  std::vector<telemetry::QuantileSketch> class_latency_after_prompt_ms;
  std::vector<double> class_active_work;
  std::vector<double> class_weighted_work;
  std::vector<double> class_prompt_work_unit_s;  // admitted in the second half

  double last_turn_s = 0.0;
  double weighted_active = 0.0;  // integral of active over the second half, session-seconds
  double weighted_limit = 0.0;
  double weighted_limit_s = 0.0;  // time covered by a finite limit
  double forecast_due_s = std::numeric_limits<double>::infinity();
  std::int64_t peak_active = 0;
};

void WorkloadRunner::State::OnFrame(const FrameRecord& r) {
  const auto it = record_of.find(r.session);
  if (it != record_of.end()) ++records[it->second].frames;
  interval_latency_ms.Add(r.latency_ms);
  interval_tokens += static_cast<std::int64_t>(r.tokens.size());
  if (const auto c = class_of_session.find(r.session); c != class_of_session.end()) {
    const Member& m = c->second;
    ClassSummary& cs = summary.classes[m.cls];
    cs.Count(r.outcome);
    class_latency_ms[m.cls].Add(r.latency_ms);
    if (r.behind_own_prompt) {
      ++cs.own_prompt_frames;
      if (r.outcome == FrameOutcome::kLate) ++cs.own_prompt_late_frames;
    } else {
      class_latency_after_prompt_ms[m.cls].Add(r.latency_ms);
    }
  }
  if (owner.on_frame) owner.on_frame(r);
}

void WorkloadRunner::State::OnSessionEnded(const SessionEnded& e) {
  const auto it = record_of.find(e.session);
  if (it == record_of.end()) return;
  records[it->second].ended_s = e.t_s;
  records[it->second].ended_by_error = e.by_loop();
  if (const auto c = class_of_session.find(e.session); c != class_of_session.end()) {
    class_active_work[c->second.cls] -= c->second.work;
  }
}

void WorkloadRunner::State::Admitted(RealtimeSessionId id, double now) {
  SessionRecord rec;
  rec.id = id;
  rec.admitted_s = now;
  if (duration) {
    rec.scheduled_end_s = now + duration->Sample(rng);
    ends.emplace(rec.scheduled_end_s, id);
  }
  record_of.emplace(id, records.size());
  records.push_back(rec);
}

void WorkloadRunner::State::HandleRequests(double now) {
  while (arrival && next_arrival_s <= now + kDueSlackSeconds) {
    requests.push({.t_s = next_arrival_s,
                   .first_t_s = next_arrival_s,
                   .population = false,
                   .cls = DrawClass()});
    next_arrival_s = arrival->NextAfter(next_arrival_s, rng);
  }
  while (!requests.empty() && requests.top().t_s <= now + kDueSlackSeconds) {
    Request req = requests.top();
    requests.pop();
    if (req.refusals == 0) ++summary.arrivals;  // its first ask
    ClassSummary* cs = options.classes.empty() ? nullptr : &summary.classes[req.cls];
    if (cs != nullptr && req.refusals == 0) ++cs->arrivals;
    SessionSpec spec = options.classes.empty() ? options.session : options.classes[req.cls].session;
    if (req.population && !options.population.aligned_phases) {
      spec.phase_ms = std::uniform_real_distribution<double>(0.0, spec.period_ms)(rng);
      if (spec.phase_ms >= spec.period_ms) spec.phase_ms = 0.0;
    }
    const Supervisor::AdmitResult r = supervisor.Admit(spec, now);
    if (r.decision.admit) {
      Admitted(r.id, now);
      if (cs != nullptr) {
        ++cs->admitted;
        cs->admitted_work += r.work;
        class_active_work[req.cls] += r.work;
        class_of_session.emplace(r.id, Member{.cls = req.cls, .work = r.work});
        if (now >= options.population.duration_s / 2.0) {
          class_prompt_work_unit_s[req.cls] += r.prompt_work_unit_s;
        }
      }
      // The forecast reported is the one made forecast_settle_s after the latest new peak.
      if (supervisor.peak_active() > peak_active) {
        peak_active = supervisor.peak_active();
        forecast_due_s = now + options.forecast_settle_s;
      }
      continue;
    }
    if (cs != nullptr) ++cs->rejected;
    // Exponential backoff from the hint, as loadgen's clients do.
    const double retry_s =
        std::max(admission::RetryBackoffMs(r.decision.retry_after_ms, ++req.refusals,
                                           admission::kRetryBackoffCapMs),
                 spec.period_ms) /
        1e3;
    req.t_s = now + retry_s;
    if (req.population || req.t_s - req.first_t_s <= options.population.patience_s) {
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
    // A session the loop already ended is not ended again (Supervisor::End ignores it).
    supervisor.End(id, now, EndReason::kDuration);
  }
}

void WorkloadRunner::State::RecordSample() {
  const SupervisorSample& p = supervisor.last_sample();
  if (p.t_s >= forecast_due_s) {
    summary.t_sat_forecast_at_s = p.t_s;
    summary.t_sat_predicted_s =
        std::isfinite(p.t_sat_s) ? p.t_s + p.t_sat_s : std::numeric_limits<double>::quiet_NaN();
    forecast_due_s = std::numeric_limits<double>::infinity();
  }
  RunSample s;
  static_cast<SupervisorSample&>(s) = p;
  static_cast<FrameCounts&>(s) = static_cast<const FrameCounts&>(supervisor.stats());
  s.admitted = supervisor.admitted();
  s.rejected = supervisor.rejected();
  s.interval_frames = interval_latency_ms.count();
  if (s.interval_frames > 0) {
    s.interval_p50_latency_ms = interval_latency_ms.Quantile(0.5);
    s.interval_p99_latency_ms = interval_latency_ms.Quantile(0.99);
    s.interval_tokens_per_frame =
        static_cast<double>(interval_tokens) / static_cast<double>(s.interval_frames);
  }
  interval_latency_ms.Clear();
  interval_tokens = 0;
  samples.push_back(s);
}

void WorkloadRunner::State::Accumulate(double now) {
  // Time-weighted means over the second half of the run: each turn's state holds since the last.
  const double half = options.population.duration_s / 2.0;
  const double from = std::max(last_turn_s, half);
  if (now > from) {
    const double dt = now - from;
    weighted_active += static_cast<double>(supervisor.active_sessions()) * dt;
    const std::int64_t limit = supervisor.controller().limit();
    if (limit != admission::kNoLimit) {
      weighted_limit += static_cast<double>(limit) * dt;
      weighted_limit_s += dt;
    }
    for (std::size_t c = 0; c < class_active_work.size(); ++c) {
      class_weighted_work[c] += class_active_work[c] * dt;
    }
  }
  last_turn_s = now;
}

WorkloadRunner::WorkloadRunner(Backend* backend, Clock* clock, const WorkloadOptions& options,
                               telemetry::MetricsRegistry* registry, telemetry::EventLog* events) {
  options.Validate();
  state_ = std::make_unique<State>(*this, backend, clock, options, registry, events);
}

WorkloadRunner::~WorkloadRunner() = default;

RunSummary WorkloadRunner::Run() {
  State& st = *state_;
  Supervisor& sup = st.supervisor;
  sup.Start();
  const double end = st.options.population.duration_s;
  for (std::int64_t i = 0; i < st.options.population.sessions; ++i)
    st.requests.push({.t_s = 0.0, .first_t_s = 0.0, .population = true, .cls = st.DrawClass()});
  if (st.arrival) st.next_arrival_s = st.arrival->NextAfter(0.0, st.rng);

  while (true) {
    const double now = sup.Now();
    if (now >= end) break;
    st.EndDueSessions(now);
    st.HandleRequests(now);
    if (sup.Tick(now)) {
      st.RecordSample();
      if (on_sample) on_sample(st.samples.back());
    }
    st.Accumulate(now);
    double next = std::min({end, sup.next_sample_s(), st.next_arrival_s});
    if (!st.ends.empty()) next = std::min(next, st.ends.top().first);
    if (!st.requests.empty()) next = std::min(next, st.requests.top().t_s);
    sup.RunOnce(next);
  }
  st.Accumulate(end);

  RunSummary& s = st.summary;
  const LoopStats& ls = sup.stats();
  static_cast<FrameCounts&>(s) = static_cast<const FrameCounts&>(ls);
  s.first_starved_at_s = ls.first_starved_at_s;
  s.kv_peak_fraction = sup.kv_peak_fraction();
  s.admitted = sup.admitted();
  s.rejected = sup.rejected();
  s.ended_by_error = sup.ended_by_error();
  s.limit_final = sup.controller().limit();
  const double half = end / 2.0;
  s.active_mean_second_half = st.weighted_active / (end - half);
  s.limit_mean_second_half = st.weighted_limit_s > 0.0 ? st.weighted_limit / st.weighted_limit_s
                                                       : std::numeric_limits<double>::quiet_NaN();
  s.active_peak = sup.peak_active();
  s.limit_changes = static_cast<std::int64_t>(sup.limit_changes().size());
  s.p50_frame_latency_ms = sup.LatencyQuantileMs(0.50);
  s.p99_frame_latency_ms = sup.LatencyQuantileMs(0.99);
  s.deadline_ms = st.options.session.deadline_ms;
  s.duration_s = end;
  s.iterations = ls.iterations;
  s.admission = sup.controller().Describe();
  s.kv_policy = st.options.session.policy.ToString();
  for (std::size_t c = 0; c < s.classes.size(); ++c) {
    s.classes[c].active_work_mean_second_half = st.class_weighted_work[c] / (end - half);
    s.classes[c].prompt_work_mean_second_half = st.class_prompt_work_unit_s[c] / (end - half);
    if (st.class_latency_ms[c].count() > 0) {
      s.classes[c].p99_frame_latency_ms = st.class_latency_ms[c].Quantile(0.99);
    }
    if (st.class_latency_after_prompt_ms[c].count() > 0) {
      s.classes[c].p99_after_own_prompt_ms = st.class_latency_after_prompt_ms[c].Quantile(0.99);
    }
  }
  if (st.events != nullptr) st.events->Flush();
  return s;
}

const std::vector<RunSample>& WorkloadRunner::samples() const { return state_->samples; }
const std::vector<SessionRecord>& WorkloadRunner::sessions() const { return state_->records; }
const std::vector<admission::LimitChange>& WorkloadRunner::limit_changes() const {
  return state_->supervisor.limit_changes();
}
const admission::AdmissionController& WorkloadRunner::controller() const {
  return state_->supervisor.controller();
}
std::int64_t WorkloadRunner::active_sessions() const {
  return state_->supervisor.active_sessions();
}

}  // namespace metronome::realtime
