// HAProxy's agent-check (HAProxy 2.6 configuration manual, "agent-check"): on each TCP connection
// to the agent port the replica writes one ASCII line of words and closes. This file is the pure
// half: the line from a small state the engine thread publishes (EngineService::replica_state)
// and the network threads complete with the free WebSocket slots (HttpServer); the socket half is
// HttpServer's agent acceptor. /readyz reads the same state (ReadinessOf).
//
// The mapping (docs/deploy.md, "The agent"), for one session per connection (loadgen and the
// protocol's clients open one WebSocket per session, so HAProxy's per-server connection count is
// the replica's session count). The capacity is what binds first: the admission limit
// (Supervisor::admission_limit: aimd's, static's, or memory's sessions that still fit) or the
// sessions running plus the free WebSocket slots (--max-connections less the WebSockets that hold
// a session); the room is capacity - active, >= 0.
//   - "drain" while the replica shuts down or when its room is 0: HAProxy sends it no new
//     connection and keeps the ones it has (their sessions run on); "ready" and "up" otherwise
//     ("ready" cancels an earlier drain; "up" an agent-marked down).
//   - "maxconn:<capacity>", so HAProxy queues what the replica would refuse rather than sending
//     it to be refused; left out with neither count (HAProxy keeps the configured maxconn) and for
//     a capacity of 0 (HAProxy reads maxconn 0 as "no limit"; drain covers it).
//   - "<P>%": the weight, P = ceil(100 x room / capacity) in [1, 100] when not draining (100%
//     with no count), so leastconn and the weighted choices lean to the replica with most room.
// Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace metronome::server {

// What the agent and /readyz report: the engine thread's last published admission state plus the
// network threads' free connection slots. Admission's budget is work in units of the reference
// session (SessionRequest::work); HAProxy counts connections, one per session: capacity and room
// speak HAProxy's unit, the sessions running plus the reference sessions that still fit.
struct ReplicaState {
  bool draining = false;      // shutting down: admits nobody
  std::int64_t limit = -1;    // admission's budget, units of work; < 0: no count applies (kNoLimit)
  std::int64_t active = 0;    // the admitted work, whole units (SystemState::WorkUnits)
  std::int64_t sessions = 0;  // sessions running
  // The operator's hard cap on sessions (--max-sessions); 0: none.
  std::int64_t max_sessions = 0;
  // WebSocket slots a new client could take now; < 0: not known (no connection cap applies, or
  // the state did not come through the server).
  std::int64_t free_connection_slots = -1;
  // Sessions on their way to another replica (a drain's handoff): being exported, or exported
  // and not yet fetched. A drained replica exits once this and sessions are 0.
  std::int64_t moving = 0;
  // Units admission would still take: limit - active, >= 0; -1 with no limit.
  [[nodiscard]] std::int64_t headroom() const;
  // Sessions (connections) this replica can hold now: the smallest of sessions + headroom,
  // max_sessions and sessions + free_connection_slots, of those known; -1 when none is.
  [[nodiscard]] std::int64_t capacity() const;
  // Sessions a newcomer could still start: capacity - sessions, >= 0; -1 with no capacity.
  [[nodiscard]] std::int64_t room() const;
};

// One line, e.g. "up ready 63% maxconn:8\n" or "up drain maxconn:8\n".
[[nodiscard]] std::string AgentResponse(const ReplicaState& state);

// /readyz's answer: ready unless draining or without room; `reason` names which (the first of
// "draining", "admission_full" (headroom 0), "no_free_connection_slots"), "ok" when ready.
struct Readiness {
  bool ready = true;
  const char* reason = "ok";
};
[[nodiscard]] Readiness ReadinessOf(const ReplicaState& state);

}  // namespace metronome::server
