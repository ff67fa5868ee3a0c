// The wire protocol of `metronome serve` (docs/protocol.md is the client author's reference):
// client messages parsed and checked against the server's caps, server messages serialised. Pure
// code: no sockets, no engine, no clock, so every byte a client can send is fuzzable
// (tests/fuzz/protocol_fuzzer.cc). The parsers never throw and never crash: bad input becomes a
// ProtocolError whose message names the message type, the field and the bad value.
//
// What the parsers check: JSON syntax, types, ranges, the server's caps, unknown fields, token ids
// against the vocabulary. What they cannot check (the server does, with the same ErrorCode
// vocabulary): whether a session exists, frame pacing, session limits, authorisation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "metronome/base/types.h"
#include "metronome/kv/kv_policy.h"
#include "metronome/telemetry/engine_metrics.h"

namespace metronome::wire {

// ---------------------------------------------------------------------------------------------
// Errors

// Wire names (ToString) are snake_case and stable: clients switch on them.
enum class ErrorCode : std::uint8_t {
  kBadJson,          // "bad_json": not UTF-8, not JSON, not an object, too deep, duplicate key
  kTooLarge,         // "too_large": longer than ServerCaps::max_message_bytes
  kUnknownType,      // "unknown_type": "type" names no client message
  kUnknownField,     // "unknown_field": a field this message does not have (typo?)
  kMissingField,     // "missing_field": a required field is absent
  kBadField,         // "bad_field": wrong type, or outside the protocol's range
  kOverCap,          // "over_cap": beyond the caps (ServerCaps) or the session's tokens_per_frame
  kUnknownSession,   // "unknown_session" (server): no such session on this connection
  kTokenOutOfRange,  // "token_out_of_range": a token id outside [0, vocab_size)
  kFrameTooEarly,    // "frame_too_early" (server): faster than the declared period, or 2 waiting
  kTooManySessions,  // "too_many_sessions" (server): the connection's session limit is reached
  kUnauthorized,     // "unauthorized" (server): missing or wrong access token
  kInternal,         // "internal": the server's fault, not the message's
  // "session_moving" (server): the session is being handed to another replica (session.moving
  // follows); resume it there and send the frame again.
  kSessionMoving,
};
inline constexpr int kNumErrorCodes = 14;

[[nodiscard]] std::string_view ToString(ErrorCode code);
// The inverse of ToString (for clients and tests); nullopt for an unknown name.
[[nodiscard]] std::optional<ErrorCode> ErrorCodeFromString(std::string_view name);

struct ProtocolError {
  ErrorCode code = ErrorCode::kInternal;
  // "<message type>: <field> = <value> <what is wrong>", e.g.
  // "session.start: kv.window = 0 must be in [1, 65536]". Values are quoted JSON, long strings cut.
  std::string message;
  // Context read from the message before the error, so a client can tell which of its sessions,
  // frames or pending session.start requests the error is about.
  std::optional<std::uint64_t> session;
  std::optional<std::int64_t> frame;      // the frame's index
  std::optional<std::string> client_ref;  // session.start's client_ref
};

// ---------------------------------------------------------------------------------------------
// Server caps: the limits a client request is checked against (over_cap beyond them).

struct ServerCaps {
  double min_period_ms = 10.0;
  double max_period_ms = 10000.0;   // also the largest deadline_ms
  int max_tokens_per_frame = 4096;  // tokens_per_frame, and ids in one frame
  int max_output_tokens_per_frame = 256;
  std::int64_t max_window = 65536;                       // kv.window, tokens
  std::int64_t max_sinks = 1024;                         // kv.sinks, tokens
  bool allow_full_kv = true;                             // false: kv.policy "full" is over_cap
  std::size_t max_message_bytes = std::size_t{1} << 20;  // one WebSocket message, text or binary
  // prompt.ids entries; a text prompt is checked by the server after tokenising it.
  int max_prompt_tokens = 8192;
  int vocab_size = 0;                  // ids must be in [0, vocab_size); 0: only >= 0 is checked
  std::size_t max_text_bytes = 65536;  // frame text and prompt text, UTF-8 bytes
};
// to_json (and, by the macro, from_json) over the caps /v1/stats publishes as "caps", under their
// own names: what a client may ask for (loadgen draws its random ids from vocab_size). The byte
// limits max_message_bytes and max_text_bytes have never been published there.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ServerCaps, vocab_size, min_period_ms, max_period_ms,
                                   max_tokens_per_frame, max_output_tokens_per_frame, max_window,
                                   max_sinks, allow_full_kv, max_prompt_tokens)

// ---------------------------------------------------------------------------------------------
// Client messages

// The KV modes and their one spelling are kv's (kv::ParseKvMode, kv::ToString).
using KvPolicyKind = kv::KvMode;       // "full", "window"
using KvPositions = kv::PositionMode;  // "absolute", "rolling"

