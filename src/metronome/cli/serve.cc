// metronome serve: the real engine behind the network server (docs/protocol.md). Clients open
// real-time sessions over WebSocket on /v1/realtime; /metrics, /healthz, /readyz, /v1/stats and
// the dashboard at / are plain HTTP. Runs until SIGINT or SIGTERM, then shuts down gracefully
// (docs/protocol.md, "Drain" and "Shutdown"): SIGTERM drains first. With --agent-port it also
// answers HAProxy's agent-check (docs/deploy.md).
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/cli/commands.h"
#include "metronome/cli/common.h"
#include "metronome/cli/start_calibration.h"
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
  // The bearer token's sources (ResolveAuthToken): at most one of the flag, the file and the
  // environment variable kAuthTokenEnv.
  std::optional<std::string> auth_token;
  std::optional<std::string> auth_token_file;
  // Without --kv-blocks/--kv-pool-mb: this fraction of the memory available after the weights
  // (PoolFromMachine). Half leaves room for the process, other tenants and the page cache.
  double kv_pool_fraction = 0.5;
  // Session defaults and caps: unset KV fields take realtime::ServingSessionDefaults.
  SessionKvFlags kv;
  std::int64_t max_window = realtime::kDefaultMaxWindowTokens;
  bool no_full_kv = false;
  std::int64_t max_context = 0;
  float temperature = 0.0f;
  std::string port_file;          // written once listening: the bound port and a newline
  int agent_port = 0;             // HAProxy agent-check port; 0: no agent
  std::string replica_id;         // session.started's replica; empty: <hostname>:<port>
  double drain_timeout_s = 30.0;  // SIGTERM: how long running sessions may go on, s
  server::ContinuityOptions continuity;
  std::optional<std::string> cluster_secret_file;  // or kClusterSecretEnv
  // Admission, alarms, forecast: the same flags as sim and drive; drive's defaults (aimd + guard).
  AdmissionFlags admission = ServingAdmissionFlags();
  bool quiet = false;
  void Register(CLI::App* sub);
  // Register's groups, in --help's order.
  void RegisterListening(CLI::App* sub);
  void RegisterContinuity(CLI::App* sub);
  void RegisterAccess(CLI::App* sub);
  void RegisterConnectionLimits(CLI::App* sub);
  void RegisterSessionDefaults(CLI::App* sub);
};

void ServeFlags::Register(CLI::App* sub) {
  model.Register(sub, /*required=*/false);
  engine.Register(sub);
  RegisterListening(sub);
  RegisterContinuity(sub);
  RegisterAccess(sub);
  RegisterConnectionLimits(sub);
  RegisterSessionDefaults(sub);
  sub->add_option("--temperature", temperature, "Sampling temperature (0: greedy)");
  admission.Register(sub);
  sub->get_option("--aimd-window-s")
      ->description(
          "AIMD control window, s (default 2; give about 25 frame periods when the "
          "sessions' periods are longer than 80 ms)");
  sub->add_flag("--quiet", quiet, "No alarm or limit-change lines on stderr");
}

void ServeFlags::RegisterListening(CLI::App* sub) {
  server::ServerOptions& so = server;
  sub->add_option("--host", so.host, "Address to listen on");
  sub->add_option("--port", so.port, "TCP port (0: an ephemeral port, printed)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--port-file", port_file,
                  "Once listening, write the bound port (with --port 0: the one chosen) to this "
                  "file, atomically (for scripts)");
  sub->add_option("--io-threads", so.io_threads, "Network threads")->check(CLI::Range(1, 256));
  sub->add_option("--agent-port", agent_port,
                  "Answer HAProxy's agent-check on this TCP port of --host: one line per "
                  "connection, drain / ready, the capacity (the admission limit, or the sessions "
                  "running plus the free WebSocket slots if fewer) as maxconn and the room left "
                  "as weight (docs/deploy.md; 0: no agent)")
      ->check(CLI::Range(0, 65535));
  sub->add_option("--replica-id", replica_id,
                  "This replica's name in session.started (default: <hostname>:<port>)");
}

