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
  // The logits row sampled for this item holds a NaN or an infinity (broken weights, or a
  // numerical fault): nothing can be sampled from it, so the item fails instead of answering a
  // token argmax picked from garbage. The step's work for the item is done (its KV appended).
  kNonFiniteLogits,
};
// "ok", "pool_exhausted", "context_full", "unknown_session", "invalid_request",
// "nonfinite_logits".
[[nodiscard]] const char* ToString(StepStatus s);

}  // namespace metronome