// session.start's "kv" as the client sent it. nullopt: not given, the server applies its default
// (policy: window; window, sinks, positions: the server's configured values).
struct KvRequest {
  std::optional<KvPolicyKind> policy;
  std::optional<std::int64_t> window;    // tokens, [1, max_window]; only with policy window
  std::optional<std::int64_t> sinks;     // tokens, [0, max_sinks]; only with policy window
  std::optional<KvPositions> positions;  // rolling only with policy window
};

using TokenIds = std::vector<TokenId>;
// A frame's input or a prompt: token ids, or UTF-8 text for the server to tokenise.
using TokensOrText = std::variant<TokenIds, std::string>;

// One message of a chat prompt ("prompt.messages"), formatted by the server with the model's chat
// template.
struct PromptMessage {
  std::string role;  // non-empty
  std::string content;
};
inline constexpr std::size_t kMaxPromptMessages = 256;
inline constexpr std::size_t kMaxRoleBytes = 64;

// "session.start"
struct StartRequest {
  double period_ms = 0.0;  // P, in [min_period_ms, max_period_ms]
  // From each frame's arrival, in (0, max_period_ms]; nullopt: not given (the period, as
  // realtime::ResolveSession decides).
  std::optional<double> deadline_ms;
  int tokens_per_frame = 0;            // a, in [1, max_tokens_per_frame]
  int output_tokens_per_frame = 1;     // o, in [0, max_output_tokens_per_frame]
  KvRequest kv;                        // all nullopt when "kv" is absent
  std::optional<TokensOrText> prompt;  // fed with the first frame
  // "prompt.messages" instead of ids / text: formatted and tokenised by the server (prompt unset).
  std::optional<std::vector<PromptMessage>> prompt_messages;
  std::optional<std::string> client_ref;  // <= kMaxClientRefBytes, echoed in the answer
};
inline constexpr std::size_t kMaxClientRefBytes = 64;

// "frame" (JSON) or a binary frame (ids only).
struct FrameRequest {
  std::uint64_t session = 0;
  std::optional<std::int64_t> index;  // the client's frame counter, >= 0
  // ids: 1..max_tokens_per_frame entries, each in [0, vocab_size); text: 1..max_text_bytes bytes.
  TokensOrText input;
};

// "session.end"
struct EndRequest {
  std::uint64_t session = 0;
};

// "ping"
struct PingRequest {
  std::optional<double> nonce;  // echoed in the pong
};

// "session.resume": a session back after a dropped connection, or on this replica after a move.
struct ResumeRequest {
  std::string resume_token;  // as session.started / session.resumed / session.moving gave it
  std::optional<std::string> client_ref;  // <= kMaxClientRefBytes, echoed in the answer
};
// A token is at most this long (the server's format is shorter; longer is bad_field).
inline constexpr std::size_t kMaxResumeTokenBytes = 1024;

using ClientMessage =
    std::variant<StartRequest, FrameRequest, EndRequest, PingRequest, ResumeRequest>;

// One WebSocket text message. Checks the size first (too_large), then UTF-8, JSON syntax, nesting
// (at most kMaxJsonDepth levels) and duplicate keys (bad_json), then "type", unknown fields, and
// the message's fields; the first problem found is reported. Never throws.
[[nodiscard]] std::variant<ClientMessage, ProtocolError> ParseClientMessage(std::string_view text,
                                                                            const ServerCaps& caps);
inline constexpr int kMaxJsonDepth = 16;

// Binary frames: one WebSocket binary message carries one frame of token ids. Little-endian:
//   offset 0  u8  magic 'M' (0x4d)
//   offset 1  u8  version 1
//   offset 2  u16 reserved, 0
//   offset 4  u64 session
//   offset 12 i64 frame index, -1: none
//   offset 20 u32 count, in [1, max_tokens_per_frame]
//   offset 24 count x i32 token ids
// The message must be exactly 24 + 4 * count bytes.
inline constexpr std::size_t kBinaryFrameHeaderBytes = 24;
inline constexpr std::uint8_t kBinaryFrameMagic = 0x4d;  // 'M'
inline constexpr std::uint8_t kBinaryFrameVersion = 1;

// Every length is checked against the bytes present before it is used. Never throws.
[[nodiscard]] std::variant<FrameRequest, ProtocolError> ParseBinaryFrame(
    std::span<const std::byte> bytes, const ServerCaps& caps);
// For clients and tests. `frame.input` must hold ids (at most 2^32 - 1 of them): text has no
// binary encoding, and passing it is a bug (MTR_CHECK).
[[nodiscard]] std::vector<std::byte> EncodeBinaryFrame(const FrameRequest& frame);

