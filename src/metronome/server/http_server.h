// The network front end of `metronome serve` (docs/protocol.md): one TCP port serving HTTP
// (/healthz, /metrics, /v1/stats, the dashboard at / and /dashboard/*) and the WebSocket endpoint
// /v1/realtime, on Boost.Beast/Asio.
// Each connection runs on its own strand; the engine's callbacks (engine thread) post back to it.
// Sends go through a bounded per-connection queue, one async_write at a time; a reader slower than
// that queue is closed with status 1008. When a connection closes, its sessions end at once.
// Connection slots are shared fairly: request and handshake deadlines, idle connections evicted
// first at the cap, an optional per-address cap (ServerOptions). Optionally, on a second port,
// HAProxy's agent-check: a line from EngineService::replica_state() per connection, then close.
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

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: an ephemeral port (port() says which)
  int io_threads = 1;
  int max_sessions_per_connection = 4;
  // HTTP and WebSocket together. At the cap a newcomer takes the slot of the oldest idle
  // connection (an HTTP connection waiting for its request, or a WebSocket with no session and no
  // session.start pending); with none idle it is closed at once.
  int max_connections = 256;
  // Connections from one client address at most (0: no cap). At the cap the same address's oldest
  // idle connection makes room, or the newcomer is closed. Off by default: one load generator, or
  // every client behind one reverse proxy, is one address.
  int max_connections_per_address = 0;
  // A connection must deliver a complete HTTP request within this (from accept, or from the
  // previous response on a kept-alive connection), and finish the WebSocket handshake within it;
  // otherwise it is closed. Slow-header clients hold a slot at most this long.
  std::int64_t handshake_timeout_ms = 5000;
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
  // frames and text prompts are rejected with bad_field); all must outlive the server.
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
