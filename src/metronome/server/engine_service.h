// The engine behind the network server: one engine thread owns the Supervisor (real-time loop,
// admission, telemetry, forecast) and the backend; network threads talk to it only through this
// class. Calls from any thread post a command to the engine thread and return at once; results come
// back through callbacks that run ON THE ENGINE THREAD, so they must be quick and must not call
// back into the service synchronously (post to the caller's own executor instead).
//
// The engine thread runs an iteration whenever a session has work, and otherwise waits on a
// condition variable until the next frame deadline, the next telemetry sample or a new command —
// a frame submitted by a client wakes it at once.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "metronome/base/clock.h"
#include "metronome/base/thread_annotations.h"
#include "metronome/realtime/backend.h"
#include "metronome/realtime/supervisor.h"
#include "metronome/server/agent_check.h"
#include "metronome/telemetry/event_log.h"
#include "metronome/telemetry/metrics.h"

namespace metronome::server {

using realtime::RealtimeSessionId;

using realtime::EndReason;  // why a session ended: one enum from the loop to the wire
// What became of a submitted frame: the loop's refusal enum, mapped to the wire's ErrorCode in
// one place (the server's connection). kNotExternal never comes back (every session is external).
using SubmitResult = realtime::RealtimeLoop::SubmitResult;

// What a session's owner (a connection) hears, on the engine thread. The sink must stay valid
// until on_ended has run (at the latest during Shutdown).
struct SessionSink {
  std::function<void(const realtime::FrameRecord&)> on_frame;  // every frame, in order
  std::function<void(EndReason)> on_ended;                     // once, last
  // kind e.g. "mute"; detail: what happened, with the numbers behind it.
  std::function<void(std::string_view kind, std::string_view detail)> on_alarm;
  // The session went to another connection (session.resume there): forget it without ending it.
  // Last, instead of on_ended.
  std::function<void()> on_taken;
  // The session's state was exported for another replica (a drain's handoff): tell the client
  // (session.moving) and forget the session. Last, instead of on_ended.
  std::function<void(const std::string& resume_token, std::int64_t next_frame)> on_moving;
};

// Continuity (docs/protocol.md, "Resuming a session"): sessions outlive their connection for a
// while, and a drain hands them to other replicas instead of ending them.
struct ContinuityOptions {
  // How long a session whose connection dropped waits for session.resume before it ends
  // (reason disconnect), and how long a drained replica keeps a moved session's state for another
  // replica to fetch, s; 0: sessions end with their connection and a drain ends them (no tokens).
  double resume_window_s = 15.0;
  // This replica's address as the other replicas reach it (http://host:port), written into
  // tokens; empty: a token resumes only here, and a drain cannot hand sessions on.
  std::string advertise_url;
  // The secret the replicas of one cluster share to move sessions: it seals the tokens this
  // replica issues (resume_token.h), the server answers GET/DELETE /v1/session-state only with it
  // and fetches from other replicas with it (state_fetch.h). Empty: no state leaves or enters by
  // fetch (a token of another replica is refused).
  std::string cluster_secret{};
  // The most sessions one client address may leave detached at once: a client that starts
  // sessions and drops their connections cannot hold the admission budget and the pool beyond
  // what it could hold connected; past it, its oldest detached session ends (reason disconnect).
  int max_detached_per_address = 16;
  // On a drain that hands sessions on: how long to keep serving them while waiting for a balancer
  // to hear the drain (HttpServer::drain_announcements: HAProxy's agent, a readiness probe), so
  // their clients' new connections go elsewhere, s. Past it they move anyway. In [0, 60].
  double handoff_wait_s = 3.0;
  void Validate() const;  // ConfigError naming the field and value
  [[nodiscard]] bool enabled() const { return resume_window_s > 0.0; }
  // A drain hands sessions on only when other replicas can find this one and fetch from it.
  [[nodiscard]] bool can_move() const {
    return enabled() && !advertise_url.empty() && !cluster_secret.empty();
  }
};

// What became of a session.resume (or a moved session's import).
struct ResumeOutcome {
  bool resumed = false;
  RealtimeSessionId id = 0;
  std::int64_t next_frame = 0;
  std::int64_t missed_frames = 0;
  std::string resume_token;      // the next one
  realtime::SessionSpec spec;    // what the session runs with (period, deadline, tokens)
  admission::Decision decision;  // refused: reason, detail, retry_after_ms
};

// The origin's answer to a fetch of a moved session's state.
struct MovedState {
  bool found = false;
  std::vector<std::byte> state;  // realtime/session_state.h's bytes
  double away_ms = 0.0;          // since the session's last frame (for the missed-frame count)
};

struct StartOutcome {
  bool admitted = false;
  RealtimeSessionId id = 0;
  admission::Decision decision;  // reason, detail, retry_after_ms when rejected
  std::string error;             // non-empty: the spec was invalid (ConfigError text)
  // Tokens the session may append before it ends with kContextFull (full KV: its KV budget or the
  // model's context limit); 0: no limit.
  TokenPos max_context = 0;
  std::string resume_token;  // session.resume's token; empty without continuity
};

// The service's bookkeeping (tests: every ended session's state is freed).
struct ServiceFootprint {
  std::int64_t live = 0;              // sessions with a sink
  std::int64_t tracked = 0;           // the supervisor's admission projections
  realtime::LoopFootprint loop;       // the real-time loop's containers
  std::int64_t backend_sessions = 0;  // sessions open in the backend
  std::int64_t used_blocks = 0;       // KV blocks in use
  std::int64_t queued_commands = 0;   // commands waiting for the engine thread
};

// The Supervisor's observer (on the engine thread): hands each session's reports to its sink.
class EngineService final : private realtime::SessionObserver {
 public:
  // Borrows backend, clock, registry and events (all must outlive the service); starts the engine
  // thread. Throws ConfigError for bad options. Clients are untrusted: options.enforce_kv_budget
  // is forced on.
  EngineService(realtime::Backend* backend, Clock* clock,
                const realtime::SupervisorOptions& options,
                telemetry::MetricsRegistry* registry = nullptr,
                telemetry::EventLog* events = nullptr, const ContinuityOptions& continuity = {});
  // Shutdown() if not done yet.
  ~EngineService() override;
  EngineService(const EngineService&) = delete;
  EngineService& operator=(const EngineService&) = delete;