void ServeFlags::RegisterContinuity(CLI::App* sub) {
  sub->add_option("--drain-timeout-s", drain_timeout_s,
                  "On SIGTERM, stop admitting and let running sessions finish for at most this "
                  "long before shutting down (0: shut down at once; SIGINT always does)")
      ->check(CLI::Range(0.0, 86400.0));
  sub->add_option("--resume-window-s", continuity.resume_window_s,
                  "How long a session outlives its dropped connection, waiting for "
                  "session.resume, and how long a drained replica keeps a moved session's state "
                  "for another replica to fetch, s (0: sessions end with their connection)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  sub->add_option("--max-detached-per-address", continuity.max_detached_per_address,
                  "The most sessions one client address may leave waiting for session.resume at "
                  "once; past it, its oldest detached session ends")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--handoff-wait-s", continuity.handoff_wait_s,
                  "On SIGTERM with a cluster secret, keep serving the sessions until a balancer "
                  "has heard the drain (an agent-check answer or a /readyz response), at most "
                  "this long, then hand them on, s")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60.0));
  sub->add_option("--advertise-url", continuity.advertise_url,
                  "This replica's address as the other replicas reach it (http://host:port), "
                  "written into resume tokens; with a cluster secret, SIGTERM hands every "
                  "session to another replica (session.moving) instead of ending it");
  sub->add_option("--cluster-secret-file", cluster_secret_file,
                  "The secret the replicas of a cluster share to move sessions (or the "
                  "environment variable METRONOME_CLUSTER_SECRET; never on the command line)");
}

void ServeFlags::RegisterAccess(CLI::App* sub) {
  sub->add_option("--auth-token", auth_token,
                  "Require 'Authorization: Bearer TOKEN' on the upgrade and on /v1/* (visible to "
                  "local users in the process list: prefer --auth-token-file or the environment "
                  "variable METRONOME_AUTH_TOKEN; at most one of the three; an empty or "
                  "whitespace-only token is an error)");
  sub->add_option("--auth-token-file", auth_token_file,
                  "Read the token from this file (its trailing line end dropped)");
  sub->add_option("--allowed-origins", allowed_origins,
                  "Comma list of Origin values (scheme://host[:port]) a browser may upgrade from, "
                  "or '*' for any (default: with no --auth-token, only pages served from this "
                  "host or a loopback name; with one, any). Requests without Origin are allowed");
}

void ServeFlags::RegisterConnectionLimits(CLI::App* sub) {
  server::ServerOptions& so = server;
  sub->add_option("--max-sessions-per-connection", so.max_sessions_per_connection,
                  "Sessions one connection may hold (too_many_sessions beyond)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--max-connections", so.max_connections,
                  "Open WebSocket connections at most; at the cap one holding no session is "
                  "closed for the newcomer, oldest first; with none, the upgrade gets 503")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--max-http-connections", so.max_http_connections,
                  "Open plain HTTP connections at most, apart from the WebSockets (so /healthz, "
                  "/readyz and /metrics answer whatever the WebSockets hold); at the cap one "
                  "still waiting for its request is closed for the newcomer, oldest first")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--connection-idle-ms", so.connection_idle_timeout_ms,
                  "Close a WebSocket that has held no session for this long, ms (0: never)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{86400000}));
  sub->add_option("--idle-periods", so.session_idle.periods,
                  "End a session (session.ended reason idle) that sent no frame for this many of "
                  "its periods, counted from its start, within [--idle-min-ms, --idle-max-ms] "
                  "(0: never)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  sub->add_option("--idle-min-ms", so.session_idle.min_ms,
                  "The shortest idle timeout of a session, ms: a short-period client's pause of "
                  "a few seconds keeps its session")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{86400000}));
  sub->add_option("--idle-max-ms", so.session_idle.max_ms,
                  "The longest idle timeout of a session, ms: a session declaring a long period "
                  "holds its slot no longer (keep it above a few of the longest period)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{86400000}));
  sub->add_option("--max-connections-per-ip", so.max_connections_per_address,
                  "Open connections from one client address at most (0: no per-address cap; one "
                  "loadgen or one reverse proxy is one address)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--handshake-timeout-ms", so.handshake_timeout_ms,
                  "Time a connection has to send a complete HTTP request (or the next one on a "
                  "kept-alive connection) and to finish the WebSocket handshake, ms")
      ->check(CLI::Range(std::int64_t{100}, std::int64_t{600000}));
}

