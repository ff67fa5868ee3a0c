#include "metronome/loadgen/load_generator.h"

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <variant>

#include "metronome/admission/admission.h"
#include "metronome/base/clock.h"
#include "metronome/base/errors.h"
#include "metronome/realtime/workload.h"
#include "metronome/telemetry/quantile_sketch.h"
#include "metronome/wire/protocol.h"

namespace metronome::loadgen {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using SteadyTime = std::chrono::steady_clock::time_point;

double MsBetween(SteadyTime a, SteadyTime b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct ParsedUrl {
  std::string host;
  std::string port;
  std::string path;
};

ParsedUrl ParseUrl(const std::string& url) {
  const std::string_view scheme = "ws://";
  if (url.rfind(scheme, 0) != 0) {
    throw ConfigError("url = '" + url + "' must start with ws:// (wss is not supported)");
  }
  const std::string rest = url.substr(scheme.size());
  const std::size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  ParsedUrl p;
  p.path = slash == std::string::npos ? "/v1/realtime" : rest.substr(slash);
  if (p.path == "/") p.path = "/v1/realtime";
  const std::size_t colon = authority.rfind(':');
  if (colon == std::string::npos || colon + 1 == authority.size() || colon == 0) {
    throw ConfigError("url = '" + url + "' must name a host and a port (ws://HOST:PORT)");
  }
  p.host = authority.substr(0, colon);
  p.port = authority.substr(colon + 1);
  if (p.host.size() > 2 && p.host.front() == '[' && p.host.back() == ']') {
    p.host = p.host.substr(1, p.host.size() - 2);
  }
  const bool digits =
      std::all_of(p.port.begin(), p.port.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || p.port.size() > 5 || std::stoi(p.port) < 1 || std::stoi(p.port) > 65535) {
    throw ConfigError("url = '" + url + "': port '" + p.port + "' must be in [1, 65535]");
  }
  return p;
}

std::string ReadFile(const std::string& path, const std::string& spec) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("payload = '" + spec + "': cannot open '" + path + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Retry-After's delta-seconds as ms; nullopt when absent or not a plain count of seconds (an
// HTTP-date is not honoured).
std::optional<double> RetryAfterMs(beast::string_view value) {
  if (value.empty() || value.size() > 9) return std::nullopt;
  double seconds = 0.0;
  for (const char c : value) {
    if (c < '0' || c > '9') return std::nullopt;
    seconds = seconds * 10.0 + (c - '0');
  }
  return seconds * 1000.0;
}

// A refusal before the session could be asked for, by a balancer or a full server: the TCP
// connection refused, reset or closed during the handshake, or the upgrade answered 503 (no
// replica or slot free now; with or without Retry-After) or 429. Retried like session.rejected.
bool IsRefusal(beast::error_code ec, int http_status) {
  if (http_status != 0) return http_status == 503 || http_status == 429;
  return ec == net::error::connection_refused || ec == net::error::connection_reset ||
         ec == net::error::eof || ec == http::error::end_of_stream;
}

// A frame the client sent and has not seen answered yet (results come back in order).
struct Outstanding {
  std::int64_t index = 0;
  SteadyTime sent;
};

}  // namespace

PayloadSource PayloadSource::Parse(const std::string& spec) {
  PayloadSource p;
  if (spec.empty() || spec == "random") return p;
  const std::size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string path = colon == std::string::npos ? std::string() : spec.substr(colon + 1);
  if ((kind != "ids" && kind != "text") || path.empty()) {
    throw ConfigError("payload = '" + spec + "' must be 'random', 'ids:FILE' or 'text:FILE'");
  }
  const std::string body = ReadFile(path, spec);
  p.describe = spec;
  if (kind == "ids") {
    p.kind = Kind::kIds;
    std::string token;
    std::int64_t line = 1;
    const auto flush = [&] {
      if (token.empty()) return;
      std::size_t used = 0;
      long long v = -1;
      try {
        v = std::stoll(token, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != token.size() || v < 0 || v > std::numeric_limits<std::int32_t>::max()) {
        throw ConfigError("payload = '" + spec + "': line " + std::to_string(line) + ": '" + token +
                          "' is not a token id (an integer in [0, 2^31))");
      }
      p.ids.push_back(static_cast<TokenId>(v));
      token.clear();
    };
    for (const char c : body) {
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ',') {
        flush();
        if (c == '\n') ++line;
      } else {
        token.push_back(c);
      }
    }
    flush();
    if (p.ids.empty()) throw ConfigError("payload = '" + spec + "': the file holds no ids");
  } else {
    p.kind = Kind::kText;
    std::istringstream words(body);
    std::string w;
    while (words >> w) p.words.push_back(w);
    if (p.words.empty()) throw ConfigError("payload = '" + spec + "': the file holds no words");
  }
  return p;
}

realtime::SessionSpec ClientSession(const LoadGenOptions& o, int vocab) {
  realtime::SessionDefaults defaults;
  defaults.kv_mode = kv::KvMode::kWindow;  // what session.start asks for when the shape says none
  defaults.vocab_size = vocab;
  return realtime::ResolveSessionOrThrow(o.session, defaults);
}

void LoadGenOptions::Validate() const {
  (void)ParseUrl(url);
  (void)ClientSession(*this, /*vocab=*/1);
  population.Validate();
  if (population.sessions > 0 && !population.arrival.empty()) {
    throw ConfigError("sessions = " + std::to_string(population.sessions) + " and arrival = '" +
                      population.arrival + "': give exactly one of them");
  }
  if (vocab < 0) throw ConfigError("vocab = " + std::to_string(vocab) + " must be >= 0");
  if (!(drain_grace_ms >= 0.0) || !(connect_timeout_s > 0.0) || !(sample_interval_s > 0.0)) {
    throw ConfigError(
        "loadgen: drain_grace_ms, connect_timeout_s and sample_interval_s must be > 0");
  }
}

nlohmann::json ReplicaFigures::ToJson() const {
  nlohmann::json j = {{"admitted", admitted},
                      {"ended", ended},
                      {"ended_by_server", ended_by_server},
                      {"dropped", dropped}};
  AddOutcomesTo(j);
  return j;
}

nlohmann::json LoadGenSummary::ToJson() const {
  nlohmann::json j = FrameSummary::ToJson();
  j["frames_sent"] = frames_sent;
  j["lost_frames"] = lost_frames;
  j["refused_frames"] = refused_frames;
  j["outcome_disagreements"] = outcome_disagreements;
  j["after_deadline_frames"] = after_deadline_frames;
  j["errors"] = errors;
  j["connect_failures"] = connect_failures;
  j["connections_refused"] = connections_refused;
  nlohmann::json refusals = nlohmann::json::object();
  for (const auto& [status, n] : upgrade_refusals) refusals[std::to_string(status)] = n;
  j["upgrade_refusals"] = std::move(refusals);
  j["sessions_dropped"] = sessions_dropped;
  j["reconnects"] = reconnects;
  j["moves_followed"] = moves_followed;
  j["sessions_resumed"] = sessions_resumed;
  j["resume_failures"] = resume_failures;
  j["p50_resume_pause_ms"] = realtime::NullIfNan(p50_resume_pause_ms);
  j["p99_resume_pause_ms"] = realtime::NullIfNan(p99_resume_pause_ms);
  j["max_resume_pause_ms"] = realtime::NullIfNan(max_resume_pause_ms);
  nlohmann::json by_replica = nlohmann::json::object();
  for (const auto& [replica, figures] : replicas) by_replica[replica] = figures.ToJson();
  j["replicas"] = std::move(by_replica);
  j["p50_server_latency_ms"] = realtime::NullIfNan(p50_server_latency_ms);
  j["p99_server_latency_ms"] = realtime::NullIfNan(p99_server_latency_ms);
  j["p99_send_lag_ms"] = realtime::NullIfNan(p99_send_lag_ms);
  j["payload"] = payload;
  return j;
}

// ---------------------------------------------------------------------------------------------

struct LoadGenerator::State {
  explicit State(const LoadGenOptions& o, telemetry::EventLog* e)
      : options(o),
        events(e),
        url(ParseUrl(o.url)),
        rng(o.population.seed),
        sample_timer(io),
        arrival_timer(io),
        stop_timer(io) {
    options.Validate();
    if (!o.population.arrival.empty()) {
      arrival = realtime::ArrivalProcess::Parse(o.population.arrival);
    }
    if (!o.population.session_duration.empty()) {
      lifetime = realtime::SessionDuration::Parse(o.population.session_duration);
    }
  }

  struct Client;
  // A session to take back on a new connection (LoadGenOptions::resume): its latest token and
  // everything the client keeps of it (its frame clock, lifetime, payload cursor, replica).
  struct ResumeTicket {
    std::string token;
    double lost_s = 0.0;  // when it was lost: session.moving, or the connection's drop
    std::uint64_t session = 0;
    std::string replica;
    double admitted_s = 0.0;
    double first_ask_s = 0.0;
    double lifetime_s = 0.0;
    SteadyTime first_frame;
    std::int64_t next_index = 0;  // the first frame not sent
    std::size_t cursor = 0;
    // Sent on the lost connection and not answered there: counted lost when it closed, and
    // outstanding again once the session is back (the server keeps results made meanwhile and
    // sends them after session.resumed).
    std::deque<Outstanding> unanswered;
  };

  LoadGenOptions options;
  telemetry::EventLog* events;
  ParsedUrl url;
  std::mt19937_64 rng;
  std::optional<realtime::ArrivalProcess> arrival;
  std::optional<realtime::SessionDuration> lifetime;
  int vocab = 256;
  // options.session resolved with the client's defaults once the vocabulary is known (Run): what
  // every session.start asks for and what frames are judged against.
  realtime::SessionSpec spec;

  net::io_context io;
  tcp::resolver::results_type endpoints;
  net::steady_timer sample_timer;
  net::steady_timer arrival_timer;
  net::steady_timer stop_timer;
  SteadyTime start;
  bool finishing = false;  // the run's duration is over: no new sessions or frames
  std::vector<std::shared_ptr<Client>> clients;
  std::int64_t next_ordinal = 0;
  std::int64_t open_clients = 0;                             // spawned and not done
  std::vector<std::shared_ptr<net::steady_timer>> respawns;  // pending reconnects
  int alarms_logged = 0;

  // Counts (single thread: plain integers).
  LoadGenSummary summary;        // its frame counts are set from `counts` at the end
  realtime::FrameCounts counts;  // every result, as the client judged it
  std::int64_t active = 0;
  std::int64_t waiting = 0;
  telemetry::QuantileSketch client_latency;
  telemetry::QuantileSketch server_latency;
  telemetry::QuantileSketch send_lag;
  telemetry::QuantileSketch resume_pause;
  std::unique_ptr<telemetry::QuantileSketch> recent = std::make_unique<telemetry::QuantileSketch>();
  std::function<void(const LoadGenSample&)>* on_sample = nullptr;
  std::function<void(const ClientFrame&)>* on_frame = nullptr;

  [[nodiscard]] double Now() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  void Trace(std::string_view type, nlohmann::json fields) {
    if (events != nullptr && events->enabled())
      events->Write(Now() * 1000.0, type, std::move(fields));
  }

  void FetchVocab();
  // How long a client refused `tries` times in a row waits, from the refusal's hint (the server's
  // retry_after_ms, a Retry-After; at least 1 ms): RetryBackoffMs, one rule for every refusal.
  [[nodiscard]] static double BackoffMs(double hint_ms, std::int64_t tries) {
    return admission::RetryBackoffMs(std::max(1.0, hint_ms), tries, admission::kRetryBackoffCapMs);
  }
  // The same client on a new connection after wait_ms (counted in reconnects); it keeps its
  // refusals in a row (`tries`) and when it first asked (first_ask_s, for its patience).
  // With a ticket the new connection takes that session back instead of asking for one.
  void Respawn(bool population, std::int64_t tries, double wait_ms, double first_ask_s,
               std::optional<ResumeTicket> ticket = std::nullopt);
  // A new connection; a reconnect passes on the client's refusals in a row and first ask.
  std::shared_ptr<Client> SpawnClient(bool population, std::int64_t refusals = 0,
                                      std::optional<double> first_ask_s = std::nullopt,
                                      std::optional<ResumeTicket> ticket = std::nullopt);
  // A client that asks for the first time (an arrival, or one of the fixed population): counted
  // in the summary's arrivals, then spawned. Reconnects (Respawn) are the same client.
  void Arrive(bool population) {
    ++summary.arrivals;
    SpawnClient(population);
  }
  void ScheduleArrival(double after_s);
  void ScheduleSample();
  void Finish();
  void StopWhenIdle();
  LoadGenSample Sample() const;
};

// One simulated client: one connection, at most one session at a time.
struct LoadGenerator::State::Client : std::enable_shared_from_this<Client> {
  enum class Phase : std::uint8_t {
    kConnecting,
    kAsking,
    kResuming,  // session.resume sent, waiting for session.resumed
    kRetryWait,
    kStreaming,
    kDraining,
    kEnding,
    kDone
  };

  Client(State* s, std::int64_t ord, bool pop)
      : st(s),
        ordinal(ord),
        population(pop),
        ws(s->io),
        timer(s->io),
        payload_rng(s->options.population.seed * 1000003ULL + static_cast<std::uint64_t>(ord)) {
    if (st->lifetime) lifetime_s = st->lifetime->Sample(st->rng);
    if (population && !st->options.population.aligned_phases) {
      phase_ms = std::uniform_real_distribution<double>(0.0, st->spec.period_ms)(st->rng);
    }
    const auto& p = st->options.payload;
    if (p.kind == PayloadSource::Kind::kIds) {
      cursor = static_cast<std::size_t>(ord * 7919) % p.ids.size();
    } else if (p.kind == PayloadSource::Kind::kText) {
      cursor = static_cast<std::size_t>(ord * 7919) % p.words.size();
    }
  }

  State* st;
  std::int64_t ordinal;
  bool population;
  websocket::stream<beast::tcp_stream> ws;
  net::steady_timer timer;
  std::mt19937_64 payload_rng;
  std::size_t cursor = 0;
  double lifetime_s = std::numeric_limits<double>::infinity();
  double phase_ms = 0.0;
  Phase phase = Phase::kConnecting;
  double first_ask_s = 0.0;
  std::int64_t refusals = 0;  // in a row, for the retry backoff
  double admitted_s = 0.0;
  std::uint64_t session = 0;
  std::string replica;                   // session.started's, once admitted
  std::string resume_token;              // the latest session.started / session.resumed gave
  std::optional<ResumeTicket> resuming;  // this connection takes that session back
  std::int64_t next_index = 0;
  SteadyTime first_frame;
  websocket::response_type upgrade_response;  // the server's (or a balancer's) answer
  std::deque<Outstanding> outstanding;
  beast::flat_buffer read_buffer;
  struct Message {
    std::string bytes;
    bool binary = false;
  };
  std::deque<Message> send_queue;
  bool writing = false;

  void Start(std::optional<double> asked_since_s = std::nullopt) {
    ++st->waiting;
    first_ask_s = asked_since_s.value_or(st->Now());
    beast::get_lowest_layer(ws).expires_after(std::chrono::duration_cast<Nanos>(
        std::chrono::duration<double>(st->options.connect_timeout_s)));
    beast::get_lowest_layer(ws).async_connect(
        st->endpoints, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
          self->OnConnect(ec);
        });
  }

  void OnConnect(beast::error_code ec) {
    if (ec) return Fail("connect", ec);
    // Frames are small and due now: Nagle's algorithm would hold one behind the server's delayed
    // ACK (~40 ms on Linux) and the client would measure that instead of the server.
    beast::error_code ignored;
    beast::get_lowest_layer(ws).socket().set_option(tcp::no_delay(true), ignored);
    ws.set_option(websocket::stream_base::decorator(
        [token = st->options.auth_token](websocket::request_type& req) {
          req.set(http::field::user_agent, "metronome-loadgen");
          if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
        }));
    ws.async_handshake(upgrade_response, st->url.host + ":" + st->url.port, st->url.path,
                       [self = shared_from_this()](beast::error_code e) { self->OnHandshake(e); });
  }

  void OnHandshake(beast::error_code ec) {
    if (ec) return Fail("handshake", ec);
    beast::get_lowest_layer(ws).expires_never();
    ws.set_option(websocket::stream_base::timeout::suggested(beast::role_type::client));
    ws.read_message_max(std::size_t{16} << 20);
    Read();
    if (resuming) return Resume();
    Ask();
  }

  void Fail(const char* what, beast::error_code ec) {
    if (phase == Phase::kDone) return;
    bool again = false;  // worth a new connection
    if (phase == Phase::kConnecting) {
      // An HTTP answer instead of the upgrade (the response's default status is 200: only a
      // declined upgrade has read one).
      const int status =
          ec == websocket::error::upgrade_declined ? upgrade_response.result_int() : 0;
      if (IsRefusal(ec, status)) return Refused(what, ec, status);
      ++st->summary.connect_failures;
      if (status != 0) {  // refused, with a reason
        ++st->summary.upgrade_refusals[status];
        again = true;
      }
      again = again || resuming.has_value();  // a session to take back is never dropped here
      st->Trace("error", {{"client", ordinal},
                          {"what", what},
                          {"message", ec.message()},
                          {"http_status", status}});
    } else if (phase != Phase::kEnding) {
      st->Trace("error", {{"client", ordinal}, {"what", what}, {"message", ec.message()}});
      // Lost while asking or waiting to ask again: the server went away before admitting it.
      again = phase == Phase::kAsking || phase == Phase::kRetryWait || phase == Phase::kResuming;
    }
    if (phase == Phase::kStreaming && st->options.resume && !resume_token.empty() &&
        st->options.reconnect && !st->finishing) {
      // The conversation is not over: take it back on a new connection.
      return HandOver(/*moving=*/false);
    }
    if (phase == Phase::kStreaming || phase == Phase::kDraining) {
      // The session was open and nobody ended it: the connection (the server) went away.
      ++st->summary.sessions_dropped;
      ++st->summary.replicas[replica].dropped;
      st->Trace("session_end", {{"session", session},
                                {"reason", "dropped"},
                                {"replica", replica},
                                {"lifetime_s", st->Now() - admitted_s}});
      again = phase == Phase::kStreaming;
      refusals = 0;
    }
    const std::int64_t tries = refusals + 1;
    std::optional<ResumeTicket> ticket = std::move(resuming);
    const double asked_since_s = ticket ? ticket->first_ask_s : st->Now();
    Done();
    if (again && st->options.reconnect && !st->finishing) {
      st->Respawn(population, tries, BackoffMs(st->spec.period_ms, tries), asked_since_s,
                  std::move(ticket));
    }
  }

  // The session goes on elsewhere (session.moving) or after its connection dropped: this
  // connection closes without ending it, and a new one takes it back with session.resume (at
  // once after a move, after the first backoff step after a drop).
  void HandOver(bool moving) {
    ResumeTicket t{.token = resume_token,
                   .lost_s = st->Now(),
                   .session = session,
                   .replica = replica,
                   .admitted_s = admitted_s,
                   .first_ask_s = first_ask_s,
                   .lifetime_s = lifetime_s,
                   .first_frame = first_frame,
                   .next_index = next_index,
                   .cursor = cursor,
                   .unanswered = outstanding};
    st->Trace("session_moving", {{"session", session},
                                 {"replica", replica},
                                 {"cause", moving ? "session.moving" : "dropped"}});
    if (moving) ++st->summary.moves_followed;
    // Not ended: the session is between connections (Respawn counts it as waiting, then the new
    // connection does until session.resumed). Frames sent and not answered here are lost until
    // the session is back (the ticket keeps them).
    --st->active;
    Close();
    const double wait_ms = moving ? 0.0 : BackoffMs(st->spec.period_ms, 1);
    const double asked_since_s = t.first_ask_s;
    st->Respawn(population, 0, wait_ms, asked_since_s, std::move(t));
  }

  void Resume() {
    phase = Phase::kResuming;
    Send(nlohmann::json{{"type", "session.resume"},
                        {"resume_token", resuming->token},
                        {"client_ref", "c" + std::to_string(ordinal)}}
             .dump(),
         false);
  }

  // The replica a session.started or session.resumed names ("" when the server names none).
  static std::string ReplicaOf(const nlohmann::json& j) {
    return j.contains("replica") && j["replica"].is_string() ? j["replica"].get<std::string>()
                                                             : std::string();
  }

  // session.resumed: the session goes on here, from the server's next frame, on its own clock.
  void OnResumed(const nlohmann::json& j) {
    ResumeTicket t = std::move(*resuming);
    resuming.reset();
    // Answered here if the server still has them (OnResult settles the rest as lost).
    st->summary.lost_frames -= static_cast<std::int64_t>(t.unanswered.size());
    outstanding = std::move(t.unanswered);
    session = j.value("session", std::uint64_t{0});
    resume_token = j.value("resume_token", "");
    replica = ReplicaOf(j);
    admitted_s = t.admitted_s;
    lifetime_s = t.lifetime_s;
    first_frame = t.first_frame;
    cursor = t.cursor;
    // On the session's own clock: the frame due within the last period is sent now (late, if at
    // all); the ones due before it were missed (never sent). The server counts its own missed
    // frames by the same rule (session.resumed's missed_frames, in the trace).
    const double behind_periods =
        MsBetween(t.first_frame, std::chrono::steady_clock::now()) / st->spec.period_ms;
    next_index = std::max(t.next_index, static_cast<std::int64_t>(std::floor(behind_periods)));
    const std::int64_t missed = next_index - t.next_index;
    for (std::int64_t i = 0; i < missed; ++i) {
      st->counts.Count(realtime::FrameOutcome::kMissed);
      st->summary.replicas[replica].Count(realtime::FrameOutcome::kMissed);
    }
    const double pause_ms = (st->Now() - t.lost_s) * 1000.0;
    st->resume_pause.Add(pause_ms);
    st->summary.max_resume_pause_ms = std::isnan(st->summary.max_resume_pause_ms)
                                          ? pause_ms
                                          : std::max(st->summary.max_resume_pause_ms, pause_ms);
    ++st->summary.sessions_resumed;
    --st->waiting;
    ++st->active;
    refusals = 0;
    st->Trace("resumed", {{"session", session},
                          {"was", t.session},
                          {"replica", replica},
                          {"from_replica", t.replica},
                          {"next_frame", next_index},
                          {"missed_frames", missed},
                          {"server_next_frame", j.value("next_frame", std::int64_t{0})},
                          {"server_missed_frames", j.value("missed_frames", std::int64_t{0})},
                          {"pause_ms", pause_ms}});
    phase = Phase::kStreaming;
    ScheduleFrame();
  }

  // A refusal with a retry hint (a draining replica reached before the balancer saw it drain, a
  // full one) is a rejection: the session is taken back on a new connection after the hint's
  // backoff, through the balancer. Without one (the token is spent, expired or unknown, or the
  // state cannot be fetched) the session is lost.
  void OnResumeRejected(const nlohmann::json& j) {
    const double hint_ms = j.value("retry_after_ms", 0.0);
    if (!(hint_ms > 0.0) || !st->options.reconnect || st->finishing) {
      return ResumeRefused(j.value("reason", "rejected"));
    }
    ++st->summary.rejected;
    const double retry_ms = BackoffMs(hint_ms, ++refusals);
    st->Trace("admission", {{"client", ordinal},
                            {"admitted", false},
                            {"reason", j.value("reason", "")},
                            {"resuming", resuming->session},
                            {"retry_after_ms", hint_ms},
                            {"wait_ms", retry_ms}});
    const std::int64_t tries = refusals;
    std::optional<ResumeTicket> ticket = std::move(resuming);
    const double asked_since_s = ticket->first_ask_s;
    Done();
    st->Respawn(population, tries, retry_ms, asked_since_s, std::move(ticket));
  }

  // The server would not take the session back: it is lost (counted as dropped, by the reason),
  // and this client asks for a new one on this connection, as after a drop without resume.
  void ResumeRefused(const std::string& reason) {
    const ResumeTicket t = std::move(*resuming);
    resuming.reset();
    ++st->summary.resume_failures[reason];
    ++st->summary.sessions_dropped;
    ++st->summary.replicas[t.replica].dropped;
    ++st->summary.replicas[t.replica].ended;
    st->Trace("session_end", {{"session", t.session},
                              {"reason", "dropped"},
                              {"resume_refused", reason},
                              {"replica", t.replica},
                              {"lifetime_s", st->Now() - t.admitted_s}});
    Ask();
  }

  // Refused before the session could be asked for (IsRefusal): a rejection, not an error. The
  // client waits as after session.rejected, from Retry-After when the answer has one (else from
  // its period), then asks again on a new connection, unless its patience runs out first.
  void Refused(const char* what, beast::error_code ec, int http_status) {
    ++st->summary.rejected;
    std::optional<double> hint_ms;
    if (http_status != 0) {
      ++st->summary.upgrade_refusals[http_status];
      hint_ms = RetryAfterMs(upgrade_response[http::field::retry_after]);
    } else {
      ++st->summary.connections_refused;
    }
    const double retry_ms = BackoffMs(hint_ms.value_or(st->spec.period_ms), ++refusals);
    st->Trace("admission", {{"client", ordinal},
                            {"admitted", false},
                            {"reason", http_status != 0 ? "http_" + std::to_string(http_status)
                                                        : std::string(what) + ": " + ec.message()},
                            {"retry_after_ms", hint_ms ? nlohmann::json(*hint_ms) : nullptr},
                            {"wait_ms", retry_ms}});
    if (OutOfPatience(retry_ms)) return Done();
    const std::int64_t tries = refusals;
    const double asked_since_s = first_ask_s;
    std::optional<ResumeTicket> ticket = std::move(resuming);
    Done();
    if (st->options.reconnect && !st->finishing) {
      st->Respawn(population, tries, retry_ms, asked_since_s, std::move(ticket));
    }
  }

  // Leaves for good: outstanding frames are lost, counts settle, the socket closes.
  // An arriving client whose next try, retry_ms from now, would fall past its patience gives up:
  // counted and traced as abandoned. Population clients never do.
  bool OutOfPatience(double retry_ms) {
    // A session being taken back is not a new client's ask: it waits as long as the server lets
    // it (a resume refused for its window ends it, counted).
    if (population || resuming ||
        st->Now() + retry_ms / 1000.0 - first_ask_s <= st->options.population.patience_s) {
      return false;
    }
    ++st->summary.abandoned;
    st->Trace("abandoned", {{"client", ordinal}, {"waited_s", st->Now() - first_ask_s}});
    return true;
  }

  void Done() {
    if (phase == Phase::kDone) return;
    if (phase == Phase::kStreaming || phase == Phase::kDraining || phase == Phase::kEnding) {
      --st->active;
      ++st->summary.replicas[replica].ended;
    } else {
      --st->waiting;
    }
    Close();
    st->StopWhenIdle();
  }

  // This connection is over: its unanswered frames are lost, the socket closes. The session's
  // counts are the caller's (Done ends it, HandOver keeps it for the next connection).
  void Close() {
    st->summary.lost_frames += static_cast<std::int64_t>(outstanding.size());
    outstanding.clear();
    phase = Phase::kDone;
    --st->open_clients;
    timer.cancel();
    beast::error_code ignored;
    beast::get_lowest_layer(ws).socket().shutdown(tcp::socket::shutdown_both, ignored);
    beast::get_lowest_layer(ws).close();
  }

  void Ask() {
    if (st->finishing) return Done();
    phase = Phase::kAsking;
    const realtime::SessionShape& shape = st->options.session;
    const realtime::SessionSpec& spec = st->spec;
    nlohmann::json j = {{"type", "session.start"},
                        {"period_ms", spec.period_ms},
                        {"deadline_ms", spec.deadline_ms},
                        {"tokens_per_frame", spec.input_tokens_per_frame},
                        {"output_tokens_per_frame", spec.output_tokens_per_frame},
                        {"client_ref", "c" + std::to_string(ordinal)}};
    // Only what the user named: an absent field gets the server's default (a client that names no
    // KV policy gets the server's, window KV unless it runs `--kv full`).
    nlohmann::json kv = nlohmann::json::object();
    if (shape.kv_mode) kv["policy"] = kv::ToString(*shape.kv_mode);
    if (spec.policy.mode == kv::KvMode::kWindow) {
      if (shape.window) kv["window"] = *shape.window;
      if (shape.sinks) kv["sinks"] = *shape.sinks;
    }
    if (shape.positions) kv["positions"] = kv::ToString(*shape.positions);
    if (!kv.empty()) j["kv"] = std::move(kv);
    if (!spec.prompt.empty()) j["prompt"] = {{"ids", spec.prompt}};
    Send(j.dump(), false);
  }

  void Send(std::string bytes, bool binary) {
    send_queue.push_back({std::move(bytes), binary});
    if (!writing) WriteNext();
  }

  void WriteNext() {
    if (send_queue.empty() || phase == Phase::kDone) {
      writing = false;
      return;
    }
    writing = true;
    ws.binary(send_queue.front().binary);
    ws.async_write(net::buffer(send_queue.front().bytes),
                   [self = shared_from_this()](beast::error_code ec, std::size_t) {
                     self->send_queue.pop_front();
                     if (ec) return self->Fail("write", ec);
                     self->WriteNext();
                   });
  }

  void Read() {
    ws.async_read(read_buffer, [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) return self->Fail("read", ec);
      const std::string text = beast::buffers_to_string(self->read_buffer.data());
      self->read_buffer.consume(self->read_buffer.size());
      self->OnMessage(text);
      if (self->phase != Phase::kDone) self->Read();
    });
  }

