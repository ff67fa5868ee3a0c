// The HTTP edge's access rules, as pure functions (no sockets; table-tested in
// tests/server/http_access_test.cc): which browser Origins may open a WebSocket, the bearer-token
// comparison, and RFC 6455's Sec-WebSocket-Key. HttpServer applies them before it accepts an
// upgrade; docs/protocol.md ("Access control") is the contract.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace metronome::server {

// Which Origin header values may upgrade. nullopt: the default rule (OriginAllowed). A list
// holds origins as a browser sends them, "scheme://host[:port]" in lower case, or "*" (any).
using AllowedOrigins = std::optional<std::vector<std::string>>;

// "" -> nullopt (the default rule); "*" -> any; otherwise a comma list of origins, each
// "http(s)://host[:port]" (case-insensitive, stored lower-cased). Throws ConfigError naming
// `allowed_origins` and the bad entry.
[[nodiscard]] AllowedOrigins ParseAllowedOrigins(std::string_view text);

// Whether a request with Origin `origin` (empty: the header is absent, i.e. not a browser; always
// allowed) and Host `host` may upgrade. An explicit list allows its entries (or anything with
// "*"). The default rule: with an auth token, any origin (the token is the gate); without one,
// only an origin whose host equals the Host header's host (ports ignored) or is a loopback name
// (localhost, *.localhost, 127.0.0.0/8, [::1]), so a page on another site cannot drive an
// unauthenticated local server.
[[nodiscard]] bool OriginAllowed(std::string_view origin, std::string_view host,
                                 const AllowedOrigins& allowed, bool token_required);

// What is wrong with `token` as the server's bearer token, or "" when nothing is: it is empty,
// only whitespace, has whitespace at either end (a header's value arrives trimmed, so no request
// could ever match it), or holds a control character (no header can carry one). A message to
// append to where the token came from, e.g. "is empty".
[[nodiscard]] std::string AuthTokenProblem(std::string_view token);

// `given == expected` in time that depends only on expected.size(), not on where the first
// differing byte is: a client timing the answers cannot learn the token byte by byte.
[[nodiscard]] bool ConstantTimeEquals(std::string_view given, std::string_view expected);

// RFC 6455 4.2.1: Sec-WebSocket-Key is the base64 encoding of 16 bytes: exactly 24 characters,
// 22 of the base64 alphabet (the last of them with its 4 padding bits zero: A, Q, g or w) and "==".
[[nodiscard]] bool IsValidWebSocketKey(std::string_view key);

}  // namespace metronome::server