void ServeFlags::RegisterSessionDefaults(CLI::App* sub) {
  sub->add_option("--kv-pool-fraction", kv_pool_fraction,
                  "Without --kv-blocks/--kv-pool-mb: the KV pool is this fraction of the memory "
                  "available after the weights (MemAvailable or the cgroup's limit, whichever is "
                  "smaller), at most what the admission limit's sessions need")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 0.95));
  // A default no client could ask for explicitly is a typo (and would overflow the pool sizing).
  const wire::ServerCaps caps;
  sub->add_option("--kv", kv.kv,
                  "Default kv.policy of a session that names none: window | full (the unbounded "
                  "baseline; default: window)")
      ->check(CLI::IsMember({"full", "window"}));
  sub->add_option("--window", kv.window,
                  "Default kv.window of a session, tokens (default: the model's trained context "
                  "capped by --max-window)")
      ->check(CLI::Range(std::int64_t{1}, caps.max_window));
  sub->add_option("--max-window", max_window,
                  "Cap on the default window when it comes from the model's trained context, "
                  "tokens")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, caps.max_window));
  sub->add_option("--sinks", kv.sinks, "Default kv.sinks of a session, tokens (default: 4)")
      ->check(CLI::Range(std::int64_t{0}, caps.max_sinks));
  sub->add_option("--positions", kv.positions,
                  "Default kv.positions: absolute | rolling (default: rolling)")
      ->check(CLI::IsMember({"absolute", "rolling"}));
  sub->add_flag("--no-full-kv", no_full_kv, "Refuse kv.policy full (over_cap)");
  sub->add_option("--max-context", max_context,
                  "Context limit of full-KV sessions in tokens (0: the model's trained context)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
}

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

// The environment variables a secret may come from (instead of a flag).
constexpr const char* kAuthTokenEnv = "METRONOME_AUTH_TOKEN";
constexpr const char* kClusterSecretEnv = "METRONOME_CLUSTER_SECRET";

// Where one secret may come from: a flag's value (visible in the process list: the auth token
// only), a file, an environment variable.
struct SecretSources {
  std::string_view what;  // "the auth token"
  std::string_view noun;  // "token": what a problem is said of ("the token is empty")
  const std::optional<std::string>* value = nullptr;  // null: no such flag
  std::string_view value_flag;
  const std::optional<std::string>* file = nullptr;
  std::string_view file_flag;
  const char* env = nullptr;
};

// The secret from its one source (an environment variable counts when set, even to ""). None:
// "". Two or more, a file that cannot be read, or a secret server::AuthTokenProblem finds wrong:
// ConfigError naming the source.
std::string ResolveSecret(const SecretSources& from) {
  // Read once, at start-up, before any thread exists that could change the environment.
  const char* env = std::getenv(from.env);  // NOLINT(concurrency-mt-unsafe)
  std::vector<std::string> given;
  if (from.value != nullptr && *from.value) given.emplace_back(from.value_flag);
  if (*from.file) given.push_back(std::string(from.file_flag) + " = '" + **from.file + "'");
  if (env != nullptr) given.push_back(std::string("the environment variable ") + from.env);
  if (given.size() > 1) {
    std::string list;
    for (std::size_t i = 0; i < given.size(); ++i) {
      list += (i == 0 ? "" : i + 1 == given.size() ? " and " : ", ") + given[i];
    }
    throw ConfigError(std::string(from.what) + " comes from one place, but " + list +
                      (given.size() == 2 ? " are both" : " are all") + " given: keep one");
  }
  if (given.empty()) return "";
  std::string secret;
  if (from.value != nullptr && *from.value) {
    secret = **from.value;
  } else if (*from.file) {
    std::ifstream in(**from.file, std::ios::binary);
    if (!in) throw ConfigError(given[0] + ": cannot open the file");
    std::ostringstream text;
    text << in.rdbuf();
    secret = text.str();
    // The line end an editor or `echo` adds is not part of the secret.
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  } else {
    secret = env;
  }
  const std::string problem = server::AuthTokenProblem(secret);
  if (!problem.empty()) {
    throw ConfigError(given[0] + ": the " + std::string(from.noun) + " " + problem +
                      " (leave every source out to go without it)");
  }
  return secret;
}