  void OnMessage(const std::string& text) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
      ++st->summary.errors;
      st->Trace("error", {{"client", ordinal}, {"what", "unparsable server message"}});
      return;
    }
    const std::string type = j["type"];
    if (type == "session.started") {
      OnStarted(j);
    } else if (type == "session.resumed" && phase == Phase::kResuming) {
      OnResumed(j);
    } else if (type == "session.moving") {
      if (phase == Phase::kStreaming && st->options.resume && !st->finishing) {
        resume_token = j.value("resume_token", resume_token);
        return HandOver(/*moving=*/true);
      }
      // Ending anyway (or not resuming): the move ends it here.
      st->Trace("session_end", {{"session", session}, {"reason", "moving"}});
      Done();
    } else if (type == "session.rejected" && phase == Phase::kResuming) {
      OnResumeRejected(j);
    } else if (type == "session.rejected") {
      OnRejected(j);
    } else if (type == "frame.result") {
      OnResult(j);
    } else if (type == "alarm") {
      if (j.value("kind", "") == "mute") ++st->counts.mute_alarms;
      if (st->alarms_logged < st->options.alarms_to_stderr) {
        ++st->alarms_logged;
        std::fprintf(
            stderr, "[alarm] t=%.1f s session %llu %s: %s%s\n", st->Now(),
            static_cast<unsigned long long>(session), j.value("kind", "").c_str(),
            j.value("detail", "").c_str(),
            st->alarms_logged == st->options.alarms_to_stderr ? " (further alarms counted)" : "");
      }
      st->Trace(
          "alarm",
          {{"session", session}, {"kind", j.value("kind", "")}, {"detail", j.value("detail", "")}});
    } else if (type == "session.ended") {
      const std::string reason = j.value("reason", "");
      if (reason != "client") {
        ++st->summary.ended_by_error;
        ++st->summary.replicas[replica].ended_by_server;
      }
      st->Trace("session_end", {{"session", session},
                                {"reason", reason},
                                {"frames", j.value("frames", 0)},
                                {"lifetime_s", st->Now() - admitted_s}});
      Done();
    } else if (type == "error") {
      OnError(j);
    }
  }

  void OnStarted(const nlohmann::json& j) {
    session = j.value("session", std::uint64_t{0});
    resume_token = j.value("resume_token", "");
    replica = ReplicaOf(j);
    --st->waiting;
    ++st->active;
    st->summary.active_peak = std::max(st->summary.active_peak, st->active);
    ++st->summary.admitted;
    ++st->summary.replicas[replica].admitted;
    admitted_s = st->Now();
    st->Trace("admission", {{"session", session},
                            {"admitted", true},
                            {"replica", replica},
                            {"wait_s", admitted_s - first_ask_s}});
    phase = Phase::kStreaming;
    first_frame = std::chrono::steady_clock::now() + FromMs(phase_ms);
    next_index = 0;
    ScheduleFrame();
  }

  void OnRejected(const nlohmann::json& j) {
    ++st->summary.rejected;
    const double hint_ms = std::max(1.0, j.value("retry_after_ms", 1000.0));
    // Exponential backoff from the server's hint: a crowd refused again and again thins out.
    const double retry_ms = BackoffMs(hint_ms, ++refusals);
    st->Trace("admission", {{"client", ordinal},
                            {"admitted", false},
                            {"reason", j.value("reason", "")},
                            {"retry_after_ms", hint_ms},
                            {"wait_ms", retry_ms}});
    if (OutOfPatience(retry_ms)) return Done();
    if (j.value("reason", "") == "shutdown" && st->options.reconnect) {
      // This server is draining: asking it again cannot help, a new connection (through a
      // balancer, to another replica) can.
      const double asked_since_s = first_ask_s;
      Done();
      return st->Respawn(population, refusals, BackoffMs(st->spec.period_ms, refusals),
                         asked_since_s);
    }
    phase = Phase::kRetryWait;
    timer.expires_after(FromMs(retry_ms));
    timer.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec && self->phase == Phase::kRetryWait) self->Ask();
    });
  }

  void OnResult(const nlohmann::json& j) {
    const SteadyTime now = std::chrono::steady_clock::now();
    const std::int64_t index = j.value("frame", std::int64_t{-1});
    while (!outstanding.empty() && outstanding.front().index < index) {
      ++st->summary.lost_frames;  // the server dropped it without a result
      outstanding.pop_front();
    }
    if (outstanding.empty() || outstanding.front().index != index) {
      ++st->summary.errors;
      st->Trace("error",
                {{"session", session}, {"what", "result for a frame not sent"}, {"frame", index}});
      return;
    }
    const double latency_ms = MsBetween(outstanding.front().sent, now);
    outstanding.pop_front();
    const std::size_t outputs = j.contains("ids") && j["ids"].is_array() ? j["ids"].size() : 0;
    const auto asked = static_cast<std::size_t>(st->spec.output_tokens_per_frame);
    const bool miss = latency_ms > st->spec.deadline_ms;
    LoadGenSummary& s = st->summary;
    realtime::FrameOutcome judged = realtime::FrameOutcome::kOk;
    if (asked > 0 && outputs == 0) {
      judged = realtime::FrameOutcome::kStarved;
      if (!std::isfinite(s.first_starved_at_s)) s.first_starved_at_s = st->Now();
    } else if (outputs < asked) {
      judged = realtime::FrameOutcome::kShort;
    } else if (miss) {
      judged = realtime::FrameOutcome::kLate;
    }
    st->counts.Count(judged);
    st->summary.replicas[replica].Count(judged);
    const std::string_view outcome = telemetry::ToString(judged);
    if (miss) ++s.after_deadline_frames;
    const std::string server_outcome = j.value("outcome", "");
    if (server_outcome != outcome) ++s.outcome_disagreements;
    const double server_ms = j.value("latency_ms", std::numeric_limits<double>::quiet_NaN());
    st->client_latency.Add(latency_ms);
    st->recent->Add(latency_ms);
    st->server_latency.Add(server_ms);
    if (st->on_frame != nullptr && *st->on_frame) {
      (*st->on_frame)(
          {st->Now(), session, index, outcome, latency_ms, server_outcome, server_ms, outputs});
    }
    if (st->events != nullptr && st->events->enabled()) {
      st->Trace("frame", {{"session", session},
                          {"frame", index},
                          {"outcome", outcome},
                          {"latency_ms", latency_ms},
                          {"server_outcome", server_outcome},
                          {"server_latency_ms", server_ms},
                          {"num_tokens", outputs}});
    }
    if (phase == Phase::kDraining) {
      if (outstanding.empty()) return End();
      ArmDrainTimer();  // the server is still answering: give the next frame its time too
    }
  }

  void OnError(const nlohmann::json& j) {
    ++st->summary.errors;
    const std::string code = j.value("code", "");
    const bool about_a_frame = j.contains("frame") && j["frame"].is_number_integer();
    nlohmann::json line = {
        {"session", session}, {"code", code}, {"message", j.value("message", "")}};
    if (about_a_frame) line["frame"] = j["frame"];
    st->Trace("error", std::move(line));
    if (about_a_frame) {
      const std::int64_t index = j["frame"];
      const auto it = std::find_if(outstanding.begin(), outstanding.end(),
                                   [&](const Outstanding& f) { return f.index == index; });
      if (it != outstanding.end()) {
        outstanding.erase(it);
        ++st->summary.refused_frames;
      }
    } else if (phase == Phase::kResuming) {
      ResumeRefused(code);  // e.g. bad_field: a token the server cannot read
    } else if (phase == Phase::kAsking) {
      // session.start itself was refused (bad parameters): retrying unchanged cannot help.
      std::fprintf(stderr, "loadgen: session.start refused: %s: %s\n", code.c_str(),
                   j.value("message", "").c_str());
      Done();
    }
  }

  void ScheduleFrame() {
    timer.expires_at(first_frame + next_index * FromMs(st->spec.period_ms));
    timer.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->OnFrameDue();
    });
  }

  void OnFrameDue() {
    if (phase != Phase::kStreaming) return;
    if (st->finishing || st->Now() - admitted_s >= lifetime_s) return BeginEnd();
    const SteadyTime scheduled = first_frame + next_index * FromMs(st->spec.period_ms);
    const SteadyTime now = std::chrono::steady_clock::now();
    st->send_lag.Add(std::max(0.0, MsBetween(scheduled, now)));
    SendFrame(next_index);
    outstanding.push_back({next_index, now});
    ++st->summary.frames_sent;
    ++next_index;
    ScheduleFrame();
  }

  void SendFrame(std::int64_t index) {
    const LoadGenOptions& o = st->options;
    const auto a = static_cast<std::size_t>(st->spec.input_tokens_per_frame);
    if (o.payload.kind == PayloadSource::Kind::kText) {
      std::string text;
      for (std::size_t i = 0; i < a; ++i) {
        if (i > 0) text.push_back(' ');
        text += o.payload.words[cursor];
        cursor = (cursor + 1) % o.payload.words.size();
      }
      Send(nlohmann::json{{"type", "frame"}, {"session", session}, {"index", index}, {"text", text}}
               .dump(),
           false);
      return;
    }
    wire::FrameRequest f;
    f.session = session;
    f.index = index;
    wire::TokenIds ids(a);
    for (auto& id : ids) {
      if (o.payload.kind == PayloadSource::Kind::kIds) {
        id = o.payload.ids[cursor];
        cursor = (cursor + 1) % o.payload.ids.size();
      } else {
        id = static_cast<TokenId>(payload_rng() % static_cast<std::uint64_t>(st->vocab));
      }
    }
    if (o.binary_frames) {
      f.input = std::move(ids);
      const std::vector<std::byte> bytes = wire::EncodeBinaryFrame(f);
      Send(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), true);
    } else {
      Send(nlohmann::json{{"type", "frame"}, {"session", session}, {"index", index}, {"ids", ids}}
               .dump(),
           false);
    }
  }

  // Stop sending; wait for every outstanding frame, then end. The server answers a session's frames
  // in order, each by its deadline (starved) or when computed (late): the drain ends early only if
  // no answer comes for a deadline plus the grace (a server that stopped answering).
  void BeginEnd() {
    phase = Phase::kDraining;
    if (outstanding.empty()) return End();
    ArmDrainTimer();
  }

  void ArmDrainTimer() {
    timer.expires_after(FromMs(st->spec.deadline_ms + st->options.drain_grace_ms));
    timer.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec && self->phase == Phase::kDraining) self->End();
    });
  }

  void End() {
    phase = Phase::kEnding;
    Send(nlohmann::json{{"type", "session.end"}, {"session", session}}.dump(), false);
    // session.ended closes the client; a server that never answers is not waited for forever.
    timer.expires_after(std::chrono::seconds(2));
    timer.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec && self->phase == Phase::kEnding) self->Done();
    });
  }

  // The run is over: sessions drain and end; clients not yet admitted leave.
  void Finish() {
    switch (phase) {
      case Phase::kStreaming:
        timer.cancel();
        BeginEnd();
        break;
      case Phase::kConnecting:
      case Phase::kAsking:
      case Phase::kResuming:
      case Phase::kRetryWait:
        Done();
        break;
      default:
        break;
    }
  }
};

