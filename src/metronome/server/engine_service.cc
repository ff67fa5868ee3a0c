#include "metronome/server/engine_service.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <utility>

#include "metronome/base/errors.h"
#include "metronome/realtime/frame_summary.h"
#include "metronome/realtime/session_state.h"
#include "metronome/server/http_access.h"
#include "metronome/server/resume_token.h"

namespace metronome::server {

namespace {
realtime::SupervisorOptions ForClients(realtime::SupervisorOptions o) {
  o.enforce_kv_budget = true;
  return o;
}

// Results kept for a detached session: frames in flight when the connection dropped (at most its
// max_pending_frames); a bound all the same.
constexpr std::size_t kMaxKeptResults = 16;

admission::Decision Refusal(std::string reason, std::string detail, double retry_after_ms = 0.0) {
  return {.admit = false,
          .reason = std::move(reason),
          .detail = std::move(detail),
          .retry_after_ms = retry_after_ms};
}

// Periods that passed with no frame while the session was away: the frames that fell due.
std::int64_t MissedFrames(double away_ms, double period_ms) {
  if (!(away_ms > 0.0) || !(period_ms > 0.0)) return 0;
  return static_cast<std::int64_t>(std::floor(away_ms / period_ms));
}
}  // namespace

void ContinuityOptions::Validate() const {
  if (!(resume_window_s >= 0.0 && resume_window_s <= 3600.0)) {
    throw ConfigError("resume_window_s = " + FormatValue(resume_window_s) +
                      " must be in [0, 3600]");
  }
  if (!(handoff_wait_s >= 0.0 && handoff_wait_s <= 60.0)) {
    throw ConfigError("handoff_wait_s = " + FormatValue(handoff_wait_s) + " must be in [0, 60]");
  }
  if (max_detached_per_address < 1) {
    throw ConfigError("max_detached_per_address = " + std::to_string(max_detached_per_address) +
                      " must be at least 1");
  }
  if (!advertise_url.empty() && !advertise_url.starts_with("http://")) {
    throw ConfigError("advertise_url = '" + advertise_url +
                      "' must be an http:// URL the other replicas reach this one at");
  }
}

EngineService::EngineService(realtime::Backend* backend, Clock* clock,
                             const realtime::SupervisorOptions& options,
                             telemetry::MetricsRegistry* registry, telemetry::EventLog* events,
                             const ContinuityOptions& continuity)
    : backend_(backend),
      clock_(clock),
      supervisor_(backend, clock, ForClients(options), registry, events),
      max_sessions_(options.max_sessions),
      continuity_(continuity),
      model_identity_(backend->model_identity()) {
  continuity_.Validate();
  supervisor_.set_observer(this);
  // Started and published before the engine thread exists (so this thread may touch its state):
  // the agent and /metrics can be asked before the thread's first turn, and must already see
  // the admission limit.
  supervisor_.Start();
  Publish();
  thread_ = std::thread([this] { Run(); });
}

EngineService::~EngineService() { Shutdown(); }

void EngineService::OnFrame(const realtime::FrameRecord& r) {
  const auto it = live_.find(r.session);
  if (it == live_.end()) return;
  Live& l = it->second;
  l.frames.Count(r.outcome);
  l.last_latency_ms = r.latency_ms;
  if (!l.attached) {
    if (l.kept.size() < kMaxKeptResults) l.kept.push_back(r);
    return;
  }
  if (l.sink.on_frame) l.sink.on_frame(r);
}

void EngineService::OnMuteAlarm(const realtime::MuteAlarm& a) {
  const auto it = live_.find(a.session);
  if (it == live_.end() || !it->second.sink.on_alarm) return;
  it->second.sink.on_alarm(
      "mute", std::to_string(a.consecutive_starved) +
                  " consecutive frames came back with no output: no KV block for the session (" +
                  std::to_string(a.used_blocks) + " of " + std::to_string(a.total_blocks) +
                  " blocks in use) at t=" + FormatValue(a.t_s) + " s");
}

void EngineService::OnSessionEnded(const realtime::SessionEnded& e) {
  const auto it = live_.find(e.session);
  if (it == live_.end()) return;
  SessionSink sink = std::move(it->second.sink);
  live_.erase(it);
  if (sink.on_ended) sink.on_ended(e.reason);
}

bool EngineService::Post(std::function<void()> command) {
  {
    const base::MutexLock lock(&mu_);
    if (!accepting_) return false;  // the engine thread is gone: nobody would run it
    commands_.push_back(std::move(command));
  }
  wake_.notify_one();
  return true;
}

void EngineService::StartSession(realtime::SessionSpec spec, SessionSink sink,
                                 std::function<void(const StartOutcome&)> done) {
  spec.external_frames = true;
  Post([this, spec = std::move(spec), sink = std::move(sink), done = std::move(done)]() mutable {
    StartOutcome out;
    if (draining_) {
      out.decision.reason = "shutdown";
      out.decision.detail = "the server is shutting down";
    } else {
      try {
        const realtime::Supervisor::AdmitResult r = supervisor_.Admit(spec, supervisor_.Now());
        out.admitted = r.decision.admit;
        out.id = r.id;
        out.decision = r.decision;
        out.max_context = r.max_context_tokens;
        if (out.admitted) {
          Live l;
          l.sink = std::move(sink);
          l.started_s = supervisor_.Now();
          l.period_ms = spec.period_ms;
          l.deadline_ms = spec.deadline_ms;
          l.work = r.work;
          l.last_frame_s = l.started_s;
          if (continuity_.enabled()) {
            l.secret = NewResumeSecret();
            out.resume_token = TokenFor(r.id, l.secret);
          }
          live_.emplace(r.id, std::move(l));
        }
      } catch (const ConfigError& e) {
        out.error = e.what();
      }
    }
    if (done) done(out);
  });
}

void EngineService::SubmitFrame(RealtimeSessionId id, std::vector<TokenId> tokens,
                                std::function<void(SubmitResult)> done) {
  // The frame arrives now, on the caller's (network) thread: time it then waits for the engine
  // thread, e.g. behind a long step, is part of its latency and eats into its deadline.
  const Nanos arrival = clock_->Now();
  Post([this, id, arrival, tokens = std::move(tokens), done = std::move(done)]() mutable {
    const auto it = live_.find(id);
    SubmitResult out = SubmitResult::kUnknownSession;
    if (it != live_.end() && it->second.moving) {
      out = SubmitResult::kMoving;
    } else if (it != live_.end()) {
      out = supervisor_.Submit(id, std::move(tokens), arrival);
      if (out == SubmitResult::kOk) it->second.last_frame_s = supervisor_.Now();
    }
    if (done) done(out);
  });
}

void EngineService::EndSession(RealtimeSessionId id, EndReason reason) {
  // Its sink hears `reason` through OnSessionEnded.
  Post([this, id, reason] {
    if (live_.contains(id)) supervisor_.End(id, supervisor_.Now(), reason);
  });
}

std::string EngineService::TokenFor(RealtimeSessionId id, const std::string& secret) const {
  return EncodeResumeToken(Sealed({.origin = continuity_.advertise_url,
                                   .session = id,
                                   .secret = secret,
                                   .model = model_identity_},
                                  continuity_.cluster_secret));
}

void EngineService::DetachSession(RealtimeSessionId id, std::string address) {
  Post([this, id, address = std::move(address)]() mutable {
    const auto it = live_.find(id);
    if (it == live_.end()) return;
    if (!it->second.moving && !continuity_.enabled()) {
      // Ending it erases its entry (OnSessionEnded): `it` is not used after this.
      supervisor_.End(id, supervisor_.Now(), EndReason::kDisconnect);
      return;
    }
    it->second.sink = {};
    it->second.attached = false;
    // A moving session's client reconnects elsewhere with session.moving's token (or lost it).
    if (it->second.moving) return;
    it->second.detached_s = supervisor_.Now();
    it->second.detached_from = address;
    EndOldestDetachedOver(address);  // may end another entry: pass no reference into live_
  });
}

void EngineService::EndOldestDetachedOver(const std::string& address) {
  // O(live sessions), once per dropped connection's session.
  std::int64_t detached = 0;
  RealtimeSessionId oldest = 0;
  double oldest_s = 0.0;
  for (const auto& [id, l] : live_) {
    if (l.attached || l.moving || l.detached_from != address) continue;
    ++detached;
    if (detached == 1 || l.detached_s < oldest_s) {
      oldest = id;
      oldest_s = l.detached_s;
    }
  }
  if (detached > continuity_.max_detached_per_address) {
    supervisor_.End(oldest, supervisor_.Now(), EndReason::kDisconnect);
  }
}

ResumeOutcome EngineService::Resumed(RealtimeSessionId id, SessionSink sink, double away_ms) {
  Live& l = live_.at(id);
  if (l.attached && l.sink.on_taken) l.sink.on_taken();
  ResumeOutcome out;
  out.resumed = true;
  out.id = id;
  out.missed_frames = MissedFrames(away_ms, l.period_ms);
  for (std::int64_t i = 0; i < out.missed_frames; ++i)
    l.frames.Count(telemetry::FrameOutcome::kMissed);
  l.sink = std::move(sink);
  l.attached = true;
  l.last_frame_s = supervisor_.Now();
  l.secret = NewResumeSecret();
  out.resume_token = TokenFor(id, l.secret);
  if (const realtime::SessionSpec* spec = supervisor_.session_spec(id)) out.spec = *spec;
  out.next_frame = supervisor_.next_frame(id);
  return out;
}

void EngineService::ResumeSession(std::string token, SessionSink sink,
                                  std::function<void(const ResumeOutcome&)> done) {
  Post([this, token = std::move(token), sink = std::move(sink), done = std::move(done)]() mutable {
    ResumeOutcome out;
    const std::optional<ResumeToken> t = ParseResumeToken(token);
    if (!continuity_.enabled()) {
      out.decision = Refusal("resume_unknown", "this server keeps no session after its connection");
    } else if (!t) {
      out.decision = Refusal("resume_token", "resume_token is not a token this server issues");
    } else if (t->model != model_identity_) {
      out.decision = Refusal("resume_model", "the token is for model " + t->model +
                                                 ", this replica serves " + model_identity_);
    } else if (const auto it = live_.find(t->session);
               it != live_.end() && !it->second.moving &&
               ConstantTimeEquals(it->second.secret, t->secret)) {
      const double away_ms = (supervisor_.Now() - it->second.last_frame_s) * 1e3;
      std::deque<realtime::FrameRecord> kept = std::move(it->second.kept);
      it->second.kept.clear();
      out = Resumed(t->session, std::move(sink), away_ms);
      supervisor_.ReportContinuity(realtime::Supervisor::Continuity::kResumed, t->session,
                                   out.missed_frames);
      if (done) done(out);
      Live& l = live_.at(t->session);
      for (const realtime::FrameRecord& r : kept) {
        if (l.sink.on_frame) l.sink.on_frame(r);
      }
      return;
    } else if (moved_.contains(t->secret) || (it != live_.end() && it->second.moving &&
                                              ConstantTimeEquals(it->second.secret, t->secret))) {
      out.decision = Refusal("shutdown",
                             "the session is moving off this draining replica: resume it through "
                             "the balancer",
                             100.0);
    } else {
      out.decision =
          Refusal("resume_unknown",
                  "no session holds this token here: it was used, it expired (the "
                  "resume window is " +
                      FormatValue(continuity_.resume_window_s) + " s), or it was never issued");
    }
    if (done) done(out);
  });
}

void EngineService::ImportMoved(std::vector<std::byte> state, double away_ms, SessionSink sink,
                                std::function<void(const ResumeOutcome&)> done) {
  Post([this, state = std::move(state), away_ms, sink = std::move(sink),
        done = std::move(done)]() mutable {
    ResumeOutcome out;
    auto decoded = realtime::DecodeSessionState(state, model_identity_);
    if (draining_) {
      out.decision = Refusal("shutdown", "the server is shutting down");
    } else if (auto* error = std::get_if<realtime::SessionStateError>(&decoded)) {
      out.decision =
          Refusal(error->kind == realtime::SessionStateError::Kind::kForeignModel ? "resume_model"
                                                                                  : "resume_state",
                  error->message);
    } else {
      const realtime::SessionState& moved = std::get<realtime::SessionState>(decoded);
      try {
        const realtime::Supervisor::AdmitResult r =
            supervisor_.AdmitMoved(moved, supervisor_.Now());
        out.decision = r.decision;
        if (r.decision.admit) {
          Live l;
          l.started_s = supervisor_.Now();
          l.period_ms = moved.spec.period_ms;
          l.deadline_ms = moved.spec.deadline_ms;
          l.work = r.work;
          l.frames = moved.frames;
          l.attached = false;
          live_.emplace(r.id, std::move(l));
          out = Resumed(r.id, std::move(sink), away_ms);
          out.decision = r.decision;
          supervisor_.ReportContinuity(realtime::Supervisor::Continuity::kMovedIn, r.id,
                                       out.missed_frames, static_cast<std::int64_t>(state.size()));
        }
      } catch (const ConfigError& e) {
        out.decision = Refusal("resume_state", std::string("session state: ") + e.what());
      }
    }
    if (done) done(out);
  });
}

void EngineService::FetchMoved(std::string token, std::function<void(MovedState)> done) {
  Post([this, token = std::move(token), done = std::move(done)] {
    MovedState out;
    const std::optional<ResumeToken> t = ParseResumeToken(token);
    if (t) {
      const auto it = moved_.find(t->secret);
      if (it != moved_.end() && it->second.id == t->session) {
        out.found = true;
        out.state = it->second.state;
        out.away_ms = (supervisor_.Now() - it->second.last_frame_s) * 1e3;
      }
    }
    if (done) done(std::move(out));
  });
}

void EngineService::ReleaseMoved(std::string token) {
  Post([this, token = std::move(token)] {
    const std::optional<ResumeToken> t = ParseResumeToken(token);
    if (!t) return;
    const auto it = moved_.find(t->secret);
    if (it != moved_.end() && it->second.id == t->session) moved_.erase(it);
    Publish();
  });
}

void EngineService::BeginHandoff() {
  Post([this] {
    draining_ = true;
    if (continuity_.can_move()) {
      handing_off_ = true;
      for (auto& [id, l] : live_) l.moving = true;
    }
    Publish();
  });
}

void EngineService::MoveOut(RealtimeSessionId id) {
  Live& l = live_.at(id);
  realtime::SessionState state;
  if (!supervisor_.ExportSession(id, &state)) return;  // frames in flight: next turn
  state.frames = l.frames;
  Moved moved{.id = id,
              .state = realtime::EncodeSessionState(state, model_identity_),
              .moved_s = supervisor_.Now(),
              .last_frame_s = l.last_frame_s};
  const std::string token = TokenFor(id, l.secret);
  SessionSink sink = std::move(l.sink);
  const bool attached = l.attached;
  const auto state_bytes = static_cast<std::int64_t>(moved.state.size());
  moved_.emplace(l.secret, std::move(moved));
  live_.erase(id);  // the end below reaches no sink: the client hears session.moving
  supervisor_.End(id, supervisor_.Now(), EndReason::kMoved);
  supervisor_.ReportContinuity(realtime::Supervisor::Continuity::kMovedOut, id, 0, state_bytes);
  if (attached && sink.on_moving) sink.on_moving(token, state.next_frame);
}

void EngineService::ContinuityTurn() {
  if (!continuity_.enabled()) return;
  const double now = supervisor_.Now();
  std::vector<RealtimeSessionId> expired;
  std::vector<RealtimeSessionId> movable;
  for (const auto& [id, l] : live_) {
    if (l.moving && !supervisor_.HasFrames(id)) {
      movable.push_back(id);
    } else if (!l.attached && !l.moving && now - l.detached_s > continuity_.resume_window_s) {
      expired.push_back(id);
    }
  }
  for (const RealtimeSessionId id : movable) MoveOut(id);
  for (const RealtimeSessionId id : expired) supervisor_.End(id, now, EndReason::kDisconnect);
  for (auto it = moved_.begin(); it != moved_.end();) {
    if (now - it->second.moved_s > continuity_.resume_window_s) {
      supervisor_.ReportContinuity(realtime::Supervisor::Continuity::kMoveLost, it->second.id);
      it = moved_.erase(it);
    } else {
      ++it;
    }
  }
}

void EngineService::StatsAsync(std::size_t max_listed, std::function<void(nlohmann::json)> done) {
  auto shared = std::make_shared<std::function<void(nlohmann::json)>>(std::move(done));
  if (!Post([this, max_listed, shared] { (*shared)(Snapshot(max_listed)); })) {
    (*shared)(nlohmann::json{{"stopped", true}});
  }
}

ServiceFootprint EngineService::Footprint() {
  auto promise = std::make_shared<std::promise<ServiceFootprint>>();
  std::future<ServiceFootprint> result = promise->get_future();
  const bool posted = Post([this, promise] {
    const kv::PoolStats pool = backend_->pool();
    std::int64_t queued = 0;
    {
      const base::MutexLock lock(&mu_);
      queued = static_cast<std::int64_t>(commands_.size());
    }
    promise->set_value({.live = static_cast<std::int64_t>(live_.size()),
                        .tracked = supervisor_.tracked_sessions(),
                        .loop = supervisor_.loop_footprint(),
                        .backend_sessions = pool.num_sessions,
                        .used_blocks = pool.used_blocks,
                        .queued_commands = queued});
  });
  if (!posted) return {};
  return result.get();
}

nlohmann::json EngineService::Stats(std::size_t max_listed) {
  auto promise = std::make_shared<std::promise<nlohmann::json>>();
  std::future<nlohmann::json> result = promise->get_future();
  StatsAsync(max_listed, [promise](nlohmann::json j) { promise->set_value(std::move(j)); });
  return result.get();
}

nlohmann::json EngineService::Snapshot(std::size_t max_listed) const {
  const realtime::SupervisorSample& s = supervisor_.last_sample();
  const realtime::LoopStats& ls = supervisor_.stats();
  const kv::PoolStats pool = backend_->pool();
  const std::int64_t limit = supervisor_.controller().limit();
  nlohmann::json j;
  j["t_s"] = supervisor_.Now();
  j["sessions"] = {{"active", supervisor_.active_sessions()},
                   {"admitted", supervisor_.admitted()},
                   {"rejected", supervisor_.rejected()},
                   {"ended_by_error", supervisor_.ended_by_error()}};
  j["draining"] = draining_;
  j["admission"] = {
      {"controller", supervisor_.controller().Describe()},
      {"limit", limit == admission::kNoLimit ? nlohmann::json(nullptr) : nlohmann::json(limit)},
      {"limit_changes", supervisor_.limit_changes().size()},
      // The budget's units: sessions of the reference shape (SessionRequest::work).
      {"work_used", supervisor_.active_work()},
      {"priced", supervisor_.priced()}};
  j["kv"] = {{"used_blocks", pool.used_blocks},
             {"free_blocks", pool.free_blocks},
             {"total_blocks", pool.num_blocks},
             {"blocks_freed_by_window", pool.blocks_freed_by_window},
             {"peak_fraction", supervisor_.kv_peak_fraction()}};
  j["forecast"] = {{"t_sat_s", realtime::NullIfNan(s.t_sat_s)}, {"warning", s.forecast_warning}};
  j["frames"] = {{"total", ls.frames},
                 {"ok", ls.ok},
                 {"late", ls.late},
                 {"starved", ls.starved},
                 {"short", ls.short_frames},
                 {"missed", supervisor_.missed_frames()},
                 {"mute_alarms", ls.mute_alarms}};
  j["continuity"] = ContinuitySnapshot();
  j["latency_ms"] = {{"p50", realtime::NullIfNan(supervisor_.LatencyQuantileMs(0.5))},
                     {"p99", realtime::NullIfNan(supervisor_.LatencyQuantileMs(0.99))}};
  AddSessionTable(max_listed, j);
  return j;
}

nlohmann::json EngineService::ContinuitySnapshot() const {
  std::int64_t detached = 0;
  std::int64_t moving = 0;
  for (const auto& [id, l] : live_) {
    detached += l.attached ? 0 : 1;
    moving += l.moving ? 1 : 0;
  }
  const realtime::Supervisor::ContinuityCounts& counts = supervisor_.continuity_counts();
  return {{"resume_window_s", continuity_.resume_window_s},
          {"advertise_url", continuity_.advertise_url},
          {"model", model_identity_},
          {"detached", detached},
          {"moving", moving},
          {"moved_waiting", moved_.size()},
          {"resumed", counts.resumed},
          {"moved_out", counts.moved_out},
          {"moved_in", counts.moved_in},
          {"moved_lost", counts.moved_lost},
          {"state_bytes_out", counts.state_bytes_out},
          {"state_bytes_in", counts.state_bytes_in}};
}

void EngineService::AddSessionTable(std::size_t max_listed, nlohmann::json& j) const {
  // Oldest first (ids grow with admission).
  std::vector<RealtimeSessionId> ids;
  ids.reserve(live_.size());
  double tightest_deadline_ms = std::numeric_limits<double>::infinity();
  for (const auto& [id, session] : live_) {
    ids.push_back(id);
    tightest_deadline_ms = std::min(tightest_deadline_ms, session.deadline_ms);
  }
  // The line a latency chart compares against: the tightest deadline any live session has.
  j["deadline_ms"] = realtime::NullIfNan(tightest_deadline_ms);
  std::sort(ids.begin(), ids.end());
  nlohmann::json list = nlohmann::json::array();
  for (std::size_t i = 0; i < ids.size() && i < max_listed; ++i) {
    const Live& l = live_.at(ids[i]);
    nlohmann::json row;
    row["id"] = ids[i];
    row["age_s"] = supervisor_.Now() - l.started_s;
    row["resident_blocks"] = supervisor_.resident_blocks(ids[i]);
    row["period_ms"] = l.period_ms;
    row["deadline_ms"] = l.deadline_ms;
    row["work"] = l.work;
    for (int o = 0; o < telemetry::kNumFrameOutcomes; ++o) {
      const auto outcome = static_cast<telemetry::FrameOutcome>(o);
      row[std::string(telemetry::ToString(outcome))] = l.frames.of(outcome);
    }
    row["last_latency_ms"] = l.last_latency_ms;
    list.push_back(std::move(row));
  }
  j["sessions"]["list"] = std::move(list);
  j["sessions"]["listed"] = std::min(ids.size(), max_listed);
}

void EngineService::EndAll(EndReason reason) {
  // Each end reaches its sink through OnSessionEnded, which drops the session from live_.
  std::vector<RealtimeSessionId> ids;
  ids.reserve(live_.size());
  for (const auto& [id, session] : live_) ids.push_back(id);
  for (const RealtimeSessionId id : ids) supervisor_.End(id, supervisor_.Now(), reason);
}

void EngineService::BeginDrain() {
  Post([this] {
    draining_ = true;
    Publish();
  });
}

ReplicaState EngineService::replica_state() const {
  const base::MutexLock lock(&state_mu_);
  return replica_state_;
}

void EngineService::Publish() {
  std::int64_t moving = static_cast<std::int64_t>(moved_.size());
  for (const auto& [id, l] : live_) moving += l.moving ? 1 : 0;
  const ReplicaState now{.draining = draining_,
                         .limit = supervisor_.admission_limit(),
                         .active = admission::WholeUnits(supervisor_.admitted_load()),
                         .sessions = supervisor_.active_sessions(),
                         .max_sessions = max_sessions_,
                         .moving = moving};
  const base::MutexLock lock(&state_mu_);
  replica_state_ = now;
}

void EngineService::Shutdown() {
  {
    const base::MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void EngineService::Run() {
  std::deque<std::function<void()>> batch;
  while (true) {
    bool stop = false;
    {
      const base::MutexLock lock(&mu_);
      batch.swap(commands_);
      stop = stopping_;
    }
    for (auto& command : batch) command();
    batch.clear();
    if (stop) break;
    ContinuityTurn();
    supervisor_.Tick(supervisor_.Now());
    Publish();
    if (supervisor_.RunIteration()) continue;
    // Idle: sleep until the next frame deadline or sample, or until a command arrives.
    const double next_s = std::min(supervisor_.NextEventSeconds(), supervisor_.next_sample_s());
    const double wait_s = std::clamp(next_s - supervisor_.Now(), 0.0, 1.0);
    base::MutexLock lock(&mu_);
    wake_.wait_for(lock, std::chrono::duration<double>(wait_s),
                   [this]() REQUIRES(mu_) { return stopping_ || !commands_.empty(); });
  }
  // Commands that raced with the shutdown still get answers; then every session ends.
  draining_ = true;
  {
    const base::MutexLock lock(&mu_);
    batch.swap(commands_);
    accepting_ = false;
  }
  for (auto& command : batch) command();
  EndAll(EndReason::kServerShutdown);
  Publish();
}

}  // namespace metronome::server