// The bearer token: --auth-token, --auth-token-file or kAuthTokenEnv; none: no access control.
std::string ResolveAuthToken(const ServeFlags& f) {
  return ResolveSecret({.what = "the auth token",
                        .noun = "token",
                        .value = &f.auth_token,
                        .value_flag = "--auth-token",
                        .file = &f.auth_token_file,
                        .file_flag = "--auth-token-file",
                        .env = kAuthTokenEnv});
}

// The cluster secret: --cluster-secret-file or kClusterSecretEnv, never a flag's value; none:
// sessions do not move between replicas.
std::string ResolveClusterSecret(const ServeFlags& f) {
  return ResolveSecret({.what = "the cluster secret",
                        .noun = "secret",
                        .value = nullptr,
                        .value_flag = {},
                        .file = &f.cluster_secret_file,
                        .file_flag = "--cluster-secret-file",
                        .env = kClusterSecretEnv});
}

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// SIGTERM: stop admitting (new sessions are rejected with reason shutdown, the agent says drain,
// so HAProxy sends nothing new). With continuity that can move (--advertise-url and a cluster
// secret) every session is handed on (session.moving) once a balancer has heard the drain (or
// after handoff_wait_s), so that the clients' new connections reach other replicas, and the
// replica waits until another one has fetched each state, or the resume window ends; otherwise
// the running sessions may finish.
// Either for at most timeout_s or until a second SIGINT/SIGTERM; the caller then shuts down as
// before (whatever still runs ends with server_shutdown).
void Drain(server::EngineService* service, const server::HttpServer& http, bool hand_off,
           boost::asio::io_context* signals_io, boost::asio::signal_set* signals,
           double timeout_s) {
  bool again = false;
  signals_io->restart();
  signals->async_wait([&again](const boost::system::error_code& ec, int /*signal*/) {
    if (!ec) again = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  const auto give_up = t0 + std::chrono::duration<double>(timeout_s);
  service->BeginDrain();
  if (hand_off) {
    const auto announce_by =
        t0 + std::chrono::duration<double>(service->continuity().handoff_wait_s);
    while (!again && http.drain_announcements() == 0 &&
           std::chrono::steady_clock::now() < std::min(announce_by, give_up)) {
      signals_io->run_for(std::chrono::milliseconds(20));
    }
    service->BeginHandoff();
  }
  std::printf("draining: no new sessions; %s %lld running ones for up to %s s\n",
              hand_off ? "handing on" : "waiting for",
              static_cast<long long>(service->replica_state().sessions),
              FormatValue(timeout_s).c_str());
  std::fflush(stdout);
  while (!again && std::chrono::steady_clock::now() < give_up) {
    const server::ReplicaState now = service->replica_state();
    if (now.draining && now.sessions == 0 && now.moving == 0) break;
    signals_io->run_for(std::chrono::milliseconds(20));
  }
  signals->cancel();
  const server::ReplicaState left = service->replica_state();
  const double took_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("drained in %.3f s: %lld sessions still running, %lld moved states unfetched%s\n",
              took_s, static_cast<long long>(left.sessions), static_cast<long long>(left.moving),
              again ? " (second signal)" : "");
  std::fflush(stdout);
}

// The session a client that names nothing gets: the server's defaults (the model's window capped
// by --max-window, rolling positions), an explicit --kv/--window/--sinks/--positions winning.
realtime::SessionDefaults ServerDefaults(const ServeFlags& f, const model::ModelConfig& config) {
  realtime::SessionShape overrides;
  f.kv.ApplyTo(&overrides);
  return realtime::WithOverrides(
      realtime::ServingSessionDefaults(config.context_length, f.max_window), overrides);
}

// The KV pool for the reference session: a given size (--kv-blocks/--kv-pool-mb), or
// PoolFromMachine capped at what the most sessions admission can ever hold need.
struct PoolPlan {
  engine::EngineOptions options;
  std::int64_t blocks_per_session = 0;  // the reference session's projected blocks
  bool capped = false;                  // PoolFromMachine stopped at admission's sessions
};

PoolPlan PlanPool(const ServeFlags& f, const model::Model& m,
                  const realtime::SessionSpec& reference, const realtime::SupervisorOptions& sup) {
  PoolPlan plan;
  plan.options = f.engine.Options(m.config, reference.policy, /*sessions=*/1,
                                  /*needed_tokens_per_session=*/1, /*chunk_tokens=*/1);
  plan.blocks_per_session = realtime::ProjectedBlocks(reference, plan.options.block_tokens,
                                                      sup.memory, /*context_limit=*/0);
  if (f.engine.pool_given()) return plan;
  // No more than the most sessions admission can ever hold need (and int-sized block ids).
  const std::int64_t max_sessions = sup.max_sessions > 0
                                        ? std::min(sup.max_sessions, sup.aimd.window.max_limit)
                                        : sup.aimd.window.max_limit;
  const std::int64_t max_blocks = std::min<std::int64_t>(
      std::int64_t{1} << 30, plan.blocks_per_session * std::max<std::int64_t>(1, max_sessions));
  const MachinePool machine = PoolFromMachine(m, plan.options, f.kv_pool_fraction, max_blocks);
  plan.options.kv_blocks = machine.blocks;
  plan.capped = machine.capped;
  return plan;
}

// A pool that cannot hold one default session would refuse every client while /healthz says ok.
// (Full KV: a session grows until it ends; one block lets it start.)
void CheckPoolHoldsOneSession(const kv::PoolStats& pool, const kv::KvPolicy& policy,
                              std::int64_t blocks_per_session) {
  const std::int64_t one_session = policy.mode == kv::KvMode::kWindow ? blocks_per_session : 1;
  if (pool.num_blocks >= one_session) return;
  throw ConfigError("the KV pool has " + std::to_string(pool.num_blocks) +
                    " blocks, fewer than one default session needs (" +
                    std::to_string(one_session) + " blocks for " + policy.ToString() +
                    "): raise --kv-blocks or --kv-pool-mb, or lower --window");
}

// One line: the pool's size, how many default sessions the KV guard lets it hold, the engine it
// belongs to and how it steps.
void PrintPoolLine(const ServeFlags& f, const kv::PoolStats& pool, const kv::KvPolicy& policy,
                   const PoolPlan& plan, const realtime::SupervisorOptions& sup) {
  admission::SessionRequest request;
  request.projected_blocks = plan.blocks_per_session;
  admission::SystemState empty;
  empty.total_blocks = empty.free_blocks = pool.num_blocks;
  const std::int64_t pool_sessions = admission::SessionsThatFit(request, empty, sup.memory);
  const std::string per_what = policy.mode == kv::KvMode::kWindow
                                   ? "at the default window (" + std::to_string(policy.window) +
                                         " tokens + " + std::to_string(policy.sinks) + " sinks)"
                                   : "at the default full KV (" +
                                         std::to_string(plan.blocks_per_session) +
                                         " blocks projected each)";
  std::string why;
  if (!f.engine.pool_given()) {
    why = plan.capped ? " (capped at what the admission limit's sessions need)"
                      : " (" + FormatValue(f.kv_pool_fraction) +
                            " of the memory available after the weights)";
  }
  const int step_tokens = sup.loop.max_step_tokens;
  const std::string steps = step_tokens > 0
                                ? "steps of at most " + std::to_string(step_tokens) + " tokens"
                                : "no step budget";
  std::printf("pool %s = %lld blocks = %lld sessions %s%s; %lld-token blocks, --model %s, %s; %s\n",
              HumanBytes(static_cast<double>(pool.num_blocks * pool.bytes_per_block)).c_str(),
              static_cast<long long>(pool.num_blocks), static_cast<long long>(pool_sessions),
              per_what.c_str(), why.c_str(), static_cast<long long>(pool.block_tokens),
              f.model.model.c_str(), f.engine.ThreadsLine().c_str(), steps.c_str());
}

// The network server's options from the flags, the origins and the token resolved (before the
// model loads: a bad one fails at once). The model's caps and defaults are set once it has.
server::ServerOptions ServerOptionsFrom(const ServeFlags& f) {
  server::ServerOptions so = f.server;
  so.allowed_origins = server::ParseAllowedOrigins(f.allowed_origins);
  so.auth_token = ResolveAuthToken(f);
  if (f.agent_port > 0) so.agent_port = f.agent_port;
  so.replica_id = f.replica_id;
  if (so.replica_id.empty()) so.replica_id = HostName() + ":{port}";  // the bound port
  so.caps.allow_full_kv = !f.no_full_kv;
  return so;
}

// Serves until SIGINT or SIGTERM (a SIGTERM drains or hands sessions on first), then shuts down
// in order. Returns the exit code.
int ServeUntilSignal(const ServeFlags& f, const server::ServerOptions& so,
                     server::EngineService* service, server::HttpServer* http, bool can_move) {
  std::printf("listening on http://%s:%d\n", so.host.c_str(), http->port());
  std::printf("dashboard: http://%s:%d/%s\n", so.host.c_str(), http->port(),
              so.auth_token.empty() ? "" : "#token=<the --auth-token>");
  std::fflush(stdout);
  if (!f.port_file.empty()) {
    const std::string error = WritePortFile(f.port_file, http->port());
    if (!error.empty()) {  // the server is up: shut it down in order, as on a signal
      std::fprintf(stderr, "error: %s\n", error.c_str());
      service->Shutdown();
      http->Stop();
      return 2;
    }
  }
  boost::asio::io_context signals_io;
  boost::asio::signal_set signals(signals_io, SIGINT, SIGTERM);
  int signal_number = 0;
  signals.async_wait([&signal_number](const boost::system::error_code& /*ec*/, int signal) {
    signal_number = signal;
  });
  signals_io.run();  // returns after the first signal
  if (signal_number == SIGTERM && f.drain_timeout_s > 0.0) {
    Drain(service, *http, can_move, &signals_io, &signals, f.drain_timeout_s);
  }
  std::printf("shutting down\n");
  std::fflush(stdout);
  // The engine first: every session ends with reason server_shutdown (in the events and metrics
  // too) and each client is sent session.ended; then every connection gets what is queued and a
  // 1001 close. Bounded: HttpServer::Stop returns within about 3 s.
  service->Shutdown();
  http->Stop();
  return 0;
}

int RunServe(const ServeFlags& f) {
  // Validated before the model loads: a typo fails at once. (--window, --sinks and --max-context
  // are range-checked by CLI11 at parse time.)
  realtime::SupervisorOptions sup = f.admission.Supervisor(/*period_ms=*/0.0);
  ReportingFlags([&] { sup.Validate(); });
  server::ServerOptions so = ServerOptionsFrom(f);
  server::ContinuityOptions continuity = f.continuity;
  continuity.cluster_secret = ResolveClusterSecret(f);
  ReportingFlags([&] {
    so.session_idle.Validate();
    continuity.Validate();
  });
  const model::Model m = f.model.Load();
  const realtime::SessionDefaults defaults = ServerDefaults(f, m.config);
  so.session_defaults = defaults;
  so.caps.vocab_size = m.config.vocab_size;
  // The server's reference session: the default shape (SessionDefaults' period, a and o) with the
  // default KV. The pool's line and the AIMD seed are stated for it.
  const realtime::SessionSpec reference = realtime::ResolveSessionOrThrow({}, defaults);
  const PoolPlan plan = PlanPool(f, m, reference, sup);
  engine::Engine eng(m, plan.options);
  CheckPoolHoldsOneSession(eng.pool_stats(), reference.policy, plan.blocks_per_session);
  eng.WarmUp();  // before the first client: its frames must not pay for JIT and first touch
  engine::SamplerOptions sampler;
  sampler.temperature = f.temperature;
  sampler.Validate();
  serving::EngineBackend backend(&eng, sampler, f.max_context);
  SteadyClock clock;
  PrintPoolLine(f, eng.pool_stats(), reference.policy, plan, sup);
  CalibrateAtStart(&eng, reference, f.admission.aimd_initial_given(), &sup);

  sup.log_to_stderr = !f.quiet;
  sup.reference_session_blocks = plan.blocks_per_session;  // memory admission: default sessions
  telemetry::MetricsRegistry registry;
  server::EngineService service(&backend, &clock, sup, &registry, /*events=*/nullptr, continuity);
  server::HttpServer http(&service, &registry, so, m.tokenizer.get());
  http.Start();
  return ServeUntilSignal(f, so, &service, &http, continuity.can_move());
}

}  // namespace

const AddCommandFlags kAddServeFlags = &AddFlagsAndRun<ServeFlags, RunServe>;

}  // namespace metronome::cli