void LoadGenerator::State::FetchVocab() {
  // One plain HTTP request before the run: it proves the server is there (and the token good) and
  // reads the vocabulary random payloads are drawn from.
  tcp::socket socket(io);
  beast::error_code ec;
  net::connect(socket, endpoints, ec);
  if (ec) {
    throw std::runtime_error("cannot reach the server at " + options.url + ": " + ec.message());
  }
  http::request<http::empty_body> req(http::verb::get, "/v1/stats", 11);
  req.set(http::field::host, url.host);
  if (!options.auth_token.empty()) {
    req.set(http::field::authorization, "Bearer " + options.auth_token);
  }
  http::write(socket, req, ec);
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  if (!ec) http::read(socket, buffer, res, ec);
  if (ec) throw std::runtime_error("GET /v1/stats from " + options.url + ": " + ec.message());
  if (res.result() == http::status::unauthorized) {
    throw std::runtime_error(
        "the server at " + options.url + " wants an access token and refused auth_token = " +
        (options.auth_token.empty() ? std::string("'' (none given)") : "the one given"));
  }
  if (options.vocab > 0) {
    vocab = options.vocab;
    return;
  }
  const nlohmann::json stats = nlohmann::json::parse(res.body(), nullptr, false);
  if (stats.is_object() && stats.contains("caps") && stats["caps"].contains("vocab_size") &&
      stats["caps"]["vocab_size"].is_number_integer() && stats["caps"]["vocab_size"] > 0) {
    vocab = stats["caps"]["vocab_size"];
  }
}

