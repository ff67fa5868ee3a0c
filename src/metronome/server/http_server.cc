#include "metronome/server/http_server.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <deque>
#include <optional>
#include <span>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/base/non_copyable.h"
#include "metronome/base/thread_annotations.h"
#include "metronome/server/agent_check.h"
#include "metronome/server/dashboard_assets.h"
#include "metronome/server/http_access.h"
#include "metronome/server/resume_token.h"
#include "metronome/server/session_start.h"
#include "metronome/server/state_fetch.h"

namespace metronome::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Request = http::request<http::string_body>;
using SteadyTime = std::chrono::steady_clock::time_point;

// How long a closing WebSocket waits for the peer's close frame before dropping the socket.
constexpr std::chrono::milliseconds kCloseGrace{1000};
// How long Stop() waits for every connection to finish closing (kCloseGrace and some slack).
constexpr std::chrono::milliseconds kStopWait{3000};
// An upgrade refused for want of a WebSocket slot is told to come back after this long (seconds,
// Retry-After): sessions end and slots free on the scale of seconds.
constexpr int kNoSlotRetryAfterS = 1;
// After an error response that closes the connection, what the client still sends is read and
// dropped for at most this long: closing with unread bytes would reset the connection and could
// destroy the response before the client reads it.
constexpr std::chrono::milliseconds kErrorLinger{1000};
// A request's start line and header fields at most (Beast's default), bytes; beyond: 431.
constexpr std::uint32_t kHeaderLimitBytes = 8192;

std::string_view View(beast::string_view v) { return {v.data(), v.size()}; }

// A connection the server can close on Stop() or evict when the connection cap is reached.
class Closable : NonCopyableNonMovable {
 public:
  virtual ~Closable() = default;
  virtual void Close() = 0;   // at once; any thread
  virtual void GoAway() = 0;  // server shutdown: tell the peer, then close; any thread
  // Holds no session and no request being answered: the first to go when slots run out.
  [[nodiscard]] bool idle() const { return idle_.load(std::memory_order_relaxed); }

 protected:
  void set_idle(bool idle) { idle_.store(idle, std::memory_order_relaxed); }

 private:
  std::atomic<bool> idle_{true};
};

wire::ProtocolError Error(wire::ErrorCode code, std::string message) {
  wire::ProtocolError e;
  e.code = code;
  e.message = std::move(message);
  return e;
}

// Connections are counted against their own cap by kind.
enum class ConnKind : std::uint8_t { kHttp, kWebSocket };
constexpr std::size_t kNumConnKinds = 2;

}  // namespace

std::int64_t SessionIdlePolicy::TimeoutMs(double period_ms) const {
  if (periods <= 0) return 0;
  const double ms = std::clamp(static_cast<double>(periods) * period_ms,
                               static_cast<double>(min_ms), static_cast<double>(max_ms));
  return static_cast<std::int64_t>(std::ceil(ms));
}

void SessionIdlePolicy::Validate() const {
  if (periods < 0) {
    throw ConfigError("session_idle.periods = " + std::to_string(periods) + " must be >= 0");
  }
  if (min_ms < 0 || max_ms < min_ms) {
    throw ConfigError("session_idle.min_ms = " + std::to_string(min_ms) +
                      " must be >= 0 and at most session_idle.max_ms = " + std::to_string(max_ms));
  }
}

struct HttpServer::Impl {
  EngineService* service;
  telemetry::MetricsRegistry* registry;
  ServerOptions options;
  const model::Tokenizer* tokenizer;
  // The most bytes of text one token stands for (its decoded bytes, +1 for a leading space a
  // decoder may drop); 0 without a tokenizer. A text longer than n * this needs more than n tokens.
  std::int64_t max_token_bytes = 0;

  // A registered connection: its client address, kind and registration order (oldest idle first).
  struct Entry {
    std::weak_ptr<Closable> conn;
    std::string address;
    std::uint64_t order = 0;
    ConnKind kind = ConnKind::kHttp;
    bool evicted = false;  // Close() requested to make room; no longer counts against the caps
  };

  // Declared before io: connections unregister while io's leftover handlers are destroyed.
  base::Mutex mu;
  std::unordered_map<Closable*, Entry> conns GUARDED_BY(mu);
  std::unordered_map<std::string, int> live_per_address GUARDED_BY(mu);  // non-evicted entries
  std::array<std::size_t, kNumConnKinds> live GUARDED_BY(mu) = {};       // non-evicted, by kind
  // WebSocket slots promised to upgrades whose connection is not registered yet.
  std::size_t websockets_reserved GUARDED_BY(mu) = 0;
  std::uint64_t next_order GUARDED_BY(mu) = 0;
  bool accepting GUARDED_BY(mu) = true;
  std::string expected_authorization;  // "Bearer <token>", or empty: no token required

  net::io_context io;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  tcp::acceptor acceptor{net::make_strand(io)};
  tcp::acceptor agent_acceptor{net::make_strand(io)};
  std::vector<std::thread> threads;
  std::atomic<int> bound_port{0};
  std::atomic<int> bound_agent_port{0};
  std::atomic<std::int64_t> drain_announcements{0};  // HttpServer::drain_announcements
  bool started = false;
  bool stopped = false;

  Impl(EngineService* s, telemetry::MetricsRegistry* r, const ServerOptions& o,
       const model::Tokenizer* t)
      : service(s), registry(r), options(o), tokenizer(t) {
    options.session_idle.Validate();
    if (!options.auth_token.empty()) expected_authorization = "Bearer " + options.auth_token;
    for (TokenId id = 0; tokenizer != nullptr && id < tokenizer->vocab_size(); ++id) {
      max_token_bytes = std::max(
          max_token_bytes, static_cast<std::int64_t>(tokenizer->DecodeToken(-1, id).size()) + 1);
    }
  }

