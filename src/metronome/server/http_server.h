// The network front end of `metronome serve` (docs/protocol.md): one TCP port serving HTTP
// (/healthz, /metrics, /v1/stats, the dashboard at / and /dashboard/*) and the WebSocket endpoint
// /v1/realtime, on Boost.Beast/Asio.
// Each connection runs on its own strand; the engine's callbacks (engine thread) post back to it.
// Sends go through a bounded per-connection queue, one async_write at a time; a reader slower than
// that queue is closed with status 1008. When a connection closes, its sessions end at once.
//
// Thread-safety: Start() and Stop() from one controlling thread; port() from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "metronome/model/tokenizer.h"
#include "metronome/server/engine_service.h"
#include "metronome/server/protocol.h"
#include "metronome/telemetry/metrics.h"

namespace metronome::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: an ephemeral port (port() says which)
  int io_threads = 1;
  std::size_t max_message_bytes = std::size_t{1} << 20;  // larger messages: close with 1009
  int max_sessions_per_connection = 4;
  int max_connections = 256;  // HTTP and WebSocket together; more are closed at once
  // Messages queued for one connection; a reader slower than that is closed with 1008 (policy)
  // and its sessions end.
  std::size_t max_send_queue = 256;
  // Empty: no access control. Otherwise the upgrade and /v1/* need "Authorization: Bearer T"
  // (401 otherwise); the dashboard's static files do not (the page sends the token it is given
  // in its URL fragment, /#token=T).
  std::string auth_token;
  ServerCaps caps;  // caps.max_message_bytes is overridden by max_message_bytes
  // Session defaults when session.start does not give them.
  std::int64_t default_window = 512;
  std::int64_t default_sinks = 4;
  KvPositions default_positions = KvPositions::kAbsolute;
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

  // Binds and listens (throws on failure), starts the io threads and returns.
  void Start();
  [[nodiscard]] int port() const;
  // Closes the listener and every connection (their sessions end), joins the io threads.
  // Idempotent.
  void Stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace metronome::server
