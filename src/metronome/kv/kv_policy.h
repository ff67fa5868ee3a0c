// What a session keeps of its past: the per-session KV bound. `full` keeps everything (up to the
// session's context limit or until the pool runs out); `window` keeps the W most recent tokens plus
// the session's first S tokens (sinks), pinned.
//
// Visibility at query position p: key j is visible iff j <= p and (j < S or j > p - W).
// Positions: `absolute` rotates token j at position j. `rolling` (StreamingLLM) uses in-cache
// positions once a gap exists (p - W + 1 > S): sink i at i, window token j at S + (j - (p - W +
// 1)), the query at S + W - 1. Because RoPE scores depend only on position differences, window keys
// rotated at their absolute positions give exactly the rolling scores; only the sink scores need
// the query moved to S + W - 1 (see kernels/paged_attention.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "metronome/base/paged_kv.h"
#include "metronome/base/types.h"

namespace metronome::kv {

enum class KvMode : std::uint8_t { kFull, kWindow };
enum class PositionMode : std::uint8_t { kAbsolute, kRolling };

// The one spelling of the modes, for every front end (CLI flags, the wire's session.start "kv",
// loadgen): "full" | "window" and "absolute" | "rolling". Parse returns nullopt for anything else.
[[nodiscard]] std::string_view ToString(KvMode mode);
[[nodiscard]] std::string_view ToString(PositionMode positions);
[[nodiscard]] std::optional<KvMode> ParseKvMode(std::string_view text);
[[nodiscard]] std::optional<PositionMode> ParsePositionMode(std::string_view text);

// The ranges KvPolicy::Validate enforces, tokens.
inline constexpr TokenPos kMaxWindowTokens = TokenPos{1} << 32;
inline constexpr TokenPos kMaxSinkTokens = TokenPos{1} << 32;

struct KvPolicy {
  KvMode mode = KvMode::kFull;
  TokenPos window = 0;  // W, tokens; only for kWindow, >= 1
  TokenPos sinks = 0;   // S, tokens; only for kWindow, >= 0
  PositionMode positions = PositionMode::kAbsolute;

  static KvPolicy Full() { return {}; }
  static KvPolicy Window(TokenPos w, TokenPos s, PositionMode pos = PositionMode::kAbsolute) {
    return {KvMode::kWindow, w, s, pos};
  }

  // Effective window and sinks: full mode is a window of "infinity" with no sinks.
  [[nodiscard]] TokenPos effective_window() const {
    return mode == KvMode::kFull ? std::numeric_limits<TokenPos>::max() / 4 : window;
  }
  [[nodiscard]] TokenPos effective_sinks() const { return mode == KvMode::kFull ? 0 : sinks; }

  [[nodiscard]] bool Visible(TokenPos p, TokenPos j) const {
    return j <= p && (j < effective_sinks() || j > p - effective_window());
  }

  // The keys a query at position p attends to, as the attention kernels take them: the sinks
  // [0, min(S, p + 1)) and the window [max(S, p - W + 1), p] (empty while p < S), the j with
  // Visible(p, j); in full mode S = 0 and W is "infinite", so only [0, p] remains. With a rolling
  // gap the sinks are scored against the query moved to S + W - 1 (see the file comment).
  [[nodiscard]] base::QueryKeys KeysOf(TokenPos p) const {
    const TokenPos s = effective_sinks();
    base::QueryKeys keys;
    keys.sink_end = std::min(s, p + 1);
    keys.window_end = p + 1;
    keys.window_begin = std::min(std::max(s, p - effective_window() + 1), keys.window_end);
    keys.rotate_sinks = RollingGap(p);
    if (keys.rotate_sinks) keys.sink_rotation = sinks + window - 1 - p;
    return keys;
  }
  // Keys a query at position p attends to (the length of its scores row): KeysOf(p)'s count. The
  // one count the engine (scratch sizing, attention flops), the cost model and its calibration use.
  [[nodiscard]] std::int64_t VisibleKeys(TokenPos p) const { return KeysOf(p).count(); }
  // VisibleKeys summed over the n queries pos0 .. pos0 + n - 1 of one chunk: the cost model's
  // visible_kv_tokens for one item of a step.
  [[nodiscard]] std::int64_t VisibleKeysOfChunk(TokenPos pos0, TokenPos n) const {
    std::int64_t total = 0;
    for (TokenPos t = 0; t < n; ++t) total += VisibleKeys(pos0 + t);
    return total;
  }

  // Rolling positions are in effect for query p (a gap between sinks and window exists).
  [[nodiscard]] bool RollingGap(TokenPos p) const {
    return mode == KvMode::kWindow && positions == PositionMode::kRolling && p - window + 1 > sinks;
  }

  // The bound on resident blocks at rest (between steps): ceil(S/B) + ceil(W/B) + 1. During a step
  // that appends a chunk of n tokens the session may hold ceil(S/B) + ceil((W - 1 + n)/B) + 1.
  // Full mode has no bound (returns -1).
  [[nodiscard]] std::int64_t MaxResidentBlocks(int block_tokens, int chunk_tokens = 0) const;

  // Throws ConfigError naming the field ("window", "sinks") and value.
  void Validate() const;

  [[nodiscard]] std::string ToString() const;  // e.g. "window W=512 S=4 rolling"
};

}  // namespace metronome::kv
