#include "metronome/kv/kv_policy.h"

#include "metronome/base/errors.h"

namespace metronome::kv {
namespace {
std::int64_t CeilDiv(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
}  // namespace

std::int64_t KvPolicy::MaxResidentBlocks(int block_tokens, int chunk_tokens) const {
  if (mode == KvMode::kFull) return -1;
  const std::int64_t in_flight = chunk_tokens > 0 ? window - 1 + chunk_tokens : window;
  return CeilDiv(sinks, block_tokens) + CeilDiv(in_flight, block_tokens) + 1;
}

std::string_view ToString(KvMode mode) { return mode == KvMode::kFull ? "full" : "window"; }

std::string_view ToString(PositionMode positions) {
  return positions == PositionMode::kRolling ? "rolling" : "absolute";
}

std::optional<KvMode> ParseKvMode(std::string_view text) {
  if (text == "full") return KvMode::kFull;
  if (text == "window") return KvMode::kWindow;
  return std::nullopt;
}

std::optional<PositionMode> ParsePositionMode(std::string_view text) {
  if (text == "absolute") return PositionMode::kAbsolute;
  if (text == "rolling") return PositionMode::kRolling;
  return std::nullopt;
}

void KvPolicy::Validate() const {
  if (mode == KvMode::kFull) return;
  if (window < 1 || window > kMaxWindowTokens) {
    throw ConfigError("window = " + std::to_string(window) + " must be in [1, " +
                      std::to_string(kMaxWindowTokens) + "]");
  }
  if (sinks < 0 || sinks > kMaxSinkTokens) {
    throw ConfigError("sinks = " + std::to_string(sinks) + " must be in [0, " +
                      std::to_string(kMaxSinkTokens) + "]");
  }
}

std::string KvPolicy::ToString() const {
  if (mode == KvMode::kFull) return "full";
  return "window W=" + std::to_string(window) + " S=" + std::to_string(sinks) + " " +
         std::string(kv::ToString(positions));
}

}  // namespace metronome::kv