  // A new (plain HTTP) connection. False when the server is stopping, or at the per-address or
  // the HTTP cap with no idle connection to evict; an evicted one is closed after the lock is
  // released.
  bool RegisterHttp(const std::shared_ptr<Closable>& c, const std::string& address) {
    std::vector<std::shared_ptr<Closable>> victims;
    bool registered = false;
    {
      const base::MutexLock lock(&mu);
      if (!accepting) return false;
      const int per_address = options.max_connections_per_address;
      const auto it = live_per_address.find(address);
      const int from_address = it == live_per_address.end() ? 0 : it->second;
      // The same address's connection of either kind makes room; one of the HTTP kind also frees
      // the HTTP slot the newcomer needs.
      bool room = true;
      if (per_address > 0 && from_address >= per_address) {
        auto victim = EvictOldestIdle(&address, std::nullopt);
        room = victim != nullptr;
        if (room) victims.push_back(std::move(victim));
      }
      if (room &&
          live[Index(ConnKind::kHttp)] >= static_cast<std::size_t>(options.max_http_connections)) {
        auto victim = EvictOldestIdle(nullptr, ConnKind::kHttp);
        room = victim != nullptr;
        if (room) victims.push_back(std::move(victim));
      }
      if (room) {
        Add(c, address, ConnKind::kHttp);
        registered = true;
      }
    }
    // Evicted ones go even when the newcomer did not fit after all: they were idle.
    for (auto& victim : victims) victim->Close();
    return registered;
  }
  // A WebSocket slot for an upgrade, until RegisterWebSocket takes it. False when the server is
  // stopping, or every slot is held by a WebSocket with a session (or one pending) or promised.
  bool ReserveWebSocketSlot() {
    std::shared_ptr<Closable> victim;
    {
      const base::MutexLock lock(&mu);
      if (!accepting) return false;
      if (live[Index(ConnKind::kWebSocket)] + websockets_reserved >=
          static_cast<std::size_t>(options.max_connections)) {
        victim = EvictOldestIdle(nullptr, ConnKind::kWebSocket);
        if (victim == nullptr) return false;
      }
      ++websockets_reserved;
    }
    if (victim) victim->Close();
    return true;
  }
  // Takes the slot ReserveWebSocketSlot promised. False when the server is stopping.
  bool RegisterWebSocket(const std::shared_ptr<Closable>& c, const std::string& address) {
    const base::MutexLock lock(&mu);
    --websockets_reserved;
    if (!accepting) return false;
    Add(c, address, ConnKind::kWebSocket);
    return true;
  }
  // WebSocket slots a newcomer could take now: the cap less the WebSockets holding a session (or
  // one pending) and the promised ones. O(connections).
  std::int64_t FreeWebSocketSlots() {
    const base::MutexLock lock(&mu);
    std::int64_t held = static_cast<std::int64_t>(websockets_reserved);
    for (const auto& [key, e] : conns) {
      if (e.evicted || e.kind != ConnKind::kWebSocket) continue;
      const auto c = e.conn.lock();
      if (c != nullptr && !c->idle()) ++held;
    }
    return std::max<std::int64_t>(0, options.max_connections - held);
  }
  // What the agent and /readyz report.
  ReplicaState State() {
    ReplicaState state = service->replica_state();
    state.free_connection_slots = FreeWebSocketSlots();
    return state;
  }
  static std::size_t Index(ConnKind kind) { return static_cast<std::size_t>(kind); }
  void Add(const std::shared_ptr<Closable>& c, const std::string& address, ConnKind kind)
      REQUIRES(mu) {
    conns.emplace(c.get(),
                  Entry{.conn = c, .address = address, .order = next_order++, .kind = kind});
    ++live_per_address[address];
    ++live[Index(kind)];
  }
  // Marks the oldest idle connection (of `address` and of `kind`, when given) evicted and returns
  // it; null when none is idle. O(connections), only at a cap.
  std::shared_ptr<Closable> EvictOldestIdle(const std::string* address,
                                            std::optional<ConnKind> kind) REQUIRES(mu) {
    Entry* oldest = nullptr;
    std::shared_ptr<Closable> victim;
    for (auto& [key, e] : conns) {
      if (e.evicted || (address != nullptr && e.address != *address)) continue;
      if (kind && e.kind != *kind) continue;
      if (oldest != nullptr && e.order > oldest->order) continue;
      auto c = e.conn.lock();
      if (c == nullptr || !c->idle()) continue;
      oldest = &e;
      victim = std::move(c);
    }
    if (oldest == nullptr) return nullptr;
    oldest->evicted = true;
    --live[Index(oldest->kind)];
    Forget(oldest->address);
    return victim;
  }
  void Forget(const std::string& address) REQUIRES(mu) {
    const auto it = live_per_address.find(address);
    if (it != live_per_address.end() && --it->second <= 0) live_per_address.erase(it);
  }
  void Unregister(Closable* c) {
    const base::MutexLock lock(&mu);
    const auto it = conns.find(c);
    if (it == conns.end()) return;
    if (!it->second.evicted) {
      Forget(it->second.address);
      --live[Index(it->second.kind)];
    }
    conns.erase(it);
  }
  bool Authorized(const Request& req) const {
    if (expected_authorization.empty()) return true;
    return ConstantTimeEquals(View(req[http::field::authorization]), expected_authorization);
  }
  [[nodiscard]] std::chrono::milliseconds handshake_timeout() const {
    return std::chrono::milliseconds(options.handshake_timeout_ms);
  }
  void DoAccept();
  void DoAgentAccept();
};

namespace {

using Impl = HttpServer::Impl;

// ---------------------------------------------------------------------------------------------
// WebSocket connection on /v1/realtime.

class WsConnection final : public Closable, public std::enable_shared_from_this<WsConnection> {
 public:
  WsConnection(tcp::socket&& socket, Impl* srv, std::string address)
      : ws_(std::move(socket)),
        strand_(ws_.get_executor()),
        timer_(strand_),
        idle_timer_(strand_),
        srv_(srv),
        address_(std::move(address)) {}
  ~WsConnection() override { srv_->Unregister(this); }
  WsConnection(const WsConnection&) = delete;
  WsConnection& operator=(const WsConnection&) = delete;

  void Run(Request req) {
    auto timeout = websocket::stream_base::timeout::suggested(beast::role_type::server);
    timeout.handshake_timeout = srv_->handshake_timeout();
    ws_.set_option(timeout);
    ws_.read_message_max(srv_->options.caps.max_message_bytes);
    auto self = shared_from_this();
    auto r = std::make_shared<Request>(std::move(req));
    net::dispatch(strand_, [self, r] {
      self->ws_.async_accept(*r, [self, r](beast::error_code ec) {
        if (ec) {
          self->Gone();
          self->HardClose();
          return;
        }
        self->accepted_ = true;
        if (self->going_away_) {
          self->GoingAway();
          return;
        }
        self->no_session_since_ = std::chrono::steady_clock::now();
        self->ArmConnectionIdleCheck();
        self->DoRead();
      });
    });
  }

  void Close() override {
    auto self = shared_from_this();
    net::post(strand_, [self] { self->HardClose(); });
  }

  void GoAway() override {
    auto self = shared_from_this();
    net::post(strand_, [self] { self->GoingAway(); });
  }

 private:
  struct FrameInfo {
    std::optional<std::int64_t> index;
    bool text = false;
  };
  struct SessionState {
    // Declared in session.start, for error messages (the engine enforces them).
    int tokens_per_frame = 0;
    double period_ms = 0.0;
    std::unordered_map<std::int64_t, FrameInfo> pending;  // by the loop's frame index
    std::int64_t accepted = 0;
    std::int64_t results = 0;
    bool ending = false;
    // The idle rule (SessionIdlePolicy): the session ends when no frame came for idle_after
    // since last_heard (its start, then its latest frame); 0: never.
    SteadyTime last_heard;
    std::chrono::milliseconds idle_after{0};
  };

  // idle(): no session and no session.start on its way; such a connection may be evicted, and is
  // closed once it has been so for connection_idle_timeout_ms.
  void UpdateIdle() {
    const bool now_idle = sessions_.empty() && pending_starts_ == 0;
    if (now_idle && !idle()) {
      no_session_since_ = std::chrono::steady_clock::now();
      ArmConnectionIdleCheck();
    }
    set_idle(now_idle);
  }

  [[nodiscard]] std::chrono::milliseconds connection_idle_timeout() const {
    return std::chrono::milliseconds(srv_->options.connection_idle_timeout_ms);
  }
  void ArmConnectionIdleCheck() {
    if (connection_idle_timeout().count() > 0) {
      ArmIdleCheck(no_session_since_ + connection_idle_timeout());
    }
  }

  // One timer serves every idle rule of the connection: it is due at the earliest deadline known
  // when it was armed; a frame only moves its session's last_heard (no timer work per frame), and
  // OnIdleCheck re-arms for whatever is due next. Strand.
  void ArmIdleCheck(SteadyTime at) {
    if (closed_ || (idle_check_at_ && *idle_check_at_ <= at)) return;
    idle_check_at_ = at;
    idle_timer_.expires_at(at);
    auto self = shared_from_this();
    idle_timer_.async_wait([self](beast::error_code ec) {
      if (!ec) self->OnIdleCheck();
    });
  }

