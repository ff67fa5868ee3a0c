// `metronome loadgen`: a paced real-time client population for `metronome serve`. Each simulated
// client opens its own WebSocket connection to /v1/realtime, asks for a session (retrying after a
// rejection's retry_after_ms, like sim/drive's clients), streams frames on a drift-free clock
// (frame k is sent at start + k x period, however late the previous send was), and measures every
// frame on the client side: latency from send to frame.result, and the outcome judged from what
// came back (no outputs: starved; fewer than asked: short; after the deadline: a deadline miss).
// The same workload spellings as sim and drive (realtime/workload.h) decide who asks and for how
// long, so a scenario can be run in-process and over the network and the two compared.
//
// Thread-safety: Run() drives everything on the calling thread (one Asio io_context); on_sample is
// called on that thread.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "metronome/base/types.h"
#include "metronome/realtime/frame_summary.h"
#include "metronome/realtime/session_resolve.h"
#include "metronome/realtime/workload.h"
#include "metronome/telemetry/event_log.h"

namespace metronome::loadgen {

// Where frame inputs come from.
struct PayloadSource {
  enum class Kind : std::uint8_t {
    kRandom,  // seeded uniform ids in [0, vocab)
    kIds,     // consecutive chunks of a token-id file, each client from its own offset
    kText,    // consecutive chunks of a text file's words, sent as text for the server to tokenise
  };
  Kind kind = Kind::kRandom;
  std::vector<TokenId> ids;         // kIds
  std::vector<std::string> words;   // kText
  std::string describe = "random";  // for the summary

  // "random" | "ids:FILE" (integers separated by whitespace or commas) | "text:FILE". Throws
  // ConfigError naming --payload, the file and the problem.
  static PayloadSource Parse(const std::string& spec);
};

struct LoadGenOptions {
  // Server. ws://HOST:PORT[/PATH]; the path defaults to /v1/realtime.
  std::string url;
  std::string auth_token;  // sent as "Authorization: Bearer T" when not empty
  // Session shape, sent in session.start: period, deadline, a, o and the prompt resolved with
  // kClientSessionDefaults (and the vocabulary), the KV fields as given (kv_mode unset: window;
  // window, sinks and positions unset: the server's defaults).
  realtime::SessionShape session;
  // Who asks and for how long: exactly one of population.sessions and population.arrival.
  realtime::PopulationOptions population;
  // Payload and encoding.
  PayloadSource payload;
  bool binary_frames = true;  // id frames as binary messages (text frames are always JSON)
  int vocab = 0;              // random ids in [0, vocab); 0: ask the server (/v1/stats), else 256
  // After the run (or a session's lifetime) a session waits for its outstanding frames before it
  // sends session.end, as long as the server keeps answering: it gives up when no answer came for
  // the deadline plus this long, ms.
  double drain_grace_ms = 1000.0;
  double connect_timeout_s = 5.0;
  double sample_interval_s = 0.5;  // on_sample period
  // The first alarms the server raises go to stderr as they arrive (then only counted).
  int alarms_to_stderr = 3;
  // A client whose session's connection drops (the server died: counted in sessions_dropped), or
  // whose WebSocket upgrade is answered with another HTTP status than 503 or 429 (counted in
  // upgrade_refusals and connect_failures), asks again on a new connection after
  // admission::RetryBackoffMs(period, tries) — behind a balancer it lands on a survivor. Off: the
  // client leaves (both are still counted). A rejection with reason "shutdown" (the server is
  // draining) is also asked again on a new connection, not on the same one. A refusal before the
  // session could be asked for — the TCP connection refused, reset or closed during the
  // handshake, or an HTTP 503 or 429 (a balancer with no replica free, a replica with no slot) —
  // is a rejection (counted in rejected, not connect_failures) retried on a new connection with
  // session.rejected's backoff, from Retry-After (seconds) when given, else from the period.
  bool reconnect = true;
  // Conversations survive (docs/protocol.md, "Resume"): a session whose server sends
  // session.moving (a drain hands it on) or whose connection drops while it streams is taken back
  // on a new connection (through the balancer) with session.resume and its latest resume_token,
  // and goes on from the server's next_frame on the same frame clock; the frames that fell due
  // meanwhile are counted as missed (session.resumed's missed_frames). A resume the server refuses
  // (the window passed, the state was lost with a killed replica) counts the session as dropped,
  // by the refusal's reason, and the client asks for a new session. Off: a move or a drop ends the
  // session (dropped) as without a server that resumes.
  bool resume = true;

