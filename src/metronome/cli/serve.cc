// metronome serve: the real engine behind the network server (docs/protocol.md). Clients open
// real-time sessions over WebSocket on /v1/realtime; /metrics, /healthz, /v1/stats and the
// dashboard at / are plain HTTP. Runs until SIGINT or SIGTERM, then shuts down gracefully
// (docs/protocol.md, "Shutdown").
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/cli/workload_flags.h"
#include "metronome/engine/engine.h"
#include "metronome/engine/sampler.h"
#include "metronome/server/engine_service.h"
#include "metronome/server/http_server.h"
#include "metronome/serving/engine_backend.h"

namespace metronome::cli {
namespace {

struct ServeFlags {
  ModelFlags model;
  EngineFlags engine;
  // Host, port, connection caps and timeouts, auth: the defaults live in server::ServerOptions
  // (one place) and the flags write into it; only serve's port default differs (8080, not 0).
  server::ServerOptions server = [] {
    server::ServerOptions o;
    o.port = 8080;
    return o;
  }();
  std::string allowed_origins;  // parsed by server::ParseAllowedOrigins; empty: its default rule
  std::int64_t sessions_hint = 16;  // pool sizing when neither --kv-blocks nor --kv-pool-mb
  // Session defaults and caps.
  std::int64_t window = 512;
  std::int64_t sinks = 4;
  std::string positions = "absolute";
  bool no_full_kv = false;
  std::int64_t max_context = 0;
  float temperature = 0.0f;
  std::string port_file;     // written once listening: the bound port and a newline
  AdmissionFlags admission;  // admission, alarms, forecast: the same flags as sim and drive
  bool quiet = false;
};

// Writes "PORT\n" to `path` atomically: a temp file beside it, then rename, so a script polling
// for the file never reads a partial number. Returns an error message, empty on success.
std::string WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << '\n';
    out.close();
    if (!out) return "--port-file = '" + path + "': cannot write '" + tmp + "'";
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return "--port-file = '" + path + "': cannot rename '" + tmp + "' to it";
  }
  return "";
}

int RunServe(const ServeFlags& f) {
  // Validated before the model loads: a typo fails at once. (--window, --sinks and --max-context
  // are range-checked by CLI11 at parse time.)
  realtime::SupervisorOptions sup = f.admission.Supervisor(/*period_ms=*/0.0);
  ReportingFlags([&] { sup.Validate(); });
  server::ServerOptions so2 = f.server;
  so2.allowed_origins = server::ParseAllowedOrigins(f.allowed_origins);
  const model::Model m = f.model.Load();
  // CLI11 admits only the parser's spellings.
  const kv::PositionMode pos =
      kv::ParsePositionMode(f.positions).value_or(kv::PositionMode::kAbsolute);
  const kv::KvPolicy policy = kv::KvPolicy::Window(f.window, f.sinks, pos);
  const engine::EngineOptions eo = f.engine.Options(
      m.config, policy, f.sessions_hint, f.window + f.sinks + 64, static_cast<int>(f.window));
  engine::Engine eng(m, eo);
  // A pool that cannot hold one default session would refuse every client while /healthz says ok.
  const std::int64_t one_session = policy.MaxResidentBlocks(eo.block_tokens, /*chunk_tokens=*/1);
  if (eng.pool_stats().num_blocks < one_session) {
    throw ConfigError("the KV pool has " + std::to_string(eng.pool_stats().num_blocks) +
                      " blocks, fewer than one default session needs (" +
                      std::to_string(one_session) + " blocks for --window " +
                      std::to_string(f.window) + " --sinks " + std::to_string(f.sinks) +
                      "): raise --kv-blocks or --kv-pool-mb, or lower --window");
  }
  eng.WarmUp();  // before the first client: its frames must not pay for JIT and first touch
  engine::SamplerOptions so;
  so.temperature = f.temperature;
  so.Validate();
  serving::EngineBackend backend(&eng, so, f.max_context);
  SteadyClock clock;

  sup.log_to_stderr = !f.quiet;
  telemetry::MetricsRegistry registry;
  server::EngineService service(&backend, &clock, sup, &registry);

  so2.session_defaults = server::ServerSessionDefaults(f.window, f.sinks, pos);
  so2.caps.vocab_size = m.config.vocab_size;
  so2.caps.allow_full_kv = !f.no_full_kv;
  server::HttpServer http(&service, &registry, so2, m.tokenizer.get());
  http.Start();

  const kv::PoolStats pool = eng.pool_stats();
  std::printf("metronome serve --model %s: KV pool %lld blocks x %lld tokens (%s), %s\n",
              f.model.model.c_str(), static_cast<long long>(pool.num_blocks),
              static_cast<long long>(pool.block_tokens),
              HumanBytes(static_cast<double>(pool.num_blocks * pool.bytes_per_block)).c_str(),
              f.engine.ThreadsLine().c_str());
  std::printf("listening on http://%s:%d\n", so2.host.c_str(), http.port());
  std::printf("dashboard: http://%s:%d/%s\n", so2.host.c_str(), http.port(),
              so2.auth_token.empty() ? "" : "#token=<the --auth-token>");
  std::fflush(stdout);
  if (!f.port_file.empty()) {
    const std::string error = WritePortFile(f.port_file, http.port());
    if (!error.empty()) {  // the server is up: shut it down in order, as on a signal
      std::fprintf(stderr, "error: %s\n", error.c_str());
      service.Shutdown();
      http.Stop();
      return 2;
    }
  }

  boost::asio::io_context signals_io;
  boost::asio::signal_set signals(signals_io, SIGINT, SIGTERM);
  signals.async_wait([](const boost::system::error_code& /*ec*/, int /*signal*/) {});
  signals_io.run();  // returns after the first signal

  std::printf("shutting down\n");
  std::fflush(stdout);
  // The engine first: every session ends with reason server_shutdown (in the events and metrics
  // too) and each client is sent session.ended; then every connection gets what is queued and a
  // 1001 close. Bounded: HttpServer::Stop returns within about 3 s.
  service.Shutdown();
  http.Stop();
  return 0;
}

}  // namespace