  // Ends the sessions that sent nothing for their idle timeout (session.ended reason idle follows
  // from the engine) and closes the connection when it has held no session for its timeout.
  void OnIdleCheck() {
    idle_check_at_.reset();
    if (closed_) return;
    const SteadyTime now = std::chrono::steady_clock::now();
    std::optional<SteadyTime> next;
    const auto consider = [&next](SteadyTime t) {
      if (!next || t < *next) next = t;
    };
    for (auto& [sid, st] : sessions_) {
      if (st.ending || st.idle_after.count() <= 0) continue;
      const SteadyTime due = st.last_heard + st.idle_after;
      if (due <= now) {
        st.ending = true;
        srv_->service->EndSession(sid, EndReason::kIdle);
      } else {
        consider(due);
      }
    }
    if (sessions_.empty() && pending_starts_ == 0 && connection_idle_timeout().count() > 0) {
      const SteadyTime due = no_session_since_ + connection_idle_timeout();
      if (due <= now) {
        CloseWith(
            websocket::close_code::normal,
            "idle: no session for " + std::to_string(connection_idle_timeout().count()) + " ms");
        return;
      }
      consider(due);
    }
    if (next) ArmIdleCheck(*next);
  }

  // Server shutdown: session.ended (server_shutdown) for every session still open, what is
  // queued, then the close frame 1001; the sessions end. Strand.
  void GoingAway() {
    going_away_ = true;
    if (closed_) return;
    if (!accepted_) return;  // the handshake's handler comes back here
    for (const auto& [sid, st] : sessions_) {
      Send(wire::SessionEnded{
          .session = sid, .reason = wire::EndReason::kServerShutdown, .frames = st.results}
               .Serialize());
    }
    if (closed_) return;  // the queue overflowed: already closing with 1008
    flush_before_close_ = true;
    CloseWith(websocket::close_code::going_away);
    sessions_.clear();  // what the engine reports later is for nobody
  }

  void DoRead() {
    auto self = shared_from_this();
    ws_.async_read(buf_, [self](beast::error_code ec, std::size_t /*n*/) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec) {
      // A message over the size cap is the client's fault (Beast closes with 1009): its sessions
      // end. A network failure leaves them to be resumed.
      Gone(/*keep_sessions=*/ec != websocket::error::message_too_big);
      HardClose();
      return;
    }
    if (closed_) return;  // closing: what arrives now is not acted on
    const auto data = buf_.data();
    if (ws_.got_text()) {
      auto parsed = wire::ParseClientMessage(
          std::string_view(static_cast<const char*>(data.data()), data.size()), srv_->options.caps);
      if (auto* m = std::get_if<wire::ClientMessage>(&parsed)) {
        Handle(std::move(*m));
      } else {
        SendError(std::get<wire::ProtocolError>(parsed));
      }
    } else {
      auto parsed = wire::ParseBinaryFrame(
          std::span<const std::byte>(static_cast<const std::byte*>(data.data()), data.size()),
          srv_->options.caps);
      if (auto* f = std::get_if<wire::FrameRequest>(&parsed)) {
        OnFrameRequest(std::move(*f));
      } else {
        SendError(std::get<wire::ProtocolError>(parsed));
      }
    }
    buf_.consume(buf_.size());
    if (!closed_) DoRead();
  }

  void Handle(wire::ClientMessage&& m) {
    if (auto* s = std::get_if<wire::StartRequest>(&m)) {
      OnStart(std::move(*s));
    } else if (auto* f = std::get_if<wire::FrameRequest>(&m)) {
      OnFrameRequest(std::move(*f));
    } else if (auto* e = std::get_if<wire::EndRequest>(&m)) {
      OnEnd(*e);
    } else if (auto* p = std::get_if<wire::PingRequest>(&m)) {
      Send(wire::Pong{.nonce = p->nonce}.Serialize());
    } else if (auto* r = std::get_if<wire::ResumeRequest>(&m)) {
      OnResume(std::move(*r));
    }
  }

  // What the engine says about a session of this connection, posted to the strand. `id` is set
  // on the engine thread before the sink's first use.
  SessionSink MakeSink(const std::shared_ptr<RealtimeSessionId>& id) {
    auto self = shared_from_this();
    return SessionSink{
        .on_frame =
            [self, id](const realtime::FrameRecord& rec) {
              net::post(self->strand_, [self, sid = *id, rec] { self->OnResult(sid, rec); });
            },
        .on_ended =
            [self, id](EndReason e) {
              net::post(self->strand_, [self, sid = *id, e] { self->OnEnded(sid, e); });
            },
        .on_alarm =
            [self, id](std::string_view kind, std::string_view detail) {
              net::post(self->strand_, [self, sid = *id, k = std::string(kind),
                                        d = std::string(detail)] { self->OnAlarm(sid, k, d); });
            },
        .on_taken = [self,
                     id] { net::post(self->strand_, [self, sid = *id] { self->Forget(sid); }); },
        .on_moving =
            [self, id](const std::string& token, std::int64_t next_frame) {
              net::post(self->strand_, [self, sid = *id, token, next_frame] {
                self->OnMoving(sid, token, next_frame);
              });
            }};
  }

  // A session went elsewhere (resumed on another connection, or moving): no session.ended.
  void Forget(RealtimeSessionId sid) {
    if (sessions_.erase(sid) > 0) UpdateIdle();
  }

  void OnMoving(RealtimeSessionId sid, const std::string& token, std::int64_t next_frame) {
    if (!sessions_.contains(sid)) return;
    Forget(sid);
    Send(wire::SessionMoving{
        .session = sid, .resume_token = token, .reason = "drain", .next_frame = next_frame}
             .Serialize());
  }

  // Why a token naming another replica cannot be fetched from here (reason, detail); nullopt: it
  // can. Checked before any request leaves: only a replica of this cluster gets one (and the
  // secret).
  [[nodiscard]] std::optional<std::pair<std::string, std::string>> RemoteTokenRefusal(
      const ResumeToken& token, const std::string& cluster_secret) const {
    if (cluster_secret.empty()) {
      return std::pair{std::string("resume_origin"),
                       "the session is held by " + token.origin +
                           " and this replica has no cluster secret to fetch it"};
    }
    if (!SealHolds(token, cluster_secret)) {
      return std::pair{std::string("resume_token"),
                       "the token names another replica (" + token.origin +
                           ") but carries no seal of this cluster's secret"};
    }
    if (token.model != srv_->service->model_identity()) {
      return std::pair{std::string("resume_model"), "the token is for model " + token.model +
                                                        ", this replica serves " +
                                                        srv_->service->model_identity()};
    }
    return std::nullopt;
  }

