#include "metronome/server/state_fetch.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <chrono>
#include <cmath>
#include <memory>
#include <utility>

namespace metronome::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

// A session's state is its window's KV: far below this for any model the engine serves.
constexpr std::uint64_t kMaxStateBytes = std::uint64_t{1} << 31;

class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(const net::any_io_executor& ex, HttpOrigin origin, http::verb verb,
           const std::string& token, const std::string& secret,
           std::function<void(StateFetchResult)> done, int timeout_ms)
      : resolver_(ex),
        stream_(ex),
        origin_(std::move(origin)),
        done_(std::move(done)),
        timeout_(timeout_ms) {
    request_.method(verb);
    request_.target(std::string(kSessionStatePath));
    request_.version(11);
    request_.set(http::field::host, origin_.host + ":" + origin_.port);
    request_.set(http::field::user_agent, "metronome");
    request_.set(std::string(kResumeTokenHeader), token);
    request_.set(std::string(kClusterSecretHeader), secret);
    request_.keep_alive(false);
    parser_.body_limit(kMaxStateBytes);
  }

  void Start() {
    auto self = shared_from_this();
    stream_.expires_after(timeout_);
    resolver_.async_resolve(origin_.host, origin_.port,
                            [self](beast::error_code ec, const tcp::resolver::results_type& r) {
                              if (ec) return self->Fail("resolving the origin: " + ec.message());
                              self->stream_.async_connect(
                                  r, [self](beast::error_code ec2, const tcp::endpoint&) {
                                    if (ec2) return self->Fail("connecting: " + ec2.message());
                                    self->Send();
                                  });
                            });
  }

 private:
  void Send() {
    auto self = shared_from_this();
    http::async_write(stream_, request_, [self](beast::error_code ec, std::size_t) {
      if (ec) return self->Fail("sending: " + ec.message());
      http::async_read(self->stream_, self->buffer_, self->parser_,
                       [self](beast::error_code ec2, std::size_t) {
                         if (ec2) return self->Fail("reading the answer: " + ec2.message());
                         self->Done();
                       });
    });
  }

  void Done() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    auto& res = parser_.get();
    const unsigned status = res.result_int();
    StateFetchResult out;
    if (status != 200 && status != 204) {
      std::string body = res.body().substr(0, 300);
      while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
      out.error = "the origin answered " + std::to_string(status) + ": " + body;
    } else {
      out.ok = true;
      const auto away = res[std::string(kAwayMsHeader)];
      double away_ms = 0.0;
      const auto [end, ec] = std::from_chars(away.data(), away.data() + away.size(), away_ms);
      if (ec == std::errc() && std::isfinite(away_ms) && away_ms >= 0.0) out.away_ms = away_ms;
      const std::string& body = res.body();
      const auto* bytes = reinterpret_cast<const std::byte*>(body.data());
      out.state.assign(bytes, bytes + body.size());
    }
    if (done_) done_(std::move(out));
  }

  void Fail(std::string error) {
    if (done_) done_({.ok = false, .error = std::move(error), .state = {}, .away_ms = 0.0});
  }

  tcp::resolver resolver_;
  beast::tcp_stream stream_;
  HttpOrigin origin_;
  http::request<http::empty_body> request_;
  beast::flat_buffer buffer_;
  http::response_parser<http::string_body> parser_;
  std::function<void(StateFetchResult)> done_;
  std::chrono::milliseconds timeout_;
};

void Run(const net::any_io_executor& executor, const std::string& origin_url, http::verb verb,
         const std::string& token, const std::string& secret,
         std::function<void(StateFetchResult)> done, int timeout_ms) {
  const std::optional<HttpOrigin> origin = ParseHttpOrigin(origin_url);
  if (!origin) {
    if (done) {
      net::post(executor, [done = std::move(done), origin_url] {
        done({.ok = false,
              .error = "the token's origin '" + origin_url + "' is not an http:// URL",
              .state = {},
              .away_ms = 0.0});
      });
    }
    return;
  }
  std::make_shared<Exchange>(executor, *origin, verb, token, secret, std::move(done), timeout_ms)
      ->Start();
}

}  // namespace

std::optional<HttpOrigin> ParseHttpOrigin(std::string_view url) {
  constexpr std::string_view kScheme = "http://";
  if (!url.starts_with(kScheme)) return std::nullopt;
  url.remove_prefix(kScheme.size());
  if (url.ends_with('/')) url.remove_suffix(1);
  if (url.empty() || url.find_first_of("/@?# ") != std::string_view::npos) return std::nullopt;
  HttpOrigin out;
  std::string_view host = url;
  std::string_view port = "80";
  if (url.front() == '[') {  // [IPv6]:port
    const auto close = url.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = url.substr(1, close - 1);
    const std::string_view rest = url.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::nullopt;
      port = rest.substr(1);
    }
  } else if (const auto colon = url.rfind(':'); colon != std::string_view::npos) {
    host = url.substr(0, colon);
    port = url.substr(colon + 1);
  }
  int port_number = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), port_number);
  if (host.empty() || ec != std::errc() || end != port.data() + port.size() || port_number < 1 ||
      port_number > 65535) {
    return std::nullopt;
  }
  out.host = host;
  out.port = port;
  return out;
}

void FetchMovedState(const net::any_io_executor& executor, const std::string& origin_url,
                     const std::string& token, const std::string& cluster_secret,
                     std::function<void(StateFetchResult)> done, int timeout_ms) {
  Run(executor, origin_url, http::verb::get, token, cluster_secret, std::move(done), timeout_ms);
}

void ReleaseMovedState(const net::any_io_executor& executor, const std::string& origin_url,
                       const std::string& token, const std::string& cluster_secret,
                       int timeout_ms) {
  Run(executor, origin_url, http::verb::delete_, token, cluster_secret, {}, timeout_ms);
}

}  // namespace metronome::server
