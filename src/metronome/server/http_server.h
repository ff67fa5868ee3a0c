// The network front end of `metronome serve` (docs/protocol.md): one TCP port serving HTTP
// (/healthz, /readyz, /metrics, /v1/stats, the dashboard at / and /dashboard/*) and the WebSocket
// endpoint /v1/realtime, on Boost.Beast/Asio.
// Each connection runs on its own strand; the engine's callbacks (engine thread) post back to it.
// Sends go through a bounded per-connection queue, one async_write at a time; a reader slower than
// that queue is closed with status 1008. When a connection closes, its sessions end at once.
// Connection slots are shared fairly: WebSockets and plain HTTP connections have separate caps (so
// probes are answered whatever the WebSockets hold), request and handshake deadlines, idle
// connections evicted first at a cap, an optional per-address cap, idle sessions ended and
// session-less WebSockets closed after a timeout (ServerOptions). Optionally, on a second port,
// HAProxy's agent-check: a line from EngineService::replica_state() and the free WebSocket slots
// per connection, then close.
//
// Thread-safety: Start() and Stop() from one controlling thread; port() from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "metronome/model/tokenizer.h"
#include "metronome/server/engine_service.h"
#include "metronome/server/http_access.h"
#include "metronome/server/session_start.h"
#include "metronome/telemetry/metrics.h"
#include "metronome/wire/protocol.h"

namespace metronome::server {

// When a session that sends no frame is ended (session.ended reason idle): after `periods` of its
// periods with no frame from the client (counted from its start for one that never sends one),
// but never sooner than min_ms (a client's hiccup, a pause of a few seconds, must not cost its
// session) and never later than max_ms (a session declaring a long period cannot hold its slot
// and its share of admission for long). Keep max_ms above a few of the longest period clients use.
struct SessionIdlePolicy {
  int periods = 10;  // 0: sessions are never ended for idleness
  std::int64_t min_ms = 5000;
  std::int64_t max_ms = 30000;
  // clamp(periods x period_ms, min_ms, max_ms), ms; 0 (never) when periods is 0.
  [[nodiscard]] std::int64_t TimeoutMs(double period_ms) const;
  void Validate() const;  // ConfigError naming the field and value
};

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: an ephemeral port (port() says which)
  int io_threads = 1;
  int max_sessions_per_connection = 4;
  // WebSocket connections at most. At the cap an upgrade takes the slot of the oldest WebSocket
  // holding no session and no session.start pending; with none, it is answered 503 (Retry-After).
  int max_connections = 256;
  // Plain HTTP connections at most (a request being read or answered, or a kept-alive one waiting
  // for the next), apart from the WebSocket slots: /healthz, /readyz and /metrics are answered
  // however many WebSockets are open. At the cap a newcomer takes the slot of the oldest one
  // waiting for its request; with none, it is closed at once.
  int max_http_connections = 64;
  // Connections from one client address at most (0: no cap). At the cap the same address's oldest
  // idle connection makes room, or the newcomer is closed. Off by default: one load generator, or
  // every client behind one reverse proxy, is one address.
  int max_connections_per_address = 0;
  // A connection must deliver a complete HTTP request within this (from accept, or from the
  // previous response on a kept-alive connection), and finish the WebSocket handshake within it;
  // otherwise it is closed. Slow-header clients hold a slot at most this long.
  std::int64_t handshake_timeout_ms = 5000;
  // A WebSocket that holds no session (and has no session.start pending) this long is closed
  // (1000, reason "idle: ..."), counted from the handshake or its last session's end; 0: never.
  std::int64_t connection_idle_timeout_ms = 30000;
  SessionIdlePolicy session_idle;
  // Messages queued for one connection; a reader slower than that is closed with 1008 (policy)
  // and its sessions end.
  std::size_t max_send_queue = 256;
  // Empty: no access control. Otherwise the upgrade and /v1/* need "Authorization: Bearer T"
  // (401 otherwise); the dashboard's static files do not (the page sends the token it is given
  // in its URL fragment, /#token=T).
  std::string auth_token;
  // Browser Origins allowed to upgrade (http_access.h: nullopt is the default rule, same host or
  // loopback only when auth_token is empty). Requests without Origin are not browsers: allowed.
  AllowedOrigins allowed_origins;
  // What a client request is checked against; a WebSocket message (and an HTTP request body)
  // larger than caps.max_message_bytes is refused (the WebSocket closes with 1009).
  wire::ServerCaps caps;
  // What session.start leaves out, the server fills in (ResolveStart): KV window, window 512,
  // sinks 4, absolute positions.
  realtime::SessionDefaults session_defaults =
      ServerSessionDefaults(/*window=*/512, /*sinks=*/4, wire::KvPositions::kAbsolute);
  // This replica's name in session.started (`replica`), so a client behind a balancer knows who
  // served it; "{port}" in it becomes the bound port at Start(); empty: left out.
  std::string replica_id;
  // HAProxy's agent-check (agent_check.h) on this TCP port of `host`: nullopt, none; 0, an
  // ephemeral port (agent_port() says which). Each connection gets one line and is closed.
  std::optional<int> agent_port;
};

class HttpServer {
 public:
  // Borrows service, registry (may be null: /metrics is empty) and tokenizer (may be null: text
  // frames and text prompts are rejected with bad_field); all must outlive the server. Throws
  // ConfigError for a bad session_idle.
  HttpServer(EngineService* service, telemetry::MetricsRegistry* registry,
             const ServerOptions& options, const model::Tokenizer* tokenizer);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens, starts the io threads and returns. Throws ConfigError naming host and port
  // when the host does not resolve or the address cannot be bound (e.g. already in use).
  void Start();
  [[nodiscard]] int port() const;
  // The agent's bound port; 0 when ServerOptions::agent_port is nullopt or before Start().
  [[nodiscard]] int agent_port() const;
  // How many times a balancer has been told this replica drains: agent answers and /readyz
  // responses given while ReplicaState::draining. A drain hands sessions on once it is > 0, so
  // that their clients' new connections go to other replicas.
  [[nodiscard]] std::int64_t drain_announcements() const;
  // Graceful: closes the listener and HTTP connections; every WebSocket is told session.ended
  // (reason server_shutdown) for each session still open, gets what was queued for it, then a
  // close frame 1001 (going away); its sessions end. A peer that does not complete the close
  // within kCloseGrace (1 s) is dropped. Joins the io threads; returns within about 3 s.
  // Idempotent. (metronome serve calls EngineService::Shutdown first, so the sessions end with
  // reason server_shutdown on the engine side too.)
  void Stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace metronome::server
