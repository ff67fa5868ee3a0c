#include "metronome/server/engine_service.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <utility>

#include "metronome/base/errors.h"

namespace metronome::server {

namespace {
realtime::SupervisorOptions ForClients(realtime::SupervisorOptions o) {
  o.enforce_kv_budget = true;
  return o;
}
}  // namespace

EngineService::EngineService(realtime::Backend* backend, Clock* clock,
                             const realtime::SupervisorOptions& options,
                             telemetry::MetricsRegistry* registry, telemetry::EventLog* events)
    : backend_(backend),
      clock_(clock),
      supervisor_(backend, clock, ForClients(options), registry, events),
      max_sessions_(options.max_sessions) {
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
  it->second.frames.Count(r.outcome);
  it->second.last_latency_ms = r.latency_ms;
  if (it->second.sink.on_frame) it->second.sink.on_frame(r);
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
          live_.emplace(r.id, Live{.sink = std::move(sink),
                                   .started_s = supervisor_.Now(),
                                   .period_ms = spec.period_ms,
                                   .deadline_ms = spec.deadline_ms,
                                   .work = r.work,
                                   .frames = {},
                                   .last_latency_ms = 0.0});
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
    const SubmitResult out = live_.contains(id) ? supervisor_.Submit(id, std::move(tokens), arrival)
                                                : SubmitResult::kUnknownSession;
    if (done) done(out);
  });
}

void EngineService::EndSession(RealtimeSessionId id, EndReason reason) {
  // Its sink hears `reason` through OnSessionEnded.
  Post([this, id, reason] {
    if (live_.contains(id)) supervisor_.End(id, supervisor_.Now(), reason);
  });
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
  j["forecast"] = {
      {"t_sat_s", std::isfinite(s.t_sat_s) ? nlohmann::json(s.t_sat_s) : nlohmann::json(nullptr)},
      {"warning", s.forecast_warning}};
  j["frames"] = {{"total", ls.frames},       {"ok", ls.ok},
                 {"late", ls.late},          {"starved", ls.starved},
                 {"short", ls.short_frames}, {"mute_alarms", ls.mute_alarms}};
  const double p50 = supervisor_.LatencyQuantileMs(0.5);
  const double p99 = supervisor_.LatencyQuantileMs(0.99);
  j["latency_ms"] = {{"p50", std::isfinite(p50) ? nlohmann::json(p50) : nlohmann::json(nullptr)},
                     {"p99", std::isfinite(p99) ? nlohmann::json(p99) : nlohmann::json(nullptr)}};
  // Per-session table, oldest first (ids grow with admission).
  std::vector<RealtimeSessionId> ids;
  ids.reserve(live_.size());
  double tightest_deadline_ms = std::numeric_limits<double>::infinity();
  for (const auto& [id, session] : live_) {
    ids.push_back(id);
    tightest_deadline_ms = std::min(tightest_deadline_ms, session.deadline_ms);
  }
  // The line a latency chart compares against: the tightest deadline any live session has.
  j["deadline_ms"] = std::isfinite(tightest_deadline_ms) ? nlohmann::json(tightest_deadline_ms)
                                                         : nlohmann::json(nullptr);
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
  return j;
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
  const ReplicaState now{.draining = draining_,
                         .limit = supervisor_.admission_limit(),
                         .active = admission::WholeUnits(supervisor_.admitted_load()),
                         .sessions = supervisor_.active_sessions(),
                         .max_sessions = max_sessions_};
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
