// The outcome of one request in a batched step: the engine's, and so the real-time backends'
// (the engine and the simulator answer in the same words). Shared vocabulary, below both.
#pragma once

#include <cstdint>

namespace metronome {

enum class StepStatus : std::uint8_t {
  kOk,
  kPoolExhausted,  // no KV blocks for this chunk; the session is unchanged
  kContextFull,    // the session's context limit would be exceeded; unchanged
  kUnknownSession,
  kInvalidRequest,  // empty chunk, token id out of range, or the session twice in one step
};
// "ok", "pool_exhausted", "context_full", "unknown_session", "invalid_request".
[[nodiscard]] const char* ToString(StepStatus s);

}  // namespace metronome