  // session.resume: a session of this replica (or, by fetching its state with the cluster secret,
  // of the token's origin) goes on on this connection.
  void OnResume(wire::ResumeRequest&& r) {
    const ServerOptions& o = srv_->options;
    const auto open = static_cast<int>(sessions_.size());
    if (open + pending_starts_ >= o.max_sessions_per_connection) {
      wire::ProtocolError e =
          Error(wire::ErrorCode::kTooManySessions,
                "session.resume: this connection has " + std::to_string(open) + " sessions and " +
                    std::to_string(pending_starts_) + " pending, its limit");
      e.client_ref = r.client_ref;
      SendError(e);
      return;
    }
    const std::optional<ResumeToken> token = ParseResumeToken(r.resume_token);
    const std::string& here = srv_->service->continuity().advertise_url;
    const bool remote = token && !token->origin.empty() && token->origin != here;
    const std::string& cluster_secret = srv_->service->continuity().cluster_secret;
    if (remote) {
      const std::optional<std::pair<std::string, std::string>> refusal =
          RemoteTokenRefusal(*token, cluster_secret);
      if (refusal) {
        Reject(r.client_ref, {.admit = false,
                              .reason = refusal->first,
                              .detail = refusal->second,
                              .retry_after_ms = 0.0});
        return;
      }
    }
    ++pending_starts_;
    UpdateIdle();
    auto self = shared_from_this();
    auto id = std::make_shared<RealtimeSessionId>(0);
    auto answered = [self, id, client_ref = r.client_ref, token = r.resume_token,
                     origin = remote ? token->origin : std::string()](const ResumeOutcome& out) {
      *id = out.id;
      net::post(self->strand_, [self, out, client_ref, token, origin] {
        self->OnResumed(out, client_ref, token, origin);
      });
    };
    if (!remote) {
      srv_->service->ResumeSession(r.resume_token, MakeSink(id), std::move(answered));
      return;
    }
    FetchMovedState(strand_, token->origin, r.resume_token, cluster_secret,
                    [self, id, answered = std::move(answered),
                     client_ref = r.client_ref](StateFetchResult fetched) mutable {
                      if (!fetched.ok) {
                        ResumeOutcome out;
                        out.decision = {.admit = false,
                                        .reason = "resume_origin",
                                        .detail = "fetching the session's state: " + fetched.error,
                                        .retry_after_ms = 0.0};
                        answered(out);
                        return;
                      }
                      self->srv_->service->ImportMoved(std::move(fetched.state), fetched.away_ms,
                                                       self->MakeSink(id), std::move(answered));
                    });
  }

  void OnResumed(const ResumeOutcome& out, const std::optional<std::string>& client_ref,
                 const std::string& token, const std::string& origin) {
    --pending_starts_;
    UpdateIdle();
    if (!out.resumed) {
      Reject(client_ref, out.decision);
      return;
    }
    if (!origin.empty()) {
      ReleaseMovedState(strand_, origin, token, srv_->service->continuity().cluster_secret);
    }
    if (gone_) {
      srv_->service->DetachSession(out.id, address_);
      return;
    }
    consecutive_rejections_ = 0;
    AddSession(out.id, out.spec.input_tokens_per_frame, out.spec.period_ms, out.next_frame);
    Send(wire::SessionResumed{.session = out.id,
                              .client_ref = client_ref,
                              .next_frame = out.next_frame,
                              .missed_frames = out.missed_frames,
                              .resume_token = out.resume_token,
                              .period_ms = out.spec.period_ms,
                              .deadline_ms = out.spec.deadline_ms,
                              .tokens_per_frame = out.spec.input_tokens_per_frame,
                              .output_tokens_per_frame = out.spec.output_tokens_per_frame,
                              .replica = srv_->options.replica_id.empty()
                                             ? std::nullopt
                                             : std::optional(srv_->options.replica_id)}
             .Serialize());
  }

  // A session admitted or resumed on this connection: its bookkeeping and its idle clock.
  // next_frame: the loop's index of its next frame (a resumed session's is not 0).
  void AddSession(RealtimeSessionId sid, int tokens_per_frame, double period_ms,
                  std::int64_t next_frame = 0) {
    SessionState state;
    state.accepted = next_frame;
    state.tokens_per_frame = tokens_per_frame;
    state.period_ms = period_ms;
    state.last_heard = std::chrono::steady_clock::now();
    state.idle_after = std::chrono::milliseconds(srv_->options.session_idle.TimeoutMs(period_ms));
    if (state.idle_after.count() > 0) ArmIdleCheck(state.last_heard + state.idle_after);
    sessions_.insert_or_assign(sid, std::move(state));
    UpdateIdle();
  }

  void OnStart(wire::StartRequest&& r) {
    const ServerOptions& o = srv_->options;
    auto fail = [&](wire::ErrorCode code, std::string message) {
      wire::ProtocolError e = Error(code, std::move(message));
      e.client_ref = r.client_ref;
      SendError(e);
    };
    const auto open = static_cast<int>(sessions_.size());
    if (open >= o.max_sessions_per_connection) {
      fail(wire::ErrorCode::kTooManySessions,
           "session.start: this connection has " + std::to_string(open) + " sessions, the limit");
      return;
    }
    auto resolved = ResolveStart(r, o.session_defaults, o.caps, srv_->tokenizer);
    if (auto* e = std::get_if<wire::ProtocolError>(&resolved)) {
      SendError(*e);
      return;
    }
    realtime::SessionSpec spec = std::get<realtime::SessionSpec>(std::move(resolved));
    if (open + pending_starts_ >= o.max_sessions_per_connection) {
      // Starts still waiting for admission fill the slots: a moment's state, not a refusal of the
      // request, so a rejection with a hint (the answers come within a loop turn or two).
      Reject(r.client_ref, {.admit = false,
                            .reason = "pending_starts",
                            .detail = std::to_string(pending_starts_) +
                                      " starts of this connection await "
                                      "admission and " +
                                      std::to_string(open) + " sessions run: its limit is " +
                                      std::to_string(o.max_sessions_per_connection),
                            .retry_after_ms = spec.period_ms});
      return;
    }
    wire::SessionStarted started{.session = 0,
                                 .client_ref = r.client_ref,
                                 .period_ms = spec.period_ms,
                                 .deadline_ms = spec.deadline_ms,
                                 .tokens_per_frame = spec.input_tokens_per_frame,
                                 .output_tokens_per_frame = spec.output_tokens_per_frame,
                                 .kv = KvSettingsOf(spec),
                                 .max_context = std::nullopt,
                                 .replica = std::nullopt,
                                 .resume_token = std::nullopt};
    ++pending_starts_;
    UpdateIdle();
    auto self = shared_from_this();
    // Set on the engine thread by `done`, read there by the sink: no lock needed.
    auto id = std::make_shared<RealtimeSessionId>(0);
    SessionSink sink = MakeSink(id);
    srv_->service->StartSession(
        std::move(spec), std::move(sink),
        [self, id, started = std::move(started)](const StartOutcome& out) mutable {
          *id = out.id;
          net::post(self->strand_, [self, out, started = std::move(started)]() mutable {
            self->OnStarted(out, std::move(started));
          });
        });
  }

  void OnStarted(const StartOutcome& out, wire::SessionStarted started) {
    --pending_starts_;
    UpdateIdle();
    if (out.admitted) {
      if (gone_) {
        srv_->service->DetachSession(out.id, address_);
        return;
      }
      AddSession(out.id, started.tokens_per_frame, started.period_ms);
      started.session = out.id;
      if (out.max_context > 0) started.max_context = out.max_context;
      if (!srv_->options.replica_id.empty()) started.replica = srv_->options.replica_id;
      if (!out.resume_token.empty()) started.resume_token = out.resume_token;
      Send(started.Serialize());
    } else if (!out.error.empty()) {
      wire::ProtocolError e = Error(wire::ErrorCode::kBadField, "session.start: " + out.error);
      e.client_ref = started.client_ref;
      SendError(e);
    } else {
      Reject(started.client_ref, out.decision);
    }
    if (out.admitted) consecutive_rejections_ = 0;
  }

