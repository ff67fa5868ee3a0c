// The receiving side of a move between replicas (docs/protocol.md, "Moving between replicas"):
// fetch a moved session's state from the replica that holds it (the resume token's origin), and,
// once it is imported here, tell that replica to forget it. Plain HTTP/1.1 on the server's
// io_context, authenticated by the cluster secret:
//
//   GET    <origin>/v1/session-state   Metronome-Resume-Token: <token>
//   DELETE <origin>/v1/session-state   Metronome-Cluster-Secret: <secret>
//
// GET answers 200 with the state's bytes (application/octet-stream; realtime/session_state.h)
// and Metronome-Away-Ms (ms since the session's last frame there); 404 for a token it does not
// hold, 401 for a wrong secret, 404 when it takes no fetches (no cluster secret). DELETE answers
// 204.
//
// Thread-safety: the callbacks run on `executor`.
#pragma once

// Before Asio: its awaitable.hpp uses std::exchange without including <utility>.
#include <boost/asio/any_io_executor.hpp>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace metronome::server {

inline constexpr std::string_view kResumeTokenHeader = "Metronome-Resume-Token";
inline constexpr std::string_view kClusterSecretHeader = "Metronome-Cluster-Secret";
inline constexpr std::string_view kAwayMsHeader = "Metronome-Away-Ms";
inline constexpr std::string_view kSessionStatePath = "/v1/session-state";

struct HttpOrigin {
  std::string host;
  std::string port;  // "80" when the URL gives none
};
// "http://host[:port][/]"; nullopt for anything else (https, a path, user info, no host).
[[nodiscard]] std::optional<HttpOrigin> ParseHttpOrigin(std::string_view url);

struct StateFetchResult {
  bool ok = false;
  std::string error;             // why not: the origin's status and body, or the network error
  std::vector<std::byte> state;  // when ok
  double away_ms = 0.0;          // when ok
};

// GET; `done` gets the result within about `timeout_ms` whatever the origin does.
void FetchMovedState(const boost::asio::any_io_executor& executor, const std::string& origin_url,
                     const std::string& token, const std::string& cluster_secret,
                     std::function<void(StateFetchResult)> done, int timeout_ms = 3000);
// DELETE, answer ignored (the origin forgets the state at the window's end anyway).
void ReleaseMovedState(const boost::asio::any_io_executor& executor, const std::string& origin_url,
                       const std::string& token, const std::string& cluster_secret,
                       int timeout_ms = 3000);

}  // namespace metronome::server
