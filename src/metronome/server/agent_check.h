// HAProxy's agent-check (HAProxy 2.6 configuration manual, "agent-check"): on each TCP connection
// to the agent port the replica writes one ASCII line of words and closes. This file is the pure
// half: the line from a small state the engine thread publishes (EngineService::replica_state);
// the socket half is HttpServer's agent acceptor.
//
// The mapping (docs/deploy.md, "The agent"), for one session per connection (loadgen and the
// protocol's clients open one WebSocket per session, so HAProxy's per-server connection count is
// the replica's session count):
//   - "drain" while the replica shuts down or when its headroom (limit - active) is 0: HAProxy
//     sends it no new connection and keeps the ones it has (their sessions run on); "ready" and
//     "up" otherwise ("ready" cancels an earlier drain; "up" an agent-marked down).
//   - "maxconn:<n>" with n = ReplicaState::max_connections (the sessions running plus the
//     reference sessions admission's budget still takes: Supervisor::admission_limit, aimd's,
//     static's, or memory's sessions that still fit), so HAProxy queues what the replica would
//     reject rather than sending it to be refused; left out with no count (HAProxy keeps the
//     configured maxconn) and for 0 (HAProxy reads maxconn 0 as "no limit"; drain covers it).
//   - "<P>%": the weight, P = ceil(100 x headroom / limit) in [1, 100] when not draining (100%
//     with no count), so leastconn and the weighted choices lean to the replica with most room.
// Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace metronome::server {

// What the agent reports, as the engine thread last published it.
// Admission's budget is work in units of the reference session (SessionRequest::work); HAProxy
// counts connections, one per session. The agent's maxconn speaks HAProxy's unit: the sessions
// running plus the sessions of the reference shape the budget still takes.
struct ReplicaState {
  bool draining = false;      // shutting down: admits nobody
  std::int64_t limit = -1;    // admission's budget, units of work; < 0: no count applies (kNoLimit)
  std::int64_t active = 0;    // the admitted work, whole units (SystemState::WorkUnits)
  std::int64_t sessions = 0;  // sessions running
  // Units admission would still take: limit - active, >= 0; -1 with no limit.
  [[nodiscard]] std::int64_t headroom() const;
  // sessions + headroom(): the connections HAProxy may hold here; -1 with no limit.
  [[nodiscard]] std::int64_t max_connections() const;
};

// One line, e.g. "up ready 63% maxconn:8\n" or "up drain maxconn:8\n".
[[nodiscard]] std::string AgentResponse(const ReplicaState& state);

}  // namespace metronome::server
