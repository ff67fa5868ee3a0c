// The network server end to end on the real clock with the cost-model backend: a Beast sync
// WebSocket client opens sessions, sends frames and bad input; plain HTTP routes and access
// control; the dashboard's embedded files; an abrupt disconnect returns every block to the pool.
#include "metronome/server/http_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "metronome/base/errors.h"
#include "metronome/model/tokenizer.h"
#include "metronome/server/dashboard_assets.h"
#include "metronome/server/http_access.h"
#include "metronome/server/resume_token.h"
#include "support/loopback_server.h"
#include "support/process_memory.h"

namespace metronome::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using nlohmann::json;

struct Server : testing::LoopbackServer {
  Server(const std::string& admission, const ServerOptions& options,
         const ContinuityOptions& continuity = {})
      : LoopbackServer(admission, /*blocks=*/256, options, /*tokenizer=*/nullptr, continuity) {}
};

void SetReadTimeout(tcp::socket& socket) {
  timeval tv{.tv_sec = 5, .tv_usec = 0};
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

// A sync WebSocket client on /v1/realtime.
class Client {
 public:
  explicit Client(int port, const std::string& token = "") {
    ws_.next_layer().connect(
        tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
    SetReadTimeout(ws_.next_layer());
    // Like the server: small messages go out at once, not behind the peer's delayed ACK.
    ws_.next_layer().set_option(tcp::no_delay(true));
    if (!token.empty()) {
      ws_.set_option(websocket::stream_base::decorator([token](websocket::request_type& req) {
        req.set(http::field::authorization, "Bearer " + token);
      }));
    }
    ws_.handshake("127.0.0.1", "/v1/realtime");
  }
  void Send(const json& j) { SendText(j.dump()); }
  void SendText(const std::string& s) {
    ws_.text(true);
    ws_.write(net::buffer(s));
  }
  void SendBinary(const std::vector<std::byte>& b) {
    ws_.binary(true);
    ws_.write(net::buffer(b.data(), b.size()));
  }
  json Read() {
    beast::flat_buffer b;
    ws_.read(b);
    return json::parse(beast::buffers_to_string(b.data()));
  }
  // Reads until a message of `type` (skipping others, e.g. results of other sessions).
  json ReadType(const std::string& type) {
    for (int i = 0; i < 100; ++i) {
      json j = Read();
      if (j["type"] == type) return j;
    }
    return {};
  }
  // session.start (2 tokens a frame every 20 ms, a 32-token window with 4 sinks, and `extra`);
  // the answer, which should be session.started.
  json Started(const json& extra = json::object()) {
    json start = {{"type", "session.start"},
                  {"period_ms", 20},
                  {"tokens_per_frame", 2},
                  {"output_tokens_per_frame", 2},
                  {"kv", {{"window", 32}, {"sinks", 4}}}};
    start.update(extra);
    Send(start);
    json j = Read();
    EXPECT_EQ(j["type"], "session.started") << j.dump();
    return j;
  }
  std::uint64_t Start(const json& extra = json::object()) {
    return Started(extra).value("session", std::uint64_t{0});
  }
  websocket::stream<tcp::socket>& ws() { return ws_; }

 private:
  net::io_context io_;
  websocket::stream<tcp::socket> ws_{io_};
};

struct HttpResult {
  int status = 0;
  std::string body;
  std::string content_type;
  std::string content_length;
  std::string allow;
};

// Headers of an upgrade request beyond the defaults (empty value: leave the header out).
struct UpgradeHeaders {
  std::string key = "dGhlIHNhbXBsZSBub25jZQ==";
  std::string origin;
  std::string host = "127.0.0.1";
  static UpgradeHeaders Key(std::string key) {
    UpgradeHeaders h;
    h.key = std::move(key);
    return h;
  }
  static UpgradeHeaders Origin(std::string origin, std::string host = "127.0.0.1") {
    UpgradeHeaders h;
    h.origin = std::move(origin);
    h.host = std::move(host);
    return h;
  }
};

HttpResult Get(int port, const std::string& target, const std::string& token = "",
               http::verb verb = http::verb::get, bool upgrade = false,
               const UpgradeHeaders& headers = {}) {
  net::io_context io;
  tcp::socket socket(io);
  socket.connect(
      tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
  SetReadTimeout(socket);
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, headers.host);
  if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
  if (upgrade) {
    req.set(http::field::upgrade, "websocket");
    req.set(http::field::connection, "upgrade");
    if (!headers.key.empty()) req.set(http::field::sec_websocket_key, headers.key);
    req.set(http::field::sec_websocket_version, "13");
    if (!headers.origin.empty()) req.set(http::field::origin, headers.origin);
  }
  req.prepare_payload();
  http::write(socket, req);
  beast::flat_buffer b;
  // HEAD: the answer has GET's Content-Length and no body; the parser must be told.
  http::response_parser<http::string_body> parser;
  parser.skip(verb == http::verb::head);
  http::read(socket, b, parser);
  const auto& res = parser.get();
  return {.status = static_cast<int>(res.result_int()),
          .body = res.body(),
          .content_type = std::string(res[http::field::content_type]),
          .content_length = std::string(res[http::field::content_length]),
          .allow = std::string(res[http::field::allow])};
}

// Get, with -1 for a connection the server closed without an answer.
int TryGetStatus(int port, const std::string& target) {
  try {
    return Get(port, target).status;
  } catch (const boost::system::system_error&) {
    return -1;
  }
}

template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds limit) {
  const auto give_up = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(HttpServerTest, FramesComeBackInOrderWithTheClientsIndexAndMetricsAreServed) {
  Server s("static:4", {});
  Client c(s.http.port());
  // A generous deadline: "ok" must not depend on how loaded the test machine is.
  const std::uint64_t id = c.Start({{"client_ref", "a"}, {"deadline_ms", 500}});
  ASSERT_NE(id, 0U);
  for (int i = 0; i < 10; ++i) {
    c.Send({{"type", "frame"}, {"session", id}, {"index", 100 + i}, {"ids", {1, 2}}});
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int i = 0; i < 10; ++i) {
    const json r = c.Read();
    ASSERT_EQ(r["type"], "frame.result") << r.dump();
    EXPECT_EQ(r["session"], id);
    EXPECT_EQ(r["frame"], 100 + i);
    EXPECT_EQ(r["outcome"], "ok");
    EXPECT_EQ(r["ids"].size(), 2U);
    EXPECT_LT(r["latency_ms"].get<double>(), 500.0);
  }
  // A binary frame without an index: the result counts the session's accepted frames.
  c.SendBinary(wire::EncodeBinaryFrame(
      {.session = id, .index = std::nullopt, .input = wire::TokenIds{3, 4}}));
  const json r = c.Read();
  EXPECT_EQ(r["type"], "frame.result") << r.dump();
  EXPECT_EQ(r["frame"], 10);
  c.Send({{"type", "ping"}, {"nonce", 7}});
  EXPECT_EQ(c.Read(), (json{{"type", "pong"}, {"nonce", 7}}));
  c.Send({{"type", "session.end"}, {"session", id}});
  const json ended = c.Read();
  EXPECT_EQ(ended["type"], "session.ended") << ended.dump();
  EXPECT_EQ(ended["reason"], "client");
  EXPECT_EQ(ended["frames"], 11);

  const HttpResult metrics = Get(s.http.port(), "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("metronome_frames_total"), std::string::npos) << metrics.body;
  EXPECT_EQ(metrics.content_type, "text/plain; version=0.0.4");
  const HttpResult health = Get(s.http.port(), "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok");
  const HttpResult stats = Get(s.http.port(), "/v1/stats");
  EXPECT_EQ(stats.status, 200);
  EXPECT_EQ(json::parse(stats.body)["sessions"]["active"], 0) << stats.body;
  EXPECT_EQ(json::parse(stats.body)["caps"]["max_window"], wire::ServerCaps{}.max_window)
      << stats.body;
  EXPECT_EQ(Get(s.http.port(), "/nope").status, 404);
  EXPECT_EQ(Get(s.http.port(), "/healthz", "", http::verb::post).status, 405);
}

TEST(HttpServerTest, AdmissionRejectsASecondSessionWithReasonLimit) {
  Server s("static:1", {});
  Client c(s.http.port());
  ASSERT_NE(c.Start(), 0U);
  c.Send({{"type", "session.start"},
          {"period_ms", 20},
          {"tokens_per_frame", 1},
          {"client_ref", "second"}});
  const json j = c.Read();
  EXPECT_EQ(j["type"], "session.rejected") << j.dump();
  EXPECT_EQ(j["reason"], "limit");
  EXPECT_EQ(j["client_ref"], "second");
  EXPECT_GT(j["retry_after_ms"].get<double>(), 0.0);
}

TEST(HttpServerTest, BadInputGetsErrorsAndTheConnectionGoesOn) {
  ServerOptions o;
  o.caps.vocab_size = 65536;
  o.max_sessions_per_connection = 2;
  o.caps.max_message_bytes = 4096;
  Server s("static:8", o);
  Client a(s.http.port());
  Client b(s.http.port());
  auto code = [](const json& j) { return j.value("code", std::string("(none)")); };

  a.SendText("{\"type\": \"ping\",");
  EXPECT_EQ(code(a.Read()), "bad_json");
  a.Send({{"type", "sesion.start"}});
  EXPECT_EQ(code(a.Read()), "unknown_type");
  const std::uint64_t id = a.Start();
  a.Send({{"type", "frame"}, {"session", id}, {"index", 3}, {"ids", {1, 70000}}});
  json e = a.Read();
  EXPECT_EQ(code(e), "token_out_of_range") << e.dump();
  EXPECT_EQ(e["frame"], 3);
  // More ids than the session declared (Start() asks for 2 per frame).
  a.Send({{"type", "frame"}, {"session", id}, {"index", 4}, {"ids", {1, 2, 3}}});
  e = a.Read();
  EXPECT_EQ(code(e), "over_cap") << e.dump();
  EXPECT_NE(e["message"].get<std::string>().find("tokens_per_frame = 2"), std::string::npos)
      << e.dump();
  // Another connection's session.
  b.Send({{"type", "frame"}, {"session", id}, {"ids", {1, 2}}});
  e = b.Read();
  EXPECT_EQ(code(e), "unknown_session") << e.dump();
  EXPECT_EQ(e["session"], id);
  b.Send({{"type", "session.end"}, {"session", id}});
  EXPECT_EQ(code(b.Read()), "unknown_session");
  // The per-connection session limit.
  ASSERT_NE(a.Start(), 0U);
  a.Send({{"type", "session.start"}, {"period_ms", 20}, {"tokens_per_frame", 1}});
  EXPECT_EQ(code(a.Read()), "too_many_sessions");
  // Still alive.
  a.Send({{"type", "ping"}});
  EXPECT_EQ(a.Read()["type"], "pong");
  // Too large: closed with 1009.
  a.SendText(std::string(5000, ' '));
  beast::flat_buffer buf;
  beast::error_code ec;
  a.ws().read(buf, ec);
  EXPECT_EQ(ec, websocket::error::closed) << ec.message();
  EXPECT_EQ(a.ws().reason().code, websocket::close_code::too_big);
  // Its sessions ended with it.
  bool drained = false;
  for (int i = 0; i < 200 && !drained; ++i) {
    const json st = s.service.Stats();
    drained = st["sessions"]["active"] == 0;
    if (!drained) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(drained);
}

TEST(HttpServerTest, AnAbruptDisconnectEndsItsSessionsAndFreesTheirBlocks) {
  Server s("static:8", {}, {.resume_window_s = 0.0, .advertise_url = {}});
  {
    Client c(s.http.port());
    const std::uint64_t id1 = c.Start();
    const std::uint64_t id2 = c.Start();
    for (int i = 0; i < 3; ++i) {
      c.Send({{"type", "frame"}, {"session", id1}, {"ids", {1, 2}}});
      c.Send({{"type", "frame"}, {"session", id2}, {"ids", {1, 2}}});
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    c.ReadType("frame.result");
    EXPECT_GT(s.service.Stats()["kv"]["used_blocks"].get<std::int64_t>(), 0);
    beast::error_code ec;
    c.ws().next_layer().close(ec);  // no close frame
  }
  const auto t0 = std::chrono::steady_clock::now();
  json st;
  for (;;) {
    st = s.service.Stats();
    if (st["kv"]["used_blocks"] == 0 && st["sessions"]["active"] == 0) break;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(1)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(st["kv"]["used_blocks"], 0) << st.dump();
  EXPECT_EQ(st["sessions"]["active"], 0) << st.dump();
  // Both ended for the disconnect, and the metrics say so.
  EXPECT_NE(
      s.registry.ExpositionText().find("metronome_sessions_ended_total{reason=\"disconnect\"} 2"),
      std::string::npos);
}

TEST(HttpServerTest, AnAccessTokenIsRequiredOnTheUpgradeAndOnV1) {
  ServerOptions o;
  o.auth_token = "sesame";
  Server s("static:4", o);
  // An upgrade without the token: 401, with it: 101.
  EXPECT_EQ(Get(s.http.port(), "/v1/realtime", "", http::verb::get, true).status, 401);
  EXPECT_EQ(Get(s.http.port(), "/v1/realtime", "wrong", http::verb::get, true).status, 401);
  EXPECT_EQ(Get(s.http.port(), "/v1/realtime", "sesame", http::verb::get, true).status, 101);
  EXPECT_THROW(Client(s.http.port(), "wrong"), boost::system::system_error);
  Client c(s.http.port(), "sesame");
  c.Send({{"type", "ping"}, {"nonce", 1}});
  EXPECT_EQ(c.Read()["type"], "pong");
  EXPECT_EQ(Get(s.http.port(), "/v1/stats").status, 401);
  EXPECT_EQ(Get(s.http.port(), "/v1/stats", "sesame").status, 200);
  EXPECT_EQ(Get(s.http.port(), "/healthz").status, 200);
}

TEST(HttpServerTest, TheDashboardIsServedFromEmbeddedFilesWithoutTheToken) {
  ServerOptions o;
  o.auth_token = "sesame";
  Server s("static:4", o);
  const HttpResult page = Get(s.http.port(), "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_NE(page.body.find("<title>Metronome</title>"), std::string::npos) << page.body;
  EXPECT_NE(page.body.find("/dashboard/dashboard.js"), std::string::npos);
  EXPECT_EQ(Get(s.http.port(), "/dashboard/index.html").body, page.body);
  const HttpResult js = Get(s.http.port(), "/dashboard/dashboard.js");
  EXPECT_EQ(js.status, 200);
  EXPECT_TRUE(js.content_type.starts_with("application/javascript")) << js.content_type;
  EXPECT_NE(js.body.find("metronomeDashboard"), std::string::npos);
  const HttpResult css = Get(s.http.port(), "/dashboard/dashboard.css");
  EXPECT_EQ(css.status, 200);
  EXPECT_TRUE(css.content_type.starts_with("text/css")) << css.content_type;
  // A query string does not change what is served.
  EXPECT_EQ(Get(s.http.port(), "/dashboard/dashboard.css?v=2").body, css.body);
  EXPECT_EQ(Get(s.http.port(), "/dashboard/nope.js").status, 404);
  EXPECT_EQ(Get(s.http.port(), "/dashboard/").status, 404);
  EXPECT_EQ(Get(s.http.port(), "/dashboard/../v1/stats").status, 404);
  EXPECT_EQ(Get(s.http.port(), "/", "", http::verb::post).status, 405);
  // The data behind the page still needs the token.
  EXPECT_EQ(Get(s.http.port(), "/v1/stats").status, 401);
}

TEST(HttpServerTest, EveryEmbeddedAssetIsServedUnderItsPath) {
  Server s("static:4", {});
  ASSERT_FALSE(DashboardAssets().empty());
  for (const DashboardAsset& a : DashboardAssets()) {
    const HttpResult r = Get(s.http.port(), std::string(a.path));
    EXPECT_EQ(r.status, 200) << a.path;
    EXPECT_EQ(r.content_type, a.content_type) << a.path;
    EXPECT_EQ(r.body, a.bytes) << a.path;
  }
}

TEST(HttpServerTest, AReaderSlowerThanTheSendQueueIsClosedAndItsSessionsEnd) {
  ServerOptions o;
  o.max_send_queue = 4;
  Server s("static:8", o);
  Client c(s.http.port());
  ASSERT_NE(c.Start(), 0U);
  // Pings and no reads: a burst of pongs overflows the queue of 4 (a reader that does not keep
  // up is closed the same way, once the socket buffers are full).
  const std::string ping = json{{"type", "ping"}, {"nonce", 123456789}}.dump();
  ASSERT_EQ(s.service.Stats()["sessions"]["active"], 1);
  beast::error_code ec;
  int sent = 0;
  for (int i = 0; i < 400000 && !ec; ++i, ++sent) {
    c.ws().text(true);
    c.ws().write(net::buffer(ping), ec);
    if (i % 1000 == 0 && s.service.Stats()["sessions"]["active"] == 0) break;
  }
  bool ended = false;
  for (int i = 0; i < 400 && !ended; ++i) {
    ended = s.service.Stats()["sessions"]["active"] == 0;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(ended) << sent << " " << ec.message();
  // What was queued before the overflow arrives, then the close frame.
  beast::flat_buffer buf;
  for (int i = 0; i < 100000 && !ec; ++i) {
    c.ws().read(buf, ec);
    buf.clear();
  }
  EXPECT_EQ(ec, websocket::error::closed) << ec.message();
  EXPECT_EQ(c.ws().reason().code, websocket::close_code::policy_error);
}

TEST(HttpServerTest, HeadIsAnsweredWhereverGetIsWithHeadersAndNoBody) {
  Server s("static:4", {});
  for (const std::string path : {"/healthz", "/metrics", "/v1/stats", "/"}) {
    const HttpResult get = Get(s.http.port(), path);
    const HttpResult head = Get(s.http.port(), path, "", http::verb::head);
    EXPECT_EQ(head.status, 200) << path;
    EXPECT_EQ(head.content_type, get.content_type) << path;
    EXPECT_TRUE(head.body.empty()) << path;
    if (path == "/healthz" || path == "/") {  // the others change between two requests
      EXPECT_EQ(head.content_length, std::to_string(get.body.size())) << path;
    }
  }
  EXPECT_EQ(Get(s.http.port(), "/nope", "", http::verb::head).status, 404);
  const HttpResult post = Get(s.http.port(), "/healthz", "", http::verb::post);
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.allow, "GET, HEAD");
}

TEST(HttpServerTest, AnUpgradeWithAMalformedSecWebSocketKeyIsRefused) {
  Server s("static:4", {});
  for (const std::string key : {"x", "dGhlIHNhbXBsZSBub25jZQ=", "dGhlIHNhbXBsZSBub25jZR==",
                                "dGhlIHNhbXBsZSBub25j!Q==", "dGhlIHNhbXBsZSBub25jZW9uY2U="}) {
    EXPECT_EQ(
        Get(s.http.port(), "/v1/realtime", "", http::verb::get, true, UpgradeHeaders::Key(key))
            .status,
        400)
        << key;
  }
  EXPECT_EQ(Get(s.http.port(), "/v1/realtime", "", http::verb::get, true).status, 101);
}

TEST(HttpServerTest, WithoutATokenOnlySameHostOrLoopbackOriginsMayUpgrade) {
  Server s("static:4", {});
  auto upgrade = [&](const std::string& origin, const std::string& host) {
    return Get(s.http.port(), "/v1/realtime", "", http::verb::get, true,
               UpgradeHeaders::Origin(origin, host))
        .status;
  };
  EXPECT_EQ(upgrade("https://evil.example", "127.0.0.1:1"), 403);
  EXPECT_EQ(upgrade("null", "127.0.0.1:1"), 403);
  EXPECT_EQ(upgrade("http://localhost:3000", "127.0.0.1:1"), 101);
  EXPECT_EQ(upgrade("http://box.example:8080", "box.example:8080"), 101);
  EXPECT_EQ(upgrade("", "127.0.0.1:1"), 101);  // no Origin: not a browser

  ServerOptions listed;
  listed.allowed_origins = ParseAllowedOrigins("https://app.example");
  Server t("static:4", listed);
  EXPECT_EQ(Get(t.http.port(), "/v1/realtime", "", http::verb::get, true,
                UpgradeHeaders::Origin("https://app.example"))
                .status,
            101);
  EXPECT_EQ(Get(t.http.port(), "/v1/realtime", "", http::verb::get, true,
                UpgradeHeaders::Origin("http://localhost:3000"))
                .status,
            403);
}

// Slowloris: sockets that connect, send part of a request header and trickle one more byte every
// few ms, reconnecting whenever the server drops them, always more of them than the server's cap.
class Slowloris {
 public:
  Slowloris(int port, int sockets) : port_(port), sockets_(sockets) {
    // Stopped and joined on destruction, before the members it uses go.
    thread_ = std::jthread([this](const std::stop_token& stop) { Run(stop); });
  }
  [[nodiscard]] int reconnects() const { return reconnects_.load(); }

 private:
  void Connect(tcp::socket& socket) {
    beast::error_code ec;
    socket.close(ec);
    socket.connect(
        tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)), ec);
    if (!ec) net::write(socket, net::buffer(std::string_view("GET /healthz HTTP/1.1\r\nX-")), ec);
    ++reconnects_;
  }
  void Run(const std::stop_token& stop) {
    net::io_context io;
    std::vector<tcp::socket> socks;
    for (int i = 0; i < sockets_; ++i) {
      socks.emplace_back(io);
      Connect(socks.back());
    }
    while (!stop.stop_requested()) {
      for (tcp::socket& socket : socks) {
        beast::error_code ec;
        net::write(socket, net::buffer(std::string_view("a")), ec);  // MSG_NOSIGNAL
        if (ec) Connect(socket);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  int port_;
  int sockets_;
  std::atomic<int> reconnects_{0};
  std::jthread thread_;  // last: the first member destroyed
};

TEST(HttpServerTest, SlowlorisSocketsAtTheCapDoNotLockOutALegitimateClient) {
  ServerOptions o;
  o.max_connections = 8;
  o.max_http_connections = 8;
  // A deadline far beyond the test: the legitimate client must be served because idle
  // connections make room, not because the slow ones time out.
  o.handshake_timeout_ms = 600000;
  Server s("static:4", o);
  const Slowloris attack(s.http.port(), 12);
  // The attack fills the cap and keeps cycling (each reconnect takes an idle slot).
  ASSERT_TRUE(WaitFor([&] { return attack.reconnects() > 24; }, std::chrono::seconds(5)));
  // A generous bound: only a lockout fails it, not a loaded machine.
  const auto bound = std::chrono::seconds(5);
  EXPECT_TRUE(WaitFor([&] { return TryGetStatus(s.http.port(), "/healthz") == 200; }, bound));
  bool session = false;
  EXPECT_TRUE(WaitFor(
      [&] {
        try {
          Client c(s.http.port());
          session = c.Start({{"deadline_ms", 1000}}) != 0;
        } catch (const boost::system::system_error&) {
          session = false;
        }
        return session;
      },
      bound));
  EXPECT_TRUE(session);
}

TEST(HttpServerTest, ARequestHeaderNotFinishedInTimeIsClosed) {
  ServerOptions o;
  o.handshake_timeout_ms = 200;
  Server s("static:4", o);
  net::io_context io;
  tcp::socket socket(io);
  socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"),
                               static_cast<unsigned short>(s.http.port())));
  SetReadTimeout(socket);  // 5 s, far beyond the server's deadline
  net::write(socket, net::buffer(std::string_view("GET /healthz HTTP/1.1\r\nHost: x")));
  char byte = 0;
  beast::error_code ec;
  socket.read_some(net::buffer(&byte, 1), ec);
  // Closed by the server (EOF or reset), not our 5 s read timeout expiring.
  EXPECT_TRUE(ec == net::error::eof || ec == net::error::connection_reset) << ec.message();
}

TEST(HttpServerTest, APerAddressCapKeepsSessionsAndEvictsOnlyIdleConnections) {
  ServerOptions o;
  o.max_connections_per_address = 2;
  Server s("static:8", o);
  Client a(s.http.port());
  Client b(s.http.port());
  ASSERT_NE(a.Start(), 0U);
  const std::uint64_t b_id = b.Start();
  ASSERT_NE(b_id, 0U);
  // Both hold a session: a third connection from 127.0.0.1 is refused.
  EXPECT_EQ(TryGetStatus(s.http.port(), "/healthz"), -1);
  // Once b has no session it is idle, and a newcomer takes its slot.
  b.Send({{"type", "session.end"}, {"session", b_id}});
  EXPECT_EQ(b.Read()["type"], "session.ended");
  EXPECT_EQ(TryGetStatus(s.http.port(), "/healthz"), 200);
  beast::flat_buffer buf;
  beast::error_code ec;
  b.ws().read(buf, ec);
  EXPECT_TRUE(ec) << "b was not evicted";
  // a kept its session.
  a.Send({{"type", "ping"}, {"nonce", 2}});
  EXPECT_EQ(a.Read()["type"], "pong");
}

TEST(HttpServerTest, StopTellsEverySessionServerShutdownThenClosesWith1001) {
  Server s("static:8", {});
  Client c(s.http.port());
  const std::uint64_t id1 = c.Start();
  const std::uint64_t id2 = c.Start();
  ASSERT_NE(id1, 0U);
  ASSERT_NE(id2, 0U);
  std::thread stopper([&] { s.http.Stop(); });
  std::set<std::uint64_t> ended;
  for (int i = 0; i < 10 && ended.size() < 2; ++i) {
    const json j = c.Read();
    if (j["type"] != "session.ended") continue;
    EXPECT_EQ(j["reason"], "server_shutdown") << j.dump();
    ended.insert(j["session"].get<std::uint64_t>());
  }
  EXPECT_EQ(ended, (std::set<std::uint64_t>{id1, id2}));
  beast::flat_buffer buf;
  beast::error_code ec;
  c.ws().read(buf, ec);
  EXPECT_EQ(ec, websocket::error::closed) << ec.message();
  EXPECT_EQ(c.ws().reason().code, websocket::close_code::going_away);
  stopper.join();
  EXPECT_TRUE(WaitFor([&] { return s.service.Stats()["kv"]["used_blocks"] == 0; },
                      std::chrono::seconds(5)));
}

// The line HAProxy's agent-check reads from the agent port: one line, then the server closes.
std::string AgentLine(int port) {
  net::io_context io;
  tcp::socket socket(io);
  socket.connect(
      tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
  SetReadTimeout(socket);
  std::string line;
  beast::error_code ec;
  net::read(socket, net::dynamic_buffer(line), ec);  // to EOF: the server closes after the line
  EXPECT_EQ(ec, net::error::eof) << ec.message();
  return line;
}

// The agent follows admission (limit, headroom) and the drain; session.started names the replica;
// a drain refuses new sessions with reason shutdown while the running one keeps its frames.
TEST(HttpServerTest, TheAgentReportsHeadroomAndDrainAndSessionsNameTheReplica) {
  ServerOptions o;
  o.agent_port = 0;
  o.replica_id = "replica-a";
  Server s("static:2", o);
  ASSERT_GT(s.http.agent_port(), 0);
  EXPECT_EQ(AgentLine(s.http.agent_port()), "up ready 100% maxconn:2\n");
  Client c(s.http.port());
  c.Send({{"type", "session.start"}, {"period_ms", 20}, {"tokens_per_frame", 1}});
  const json started = c.Read();
  ASSERT_EQ(started["type"], "session.started") << started.dump();
  EXPECT_EQ(started["replica"], "replica-a");
  const auto id = started["session"].get<std::uint64_t>();
  // Published after the engine thread's next turn: the line changes, it is never wrong for long.
  EXPECT_TRUE(WaitFor([&] { return AgentLine(s.http.agent_port()) == "up ready 50% maxconn:2\n"; },
                      std::chrono::seconds(5)));
  ASSERT_NE(c.Start(), 0U);
  EXPECT_TRUE(WaitFor([&] { return AgentLine(s.http.agent_port()) == "up drain maxconn:2\n"; },
                      std::chrono::seconds(5)));
  EXPECT_NE(s.registry.ExpositionText().find("\nmetronome_admission_headroom 0\n"),
            std::string::npos);
  c.Send({{"type", "session.end"}, {"session", id}});
  EXPECT_EQ(c.ReadType("session.ended")["session"], id);
  EXPECT_TRUE(WaitFor([&] { return AgentLine(s.http.agent_port()) == "up ready 50% maxconn:2\n"; },
                      std::chrono::seconds(5)));

  // A full replica's "drain" is not a drain: no balancer has been told this one goes away.
  EXPECT_EQ(s.http.drain_announcements(), 0);
  s.service.BeginDrain();
  EXPECT_TRUE(WaitFor([&] { return AgentLine(s.http.agent_port()) == "up drain maxconn:2\n"; },
                      std::chrono::seconds(5)));
  EXPECT_GE(s.http.drain_announcements(), 1) << "the agent's answer told HAProxy";
  EXPECT_EQ(s.service.replica_state().active, 1);
  c.Send({{"type", "session.start"}, {"period_ms", 20}, {"tokens_per_frame", 1}});
  const json refused = c.ReadType("session.rejected");
  EXPECT_EQ(refused["reason"], "shutdown") << refused.dump();
  EXPECT_EQ(s.service.Stats()["draining"], true);
}

TEST(HttpServerTest, StartFailsWithAConfigErrorNamingTheAddress) {
  Server s("static:4", {});
  ServerOptions busy;
  busy.port = s.http.port();
  HttpServer second(&s.service, nullptr, busy, nullptr);
  try {
    second.Start();
    ADD_FAILURE() << "bound a port already in use";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(s.http.port())), std::string::npos) << what;
    EXPECT_NE(what.find("in use"), std::string::npos) << what;
  }
  ServerOptions foreign;
  foreign.host = "192.0.2.1";  // TEST-NET-1: numeric (no DNS), never a local address
  HttpServer third(&s.service, nullptr, foreign, nullptr);
  EXPECT_THROW(third.Start(), ConfigError);
}

// Every ended session's state is freed over the network too: thousands of sessions started, fed
// and ended on one connection (1 in 10 with an 8192-id prompt) leave the service's containers at
// their baseline and RSS within 8 MiB of what it was after a warm-up.
TEST(HttpServerTest, SessionsStartedAndEndedOverTheNetworkLeaveNothingBehind) {
  testing::LoopbackServer s("static:64", /*blocks=*/2048);
  Client c(s.port());
  std::vector<int> long_prompt(8192);
  for (int i = 0; i < 8192; ++i) long_prompt[static_cast<std::size_t>(i)] = i % 1000;
  auto one = [&](int i) {
    json extra = json::object();
    if (i % 10 == 0) extra["prompt"] = {{"ids", long_prompt}};
    const std::uint64_t id = c.Start(extra);
    ASSERT_NE(id, 0U);
    c.Send({{"type", "frame"}, {"session", id}, {"ids", {1, 2}}});
    c.Send({{"type", "session.end"}, {"session", id}});
    const json ended = c.ReadType("session.ended");
    ASSERT_EQ(ended["session"], id) << ended.dump();
  };
  // Fewer under sanitizers (8192-id prompts through the JSON parser are slow there), where only the
  // containers are checked.
  constexpr int kWarmup = testing::kRssIsMeaningful ? 200 : 20;
  constexpr int kSessions = testing::kRssIsMeaningful ? 4000 : 400;
  for (int i = 0; i < kWarmup; ++i) one(i);
  const std::int64_t rss_after_warmup = testing::ResidentBytes();
  for (int i = 0; i < kSessions; ++i) one(i);
  const ServiceFootprint f = s.service.Footprint();
  EXPECT_EQ(f.live, 0);
  EXPECT_EQ(f.tracked, 0);
  EXPECT_EQ(f.loop.sessions, 0);
  EXPECT_EQ(f.loop.retired, 0);
  EXPECT_EQ(f.loop.arrivals, 0);
  EXPECT_EQ(f.loop.ready, 0);
  EXPECT_EQ(f.backend_sessions, 0);
  EXPECT_EQ(f.used_blocks, 0);
  if (testing::kRssIsMeaningful) {
    const std::int64_t growth = testing::ResidentBytes() - rss_after_warmup;
    RecordProperty("rss_growth_bytes", std::to_string(growth));
    EXPECT_LT(growth, std::int64_t{8} << 20)
        << "RSS grew by " << growth << " bytes over " << kSessions << " sessions after the warm-up";
  }
}

// Text is tokenised, then held to the session's declared tokens_per_frame exactly as ids are
// (over_cap, the same message): one session's compute per frame is what admission saw.
TEST(HttpServerTest, ATextFrameOverTheDeclaredTokenCountIsRefusedLikeIds) {
  const std::unique_ptr<model::Tokenizer> tokenizer =
      model::MakeSentencePieceTokenizer(model::MakeSyntheticVocabulary(512));
  ServerOptions o;
  o.caps.vocab_size = 512;
  testing::LoopbackServer s("static:4", /*blocks=*/256, o, tokenizer.get());
  Client c(s.port());
  // A generous deadline: the accepted frame's outcome must not depend on the machine's load.
  const std::uint64_t id = c.Start({{"deadline_ms", 2000}});  // 2 tokens per frame
  // Short texts that take more than 2 tokens (tokenised, then counted), and a 20 KB one (refused
  // by its length before tokenising: no 2 tokens can hold it).
  for (const std::string& text :
       {std::string("a a a a a"), std::string("x, y; z."), std::string(20000, 'a')}) {
    ASSERT_GT(tokenizer->Encode(text, /*add_bos=*/false).size(), 2U) << text;
    c.Send({{"type", "frame"}, {"session", id}, {"index", 1}, {"text", text}});
    const json err = c.Read();
    EXPECT_EQ(err["type"], "error") << err.dump();
    EXPECT_EQ(err["code"], "over_cap") << err.dump();
    EXPECT_EQ(err["frame"], 1);
    EXPECT_NE(err["message"].get<std::string>().find("text has "), std::string::npos) << err.dump();
    EXPECT_NE(err["message"].get<std::string>().find("the session's tokens_per_frame = 2"),
              std::string::npos)
        << err.dump();
  }
  json e;
  c.Send({{"type", "frame"}, {"session", id}, {"index", 2}, {"ids", {1, 2, 3}}});
  e = c.Read();
  EXPECT_EQ(e["code"], "over_cap") << e.dump();
  EXPECT_NE(e["message"].get<std::string>().find(
                "ids has 3 tokens, more than the session's tokens_per_frame = 2"),
            std::string::npos)
      << e.dump();
  // Text within the declared count is served.
  c.Send({{"type", "frame"}, {"session", id}, {"index", 3}, {"text", "a"}});
  const json r = c.Read();
  EXPECT_EQ(r["type"], "frame.result") << r.dump();
  EXPECT_EQ(r["frame"], 3);
  EXPECT_TRUE(r.contains("text")) << r.dump();
}

// The declared rate is enforced: frames sent back to back, far faster than the period, are
// accepted up to the burst allowance and then refused with frame_too_early, never admitted into
// the KV early.
TEST(HttpServerTest, FramesFasterThanTheDeclaredPeriodAreRefusedBeyondTheBurst) {
  testing::LoopbackServer s("static:4");
  Client c(s.port());
  // Period 10 s, 1 token per frame: the attack of issue 11 item 2 on a window session.
  const std::uint64_t id = c.Start({{"period_ms", 10000}, {"tokens_per_frame", 1}});
  constexpr int kSent = 40;
  for (int i = 0; i < kSent; ++i) {
    c.Send({{"type", "frame"}, {"session", id}, {"index", i}, {"ids", {1}}});
  }
  // Every frame gets exactly one answer: a result (accepted) or an error (refused).
  int results = 0;
  int too_early = 0;
  while (results + too_early < kSent) {
    const json j = c.Read();
    ASSERT_TRUE(j["type"] == "frame.result" || j["type"] == "error") << j.dump();
    if (j["type"] == "frame.result") ++results;
    if (j["type"] == "error") {
      EXPECT_EQ(j["code"], "frame_too_early") << j.dump();
      ++too_early;
    }
  }
  // realtime::FramePacing's default: 4 frames back to back at a 10 s period (tolerance 30 s), and
  // no more than 2 waiting at once.
  EXPECT_GE(results, 2);
  EXPECT_LE(results, realtime::FramePacing{}.burst_frames);
}

// A full-KV session admitted by the memory controller is told up front what admission reserved
// for it (session.started.max_context, in tokens); RealtimeLoop/Supervisor tests check that it
// ends there with context_full. A window session's bound needs no budget (max_context null).
TEST(HttpServerTest, AFullKvSessionIsToldItsKvBudget) {
  testing::LoopbackServer s("memory", /*blocks=*/256);
  Client c(s.port());
  // 300 s (memory.full_mode_session_s) / 10 s = 30 frames of 1 + 1 tokens: 60 tokens, 4 blocks
  // of 16: 64 tokens.
  c.Send({{"type", "session.start"},
          {"period_ms", 10000},
          {"tokens_per_frame", 1},
          {"output_tokens_per_frame", 1},
          {"kv", {{"policy", "full"}}}});
  const json full = c.Read();
  ASSERT_EQ(full["type"], "session.started") << full.dump();
  EXPECT_EQ(full["max_context"], 64) << full.dump();
  c.Send({{"type", "session.start"}, {"period_ms", 20}, {"tokens_per_frame", 1}});
  const json window = c.Read();
  ASSERT_EQ(window["type"], "session.started") << window.dump();
  EXPECT_TRUE(window["max_context"].is_null()) << window.dump();
}

}  // namespace
}  // namespace metronome::server

namespace metronome::server {
namespace {

// Sends `request` as raw bytes on a fresh connection and returns everything the server sends
// back until it closes (or 5 s pass).
std::string RawExchange(int port, const std::string& request) {
  net::io_context io;
  tcp::socket socket(io);
  socket.connect(
      tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
  SetReadTimeout(socket);
  beast::error_code ec;
  net::write(socket, net::buffer(request), ec);
  std::string response;
  net::read(socket, net::dynamic_buffer(response), ec);
  return response;
}

// The status line's code of a raw response; -1 for none.
int StatusOf(const std::string& response) {
  if (!response.starts_with("HTTP/1.1 ") || response.size() < 12) return -1;
  return std::stoi(response.substr(9, 3));
}

// What HTTP says, where a request cannot be served as sent: 400, 431, 505 and 426, each answered
// (never a silent close).
TEST(HttpServerTest, MalformedOversizedAndWrongVersionRequestsGetTheirStatus) {
  Server s("static:4", {});
  const int port = s.http.port();
  EXPECT_EQ(StatusOf(RawExchange(port, "GARBAGE\r\n\r\n")), 400);
  EXPECT_EQ(StatusOf(RawExchange(port, "GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n")), 400);
  const std::string big =
      "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(16 * 1024, 'a') + "\r\n\r\n";
  const std::string too_large = RawExchange(port, big);
  EXPECT_EQ(StatusOf(too_large), 431) << too_large.substr(0, 200);
  const std::string v2 = RawExchange(port, "GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n");
  EXPECT_EQ(StatusOf(v2), 505) << v2;
  EXPECT_NE(v2.find("HTTP/1.0 and HTTP/1.1"), std::string::npos) << v2;
  // The WebSocket endpoint asked for without the upgrade: 426, naming the protocol.
  const std::string plain =
      RawExchange(port, "GET /v1/realtime HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(StatusOf(plain), 426) << plain;
  EXPECT_NE(plain.find("\r\nUpgrade: websocket\r\n"), std::string::npos) << plain;
  // And what was fine stays fine.
  EXPECT_EQ(
      StatusOf(RawExchange(port, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")),
      200);
}

// /readyz: 200 with room, 503 naming why when admission is full, every WebSocket slot holds a
// session, or the server drains; /healthz stays 200 throughout (liveness).
TEST(HttpServerTest, ReadyzSaysWhyNotReadyWhileHealthzStaysOk) {
  ServerOptions o;
  o.max_connections = 2;
  Server s("static:1", o);
  const int port = s.http.port();
  HttpResult r = Get(port, "/readyz");
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.content_type, "application/json");
  EXPECT_EQ(json::parse(r.body)["reason"], "ok") << r.body;
  EXPECT_EQ(json::parse(r.body)["free_connection_slots"], 2) << r.body;
  Client c(port);
  ASSERT_NE(c.Start(), 0U);
  EXPECT_TRUE(WaitFor([&] { return Get(port, "/readyz").status == 503; }, std::chrono::seconds(5)));
  r = Get(port, "/readyz");
  const json body = json::parse(r.body);
  EXPECT_EQ(body["ready"], false) << r.body;
  EXPECT_EQ(body["reason"], "admission_full") << r.body;
  EXPECT_EQ(body["headroom"], 0) << r.body;
  EXPECT_EQ(body["free_connection_slots"], 1) << r.body;
  EXPECT_EQ(Get(port, "/healthz").status, 200);
  s.service.BeginDrain();
  EXPECT_TRUE(
      WaitFor([&] { return json::parse(Get(port, "/readyz").body)["reason"] == "draining"; },
              std::chrono::seconds(5)));
  EXPECT_EQ(Get(port, "/healthz").status, 200);
}

// Every WebSocket slot holds a session: probes are still answered (their own slots), an upgrade
// gets 503 with Retry-After instead of a reset, /readyz and the agent say there is no room.
TEST(HttpServerTest, ProbesAreAnsweredWhenEveryWebSocketSlotIsTaken) {
  ServerOptions o;
  o.max_connections = 2;
  o.agent_port = 0;
  Server s("static:8", o);
  const int port = s.http.port();
  Client a(port);
  Client b(port);
  const std::uint64_t a_id = a.Start();
  ASSERT_NE(a_id, 0U);
  ASSERT_NE(b.Start(), 0U);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(TryGetStatus(port, "/healthz"), 200);
    EXPECT_EQ(TryGetStatus(port, "/metrics"), 200);
  }
  const HttpResult ready = Get(port, "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(json::parse(ready.body)["reason"], "no_free_connection_slots") << ready.body;
  const std::string upgrade = RawExchange(
      port,
      "GET /v1/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: "
      "Upgrade, close\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: "
      "13\r\n\r\n");
  EXPECT_EQ(StatusOf(upgrade), 503) << upgrade;
  EXPECT_NE(upgrade.find("\r\nRetry-After: 1\r\n"), std::string::npos) << upgrade;
  EXPECT_TRUE(WaitFor([&] { return AgentLine(s.http.agent_port()) == "up drain maxconn:2\n"; },
                      std::chrono::seconds(5)))
      << AgentLine(s.http.agent_port());
  // A session-less WebSocket is no squatter: it gives its slot to an upgrade.
  a.Send({{"type", "session.end"}, {"session", a_id}});
  (void)a.ReadType("session.ended");
  Client newcomer(port);
  EXPECT_NE(newcomer.Start(), 0U);
}

// A session that sends nothing ends with reason idle after its idle timeout (counted in
// /metrics); one that sends every period keeps going; a connection left with no session is
// closed with 1000 and a reason.
TEST(HttpServerTest, IdleSessionsEndAndSessionlessConnectionsClose) {
  ServerOptions o;
  o.session_idle = {.periods = 2, .min_ms = 150, .max_ms = 400};
  o.connection_idle_timeout_ms = 300;
  Server s("static:8", o);
  const int port = s.http.port();
  Client quiet(port);
  Client busy(port);
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint64_t quiet_id = quiet.Start({{"period_ms", 20}});
  const std::uint64_t busy_id = busy.Start({{"period_ms", 20}});
  ASSERT_NE(quiet_id, 0U);
  ASSERT_NE(busy_id, 0U);
  // busy sends a frame every 50 ms (within its 150 ms timeout) while quiet says nothing.
  std::atomic<bool> stop{false};
  std::thread sender([&] {
    for (int i = 0; !stop.load(); ++i) {
      busy.Send({{"type", "frame"}, {"session", busy_id}, {"index", i}, {"ids", {1, 2}}});
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const json ended = quiet.ReadType("session.ended");
  const double after_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(ended["session"], quiet_id) << ended.dump();
  EXPECT_EQ(ended["reason"], "idle") << ended.dump();
  EXPECT_GE(after_s, 0.14);  // the floor: 2 periods (40 ms) is less
  EXPECT_LT(after_s, 2.0);
  // quiet's connection now holds no session: closed after 300 ms with 1000 and a reason.
  beast::flat_buffer buf;
  beast::error_code ec;
  quiet.ws().read(buf, ec);
  EXPECT_EQ(ec, websocket::error::closed) << ec.message();
  EXPECT_EQ(quiet.ws().reason().code, websocket::close_code::normal);
  const auto& reason = quiet.ws().reason().reason;
  const std::string reason_text(reason.data(), reason.size());
  EXPECT_TRUE(reason_text.starts_with("idle: no session for 300 ms")) << reason_text;
  stop = true;
  sender.join();
  // busy's session went on; its last results may still be coming.
  busy.Send({{"type", "session.end"}, {"session", busy_id}});
  EXPECT_EQ(busy.ReadType("session.ended")["reason"], "client");
  EXPECT_NE(s.registry.ExpositionText().find("metronome_sessions_ended_total{reason=\"idle\"} 1"),
            std::string::npos);
  // A connection that never starts a session is closed too.
  Client never(port);
  never.ws().read(buf, ec);
  EXPECT_EQ(ec, websocket::error::closed) << ec.message();
}

TEST(SessionIdlePolicyTest, TheTimeoutIsPeriodsClampedAndValidated) {
  const SessionIdlePolicy p{.periods = 10, .min_ms = 5000, .max_ms = 30000};
  EXPECT_EQ(p.TimeoutMs(80.0), 5000);      // a Moshi-like client: the floor
  EXPECT_EQ(p.TimeoutMs(1000.0), 10000);   // 10 periods
  EXPECT_EQ(p.TimeoutMs(10000.0), 30000);  // a 10 s squatter: the ceiling
  EXPECT_EQ((SessionIdlePolicy{.periods = 0}).TimeoutMs(80.0), 0);
  EXPECT_THROW((SessionIdlePolicy{.periods = -1}).Validate(), ConfigError);
  try {
    (SessionIdlePolicy{.periods = 2, .min_ms = 500, .max_ms = 100}).Validate();
    ADD_FAILURE() << "min_ms > max_ms accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("session_idle.min_ms = 500 must be >= 0 and at most "
                                         "session_idle.max_ms = 100"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Continuity: session.resume after a dropped connection, session.moving on a drain with handoff.

// Sends `frames` frames (ids from `first`) one after another and returns their results' ids.
std::vector<json> RunFrames(Client& c, std::uint64_t id, int first, int frames) {
  std::vector<json> ids;
  for (int i = first; i < first + frames; ++i) {
    c.Send({{"type", "frame"}, {"session", id}, {"ids", {1 + i % 7, 2 + i % 5}}});
    const json r = c.ReadType("frame.result");
    EXPECT_EQ(r["frame"], i) << r.dump();
    ids.push_back(r["ids"]);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ids;
}

void DropConnection(Client& c) {
  beast::error_code ec;
  c.ws().next_layer().close(ec);  // no close frame: as a network failure
}

HttpResult StateRequest(int port, http::verb verb, const std::string& token,
                        const std::string& secret) {
  net::io_context io;
  tcp::socket socket(io);
  socket.connect(
      tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)));
  SetReadTimeout(socket);
  http::request<http::string_body> req{verb, "/v1/session-state", 11};
  req.set(http::field::host, "127.0.0.1");
  req.set("Metronome-Resume-Token", token);
  if (!secret.empty()) req.set("Metronome-Cluster-Secret", secret);
  req.prepare_payload();
  http::write(socket, req);
  beast::flat_buffer b;
  http::response<http::string_body> res;
  http::read(socket, b, res);
  HttpResult out;
  out.status = static_cast<int>(res.result_int());
  out.body = res.body();
  return out;
}

TEST(HttpServerContinuityTest, ADroppedConnectionResumesWhereItWasAndCountsMissedFrames) {
  Server s("static:8", {}, {.resume_window_s = 5.0, .advertise_url = {}});
  std::vector<json> uninterrupted;
  {
    Client c(s.http.port());
    const std::uint64_t id = c.Start();
    uninterrupted = RunFrames(c, id, 0, 12);
    c.Send({{"type", "session.end"}, {"session", id}});
    EXPECT_EQ(c.ReadType("session.ended")["reason"], "client");
  }
  Client c(s.http.port());
  const json started = c.Started();
  ASSERT_EQ(started["type"], "session.started");
  ASSERT_TRUE(started.contains("resume_token")) << started.dump();
  const std::uint64_t id = started["session"];
  std::vector<json> got = RunFrames(c, id, 0, 5);
  DropConnection(c);
  std::this_thread::sleep_for(std::chrono::milliseconds(120));  // ~6 periods away

  Client back(s.http.port());
  back.Send({{"type", "session.resume"},
             {"resume_token", started["resume_token"]},
             {"client_ref", "again"}});
  const json resumed = back.ReadType("session.resumed");
  ASSERT_EQ(resumed["type"], "session.resumed") << resumed.dump();
  EXPECT_EQ(resumed["client_ref"], "again");
  EXPECT_EQ(resumed["next_frame"], 5);
  EXPECT_GE(resumed["missed_frames"].get<int>(), 4) << resumed.dump();
  EXPECT_NE(resumed["resume_token"], started["resume_token"]) << "a token is good once";
  EXPECT_EQ(resumed["tokens_per_frame"], 2);
  const std::uint64_t again = resumed["session"];
  const std::vector<json> rest = RunFrames(back, again, 5, 7);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, uninterrupted) << "the same outputs as a session that never dropped";
  const json st = s.service.Stats();
  EXPECT_EQ(st["sessions"]["active"], 1) << st.dump();
  EXPECT_GE(st["frames"]["missed"].get<int>(), 4) << st.dump();
  EXPECT_EQ(s.service.Stats()["continuity"]["resumed"], 1) << "/v1/stats counts it too";
  EXPECT_NE(s.registry.ExpositionText().find("metronome_sessions_resumed_total 1"),
            std::string::npos);

  // The spent token is refused, precisely, and the live session is untouched.
  Client replay(s.http.port());
  replay.Send({{"type", "session.resume"}, {"resume_token", started["resume_token"]}});
  const json refused = replay.Read();
  EXPECT_EQ(refused["type"], "session.rejected") << refused.dump();
  EXPECT_EQ(refused["reason"], "resume_unknown") << refused.dump();
  EXPECT_EQ(refused["retry_after_ms"], 0.0);
  replay.Send({{"type", "session.resume"}, {"resume_token", "mtr1.not-a-token"}});
  EXPECT_EQ(replay.Read()["reason"], "resume_token");
  RunFrames(back, again, 12, 2);
}

TEST(HttpServerContinuityTest, AResumeTakesTheSessionFromAConnectionStillHoldingIt) {
  Server s("static:8", {}, {.resume_window_s = 5.0, .advertise_url = {}});
  Client old_conn(s.http.port());
  old_conn.Send({{"type", "session.start"}, {"period_ms", 20}, {"tokens_per_frame", 2}});
  const json started = old_conn.Read();
  Client fresh(s.http.port());
  fresh.Send({{"type", "session.resume"}, {"resume_token", started["resume_token"]}});
  const json resumed = fresh.ReadType("session.resumed");
  ASSERT_EQ(resumed["type"], "session.resumed") << resumed.dump();
  // The old connection no longer has it.
  old_conn.Send({{"type", "frame"}, {"session", started["session"]}, {"ids", {1}}});
  EXPECT_EQ(old_conn.Read()["code"], "unknown_session");
  RunFrames(fresh, resumed["session"], 0, 2);
}

TEST(HttpServerContinuityTest, AfterTheWindowTheSessionEndsAndItsTokenIsRefused) {
  Server s("static:8", {}, {.resume_window_s = 0.2, .advertise_url = {}});
  json started;
  {
    Client c(s.http.port());
    c.Send({{"type", "session.start"}, {"period_ms", 20}, {"tokens_per_frame", 2}});
    started = c.Read();
    RunFrames(c, started["session"], 0, 2);
    DropConnection(c);
  }
  ASSERT_TRUE(WaitFor([&] { return s.service.Stats()["sessions"]["active"] == 0; },
                      std::chrono::milliseconds(3000)));
  EXPECT_EQ(s.service.Stats()["kv"]["used_blocks"], 0);
  EXPECT_NE(
      s.registry.ExpositionText().find("metronome_sessions_ended_total{reason=\"disconnect\"} 1"),
      std::string::npos);
  Client c(s.http.port());
  c.Send({{"type", "session.resume"}, {"resume_token", started["resume_token"]}});
  const json refused = c.Read();
  EXPECT_EQ(refused["reason"], "resume_unknown") << refused.dump();
  EXPECT_NE(refused["detail"].get<std::string>().find("resume window"), std::string::npos);
}

// A client that starts sessions and drops their connections holds no more of them than
// max_detached_per_address: past it, its oldest waiting session ends and its token is spent.
TEST(HttpServerContinuityTest, OneAddressLeavesAtMostItsCapOfSessionsWaiting) {
  Server s("static:8", {},
           {.resume_window_s = 30.0, .advertise_url = {}, .max_detached_per_address = 2});
  std::vector<json> started;
  for (int i = 0; i < 3; ++i) {
    Client c(s.http.port());
    started.push_back(c.Started({{"period_ms", 1000}}));
    DropConnection(c);
    // One at a time, so the order of the drops is the order of their age.
    const int waiting = std::min(i + 1, 2);
    ASSERT_TRUE(WaitFor(
        [&] {
          const json stats = s.service.Stats();
          return stats["continuity"]["detached"] == waiting &&
                 stats["sessions"]["active"] == waiting;
        },
        std::chrono::milliseconds(3000)));
  }
  EXPECT_EQ(s.service.Stats()["sessions"]["active"], 2);
  Client back(s.http.port());
  back.Send({{"type", "session.resume"}, {"resume_token", started[0]["resume_token"]}});
  EXPECT_EQ(back.Read()["reason"], "resume_unknown") << "the oldest was ended";
  for (int i = 1; i < 3; ++i) {
    back.Send({{"type", "session.resume"}, {"resume_token", started[i]["resume_token"]}});
    EXPECT_EQ(back.ReadType("session.resumed")["type"], "session.resumed") << i;
  }
}

// Two replicas of one cluster: a drain hands the session over, the other replica fetches its
// state with the cluster secret and the conversation goes on with the same outputs.
TEST(HttpServerContinuityTest, ADrainHandsTheSessionToAnotherReplica) {
  const std::string secret = "correct horse battery staple";
  ServerOptions origin_options;
  // The origin's advertise URL needs its port: bind one first.
  net::io_context io;
  tcp::acceptor probe(io, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  const int origin_port = probe.local_endpoint().port();
  probe.close();
  origin_options.port = origin_port;
  const std::string origin_url = "http://127.0.0.1:" + std::to_string(origin_port);
  Server origin("static:8", origin_options,
                {.resume_window_s = 5.0, .advertise_url = origin_url, .cluster_secret = secret});
  Server target(
      "static:8", {},
      {.resume_window_s = 5.0, .advertise_url = "http://127.0.0.1:1", .cluster_secret = secret});
  Server stranger("static:8", {}, {.resume_window_s = 5.0, .advertise_url = {}});

  std::vector<json> uninterrupted;
  {
    Client c(target.http.port());
    uninterrupted = RunFrames(c, c.Start(), 0, 10);
  }
  Client c(origin.http.port());
  const json started = c.Started();
  std::vector<json> got = RunFrames(c, started["session"], 0, 4);
  origin.service.BeginHandoff();
  const json moving = c.ReadType("session.moving");
  ASSERT_EQ(moving["type"], "session.moving") << moving.dump();
  EXPECT_EQ(moving["reason"], "drain");
  EXPECT_EQ(moving["next_frame"], 4);
  c.Send({{"type", "frame"}, {"session", started["session"]}, {"ids", {1}}});
  EXPECT_EQ(c.Read()["code"], "unknown_session") << "the moved session left this connection";
  // The session counts as moving from the moment it is marked, while the engine still runs it, so
  // wait for the handed-off state itself: moving and no longer a session of this replica.
  ASSERT_TRUE(WaitFor(
      [&] {
        const ReplicaState state = origin.service.replica_state();
        return state.moving == 1 && state.sessions == 0;
      },
      std::chrono::milliseconds(2000)));

  // Without the secret, or with a wrong one, the state stays where it is.
  const std::string token = moving["resume_token"];
  EXPECT_EQ(StateRequest(origin.http.port(), http::verb::get, token, "").status, 401);
  EXPECT_EQ(StateRequest(origin.http.port(), http::verb::get, token, "wrong").status, 401);
  EXPECT_EQ(StateRequest(stranger.http.port(), http::verb::get, token, "x").status, 404)
      << "a server without a cluster secret has no state endpoint";
  Client elsewhere(stranger.http.port());
  elsewhere.Send({{"type", "session.resume"}, {"resume_token", token}});
  EXPECT_EQ(elsewhere.Read()["reason"], "resume_origin") << "no secret to fetch with";

  // A token naming another origin is fetched only when its seal holds: a forged one (the
  // stranger's URL as origin, no seal) is refused before any request leaves the target.
  tcp::acceptor bait(io, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0));
  const std::optional<ResumeToken> real = ParseResumeToken(token);
  ASSERT_TRUE(real.has_value());
  ResumeToken forged = *real;
  forged.origin = "http://127.0.0.1:" + std::to_string(bait.local_endpoint().port());
  forged.seal.clear();
  Client forger(target.http.port());
  forger.Send({{"type", "session.resume"}, {"resume_token", EncodeResumeToken(forged)}});
  const json forged_answer = forger.Read();
  EXPECT_EQ(forged_answer["reason"], "resume_token") << forged_answer.dump();
  forged = Sealed(forged, "not the cluster's secret");
  forger.Send({{"type", "session.resume"}, {"resume_token", EncodeResumeToken(forged)}});
  EXPECT_EQ(forger.Read()["reason"], "resume_token") << "sealed with another secret";
  bait.non_blocking(true);
  boost::system::error_code no_connection;
  tcp::socket caught(io);
  bait.accept(caught, no_connection);
  EXPECT_EQ(no_connection, net::error::would_block) << "the target called the forged origin";

  Client moved(target.http.port());
  moved.Send({{"type", "session.resume"}, {"resume_token", token}});
  const json resumed = moved.ReadType("session.resumed");
  ASSERT_EQ(resumed["type"], "session.resumed") << resumed.dump();
  EXPECT_EQ(resumed["next_frame"], 4);
  const std::vector<json> rest = RunFrames(moved, resumed["session"], 4, 6);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, uninterrupted);
  // Released: the origin holds nothing more and may exit; the token is spent.
  ASSERT_TRUE(WaitFor([&] { return origin.service.replica_state().moving == 0; },
                      std::chrono::milliseconds(2000)));
  EXPECT_EQ(StateRequest(origin.http.port(), http::verb::get, token, secret).status, 404);
  EXPECT_NE(
      target.registry.ExpositionText().find("metronome_sessions_moved_total{direction=\"in\"} 1"),
      std::string::npos);
  EXPECT_NE(
      origin.registry.ExpositionText().find("metronome_sessions_moved_total{direction=\"out\"} 1"),
      std::string::npos);
  // The bytes that moved: the same state out of the origin and into the target, a window's KV.
  const auto bytes = [](const std::string& text, const std::string& direction) {
    const std::string key = "metronome_session_state_bytes_total{direction=\"" + direction + "\"} ";
    const std::size_t at = text.find(key);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + key.size()));
  };
  const double out_bytes = bytes(origin.registry.ExpositionText(), "out");
  EXPECT_GT(out_bytes, 0.0);
  EXPECT_EQ(out_bytes, bytes(target.registry.ExpositionText(), "in"));
  EXPECT_EQ(origin.service.Stats()["continuity"]["moved_out"], 1);
  EXPECT_EQ(target.service.Stats()["continuity"]["moved_in"], 1);
  EXPECT_EQ(target.service.Stats()["continuity"]["state_bytes_in"].get<double>(), out_bytes);
}

}  // namespace
}  // namespace metronome::server
