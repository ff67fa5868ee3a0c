// Convenience for single-session callers (generate, score, tests): feed a token sequence to one
// session in chunks and receive its logits. Batched multi-session work calls Engine::Step directly.
#pragma once

#include <functional>
#include <span>

#include "metronome/engine/engine.h"

namespace metronome::engine {

// Callback receives (index of the token within `tokens`, logits after that token).
using LogitsCallback = std::function<void(std::size_t, std::span<const float>)>;

// Feeds `tokens` in chunks of at most `chunk_tokens`. With `all_logits` the callback sees every
// position, otherwise only the last token of the sequence. Returns the first non-ok status (the
// tokens before the failing chunk stay appended); kNonFiniteLogits when a row the callback would
// see cannot be sampled (Engine::logits_finite), before the callback sees it.
StepStatus Feed(Engine& engine, SessionId session, std::span<const TokenId> tokens,
                int chunk_tokens, bool all_logits, const LogitsCallback& on_logits);

}  // namespace metronome::engine