// ---------------------------------------------------------------------------------------------
// Server messages. Serialize() returns one JSON text message; "type" comes first, optional fields
// are omitted when absent, non-finite numbers become null and invalid UTF-8 is replaced by U+FFFD,
// so it never throws for any field value.

struct KvSettings {  // the effective policy of a started session
  KvPolicyKind policy = KvPolicyKind::kWindow;
  std::int64_t window = 0;  // tokens; only serialised for policy window
  std::int64_t sinks = 0;   // tokens; only serialised for policy window
  KvPositions positions = KvPositions::kAbsolute;
};

// "session.started"
struct SessionStarted {
  std::uint64_t session = 0;
  std::optional<std::string> client_ref;
  double period_ms = 0.0;
  double deadline_ms = 0.0;
  int tokens_per_frame = 0;
  int output_tokens_per_frame = 0;
  KvSettings kv;
  // Tokens the session may append before it ends with reason context_full; nullopt (null on the
  // wire): unlimited.
  std::optional<std::int64_t> max_context;
  // The replica serving the session (serve --replica-id); nullopt: omitted.
  std::optional<std::string> replica;
  // What session.resume takes to get the session back (nullopt: this server keeps no session
  // after its connection; omitted).
  std::optional<std::string> resume_token;
  [[nodiscard]] std::string Serialize() const;
};

// "session.resumed": session.resume's answer. The session goes on as it was (the same KV,
// positions, sampler, counters); the frames that fell due while it was away are counted as missed.
struct SessionResumed {
  std::uint64_t session = 0;  // its id on this connection from now on
  std::optional<std::string> client_ref;
  std::int64_t next_frame = 0;     // the index of the frame the server takes next
  std::int64_t missed_frames = 0;  // periods that passed with no frame while it was away
  std::string resume_token;        // the next resume's token (the one presented is spent)
  double period_ms = 0.0;
  double deadline_ms = 0.0;
  int tokens_per_frame = 0;
  int output_tokens_per_frame = 0;
  std::optional<std::string> replica;
  [[nodiscard]] std::string Serialize() const;
};

// "session.moving": the replica hands the session on (reason "drain": it is shutting down); no
// frame is taken any more. Reconnect (through the balancer, or to any replica) and send
// session.resume with this token.
struct SessionMoving {
  std::uint64_t session = 0;
  std::string resume_token;
  std::string reason = "drain";
  std::int64_t next_frame = 0;  // the index of the frame the session takes next, wherever it goes
  [[nodiscard]] std::string Serialize() const;
};

// "session.rejected": admission said no; the client may retry after retry_after_ms.
struct SessionRejected {
  std::optional<std::string> client_ref;
  std::string reason;  // short code: "limit", "kv_guard", "pool", "max_sessions"
  std::string detail;  // human-readable, with the numbers behind it
  double retry_after_ms = 0.0;
  [[nodiscard]] std::string Serialize() const;
};

// One vocabulary for frame outcomes across the loop, telemetry and the wire ("ok", "late",
// "starved", "short": telemetry::ToString).
using FrameOutcome = telemetry::FrameOutcome;

// "frame.result"
struct FrameResult {
  std::uint64_t session = 0;
  // The client's index when the frame carried one, else the session's count of accepted frames
  // before this one.
  std::int64_t frame = 0;
  TokenIds ids;                     // the outputs: o of them, fewer for short, none for starved
  std::optional<std::string> text;  // ids decoded, for frames that carried text
  double latency_ms = 0.0;          // from the frame's arrival at the server to this result
  FrameOutcome outcome = FrameOutcome::kOk;
  [[nodiscard]] std::string Serialize() const;
};

// Why a session ended: the one vocabulary of the engine (telemetry::EndReason: "client",
// "context_full", "server_shutdown", "disconnect", "error", "idle", "nonfinite_logits";
// "duration" never reaches the wire).
using EndReason = telemetry::EndReason;

// "session.ended"
struct SessionEnded {
  std::uint64_t session = 0;
  EndReason reason = EndReason::kClient;
  std::int64_t frames = 0;  // frame.result messages sent for the session
  [[nodiscard]] std::string Serialize() const;
};

// "alarm", e.g. kind "mute" after k consecutive starved frames.
struct Alarm {
  std::uint64_t session = 0;
  std::string kind;
  std::string detail;
  [[nodiscard]] std::string Serialize() const;
};

// "pong": the ping's nonce echoed (an integer when it was one, up to 2^53).
struct Pong {
  std::optional<double> nonce;
  [[nodiscard]] std::string Serialize() const;
};

// "error": a ProtocolError on the wire.
struct ErrorMessage {
  ProtocolError error;
  [[nodiscard]] std::string Serialize() const;
};

}  // namespace metronome::wire