std::shared_ptr<LoadGenerator::State::Client> LoadGenerator::State::SpawnClient(
    bool population, std::int64_t refusals, std::optional<double> first_ask_s,
    std::optional<ResumeTicket> ticket) {
  auto c = std::make_shared<Client>(this, next_ordinal++, population);
  c->refusals = refusals;
  c->resuming = std::move(ticket);
  clients.push_back(c);
  ++open_clients;
  c->Start(first_ask_s);
  return c;
}

void LoadGenerator::State::Respawn(bool population, std::int64_t tries, double wait_ms,
                                   double first_ask_s, std::optional<ResumeTicket> ticket) {
  auto timer = std::make_shared<net::steady_timer>(io);
  respawns.push_back(timer);
  ++open_clients;         // the client to come: the run does not end while it is pending
  if (ticket) ++waiting;  // a session between connections
  timer->expires_after(FromMs(wait_ms));
  timer->async_wait([this, timer, population, tries, first_ask_s,
                     ticket = std::move(ticket)](beast::error_code ec) mutable {
    std::erase(respawns, timer);
    --open_clients;
    if (ticket) --waiting;
    if (ec || finishing) return StopWhenIdle();
    ++summary.reconnects;
    SpawnClient(population, tries, first_ask_s, std::move(ticket));
  });
}