void RegisterServe(CLI::App* app, int* exit_code) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* sub = app->add_subcommand(
      "serve",
      "Serve real-time sessions over WebSocket (docs/protocol.md) on the real engine, with "
      "/metrics, /healthz, /v1/stats and a live dashboard at /");
  flags->model.Register(sub, /*required=*/false);
  flags->engine.Register(sub);
  server::ServerOptions& so = flags->server;
  sub->add_option("--host", so.host, "Address to listen on");
  sub->add_option("--port", so.port, "TCP port (0: an ephemeral port, printed)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--port-file", flags->port_file,
                  "Once listening, write the bound port (with --port 0: the one chosen) to this "
                  "file, atomically (for scripts)");
  sub->add_option("--io-threads", so.io_threads, "Network threads")->check(CLI::Range(1, 256));
  sub->add_option("--auth-token", so.auth_token,
                  "Require 'Authorization: Bearer TOKEN' on the upgrade and on /v1/*");
  sub->add_option("--max-sessions-per-connection", so.max_sessions_per_connection,
                  "Sessions one connection may hold (too_many_sessions beyond)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--max-connections", so.max_connections,
                  "Open connections at most; at the cap an idle one (no session yet, or an HTTP "
                  "request still unfinished) is closed for the newcomer, oldest first")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--max-connections-per-ip", so.max_connections_per_address,
                  "Open connections from one client address at most (0: no per-address cap; one "
                  "loadgen or one reverse proxy is one address)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--handshake-timeout-ms", so.handshake_timeout_ms,
                  "Time a connection has to send a complete HTTP request (or the next one on a "
                  "kept-alive connection) and to finish the WebSocket handshake, ms")
      ->check(CLI::Range(std::int64_t{100}, std::int64_t{600000}));
  sub->add_option("--allowed-origins", flags->allowed_origins,
                  "Comma list of Origin values (scheme://host[:port]) a browser may upgrade from, "
                  "or '*' for any (default: with no --auth-token, only pages served from this "
                  "host or a loopback name; with one, any). Requests without Origin are allowed");
  sub->add_option("--pool-sessions", flags->sessions_hint,
                  "Window sessions the KV pool is sized for without --kv-blocks/--kv-pool-mb")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  // A default no client could ask for explicitly is a typo (and would overflow the pool sizing).
  const wire::ServerCaps caps;
  sub->add_option("--window", flags->window, "Default kv.window of a session, tokens")
      ->check(CLI::Range(std::int64_t{1}, caps.max_window));
  sub->add_option("--sinks", flags->sinks, "Default kv.sinks of a session, tokens")
      ->check(CLI::Range(std::int64_t{0}, caps.max_sinks));
  sub->add_option("--positions", flags->positions, "Default kv.positions: absolute | rolling")
      ->check(CLI::IsMember({"absolute", "rolling"}));
  sub->add_flag("--no-full-kv", flags->no_full_kv, "Refuse kv.policy full (over_cap)");
  sub->add_option("--max-context", flags->max_context,
                  "Context limit of full-KV sessions in tokens (0: the model's trained context)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  sub->add_option("--temperature", flags->temperature, "Sampling temperature (0: greedy)");
  flags->admission.Register(sub);
  sub->get_option("--aimd-window-s")
      ->description(
          "AIMD control window, s (default 2; give about 25 frame periods when the "
          "sessions' periods are longer than 80 ms)");
  sub->add_flag("--quiet", flags->quiet, "No alarm or limit-change lines on stderr");
  sub->callback([flags, exit_code] { *exit_code = RunServe(*flags); });
}

}  // namespace metronome::cli