  // Admission decides on the engine thread; `done` gets the outcome there. An admitted session
  // takes frames from SubmitFrame (spec.external_frames is forced on) and reports to `sink`.
  void StartSession(realtime::SessionSpec spec, SessionSink sink,
                    std::function<void(const StartOutcome&)> done);
  // A frame of the client's tokens, arriving now (stamped on the calling thread, before it waits
  // for the engine thread). `done` (optional) gets the outcome.
  void SubmitFrame(RealtimeSessionId id, std::vector<TokenId> tokens,
                   std::function<void(SubmitResult)> done = {});
  // Ends a session (its blocks return to the pool at once); its sink hears `reason` (kClient: the
  // client asked; kIdle: the connection saw no frame for the idle timeout).
  void EndSession(RealtimeSessionId id, EndReason reason = EndReason::kClient);

  // Continuity. The connection of a session is gone: without continuity the session ends
  // (disconnect); with it, it keeps running without a sink (results of frames in flight are kept
  // for the next one) for resume_window_s, then ends (disconnect).
  // `address`: the client's, for max_detached_per_address.
  void DetachSession(RealtimeSessionId id, std::string address);
  // session.resume of a token this replica issued: the session (held here, detached or still on
  // another connection, whose sink then hears on_taken) goes on with `sink`, which first gets the
  // results kept while it was away (after `done`). Refusals: reason "resume_token" (not a token),
  // "resume_model" (another model's), "resume_unknown" (spent, expired or never issued here),
  // "shutdown" (its state is moving off this draining replica: retry through the balancer).
  void ResumeSession(std::string token, SessionSink sink,
                     std::function<void(const ResumeOutcome&)> done);
  // A session moved from another replica (its origin's FetchMoved bytes; away_ms: since its last
  // frame there): admission decides as for a new session (Supervisor::AdmitMoved); refusals as
  // there, plus "resume_state" (the bytes: corrupt, another version, another model, a bad spec).
  void ImportMoved(std::vector<std::byte> state, double away_ms, SessionSink sink,
                   std::function<void(const ResumeOutcome&)> done);
  // The origin side of a move: the state of the moved session `token` names (found false for an
  // unknown, spent or expired one); kept until ReleaseMoved or the window ends.
  void FetchMoved(std::string token, std::function<void(MovedState)> done);
  // The receiving replica has the session: forget its state here.
  void ReleaseMoved(std::string token);
  // Drain by moving (ContinuityOptions::can_move): BeginDrain, then every session, once its frames
  // in flight are answered, is exported, kept for another replica to fetch and its sink hears
  // on_moving; frames sent meanwhile are refused (kMoving). replica_state().moving counts the
  // sessions not yet fetched. Without can_move, BeginDrain alone.
  void BeginHandoff();
  [[nodiscard]] const ContinuityOptions& continuity() const { return continuity_; }
  [[nodiscard]] const std::string& model_identity() const { return model_identity_; }