  void Validate() const;  // ConfigError naming the field and value
};

// The session `o` asks for, resolved with the client's defaults (realtime::SessionDefaults' with
// KV window; its synthetic prompt ids in [0, vocab)): what session.start sends for the period,
// deadline, a, o and prompt, and what frames are judged against. ConfigError naming the field.
[[nodiscard]] realtime::SessionSpec ClientSession(const LoadGenOptions& o, int vocab);

// The client-side view at one sample. Counts are cumulative.
// The client's frame counts so far (FrameCounts), and:
struct LoadGenSample : realtime::FrameCounts {
  double t_s = 0.0;
  std::int64_t active = 0;   // admitted sessions streaming frames
  std::int64_t waiting = 0;  // clients connecting, asking or waiting to retry
  std::int64_t admitted = 0;
  std::int64_t rejected = 0;
  std::int64_t errors = 0;
  // Client latency p99 over frames received since the previous sample, ms (NaN: none).
  double p99_latency_ms_recent = std::numeric_limits<double>::quiet_NaN();
};

// One answered frame as the client saw it (the trace's frame row).
struct ClientFrame {
  double t_s = 0.0;  // when the result arrived, s from the start of the run
  std::uint64_t session = 0;
  std::int64_t frame = 0;
  std::string_view outcome;         // judged by the client: ok, late, starved, short
  double latency_ms = 0.0;          // send to result, client clock
  std::string_view server_outcome;  // as the server reported it
  double server_latency_ms = 0.0;   // arrival at the server to result, server clock
  std::size_t outputs = 0;          // output ids received
};

// What one replica did for this client population, by the `replica` of session.started (""
// when the server names none): sessions, and the frames of those sessions as the client judged
// them (FrameCounts).
struct ReplicaFigures : realtime::FrameCounts {
  std::int64_t admitted = 0;
  // Sessions that ended, however: the client's session.end answered, the server's session.ended,
  // or the connection lost (`dropped`, a subset). admitted - ended were still open at the end.
  std::int64_t ended = 0;
  std::int64_t ended_by_server = 0;  // session.ended with a reason other than client
  std::int64_t dropped = 0;          // the connection closed while the session was open
  [[nodiscard]] nlohmann::json ToJson() const;
};

// The summary: the keys of sim/drive's summary that a client can observe (realtime::FrameSummary,
// the same meaning), plus what only a client sees. Counted on the client: frames = frame.result
// messages received; late = every output, but after the deadline on the client clock;
// deadline_misses = the late frames, as in sim/drive (starved and short frames are handed back at
// their deadline by design and reach the client a network hop after it; they are counted on their
// own); mute_alarms = "alarm" messages of kind mute; rejected = session.rejected messages and
// refused connections (LoadGenOptions::reconnect; a retrying client counts per try); ended_by_error
// = sessions the server ended (context_full, error, shutdown); latency percentiles on the client
// clock.
struct LoadGenSummary : realtime::FrameSummary {
  // Only a client sees these.
  std::int64_t frames_sent = 0;
  std::int64_t lost_frames = 0;     // sent, never answered (connection lost, session ended)
  std::int64_t refused_frames = 0;  // answered with an error (e.g. frame_too_early)
  // Results whose outcome the server judged differently from the client (network delay turning
  // an on-time frame late, mostly).
  std::int64_t outcome_disagreements = 0;
  // Results that reached the client after the deadline, whatever they held.
  std::int64_t after_deadline_frames = 0;
  std::int64_t errors = 0;            // error messages received
  std::int64_t connect_failures = 0;  // connections or handshakes that failed, refusals aside
  // Upgrades answered with an HTTP status (e.g. HAProxy's 503: no replica had room, or the queue
  // timed out), by status; 503 and 429 are counted in rejected, the others in connect_failures.
  std::map<int, std::int64_t> upgrade_refusals;
  // TCP connections refused, or reset or closed during the handshake (counted in rejected).
  std::int64_t connections_refused = 0;
  std::int64_t sessions_dropped = 0;  // sessions whose connection closed while they were open
  std::int64_t reconnects = 0;        // new connections after a drop or an upgrade refusal
  // Continuity (LoadGenOptions::resume): session.moving messages followed, sessions taken back by
  // session.resume (after a move or a drop), refused resumes by reason (each also a dropped
  // session), and the pause of each resume: from the move or the drop to session.resumed, ms.
  // Frames that fell due during a pause are never sent: the FrameCounts' `missed` (counted in
  // `frames` too, as every outcome is). Every frame due is accounted for: frames_sent = (frames -
  // missed) + lost_frames + refused_frames (+ the ones still outstanding when the run was cut
  // off), and the missed frames were due but not sent.
  std::int64_t moves_followed = 0;
  std::int64_t sessions_resumed = 0;
  std::map<std::string, std::int64_t> resume_failures;
  double p50_resume_pause_ms = std::numeric_limits<double>::quiet_NaN();
  double p99_resume_pause_ms = std::numeric_limits<double>::quiet_NaN();
  double max_resume_pause_ms = std::numeric_limits<double>::quiet_NaN();
  std::map<std::string, ReplicaFigures> replicas;  // by session.started's replica
  double p50_server_latency_ms = std::numeric_limits<double>::quiet_NaN();  // the server's clock
  double p99_server_latency_ms = std::numeric_limits<double>::quiet_NaN();
  // How late the client sent frames against its own schedule (an overloaded client shows here).
  double p99_send_lag_ms = std::numeric_limits<double>::quiet_NaN();
  std::string payload;

  [[nodiscard]] nlohmann::json ToJson() const;
};

class LoadGenerator {
 public:
  // `events` (optional, borrowed): the trace, one line per frame, admission, rejection, alarm,
  // error and session end. Throws ConfigError for bad options.
  explicit LoadGenerator(const LoadGenOptions& options, telemetry::EventLog* events = nullptr);
  ~LoadGenerator();
  LoadGenerator(const LoadGenerator&) = delete;
  LoadGenerator& operator=(const LoadGenerator&) = delete;

  // Runs for options.duration_s, drains, closes every connection and returns the summary. Throws
  // std::runtime_error when the server cannot be reached at all. Call once.
  LoadGenSummary Run();

  std::function<void(const LoadGenSample&)> on_sample;
  std::function<void(const ClientFrame&)> on_frame;  // every answered frame (e.g. a CSV trace)

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace metronome::loadgen