  // session.rejected. A hint grows with this connection's rejections in a row (hint x 2^(n-1),
  // admission::RetryBackoffMs, at most RetryHint::kMaxHintMs): a client that obeys every hint
  // exactly thins out instead of asking at the controller's pace. A hint of 0 (a door reason:
  // change the request) stays 0.
  void Reject(const std::optional<std::string>& client_ref, const admission::Decision& d) {
    ++consecutive_rejections_;
    const double hint_ms = d.retry_after_ms > 0.0 ? admission::RetryBackoffMs(
                                                        d.retry_after_ms, consecutive_rejections_,
                                                        admission::RetryHint::kMaxHintMs)
                                                  : 0.0;
    Send(wire::SessionRejected{
        .client_ref = client_ref, .reason = d.reason, .detail = d.detail, .retry_after_ms = hint_ms}
             .Serialize());
  }

  void OnFrameRequest(wire::FrameRequest&& f) {
    auto fail = [&](wire::ErrorCode code, std::string message) {
      wire::ProtocolError e = Error(code, std::move(message));
      e.session = f.session;
      e.frame = f.index;
      SendError(e);
    };
    auto it = sessions_.find(f.session);
    if (it == sessions_.end() || it->second.ending) {
      fail(wire::ErrorCode::kUnknownSession,
           "frame: session " + std::to_string(f.session) + " is not open on this connection");
      return;
    }
    // The client is there: any frame for the session, even one refused below, resets its idle
    // clock.
    it->second.last_heard = std::chrono::steady_clock::now();
    std::vector<TokenId> tokens;
    const bool text = std::holds_alternative<std::string>(f.input);
    if (text) {
      if (srv_->tokenizer == nullptr) {
        fail(wire::ErrorCode::kBadField,
             "frame: text needs a tokenizer and this server has none (send ids)");
        return;
      }
      // The declared count bounds the text's length too: a text that cannot fit is refused before
      // the tokenizer spends time on it (BPE costs more than linear time in the length), so a
      // client declaring 1 token per frame cannot make the network thread tokenise 64 KB texts.
      const std::string& text_in = std::get<std::string>(f.input);
      const std::int64_t max_bytes = it->second.tokens_per_frame * srv_->max_token_bytes;
      if (static_cast<std::int64_t>(text_in.size()) > max_bytes) {
        fail(wire::ErrorCode::kOverCap,
             "frame: text has " + std::to_string(text_in.size()) + " bytes, more than the " +
                 "session's tokens_per_frame = " + std::to_string(it->second.tokens_per_frame) +
                 " tokens can hold (" + std::to_string(max_bytes) + " bytes)");
        return;
      }
      tokens = srv_->tokenizer->Encode(text_in, /*add_bos=*/false);
      if (tokens.empty()) {
        fail(wire::ErrorCode::kBadField, "frame: text has no tokens");
        return;
      }
    } else {
      tokens = std::move(std::get<wire::TokenIds>(f.input));
    }
    // Ids and text alike: the engine refuses more tokens than the session declared (kTooMany).
    const std::size_t count = tokens.size();
    auto self = shared_from_this();
    srv_->service->SubmitFrame(
        f.session, std::move(tokens),
        [self, sid = f.session, index = f.index, text, count](SubmitResult out) {
          net::post(self->strand_, [self, sid, index, text, count, out] {
            self->OnSubmitted(sid, index, text, count, out);
          });
        });
  }

  void OnSubmitted(std::uint64_t sid, std::optional<std::int64_t> index, bool text,
                   std::size_t count, SubmitResult out) {
    auto fail = [&](wire::ErrorCode code, std::string message) {
      wire::ProtocolError e = Error(code, std::move(message));
      e.session = sid;
      e.frame = index;
      SendError(e);
    };
    auto it = sessions_.find(sid);
    switch (out) {
      case SubmitResult::kOk:
        if (it != sessions_.end()) {
          it->second.pending[it->second.accepted++] = FrameInfo{.index = index, .text = text};
        }
        return;
      case SubmitResult::kTooEarly:
        fail(wire::ErrorCode::kFrameTooEarly,
             "frame: session " + std::to_string(sid) + " already has its frames waiting");
        return;
      case SubmitResult::kTooFast:
        fail(wire::ErrorCode::kFrameTooEarly,
             "frame: session " + std::to_string(sid) + " sends faster than its period_ms = " +
                 (it != sessions_.end() ? FormatValue(it->second.period_ms) : std::string("?")) +
                 " (beyond the burst allowance)");
        return;
      case SubmitResult::kTooMany:
        fail(wire::ErrorCode::kOverCap,
             std::string("frame: ") + (text ? "text" : "ids") + " has " + std::to_string(count) +
                 " tokens, more than the session's tokens_per_frame = " +
                 (it != sessions_.end() ? std::to_string(it->second.tokens_per_frame)
                                        : std::string("?")));
        return;
      case SubmitResult::kUnknownSession:
      case SubmitResult::kNotExternal:  // never: every server session takes external frames
        fail(wire::ErrorCode::kUnknownSession,
             "frame: session " + std::to_string(sid) + " is not open on this connection");
        return;
      case SubmitResult::kEmpty:
        fail(wire::ErrorCode::kBadField, "frame: no tokens");
        return;
      case SubmitResult::kMoving:
        fail(wire::ErrorCode::kSessionMoving,
             "frame: session " + std::to_string(sid) +
                 " is moving to another replica (session.moving follows): resume it there and "
                 "send this frame again");
        return;
    }
  }

  void OnEnd(const wire::EndRequest& e) {
    auto it = sessions_.find(e.session);
    if (it == sessions_.end() || it->second.ending) {
      wire::ProtocolError err = Error(
          wire::ErrorCode::kUnknownSession,
          "session.end: session " + std::to_string(e.session) + " is not open on this connection");
      err.session = e.session;
      SendError(err);
      return;
    }
    it->second.ending = true;
    srv_->service->EndSession(e.session);
  }

  void OnResult(RealtimeSessionId sid, const realtime::FrameRecord& rec) {
    auto it = sessions_.find(sid);
    if (it == sessions_.end()) return;
    SessionState& st = it->second;
    wire::FrameResult fr;
    fr.session = sid;
    fr.frame = rec.index;
    auto p = st.pending.find(rec.index);
    if (p != st.pending.end()) {
      if (p->second.index) fr.frame = *p->second.index;
      if (p->second.text && srv_->tokenizer != nullptr) {
        fr.text = srv_->tokenizer->Decode(rec.tokens);
      }
      st.pending.erase(p);
    }
    fr.ids = rec.tokens;
    fr.latency_ms = rec.latency_ms;
    fr.outcome = rec.outcome;
    ++st.results;
    Send(fr.Serialize());
  }

  void OnEnded(RealtimeSessionId sid, EndReason e) {
    auto it = sessions_.find(sid);
    if (it == sessions_.end()) return;
    const std::int64_t frames = it->second.results;
    sessions_.erase(it);
    UpdateIdle();
    Send(wire::SessionEnded{.session = sid, .reason = e, .frames = frames}.Serialize());
  }

  void OnAlarm(RealtimeSessionId sid, const std::string& kind, const std::string& detail) {
    if (!sessions_.contains(sid)) return;
    Send(wire::Alarm{.session = sid, .kind = kind, .detail = detail}.Serialize());
  }

  void SendError(const wire::ProtocolError& e) { Send(wire::ErrorMessage{.error = e}.Serialize()); }

  void Send(std::string message) {
    if (closed_) return;
    if (queue_.size() >= srv_->options.max_send_queue) {
      CloseWith(websocket::close_code::policy_error);
      return;
    }
    queue_.push_back(std::move(message));
    if (!writing_) DoWrite();
  }

