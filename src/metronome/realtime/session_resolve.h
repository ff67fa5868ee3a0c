// Resolving a session once, at the edge: what a client asked for (the wire's session.start, the
// CLI's session-shape flags or a workload's shape) plus the defaults the server (or tool) holds
// and an optional tokenizer become a fully resolved SessionSpec, or a typed error naming the field
// and value. Every rule that fills in or checks a session's shape lives here and only here:
//   - an absent field takes SessionDefaults' value;
//   - deadline_ms absent or 0 means the period (the resolved spec always has deadline_ms > 0);
//   - kv: the mode, then window and sinks (window mode only) and positions;
//   - the prompt: token ids as given, text tokenised (with BOS) by the tokenizer, or a synthetic
//     stand-in of N ids ((i * 31 + 7) % vocab_size, the fixed system prompt of sim, drive and
//     loadgen), at most max_prompt_tokens.
// Downstream code (WsConnection, EngineService, Supervisor, RealtimeLoop, WorkloadRunner,
// LoadGenerator, sim) takes the resolved spec and never re-derives a default. Caps a server puts on
// the wire (wire/protocol.h's ServerCaps) are checked by the protocol parser before this runs;
// the checks here are the domain's (a period is positive, a window holds a token, ...).
//
// Pure: no I/O, no clock; thread-safe (the tokenizer's Encode is const).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "metronome/base/types.h"
#include "metronome/kv/kv_policy.h"
#include "metronome/model/tokenizer.h"
#include "metronome/realtime/realtime_loop.h"

namespace metronome::realtime {

// A stand-in prompt of `tokens` fixed ids (see above).
struct SyntheticPrompt {
  int tokens = 0;
};
// No prompt, token ids, UTF-8 text for the tokenizer, or a synthetic stand-in. Empty ids or text
// mean no prompt.
using PromptRequest =
    std::variant<std::monostate, std::vector<TokenId>, std::string, SyntheticPrompt>;

// A session as asked for; an unset optional takes SessionDefaults' value.
struct SessionShape {
  std::optional<double> period_ms;             // P, ms, > 0
  std::optional<double> deadline_ms;           // from each frame's arrival, ms, >= 0; 0: the period
  std::optional<int> tokens_per_frame;         // a, >= 1
  std::optional<int> output_tokens_per_frame;  // o, >= 0
  std::optional<kv::KvMode> kv_mode;
  std::optional<TokenPos> window;  // W, tokens, window mode only
  std::optional<TokenPos> sinks;   // S, tokens, window mode only
  std::optional<kv::PositionMode> positions;
  PromptRequest prompt;
};

// What the server or tool fills in and bounds a shape with.
struct SessionDefaults {
  double period_ms = 80.0;
  double deadline_ms = 0.0;  // 0: the period
  int tokens_per_frame = 1;
  int output_tokens_per_frame = 1;
  kv::KvMode kv_mode = kv::KvMode::kFull;
  TokenPos window = 512;
  TokenPos sinks = 4;
  kv::PositionMode positions = kv::PositionMode::kAbsolute;
  int max_prompt_tokens = 0;  // 0: no cap
  int vocab_size = 0;         // synthetic prompt ids lie in [0, vocab_size); needs > 0 for one
};

// The server's cap on a default window, tokens (serve and drive's --max-window): a model trained on
// a long context would otherwise give every session its whole context. 4096 covers the trained
// context of the small models this engine runs (synthetic, llama2.c, SmolLM 2k-8k) and the presets'
// windows (1000-2048 tokens), and bounds a 7B session (128 KiB of bf16 K/V per token) to 512 MiB.
inline constexpr TokenPos kDefaultMaxWindowTokens = 4096;
inline constexpr TokenPos kDefaultSinkTokens = 4;

// The defaults of a serving engine (serve, drive, the server's session.start): a session keeps
// W = min(trained_context, max_window) recent tokens (max_window when the trained context is
// unknown, <= 0) plus kDefaultSinkTokens sinks, with rolling positions, so no position ever
// exceeds what the model was trained on and memory and per-frame cost are bounded; the rest of the
// shape keeps SessionDefaults' values. max_window >= 1.
[[nodiscard]] SessionDefaults ServingSessionDefaults(TokenPos trained_context, TokenPos max_window);

// `defaults` with every field `overrides` sets put in its place ("an explicit field wins over the
// default", for a server's or tool's own defaults: serve's --kv/--window/--sinks/--positions).
// The prompt of `overrides` is ignored (defaults hold none); nothing is checked here: a field out
// of its domain is reported when a shape is resolved against the result. So, for a shape without a
// prompt, ResolveSession({}, WithOverrides(d, shape)) == ResolveSession(shape, d).
[[nodiscard]] SessionDefaults WithOverrides(SessionDefaults defaults,
                                            const SessionShape& overrides);

enum class SessionErrorCode : std::uint8_t {
  kBadValue,        // out of the field's domain (a negative period, a window of 0 tokens, ...)
  kOverCap,         // beyond a limit of the defaults (max_prompt_tokens)
  kNeedsTokenizer,  // a text prompt and no tokenizer
};
[[nodiscard]] std::string_view ToString(SessionErrorCode code);

struct SessionError {
  SessionErrorCode code = SessionErrorCode::kBadValue;
  std::string field;    // the shape's field: "period_ms", "window", "prompt.text", ...
  std::string value;    // as given, formatted
  std::string message;  // "period_ms = -1 must be > 0": names the field and value
};

using SessionResolution = std::variant<SessionSpec, SessionError>;

// The resolved spec, or the first error in the order of SessionShape's fields. `tokenizer` may be
// null (a text prompt is then kNeedsTokenizer).
[[nodiscard]] SessionResolution ResolveSession(const SessionShape& shape,
                                               const SessionDefaults& defaults,
                                               const model::Tokenizer* tokenizer = nullptr);

// ResolveSession for callers whose bad input is a configuration error: throws ConfigError with
// the error's message.
[[nodiscard]] SessionSpec ResolveSessionOrThrow(const SessionShape& shape,
                                                const SessionDefaults& defaults,
                                                const model::Tokenizer* tokenizer = nullptr);

}  // namespace metronome::realtime
