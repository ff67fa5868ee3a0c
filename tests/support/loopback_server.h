// The `serve` stack in-process for tests: the engine service on the cost-model backend (1 ms per
// step, real clock) behind the HTTP/WebSocket server on an ephemeral loopback port, with the given
// tokenizer (none by default).
// Started in the constructor, drained and stopped in the destructor.
#pragma once

#include <cstdint>
#include <string>

#include "metronome/base/clock.h"
#include "metronome/realtime/backend.h"
#include "metronome/realtime/cost_model.h"
#include "metronome/realtime/supervisor.h"
#include "metronome/server/engine_service.h"
#include "metronome/server/http_server.h"
#include "metronome/telemetry/metrics.h"

namespace metronome::testing {

inline realtime::SupervisorOptions QuietSupervisor(const std::string& admission) {
  realtime::SupervisorOptions o;
  o.admission = admission;
  o.log_to_stderr = false;
  return o;
}

struct LoopbackServer {
  realtime::CostModelBackend backend;  // `blocks` KV blocks of 16 tokens
  SteadyClock clock;
  telemetry::MetricsRegistry registry;
  server::EngineService service;
  server::HttpServer http;

  // `tokenizer` (may be null: text frames and prompts are refused) must outlive the server.
  explicit LoopbackServer(const std::string& admission, std::int64_t blocks = 256,
                          const server::ServerOptions& options = {},
                          const model::Tokenizer* tokenizer = nullptr,
                          const server::ContinuityOptions& continuity = {})
      : backend({.c0_s = 0.001}, blocks, 16),
        service(&backend, &clock, QuietSupervisor(admission), &registry, /*events=*/nullptr,
                continuity),
        http(&service, &registry, options, tokenizer) {
    http.Start();
  }
  ~LoopbackServer() {
    http.Stop();
    service.Shutdown();
  }
  LoopbackServer(const LoopbackServer&) = delete;
  LoopbackServer& operator=(const LoopbackServer&) = delete;

  [[nodiscard]] int port() const { return http.port(); }
  [[nodiscard]] std::string url() const { return "ws://127.0.0.1:" + std::to_string(port()); }
};

}  // namespace metronome::testing