  void DoWrite() {
    writing_ = true;
    ws_.text(true);
    auto self = shared_from_this();
    ws_.async_write(net::buffer(queue_.front()),
                    [self](beast::error_code ec, std::size_t /*n*/) { self->OnWrite(ec); });
  }

  void OnWrite(beast::error_code ec) {
    writing_ = false;
    queue_.pop_front();
    if (ec) {
      Gone();
      HardClose();
      return;
    }
    if (close_code_) {
      if (flush_before_close_ && !queue_.empty()) {
        DoWrite();
        return;
      }
      queue_.clear();
      StartClose();
      return;
    }
    if (!queue_.empty() && !closed_) DoWrite();
  }

  // Closes with `code` and `reason` (a close frame after the write in flight, if any), ends the
  // sessions at once, and drops the socket after kCloseGrace whatever the peer does.
  void CloseWith(websocket::close_code code, std::string_view reason = {}) {
    if (closed_) return;
    closed_ = true;
    // Closed for the client's own fault (a reader too slow for its queue): its sessions end; any
    // other close (idle, shutdown) leaves them to be resumed.
    Gone(/*keep_sessions=*/code != websocket::close_code::policy_error);
    close_code_ = code;
    close_reason_ = reason;
    if (writing_) {
      // The front one is being written; the rest goes too unless it is to be flushed first.
      if (!flush_before_close_) {
        while (queue_.size() > 1) queue_.pop_back();
      }
    } else if (flush_before_close_ && !queue_.empty()) {
      DoWrite();
    } else {
      queue_.clear();
      StartClose();
    }
    auto self = shared_from_this();
    timer_.expires_after(kCloseGrace);
    timer_.async_wait([self](beast::error_code ec) {
      if (!ec) self->HardClose();
    });
  }

  void StartClose() {
    auto self = shared_from_this();
    // RFC 6455 5.5: a control frame's payload is at most 125 bytes, 2 of them the code.
    ws_.async_close(websocket::close_reason(*close_code_, close_reason_.substr(0, 123)),
                    [self](beast::error_code /*ec*/) { self->HardClose(); });
  }

  void HardClose() {
    closed_ = true;
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().shutdown(tcp::socket::shutdown_both, ec);
    beast::get_lowest_layer(ws_).socket().close(ec);
    timer_.cancel();
    idle_timer_.cancel();
  }

  // The connection is gone (or going): every session is detached (EngineService::DetachSession:
  // it waits for session.resume within the resume window, or ends at once, reason disconnect,
  // without continuity), or, with keep_sessions false, ends (disconnect); nobody is told.
  void Gone(bool keep_sessions = true) {
    if (gone_) return;
    gone_ = true;
    closed_ = true;
    for (auto& [sid, st] : sessions_) {
      if (!st.ending) {
        if (keep_sessions) {
          srv_->service->DetachSession(sid, address_);
        } else {
          srv_->service->EndSession(sid, EndReason::kDisconnect);
        }
      }
      st.ending = true;
    }
  }

  websocket::stream<beast::tcp_stream> ws_;
  net::any_io_executor strand_;
  net::steady_timer timer_;
  net::steady_timer idle_timer_;             // the idle rules (ArmIdleCheck)
  std::optional<SteadyTime> idle_check_at_;  // when idle_timer_ is due; nullopt: not armed
  SteadyTime no_session_since_;              // while idle(): since when
  Impl* srv_;
  std::string address_;  // the client's: its detached sessions are capped per address
  beast::flat_buffer buf_;
  std::deque<std::string> queue_;
  bool writing_ = false;
  bool closed_ = false;              // nothing more is sent
  bool gone_ = false;                // sessions ended
  bool accepted_ = false;            // the handshake completed
  bool going_away_ = false;          // the server is stopping
  bool flush_before_close_ = false;  // send what is queued before the close frame (shutdown)
  std::optional<websocket::close_code> close_code_;
  std::string close_reason_;  // the close frame's reason text
  std::unordered_map<std::uint64_t, SessionState> sessions_;
  int pending_starts_ = 0;
  std::int64_t consecutive_rejections_ = 0;  // session.rejected since the last admission
};

// ---------------------------------------------------------------------------------------------
// Plain HTTP connection: routes (the dashboard's embedded files included), or hands an upgrade on
// /v1/realtime to a WsConnection.

class HttpSession final : public Closable, public std::enable_shared_from_this<HttpSession> {
 public:
  HttpSession(tcp::socket&& socket, Impl* srv, std::string address)
      : stream_(std::move(socket)), srv_(srv), address_(std::move(address)) {}
  ~HttpSession() override { srv_->Unregister(this); }
  HttpSession(const HttpSession&) = delete;
  HttpSession& operator=(const HttpSession&) = delete;

  void Run() {
    auto self = shared_from_this();
    net::dispatch(stream_.get_executor(), [self] { self->DoRead(); });
  }

  void Close() override {
    auto self = shared_from_this();
    net::post(stream_.get_executor(), [self] {
      beast::error_code ec;
      self->stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
      self->stream_.socket().close(ec);
    });
  }
  void GoAway() override { Close(); }

 private:
  void DoRead() {
    set_idle(true);
    parser_.emplace();
    parser_->header_limit(kHeaderLimitBytes);
    parser_->body_limit(srv_->options.caps.max_message_bytes);
    // The whole request (headers and body) within the deadline: a client trickling bytes holds
    // its slot no longer than that.
    stream_.expires_after(srv_->handshake_timeout());
    auto self = shared_from_this();
    http::async_read(stream_, buffer_, *parser_,
                     [self](beast::error_code ec, std::size_t /*n*/) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    set_idle(false);
    Request req = parser_->release();
    if (req.version() != 10 && req.version() != 11) {
      return RespondAndClose(http::status::http_version_not_supported,
                             "HTTP version " + std::to_string(req.version() / 10) + "." +
                                 std::to_string(req.version() % 10) +
                                 " not supported: this server speaks HTTP/1.0 and HTTP/1.1\n");
    }
    const std::string_view target = View(req.target());
    const std::string_view path = target.substr(0, target.find('?'));
    if (path == "/v1/realtime" && !websocket::is_upgrade(req) &&
        (req.method() == http::verb::get || req.method() == http::verb::head)) {
      Respond(req, http::status::upgrade_required,
              "/v1/realtime is a WebSocket endpoint: send the upgrade (Upgrade: websocket)\n",
              "text/plain");
      return;
    }
    if (websocket::is_upgrade(req) && path == "/v1/realtime") return Upgrade(std::move(req));
    if (path == kSessionStatePath) {
      ServeSessionState(std::move(req));
      return;
    }
    // HEAD is answered wherever GET is: the same status and headers, no body.
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      Respond(req, http::status::method_not_allowed, "method not allowed\n", "text/plain");
    } else if (path == "/healthz") {
      Respond(req, http::status::ok, "ok", "text/plain");
    } else if (path == "/readyz") {
      RespondReadiness(req);
    } else if (path == "/metrics") {
      Respond(req, http::status::ok,
              srv_->registry != nullptr ? srv_->registry->ExpositionText() : std::string(),
              "text/plain; version=0.0.4");
    } else if (path.starts_with("/v1/") && !srv_->Authorized(req)) {
      Respond(req, http::status::unauthorized, "unauthorized\n", "text/plain");
    } else if (path == "/v1/stats") {
      // The engine thread builds the snapshot; this thread goes on serving other connections.
      auto self = shared_from_this();
      auto shared_req = std::make_shared<Request>(std::move(req));
      srv_->service->StatsAsync(200, [self, shared_req](nlohmann::json stats) {
        net::post(self->stream_.get_executor(), [self, shared_req, stats = std::move(stats)]() {
          self->RespondStats(*shared_req, stats);
        });
      });
    } else if (const DashboardAsset* asset = FindDashboardAsset(path); asset != nullptr) {
      // No auth: the page holds no data, it fetches /v1/* with the token from its URL fragment.
      // no-cache: a rebuilt binary serves new files under the same names.
      Respond(req, http::status::ok, std::string(asset->bytes), asset->content_type, "no-cache");
    } else {
      Respond(req, http::status::not_found, "not found\n", "text/plain");
    }
  }