  // A JSON snapshot (sessions with a per-session table of at most max_listed, pool, admission,
  // forecast, frame counts, latency percentiles, the tightest live deadline); blocks until the
  // engine thread has produced it.
  [[nodiscard]] nlohmann::json Stats(std::size_t max_listed = 200);
  // Sizes of the service's containers; blocks until the engine thread has produced them.
  [[nodiscard]] ServiceFootprint Footprint();
  // The same without blocking the caller: `done` gets the snapshot on the engine thread (or at
  // once, {"stopped": true}, after Shutdown). For network threads, which must not wait.
  void StatsAsync(std::size_t max_listed, std::function<void(nlohmann::json)> done);
  // Stops admitting: every later session.start is rejected with reason "shutdown" and
  // replica_state() says draining; running sessions go on until they end or Shutdown() ends
  // them. For a graceful stop (metronome serve on SIGTERM). Idempotent.
  void BeginDrain();
  // Draining, the admission limit and the active sessions, as the engine thread last published
  // them (after every command batch and loop turn). Never waits for the engine thread: the agent
  // reads it on a network thread.
  [[nodiscard]] ReplicaState replica_state() const;
  // Ends every session (sinks hear kServerShutdown) and joins the engine thread. Idempotent.
  // Calls made after it are ignored (their callbacks never run).
  void Shutdown();

 private:
  // False (command dropped) once the engine thread is gone.
  bool Post(std::function<void()> command);
  void Run();                                                           // the engine thread
  [[nodiscard]] nlohmann::json Snapshot(std::size_t max_listed) const;  // engine thread
  // Snapshot's parts (engine thread): continuity's counters, and the live sessions' table (the
  // first max_listed, oldest first) with the tightest deadline among them.
  [[nodiscard]] nlohmann::json ContinuitySnapshot() const;
  void AddSessionTable(std::size_t max_listed, nlohmann::json& j) const;
  void EndAll(EndReason reason);
  void Publish();  // engine thread: replica_state_ from the supervisor
  // Engine thread: continuity's turn (exports of moving sessions, expiries).
  void ContinuityTurn();
  void MoveOut(RealtimeSessionId id);
  // Ends `address`'s oldest detached session when it holds more than max_detached_per_address.
  void EndOldestDetachedOver(const std::string& address);
  [[nodiscard]] std::string TokenFor(RealtimeSessionId id, const std::string& secret) const;
  ResumeOutcome Resumed(RealtimeSessionId id, SessionSink sink, double away_ms);
  // realtime::SessionObserver, engine thread.
  void OnFrame(const realtime::FrameRecord& r) override;
  void OnMuteAlarm(const realtime::MuteAlarm& a) override;
  void OnSessionEnded(const realtime::SessionEnded& e) override;

  // A live session: its sink and what /v1/stats reports about it.
  struct Live {
    SessionSink sink;
    double started_s = 0.0;
    double period_ms = 0.0;
    double deadline_ms = 0.0;  // the resolved spec's
    double work = 1.0;         // its price, units of work (SessionRequest::work)
    realtime::FrameCounts frames;
    double last_latency_ms = 0.0;
    // Continuity.
    std::string secret;         // the current resume token's; empty without continuity
    double last_frame_s = 0.0;  // when its latest frame arrived (its start before one did)
    bool attached = true;       // a connection holds it (its sink is set)
    double detached_s = 0.0;    // when its connection dropped (while !attached)
    std::string detached_from;  // the address of the connection that dropped (while !attached)
    bool moving = false;        // being handed on: no frame is taken
    std::deque<realtime::FrameRecord> kept;  // results while detached, for the next connection
  };
  // A moved session's state, until fetched and released, or the window ends.
  struct Moved {
    RealtimeSessionId id = 0;
    std::vector<std::byte> state;
    double moved_s = 0.0;       // when it was exported
    double last_frame_s = 0.0;  // for the receiving replica's missed-frame count
  };

  realtime::Backend* backend_;
  Clock* clock_;                     // read from any thread (Clock::Now is thread-safe)
  realtime::Supervisor supervisor_;  // engine thread only
  const std::int64_t max_sessions_;  // the operator's hard cap (0: none), for ReplicaState
  std::unordered_map<RealtimeSessionId, Live> live_;  // engine thread only
  bool draining_ = false;  // engine thread only: shutting down, admit nobody
  const ContinuityOptions continuity_;
  const std::string model_identity_;
  bool handing_off_ = false;                      // engine thread only: BeginHandoff ran
  std::unordered_map<std::string, Moved> moved_;  // engine thread only, by token secret

  mutable base::Mutex state_mu_;  // held only to copy replica_state_: never for long
  ReplicaState replica_state_ GUARDED_BY(state_mu_);

  base::Mutex mu_;
  std::condition_variable_any wake_;
  std::deque<std::function<void()>> commands_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  bool accepting_ GUARDED_BY(mu_) = true;  // false once the engine thread took its last commands
  std::thread thread_;
};

}  // namespace metronome::server