void LoadGenerator::State::ScheduleArrival(double after_s) {
  const double next_s = arrival->NextAfter(after_s, rng);
  if (next_s >= options.population.duration_s) return;
  arrival_timer.expires_at(start + FromMs(next_s * 1000.0));
  arrival_timer.async_wait([this, next_s](beast::error_code ec) {
    if (ec || finishing) return;
    Arrive(false);
    ScheduleArrival(next_s);
  });
}

LoadGenSample LoadGenerator::State::Sample() const {
  LoadGenSample s;
  s.t_s = Now();
  s.active = active;
  s.waiting = waiting;
  static_cast<realtime::FrameCounts&>(s) = counts;
  s.admitted = summary.admitted;
  s.rejected = summary.rejected;
  s.errors = summary.errors + summary.connect_failures;
  s.p99_latency_ms_recent = recent->Quantile(0.99);
  return s;
}

void LoadGenerator::State::ScheduleSample() {
  sample_timer.expires_after(FromMs(options.sample_interval_s * 1000.0));
  sample_timer.async_wait([this](beast::error_code ec) {
    // A cancel() cannot recall a handler already queued: check for the end here too.
    if (ec || (finishing && open_clients == 0)) return;
    if (on_sample != nullptr && *on_sample) (*on_sample)(Sample());
    recent = std::make_unique<telemetry::QuantileSketch>();
    // Finished clients go (a long run with arrivals would otherwise keep every one).
    std::erase_if(clients, [](const auto& c) { return c->phase == Client::Phase::kDone; });
    ScheduleSample();
  });
}