  // A read that failed: a request that cannot be parsed is answered (and the connection closed);
  // a peer that went away or missed the deadline is not.
  void OnReadError(beast::error_code ec) {
    if (ec == http::error::header_limit) {
      return RespondAndClose(
          http::status::request_header_fields_too_large,
          "request header too large: more than " + std::to_string(kHeaderLimitBytes) + " bytes\n");
    }
    if (ec == http::error::body_limit) {
      return RespondAndClose(http::status::payload_too_large,
                             "request body too large: more than " +
                                 std::to_string(srv_->options.caps.max_message_bytes) + " bytes\n");
    }
    if (ec == http::error::bad_version) {  // Beast parses HTTP/1.x only
      return RespondAndClose(http::status::http_version_not_supported,
                             "HTTP version not supported: this server speaks HTTP/1.0 and "
                             "HTTP/1.1\n");
    }
    if (ec.category() == http::make_error_code(http::error::bad_target).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      return RespondAndClose(http::status::bad_request,
                             "malformed HTTP request: " + ec.message() + "\n");
    }
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  }

  // GET /v1/realtime with the upgrade: checked (key, origin, token, a free slot), then handed to
  // a WsConnection.
  void Upgrade(Request req) {
    // Beast accepts any Sec-WebSocket-Key; RFC 6455 asks for base64 of 16 bytes.
    if (!IsValidWebSocketKey(View(req[http::field::sec_websocket_key]))) {
      Respond(req, http::status::bad_request,
              "bad Sec-WebSocket-Key: must be the base64 encoding of 16 bytes\n", "text/plain");
      return;
    }
    if (!OriginAllowed(View(req[http::field::origin]), View(req[http::field::host]),
                       srv_->options.allowed_origins, !srv_->expected_authorization.empty())) {
      Respond(req, http::status::forbidden, "origin not allowed\n", "text/plain");
      return;
    }
    if (!srv_->Authorized(req)) {
      Respond(req, http::status::unauthorized, "unauthorized\n", "text/plain");
      return;
    }
    if (!srv_->ReserveWebSocketSlot()) {
      Respond(req, http::status::service_unavailable,
              "every WebSocket slot is taken (" + std::to_string(srv_->options.max_connections) +
                  ", each holding a session): try again later\n",
              "text/plain");
      return;
    }
    stream_.expires_never();
    auto ws = std::make_shared<WsConnection>(stream_.release_socket(), srv_, address_);
    if (srv_->RegisterWebSocket(ws, address_)) ws->Run(std::move(req));
  }

  // /readyz: 200 when this replica takes new sessions, else 503 with the reason (ReadinessOf).
  void RespondReadiness(const Request& req) {
    const ReplicaState state = srv_->State();
    if (state.draining) ++srv_->drain_announcements;
    const Readiness r = ReadinessOf(state);
    const auto count = [](std::int64_t n) {
      return n < 0 ? nlohmann::json(nullptr) : nlohmann::json(n);
    };
    const nlohmann::json body = {{"ready", r.ready},
                                 {"reason", r.reason},
                                 {"draining", state.draining},
                                 {"sessions", state.sessions},
                                 {"work_used_units", state.active},
                                 {"limit", count(state.limit)},
                                 {"headroom", count(state.headroom())},
                                 {"free_connection_slots", count(state.free_connection_slots)}};
    Respond(req, r.ready ? http::status::ok : http::status::service_unavailable, body.dump(),
            "application/json", "no-store");
  }

  // GET / DELETE /v1/session-state (state_fetch.h): another replica of the cluster fetches a
  // moved session's state, then releases it. Only with the cluster secret; 404 without one, so a
  // server that moves nothing does not say it could.
  void ServeSessionState(Request req) {
    const std::string& secret = srv_->service->continuity().cluster_secret;
    if (secret.empty()) {
      Respond(req, http::status::not_found, "not found\n", "text/plain");
      return;
    }
    if (!ConstantTimeEquals(View(req[std::string(kClusterSecretHeader)]), secret)) {
      Respond(req, http::status::unauthorized,
              "unauthorized: " + std::string(kClusterSecretHeader) +
                  " is missing or is not this cluster's secret\n",
              "text/plain");
      return;
    }
    std::string token(View(req[std::string(kResumeTokenHeader)]));
    if (req.method() == http::verb::delete_) {
      srv_->service->ReleaseMoved(std::move(token));
      Respond(req, http::status::no_content, "", "text/plain");
      return;
    }
    if (req.method() != http::verb::get) {
      Respond(req, http::status::method_not_allowed, "method not allowed\n", "text/plain");
      return;
    }
    auto self = shared_from_this();
    auto shared_req = std::make_shared<Request>(std::move(req));
    srv_->service->FetchMoved(std::move(token), [self, shared_req](MovedState moved) {
      net::post(self->stream_.get_executor(), [self, shared_req, moved = std::move(moved)]() {
        if (!moved.found) {
          self->Respond(*shared_req, http::status::not_found,
                        "no moved session holds this token here (released, expired or never "
                        "issued)\n",
                        "text/plain");
          return;
        }
        self->Respond(
            *shared_req, http::status::ok,
            std::string(reinterpret_cast<const char*>(moved.state.data()), moved.state.size()),
            "application/octet-stream", "no-store", {{kAwayMsHeader, FormatValue(moved.away_ms)}});
      });
    });
  }

  void RespondStats(const Request& req, nlohmann::json stats) {
    stats["caps"] = srv_->options.caps;  // wire::ServerCaps' to_json
    Respond(req, http::status::ok, stats.dump(), "application/json");
  }

  using Headers = std::vector<std::pair<std::string_view, std::string>>;
  void Respond(const Request& req, http::status status, std::string body,
               std::string_view content_type, std::string_view cache_control = {},
               const Headers& headers = {}) {
    auto res = std::make_shared<http::response<http::string_body>>(status, req.version());
    res->set(http::field::server, "metronome");
    for (const auto& [name, value] : headers) {
      res->set(beast::string_view(name.data(), name.size()), value);
    }
    res->set(http::field::content_type,
             beast::string_view(content_type.data(), content_type.size()));
    if (!cache_control.empty()) {
      res->set(http::field::cache_control,
               beast::string_view(cache_control.data(), cache_control.size()));
    }
    if (status == http::status::method_not_allowed) {
      res->set(http::field::allow,
               View(req.target()).starts_with(kSessionStatePath) ? "GET, DELETE" : "GET, HEAD");
    }
    if (status == http::status::service_unavailable) {
      res->set(http::field::retry_after, std::to_string(kNoSlotRetryAfterS));
    }
    res->keep_alive(req.keep_alive());
    if (status == http::status::upgrade_required) {
      // RFC 9110 15.5.22: a 426 names the protocol to upgrade to, and Upgrade is a connection
      // option.
      res->set(http::field::upgrade, "websocket");
      res->set(http::field::connection, req.keep_alive() ? "Upgrade" : "Upgrade, close");
    }
    res->body() = std::move(body);
    res->prepare_payload();
    if (req.method() == http::verb::head) res->body().clear();  // Content-Length stays GET's
    auto self = shared_from_this();
    http::async_write(stream_, *res, [self, res](beast::error_code ec, std::size_t /*n*/) {
      if (ec || res->need_eof()) {
        self->stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
        if (!ec && self->linger_) self->Linger();
        return;
      }
      self->DoRead();
    });
  }

