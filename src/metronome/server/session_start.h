// session.start, from the parsed wire message to the resolved session: the protocol's
// StartRequest becomes a realtime::SessionShape, which realtime::ResolveSession completes with the
// server's session defaults, its caps and its tokenizer. The rules themselves live in the
// resolver; this file only maps the wire's names and error codes onto it, so the WebSocket
// connection keeps transport only and the fuzzer can run parsed starts through the same path.
//
// Pure; thread-safe.
#pragma once

#include <variant>

#include "metronome/model/tokenizer.h"
#include "metronome/realtime/session_resolve.h"
#include "metronome/wire/protocol.h"

namespace metronome::server {

// The fields a client may leave out of session.start and what the server puts there: KV window,
// the configured window, sinks and positions, o = 1 (the wire's own default).
[[nodiscard]] realtime::SessionDefaults ServerSessionDefaults(std::int64_t window,
                                                              std::int64_t sinks,
                                                              wire::KvPositions positions);

// The shape a parsed session.start asks for.
[[nodiscard]] realtime::SessionShape ShapeOf(const wire::StartRequest& request);

// The resolved session, or the error to send: bad_field (a value out of the domain, a text prompt
// without a tokenizer, prompt.messages for a model whose chat template the server does not
// format) or over_cap (a prompt longer than caps.max_prompt_tokens once tokenised). A
// prompt.messages is formatted with the model's chat template (model::EncodeChat) into ids.
// The message starts with "session.start: ", the error carries the request's client_ref.
// `tokenizer` may be null.
[[nodiscard]] std::variant<realtime::SessionSpec, wire::ProtocolError> ResolveStart(
    const wire::StartRequest& request, realtime::SessionDefaults defaults,
    const wire::ServerCaps& caps, const model::Tokenizer* tokenizer);

// The effective KV settings a session.started reports for a resolved spec.
[[nodiscard]] wire::KvSettings KvSettingsOf(const realtime::SessionSpec& spec);

}  // namespace metronome::server