void LoadGenerator::State::Finish() {
  finishing = true;
  arrival_timer.cancel();
  for (auto& t : std::vector(respawns)) t->cancel();
  for (auto& c : clients) c->Finish();
  // Whatever has not closed by now (a server that stopped answering) is cut off.
  stop_timer.expires_after(FromMs(spec.deadline_ms + options.drain_grace_ms + 3000.0));
  stop_timer.async_wait([this](beast::error_code ec) {
    if (ec) return;
    for (auto& c : clients) c->Done();
  });
  StopWhenIdle();
}

// After the run, the io_context returns once the last client is done and these timers go.
void LoadGenerator::State::StopWhenIdle() {
  if (!finishing || open_clients > 0) return;
  sample_timer.cancel();
  stop_timer.cancel();
}

LoadGenerator::LoadGenerator(const LoadGenOptions& options, telemetry::EventLog* events)
    : state_(std::make_unique<State>(options, events)) {}

LoadGenerator::~LoadGenerator() = default;

LoadGenSummary LoadGenerator::Run() {
  State& st = *state_;
  st.on_sample = &on_sample;
  st.on_frame = &on_frame;
  tcp::resolver resolver(st.io);
  beast::error_code ec;
  st.endpoints = resolver.resolve(st.url.host, st.url.port, ec);
  if (ec) throw std::runtime_error("cannot resolve '" + st.url.host + "': " + ec.message());
  st.FetchVocab();
  st.spec = ClientSession(st.options, st.vocab);

  st.start = std::chrono::steady_clock::now();
  if (st.options.population.sessions > 0) {
    for (std::int64_t i = 0; i < st.options.population.sessions; ++i) st.Arrive(true);
  } else {
    st.ScheduleArrival(0.0);
  }
  st.ScheduleSample();
  net::steady_timer end_timer(st.io);
  end_timer.expires_at(st.start + FromMs(st.options.population.duration_s * 1000.0));
  end_timer.async_wait([&st](beast::error_code e) {
    if (!e) st.Finish();
  });
  st.io.run();

  LoadGenSummary s = st.summary;
  static_cast<realtime::FrameCounts&>(s) = st.counts;
  s.duration_s = st.Now();
  s.deadline_ms = st.spec.deadline_ms;
  s.p50_frame_latency_ms = st.client_latency.Quantile(0.5);
  s.p99_frame_latency_ms = st.client_latency.Quantile(0.99);
  s.p50_server_latency_ms = st.server_latency.Quantile(0.5);
  s.p99_server_latency_ms = st.server_latency.Quantile(0.99);
  s.p99_send_lag_ms = st.send_lag.Quantile(0.99);
  s.p50_resume_pause_ms = st.resume_pause.Quantile(0.5);
  s.p99_resume_pause_ms = st.resume_pause.Quantile(0.99);
  const realtime::SessionShape& shape = st.options.session;
  s.kv_policy =
      !shape.kv_mode ? std::string("server default")
      : st.spec.policy.mode == kv::KvMode::kFull
          ? std::string("full")
          : "window W=" +
                (shape.window ? std::to_string(*shape.window) : std::string("server default")) +
                " S=" +
                (shape.sinks ? std::to_string(*shape.sinks) : std::string("server default"));
  s.payload = st.options.payload.describe;
  return s;
}

}  // namespace metronome::loadgen