  // An error answer to a request that could not be read whole: HTTP/1.1, then the connection
  // closes (lingering so the answer is not lost to a reset).
  void RespondAndClose(http::status status, std::string body) {
    Request stub;
    stub.version(11);
    stub.method(http::verb::get);
    stub.keep_alive(false);
    linger_ = true;
    Respond(stub, status, std::move(body), "text/plain");
  }

  // Reads and drops what the client still sends, until it closes or kErrorLinger passes. The
  // connection may be evicted meanwhile.
  void Linger() {
    set_idle(true);
    stream_.expires_after(kErrorLinger);
    auto self = shared_from_this();
    stream_.async_read_some(net::buffer(linger_buffer_),
                            [self](beast::error_code ec, std::size_t /*n*/) {
                              if (!ec) self->Linger();
                            });
  }

  beast::tcp_stream stream_;
  Impl* srv_;
  std::string address_;  // the client's, for the per-address cap
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool linger_ = false;  // answering a request that could not be read: Linger after the answer
  std::array<char, 4096> linger_buffer_{};
};

}  // namespace

// The agent: the line is built from what the engine thread last published (no wait for it) and
// written into the fresh socket's send buffer, then the socket closes. The client is never read
// from, so a slow or silent one costs one short write; one that never reads is closed with the
// write done or failed, whichever comes first.
void HttpServer::Impl::DoAgentAccept() {
  agent_acceptor.async_accept(
      net::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted || !agent_acceptor.is_open()) return;
        if (!ec) {
          auto conn = std::make_shared<tcp::socket>(std::move(socket));
          const ReplicaState state = State();
          if (state.draining) ++drain_announcements;
          auto line = std::make_shared<std::string>(AgentResponse(state));
          net::async_write(*conn, net::buffer(*line),
                           [conn, line](beast::error_code /*ec*/, std::size_t /*bytes*/) {
                             beast::error_code ignored;
                             conn->shutdown(tcp::socket::shutdown_both, ignored);
                             conn->close(ignored);
                           });
        }
        DoAgentAccept();
      });
}

void HttpServer::Impl::DoAccept() {
  acceptor.async_accept(net::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    if (!ec) {
      // Results are small messages sent as soon as they are ready: without TCP_NODELAY, Nagle's
      // algorithm holds one behind the peer's delayed ACK (~40 ms on Linux), half a Moshi period.
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      const tcp::endpoint peer = socket.remote_endpoint(ignored);
      std::string address = ignored ? std::string() : peer.address().to_string();
      auto s = std::make_shared<HttpSession>(std::move(socket), this, address);
      if (RegisterHttp(s, address)) s->Run();
    }
    DoAccept();
  });
}

HttpServer::HttpServer(EngineService* service, telemetry::MetricsRegistry* registry,
                       const ServerOptions& options, const model::Tokenizer* tokenizer)
    : impl_(std::make_unique<Impl>(service, registry, options, tokenizer)) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Start() {
  Impl& s = *impl_;
  if (s.started) return;
  const std::string where = s.options.host + ":" + std::to_string(s.options.port);
  beast::error_code ec;
  tcp::resolver resolver(s.io);
  const auto results = resolver.resolve(s.options.host, std::to_string(s.options.port), ec);
  if (ec || results.empty()) {
    throw ConfigError("host = '" + s.options.host + "' does not resolve to an address" +
                      (ec ? ": " + ec.message() : std::string()));
  }
  const tcp::endpoint endpoint = results.begin()->endpoint();
  const auto fail = [&](std::string_view step) {
    beast::error_code ignored;
    s.acceptor.close(ignored);
    throw ConfigError("cannot listen on " + where + ": " + std::string(step) + ": " + ec.message());
  };
  if (s.acceptor.open(endpoint.protocol(), ec); ec) fail("open");
  if (s.acceptor.set_option(net::socket_base::reuse_address(true), ec); ec) fail("setsockopt");
  if (s.acceptor.bind(endpoint, ec); ec) fail("bind");
  if (s.acceptor.listen(net::socket_base::max_listen_connections, ec); ec) fail("listen");
  if (s.options.agent_port) {
    const tcp::endpoint agent(endpoint.address(),
                              static_cast<unsigned short>(*s.options.agent_port));
    const auto agent_fail = [&](std::string_view step) {
      beast::error_code ignored;
      s.agent_acceptor.close(ignored);
      s.acceptor.close(ignored);
      throw ConfigError("agent_port = " + std::to_string(*s.options.agent_port) +
                        ": cannot listen on " + s.options.host + ":" +
                        std::to_string(*s.options.agent_port) + ": " + std::string(step) + ": " +
                        ec.message());
    };
    if (s.agent_acceptor.open(agent.protocol(), ec); ec) agent_fail("open");
    if (s.agent_acceptor.set_option(net::socket_base::reuse_address(true), ec); ec) {
      agent_fail("setsockopt");
    }
    if (s.agent_acceptor.bind(agent, ec); ec) agent_fail("bind");
    if (s.agent_acceptor.listen(net::socket_base::max_listen_connections, ec); ec) {
      agent_fail("listen");
    }
    s.bound_agent_port = s.agent_acceptor.local_endpoint().port();
    s.DoAgentAccept();
  }
  s.started = true;
  s.bound_port = s.acceptor.local_endpoint().port();
  if (const std::size_t at = s.options.replica_id.find("{port}"); at != std::string::npos) {
    s.options.replica_id.replace(at, std::string_view("{port}").size(),
                                 std::to_string(s.bound_port.load()));
  }
  s.DoAccept();
  s.work.emplace(s.io.get_executor());
  const int n = std::max(1, s.options.io_threads);
  for (int i = 0; i < n; ++i) s.threads.emplace_back([&s] { s.io.run(); });
}

int HttpServer::port() const { return impl_->bound_port.load(); }
int HttpServer::agent_port() const { return impl_->bound_agent_port.load(); }
std::int64_t HttpServer::drain_announcements() const { return impl_->drain_announcements.load(); }

void HttpServer::Stop() {
  Impl& s = *impl_;
  if (!s.started || s.stopped) return;
  s.stopped = true;
  net::post(s.acceptor.get_executor(), [&s] {
    beast::error_code ec;
    s.acceptor.close(ec);
  });
  net::post(s.agent_acceptor.get_executor(), [&s] {
    beast::error_code ec;
    s.agent_acceptor.close(ec);
  });
  std::vector<std::shared_ptr<Closable>> open;
  {
    const base::MutexLock lock(&s.mu);
    s.accepting = false;
    for (auto& [key, entry] : s.conns) {
      if (auto c = entry.conn.lock()) open.push_back(std::move(c));
    }
  }
  for (auto& c : open) c->GoAway();
  open.clear();
  // Connections go once their close handshake is done (or kCloseGrace passed) and their
  // sessions' last callbacks have run.
  const auto give_up = std::chrono::steady_clock::now() + kStopWait;
  while (std::chrono::steady_clock::now() < give_up) {
    {
      const base::MutexLock lock(&s.mu);
      if (s.conns.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  s.work.reset();
  s.io.stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
}

}  // namespace metronome::server
